"""A synthetic mixture-of-experts model in llama.cpp's ``llama`` architecture with ``expert_count > 0`` (the Mixtral
layout), written deterministically from a seed with the ``gguf`` package (:func:`generate_synthetic_moe`):
the tensors and their values, chunk by chunk, in parallel; the vocabulary taken from a real GGUF file.

Longer than 400 lines: the parameters, the tensor plan, the value tables and the writer are one generator;
its output's bytes are fixed by GENERATOR_VERSION.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np

# the harness's one file digest (a module attribute, so tests can count calls)
from ..common.fs import sha256_file as _file_sha256
from .models import GiB, ModelError, open_gguf, record_made, reusable


#: Bumped whenever the bytes :func:`generate_synthetic_moe` writes for given
#: parameters change; it is part of the output file name.
GENERATOR_VERSION = 1


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

#: A ``tokenizer.ggml.*`` key's value as the vocabulary copy holds it: strings as raw bytes, arrays as lists,
#: numbers and flags as gguf reads them (:func:`_read_vocab`).
VocabValue = bytes | int | float | bool | list[bytes] | list[int] | list[float] | list[bool]


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


def _read_vocab(vocab_gguf: Path) -> tuple[list[tuple[str, VocabValue, gguf.GGUFValueType, gguf.GGUFValueType | None]], int]:
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
        value: VocabValue
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
            out.write(chunk.view(np.uint8).reshape(-1).data)
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
