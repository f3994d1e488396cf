"""Tests for models derived with llama-quantize (harness.matrix.models.derive_quantized, kind ``quantized``).

No llama.cpp build: llama-quantize is replaced by a small script that records its arguments and copies the
source to the output (or fails the way llama-quantize fails), injected as a QuantizeTool.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.matrix.config import MatrixError, Model, load_matrix
from harness.matrix.models import ModelError, QuantizeTool, derive_quantized, model_summary, quantized_spec_problems
from harness.matrix.moe_generator import MoeParams, generate_synthetic_moe
from harness.matrix.model_sources.registry import ModelStore, model_identity
from harness.stages.building import quantize_tool as qt

from test_models import TINY, vocab  # noqa: F401  (the vocabulary fixture)

ROOT = Path(__file__).resolve().parents[1]

FAKE_QUANTIZE = textwrap.dedent('''\
    import json, os, shutil, sys
    log = os.environ["FAKE_QUANTIZE_LOG"]
    with open(log, "a") as fh:
        fh.write(json.dumps(sys.argv[1:]) + "\\n")
    if os.environ.get("FAKE_QUANTIZE_FAIL"):
        print("main: build = 0 (unknown)")
        print("llama_model_quantize: failed to quantize: this quantization requires an imatrix!", file=sys.stderr)
        print("main: failed to quantize model from 'x.gguf'", file=sys.stderr)
        sys.exit(1)
    args = sys.argv[1:]
    while args[0] == "--tensor-type":
        args = args[2:]
    src, out = args[0], args[1]
    shutil.copyfile(src, out)
    with open(out, "ab") as fh:
        fh.write(json.dumps(sys.argv[1:]).encode())
''')

SPEC = {"kind": "quantized", "from": "tiny", "type": "Q4_K_M",
        "tensor_types": [[r"blk\.0\.ffn_.*_exps", "q3_k"], [r"blk\.1\.ffn_.*_exps", "q6_k"],
                         [r"attn_(q|k|v|output)\.weight", "q8_0"]]}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake llama-quantize (``tool``), its call log (``calls()``) and a cache directory."""
    script = tmp_path / "fake_quantize.py"
    script.write_text(FAKE_QUANTIZE)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_QUANTIZE_LOG", str(log))
    monkeypatch.delenv("FAKE_QUANTIZE_FAIL", raising=False)

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    tool = QuantizeTool((sys.executable, str(script)), "a" * 64, "a fake llama-quantize")
    return SimpleNamespace(tool=tool, calls=calls, cache=tmp_path / "cache")


@pytest.fixture
def source(vocab: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # noqa: F811
    path = generate_synthetic_moe(vocab, TINY, tmp_path_factory.mktemp("src"))
    return path, {"kind": "synthetic-moe", "generated": path.name}


def derive(fake: SimpleNamespace, source: tuple[Path, dict], spec: dict = SPEC, tool: QuantizeTool | None = None,
           identity: dict | None = None) -> Path:
    return derive_quantized("tiny-quant", spec, source[0], identity or source[1], tool or fake.tool, fake.cache)


def test_the_first_derivation_runs_llama_quantize_with_every_override_and_the_second_reuses_it(fake, source):
    path = derive(fake, source)
    assert path.parent == fake.cache / "models" / "derived" and path.name.startswith("tiny-quant-Q4_K_M-")
    (argv,) = fake.calls()
    assert argv[:6] == ["--tensor-type", r"blk\.0\.ffn_.*_exps=q3_k", "--tensor-type", r"blk\.1\.ffn_.*_exps=q6_k",
                        "--tensor-type", r"attn_(q|k|v|output)\.weight=q8_0"]
    assert argv[6] == str(source[0]) and argv[8] == "Q4_K_M" and int(argv[9]) >= 1
    inputs = json.loads(path.with_name(path.name + ".inputs.json").read_text())
    assert inputs["quantize"]["digest"] == "a" * 64 and inputs["source_identity"] == source[1]
    assert derive(fake, source) == path
    assert len(fake.calls()) == 1  # warm: nothing runs
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("change", ["source", "quantize", "type", "override type", "override pattern",
                                    "override order", "override added"])
def test_each_input_change_misses_the_cache(fake, source, change):
    first = derive(fake, source)
    spec, tool, identity = json.loads(json.dumps(SPEC)), fake.tool, None
    if change == "source":
        identity = {"kind": "synthetic-moe", "generated": "moe-llama-other-params.gguf"}
    elif change == "quantize":
        tool = QuantizeTool(fake.tool.argv, "b" * 64, "another build")
    elif change == "type":
        spec["type"] = "Q5_K_M"
    elif change == "override type":
        spec["tensor_types"][0][1] = "q4_k"
    elif change == "override pattern":
        spec["tensor_types"][0][0] = r"blk\.0\.ffn_(gate|up)_exps"
    elif change == "override order":
        spec["tensor_types"].reverse()
    else:
        spec["tensor_types"].append(["token_embd", "q8_0"])
    second = derive(fake, source, spec, tool, identity)
    assert second != first and second.is_file() and first.is_file()
    assert len(fake.calls()) == 2


def test_the_type_is_one_key_whatever_its_case(fake, source):
    first = derive(fake, source)
    assert derive(fake, source, {**SPEC, "type": "q4_k_m"}) == first
    assert len(fake.calls()) == 1


@pytest.mark.parametrize("spec_change, where, words", [
    ({"type": "IQ2_XXS"}, "type", "IQ2_XXS needs an importance matrix"),
    ({"type": "IQ1_S"}, "type", "IQ1_S needs an importance matrix"),
    ({"type": "IQ3_XXS"}, "type", "IQ3_XXS needs an importance matrix"),
    ({"type": "Q2_K_S"}, "type", "Q2_K_S needs an importance matrix"),
    ({"type": "Q4_K_Q"}, "type", "'Q4_K_Q' is not a llama-quantize type"),
    ({"tensor_types": [["ffn_up_exps", "iq2_xs"]]}, "tensor_types.0.1", "iq2_xs needs an importance matrix"),
    ({"tensor_types": [["ffn_up_exps", "q9_k"]]}, "tensor_types.0.1", "'q9_k' is not a ggml tensor type"),
    ({"tensor_types": [["blk\\.\\D\\.", "q4_k"]]}, "tensor_types.0.0", "capital letters"),
    ({"tensor_types": [["a=b", "q4_k"]]}, "tensor_types.0.0", "holds '='"),
    ({"tensor_types": [["blk\\.(0", "q4_k"]]}, "tensor_types.0.0", "not a regular expression"),
])
def test_types_needing_an_importance_matrix_and_malformed_overrides_are_refused(fake, source, spec_change, where,
                                                                                words):
    spec = {**SPEC, **spec_change}
    assert any(".".join(map(str, k)) == where and words in m for k, m in quantized_spec_problems(spec))
    with pytest.raises(ModelError, match=f"model tiny-quant: {where.replace('.', '[.]')}: .*{words[:12]}"):
        derive(fake, source, spec)
    assert fake.calls() == []


def test_a_pattern_that_matches_no_tensor_is_refused_before_llama_quantize_runs(fake, source):
    spec = {**SPEC, "tensor_types": [[r"blk\.0\.ffn_.*_exps", "q3_k"], [r"blk\.0\.ffn_gate_shexp", "q8_0"]]}
    with pytest.raises(ModelError, match=r"pattern 'blk\\\\.0\\\\.ffn_gate_shexp' matches no tensor of tiny"):
        derive(fake, source, spec)
    assert fake.calls() == []


def test_a_failing_llama_quantize_is_named_with_its_exit_status_and_reason_and_leaves_nothing(fake, source,
                                                                                           monkeypatch):
    monkeypatch.setenv("FAKE_QUANTIZE_FAIL", "1")
    with pytest.raises(ModelError) as err:
        derive(fake, source)
    assert str(err.value) == (
        "model tiny-quant: deriving it from tiny with a fake llama-quantize failed: llama-quantize exited 1: "
        "llama_model_quantize: failed to quantize: this quantization requires an imatrix! / "
        "main: failed to quantize model from 'x.gguf'")
    assert not any((fake.cache / "models" / "derived").iterdir())


def test_a_missing_llama_quantize_program_is_named(fake, source, tmp_path):
    tool = QuantizeTool((str(tmp_path / "no-such-llama-quantize"),), "c" * 64, "llama-quantize of nowhere")
    with pytest.raises(ModelError, match="model tiny-quant: cannot run llama-quantize of nowhere"):
        derive(fake, source, tool=tool)


# --------------------------------------------------------------------------- the store and the matrix


def store(fake, tmp_path: Path, vocab: Path, quantize=None) -> ModelStore:  # noqa: F811
    params = {f: getattr(TINY, f) for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_expert",
                                            "n_expert_used", "n_ff_exp", "n_ctx_train", "seed")}
    models = {"tiny": Model("tiny", "synthetic-moe", {"vocab": vocab.name, "params": params}),
              "tiny-quant": Model("tiny-quant", "quantized", SPEC),
              "tiny-requant": Model("tiny-requant", "quantized", {**SPEC, "from": "tiny-quant", "tensor_types": []})}
    return ModelStore(models, fake.cache, lambda: vocab.parent, "matrix.yaml", quantize)


def test_the_store_makes_the_source_then_derives_from_it_asking_for_llama_quantize_once(fake, tmp_path, vocab):  # noqa: F811
    asked = []

    def quantize() -> QuantizeTool:
        asked.append(1)
        return fake.tool

    models = store(fake, tmp_path, vocab, quantize)
    derived = models.path("tiny-quant")
    assert models.path("tiny").is_file() and models.path("tiny-requant") != derived
    assert fake.calls()[0][6] == str(models.path("tiny"))
    assert fake.calls()[1][0] == str(derived)  # a chain: derived from the derived model
    assert asked == [1]


def test_the_store_names_a_missing_quantize_build_for_every_derived_model(fake, tmp_path, vocab):  # noqa: F811
    def quantize() -> QuantizeTool:
        raise ModelError("llama-quantize: the base build of linux-x86_64-cpu failed: build failed: error: x")

    models = store(fake, tmp_path, vocab, quantize)
    for name in ("tiny-quant", "tiny-quant"):
        with pytest.raises(ModelError, match="the base build of linux-x86_64-cpu failed"):
            models.path(name)
    assert models.path("tiny").is_file()
    without = store(fake, tmp_path, vocab)
    with pytest.raises(ModelError, match="derived with llama-quantize from tiny, and this command has no build"):
        without.path("tiny-quant")


def test_models_says_which_build_it_needs_when_there_is_none(tmp_path):
    matrix = load_matrix(ROOT / "matrix.yaml")
    with pytest.raises(ModelError) as err:
        qt.built_tool(matrix, tmp_path / "work")
    assert "derived models need llama-quantize from the base build of linux-x86_64-cpu" in str(err.value)
    assert f"python -m harness build --platform linux-x86_64-cpu --work-dir {tmp_path / 'work'}" in str(err.value)


def test_the_quantize_digest_follows_the_program_and_its_libraries_not_their_dates(tmp_path):
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-quantize").write_bytes(b"\x00program")
    lib = bin_dir / "libllama.so"
    lib.write_bytes(b"\x00library one")
    platform = load_matrix(ROOT / "matrix.yaml").platforms["linux-x86_64-cpu"]
    first = qt.tool_from_build(platform, bin_dir)
    assert first.argv == (str(bin_dir / "llama-quantize"),) and "linux-x86_64-cpu's base build" in first.where
    os.utime(lib, (1, 1))
    assert qt.tool_from_build(platform, bin_dir).digest == first.digest
    lib.write_bytes(b"\x00library two")
    assert qt.tool_from_build(platform, bin_dir).digest != first.digest
    (bin_dir / "llama-quantize").unlink()
    with pytest.raises(ModelError, match="does not exist; the base build of linux-x86_64-cpu does not build it"):
        qt.tool_from_build(platform, bin_dir)


def test_the_pipeline_builds_the_host_cpu_platforms_base_before_deriving(tmp_path, monkeypatch):
    from harness.stages.building.builds import Builds
    matrix = load_matrix(ROOT / "matrix.yaml")
    monkeypatch.setattr(qt, "host_os", lambda: "linux")
    monkeypatch.setattr(qt, "host_arch", lambda: "x86_64")
    built = []

    def build_variant(p, variant):
        built.append((p.name, variant))
        return SimpleNamespace(status="failed", detail="build failed: error: quantize.cpp")

    stub = SimpleNamespace(matrix=matrix, build_variant=build_variant)
    with pytest.raises(ModelError, match="llama-quantize: the base build of linux-x86_64-cpu failed: build failed"):
        Builds.quantize_tool(stub)  # type: ignore[arg-type]
    assert built == [("linux-x86_64-cpu", "base")]


def test_the_host_cpu_platform_makes_derived_models_for_the_cuda_platforms_too(monkeypatch):
    platforms = load_matrix(ROOT / "matrix.yaml").platforms
    monkeypatch.setattr(qt, "host_os", lambda: "linux")
    monkeypatch.setattr(qt, "host_arch", lambda: "x86_64")
    assert qt.quantize_platform(platforms.values()).name == "linux-x86_64-cpu"
    monkeypatch.setattr(qt, "host_arch", lambda: "aarch64")
    assert qt.quantize_platform(platforms.values()) is None
    assert "gpu: none, os: linux, arch: aarch64 whose targets list llama-quantize" in str(qt.no_quantize_platform())


def write_matrix(tmp_path: Path, models_yaml: str) -> Path:
    text = (ROOT / "matrix.yaml").read_text()
    end = text.index("\nprompts:\n")
    extra = textwrap.indent(textwrap.dedent(models_yaml), "  ")
    path = tmp_path / "matrix.yaml"
    path.write_text(text[:end] + "\n" + extra + text[end:])
    return path


def derived(name: str = "odd", source: str = "moe-small", base_type: str = "Q4_K_M", overrides: str = "") -> str:
    """A ``kind: quantized`` entry of matrix.yaml; ``overrides``: its tensor_types items, one per line."""
    text = f"{name}:\n  kind: quantized\n  from: {source}\n  type: {base_type}\n"
    return text + ("  tensor_types:\n" + textwrap.indent(overrides, "    ") if overrides else "")


@pytest.mark.parametrize("models_yaml, message", [
    (derived(source="no-such-model"), "models.odd.from: unknown model 'no-such-model'"),
    (derived("loop-a", "loop-b") + derived("loop-b", "loop-a"),
     "models.loop-a.from: derived from itself (loop-a -> loop-b -> loop-a)"),
    (derived(base_type="IQ2_XXS"), "models.odd.type: IQ2_XXS needs an importance matrix"),
    (derived(overrides="- ['ffn_up_exps', iq1_m]\n"), "models.odd.tensor_types[0][1]: iq1_m needs an importance matrix"),
    (derived(overrides="- ['ffn_up_exps']\n"), "models.odd.tensor_types[0]"),
])
def test_the_matrix_refuses_a_derived_model_it_cannot_make_naming_the_line(tmp_path, models_yaml, message):
    path = write_matrix(tmp_path, models_yaml)
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert message in str(err.value)
    line = next(ln for ln in str(err.value).splitlines() if message in ln)
    assert line.strip().startswith(f"{path}:")


def test_the_matrix_derives_the_cpu_model_from_moe_small_with_the_cpu_platforms_llama_quantize():
    matrix = load_matrix(ROOT / "matrix.yaml")
    small = matrix.models["moe-small-quant"]
    assert (small.kind, small.spec["from"]) == ("quantized", "moe-small")
    assert "moe-small-quant" in matrix.groups["base-vs-fork"].models
    assert "llama-quantize" in matrix.platforms["linux-x86_64-cpu"].targets


def test_the_gpu_model_is_derived_from_a_48_layer_synthetic_moe():
    matrix = load_matrix(ROOT / "matrix.yaml")
    assert matrix.models["moe-48l-quant"].spec["from"] == "moe-48l-f16"
    assert matrix.models["moe-48l-f16"].spec["params"]["n_layer"] == 48


def test_the_gpu_models_experts_by_layer_are_the_documented_4176_mib():
    """moe-48l-quant's expert bytes from its shape and types, without making it: Q3_K, Q4_K and Q6_K blocks of
    256 weights take 110, 144 and 210 bytes; the seed's limits in matrix.yaml are scaled from this total."""
    matrix = load_matrix(ROOT / "matrix.yaml")
    p = MoeParams(**matrix.models["moe-48l-f16"].spec["params"])
    per_layer_blocks = 3 * p.n_expert * p.n_embd * p.n_ff_exp // 256
    import re
    sizes = {"q3_k": 110, "q4_k": 144, "q6_k": 210}
    by_layer = []
    for layer in range(p.n_layer):
        name = f"blk.{layer}.ffn_up_exps.weight"
        ttype = next(t for pat, t in matrix.models["moe-48l-quant"].spec["tensor_types"] if re.search(pat, name))
        by_layer.append(per_layer_blocks * sizes[ttype])
    total_mib = sum(by_layer) / 2**20
    assert total_mib == 4176
    env = matrix.configs["cuda-seed-sim-partial"].env
    assert int(env["GGML_CUDA_PIN_SIM_CALL_MAX_MB"]) == round(total_mib * 2 / 52.2)
    assert int(env["GGML_CUDA_PIN_SIM_TOTAL_MAX_MB"]) == round(total_mib * 4 / 52.2)


def test_the_summary_records_the_expert_types_of_each_layer(fake, source):
    summary = model_summary(source[0], cache=False)
    assert summary["expert_tensor_types_by_layer"] == [["F16"], ["F16"]]


def test_a_file_models_identity_is_its_sha256_also_where_no_sidecar_can_be_written(tmp_path, monkeypatch):
    from harness.matrix import models
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF model bytes")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(models, "_write_sidecar", read_only)
    got = model_identity(Model("m", "file", {"path": f}), f)
    assert got == {"kind": "file", "sha256": hashlib.sha256(b"GGUF model bytes").hexdigest()}
