"""Platform kinds, declared once (harness/kinds): the registry matches the schema's enums, and a new GPU kind
is its declaration, its value in the schema's enum and its platform in matrix.yaml: nothing else.

The fake kind here (``rocm``) is declared in this file only; the run loop's real stage table takes a platform
of it through preflight, build, test and compare, and every refusal and skip names what the declaration says.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from harness.common.errors import InputError
from harness.kinds import registry
from harness.kinds.shape import LOAD_MODES, EnvVar, GpuKind, HostTool
from harness.matrix import config
from harness.matrix.config import load_matrix
from harness.pipeline import Options, run_stages
from harness.kinds import machine
from harness.record import environment
from harness.record.cache import identity_key
from harness.record.run import Run
from harness.stages.building.preflight import check_inputs
from harness.stages.outputs.generation_cache import side_identity

ROOT = Path(__file__).resolve().parents[1]
ROCM = "linux-host-rocm"


def test_the_registry_declares_every_kind_of_the_schema_and_no_other():
    defs = json.loads(config.SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]
    assert defs["gpuKind"]["enum"] == list(registry.GPUS)
    assert defs["osKind"]["enum"] == list(registry.OSES)
    for name, kind in registry.GPUS.items():
        assert kind.name == name and set(kind.expert_homes) <= set(LOAD_MODES)
        assert kind.has_device == ("device" in kind.expert_homes)  # a device kind says where offloaded experts go


def test_a_platform_of_an_undeclared_kind_is_named():
    class P:
        name, os, arch, gpu = "p", "linux", "x86_64", "vulkan"
    with pytest.raises(registry.UnknownKind, match="platform p: hardware.gpu 'vulkan' is declared by no module"):
        registry.gpu_of(P)


def _fake_kind(visible: int) -> GpuKind:
    """An AMD GPU kind through a HIP backend, as a new module of harness/kinds would declare it."""
    return GpuKind(
        name="rocm", backend="HIP", described="a platform with AMD GPUs", device="an AMD GPU", devices="AMD GPUs",
        visible=lambda: visible, visible_probe="rocm-smi",
        expert_homes={"device": "ROCm[0-9]*", "host-mmap": "CPU_Mapped", "host": "ROCm_Host", "host-unpinned": "CPU"},
        lanes="one",
        build_tool=HostTool("the ROCm toolkit", ("hipcc-of-no-machine",), "hipcc", env=("HARNESS_TEST_HIPCXX",)),
        env=(EnvVar("HIP_VISIBLE_DEVICES", "visibility", meaning="which GPUs the HIP runtime enumerates"),),
        backend_env=re.compile(r"^(GGML_HIP_|HIP_VISIBLE_DEVICES$)"),
    )


@pytest.fixture
def rocm(tmp_path, monkeypatch):
    """Declare the fake kind (``visible`` GPUs: set per test through the returned function) and a matrix with
    one platform of it: the repository's matrix.yaml plus that platform, two toy groups and a toy configuration;
    the schema's enum extended by the kind's name.  Returns a function of the visible count -> the matrix."""
    schema = json.loads(config.SCHEMA_PATH.read_text(encoding="utf-8"))
    schema["$defs"]["gpuKind"]["enum"].append("rocm")
    schema_path = tmp_path / "matrix.schema.json"
    schema_path.write_text(json.dumps(schema), encoding="utf-8")
    monkeypatch.setattr(config, "SCHEMA_PATH", schema_path)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text(encoding="utf-8"))
    data["platforms"] = {ROCM: {
        "os": registry.host_os(), "arch": registry.host_arch(), "hardware": {"gpu": "rocm"},
        "cmake": {"CMAKE_BUILD_TYPE": "Release", "GGML_HIP": "ON"}, "targets": ["llama-completion"],
        "test_labels": ["fork"], "groups": ["rocm-base-vs-fork", "rocm-2gpu", "rocm-cuda-env"]}}
    data["configs"]["fork-cuda-env"] = {"build": "fork", "env": {"GGML_CUDA_NO_PINNED": "1"}}
    data["groups"] = {
        "rocm-base-vs-fork": {"models": ["moe-small"], "reference": "base", "candidates": ["fork"]},
        "rocm-2gpu": {"models": ["moe-small"], "reference": "base", "candidates": ["fork"], "min_gpus": 2},
        "rocm-cuda-env": {"models": ["moe-small"], "reference": "base", "candidates": ["fork-cuda-env"]}}
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    # tool paths of matrix.yaml (toolchains) are relative to the checkout's root
    monkeypatch.chdir(ROOT)

    def declare(visible: int):
        monkeypatch.setitem(registry.GPUS, "rocm", _fake_kind(visible))
        return load_matrix(path)
    return declare


def test_preflight_refuses_another_backends_variable_on_the_new_kind(rocm, tmp_path):
    matrix = rocm(visible=1)
    with pytest.raises(InputError) as err:
        check_inputs(matrix, [ROCM], ["rocm-cuda-env"], [], None, tmp_path / "cache")
    assert str(err.value) == (
        f"configuration fork-cuda-env of group rocm-cuda-env sets GGML_CUDA_NO_PINNED, which only the CUDA backend "
        f"reads, on {ROCM}, a platform with AMD GPUs ({matrix.path}: configs.fork-cuda-env.env)")


def test_a_group_needing_more_devices_than_visible_is_skipped_with_the_kinds_words(rocm):
    matrix = rocm(visible=1)
    p = matrix.platform(ROCM)
    assert registry.group_fits(p, matrix.groups["rocm-base-vs-fork"]) is None
    assert registry.group_fits(p, matrix.groups["rocm-2gpu"]) == \
        "needs 2 AMD GPUs; 1 visible here (HIP_VISIBLE_DEVICES=unset)"


def test_the_run_loop_skips_build_test_and_compare_of_the_new_kind_with_its_reasons(rocm, tmp_path):
    """The real stage table: nothing is built or run; each command's step says what the kind lacks."""
    matrix = rocm(visible=0)
    run = Run(tmp_path / "results", "rocm")
    lines: list[str] = []
    code = run_stages(matrix, run, Options(platforms=[ROCM], groups=["rocm-base-vs-fork"], work_dir=tmp_path / "work"),
                      ["build", "test", "compare-outputs"], say=lines.append)
    summary = json.loads((run.dir / "summary.json").read_text())
    steps = {s["step"]: (s["status"], s["detail"]) for s in summary["configurations"] if s["platform"] == ROCM}
    assert steps == {
        "build": ("skipped", "needs the ROCm toolkit ($HARNESS_TEST_HIPCXX, hipcc-of-no-machine on PATH) to build"),
        "test": ("skipped", "needs an AMD GPU; rocm-smi reports none on this machine"),
        "compare-outputs": ("skipped", "needs an AMD GPU; rocm-smi reports none on this machine")}
    assert summary["overall"] == "incomplete" and code == 3
    assert not (run.dir / ROCM / "base").exists()  # nothing was built



def _kind_on_a_machine(card: str, runtime: Path) -> GpuKind:
    """The fake kind on a machine with one AMD GPU ``card``: what its tools would report, and the HIP runtime
    library ``runtime`` its builds link."""
    return replace(_fake_kind(1), inventory=lambda: [{"name": card, "driver": "6.3.42131", "memory": "192 GiB"}],
                   driver_version=lambda: "6.3.1", toolkit_version=lambda: "HIP version: 6.3.42131",
                   runtime_libraries=lambda cmake_cache: [runtime])


def test_the_new_kinds_machine_identity_reaches_the_result_cache_key_and_environment_json(tmp_path, monkeypatch):
    """The kind's declaration is all the result cache and environment.json ask: its devices, driver and runtime
    enter a generation's cache key (another card, another key) and the platform's environment record."""
    monkeypatch.setattr("harness.kinds.nvidia.nvidia_gpus", lambda: [])  # this machine's NVIDIA tools say nothing
    for probe in ("cuda_driver_version", "nvcc_version"):
        monkeypatch.setattr(f"harness.kinds.nvidia.{probe}", lambda: None)
    runtime = tmp_path / "libamdhip64.so.6"
    runtime.write_bytes(b"the HIP runtime")
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for program in ("llama-harness-engine", "llama-completion"):
        (bin_dir / program).write_bytes(program.encode())

    def key(card: str) -> tuple[str, dict]:
        identity = side_identity(bin_dir, ["llama-harness-engine", "llama-completion"],
                                 kind=_kind_on_a_machine(card, runtime))
        return identity_key(identity.facts), identity.facts["machine"]
    mi300, facts = key("AMD Instinct MI300X")
    assert facts["gpus"] == [{"name": "AMD Instinct MI300X", "driver": "6.3.42131", "memory": "192 GiB"}]
    assert facts["hip_driver"] == "6.3.1" and facts["hip_runtime"]
    assert key("AMD Instinct MI250X")[0] != mi300  # results are never reused across different GPUs
    runtime.write_bytes(b"another HIP runtime")
    assert key("AMD Instinct MI300X")[0] != mi300  # nor across runtimes

    monkeypatch.setitem(registry.GPUS, "rocm", _kind_on_a_machine("AMD Instinct MI300X", runtime))
    record_path = tmp_path / "environment.json"
    record_path.write_text(json.dumps(environment.collect("a" * 40, "test", [])), encoding="utf-8")
    written = json.loads(record_path.read_text(encoding="utf-8"))
    assert written["gpus"] == [{"name": "AMD Instinct MI300X", "driver": "6.3.42131", "memory": "192 GiB"}]
    assert (written["visible_gpus"], written["hip_driver"], written["hip_toolkit"]) == (1, "6.3.1", "HIP version: 6.3.42131")
    assert environment.read_environment(record_path).gpus == ({"name": "AMD Instinct MI300X", "driver": "6.3.42131",
                                                                "memory": "192 GiB"},)
    fingerprint = machine.machine_fingerprint(written)
    assert fingerprint["gpus"] == [["AMD Instinct MI300X", "6.3.42131"]] and fingerprint["hip_driver"] == "6.3.1"

# ----- model sources: one module per kind, one registry ---------------------------------------------------------

def _schema_model_kinds() -> list[str]:
    """The ``kind`` values matrix.schema.json's models accept (``$defs.model``: each a ``const`` of one branch)."""
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            kind = node.get("properties", {}).get("kind") if isinstance(node.get("properties"), dict) else None
            if isinstance(kind, dict) and "const" in kind:
                found.append(kind["const"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(json.loads(config.SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]["model"])
    return found


def test_every_model_kind_of_the_schema_has_its_source_module():
    from harness.matrix.model_sources.registry import SOURCES
    assert sorted(_schema_model_kinds()) == sorted(SOURCES)
    for kind, source in SOURCES.items():
        assert source.kind == kind


def test_a_model_of_an_undeclared_kind_is_named_and_a_derived_one_is_not_found_before_it_is_made(tmp_path):
    from harness.matrix.config import Model
    from harness.matrix.model_sources.registry import made_model_path, obtain_model
    from harness.matrix.models import ModelError
    with pytest.raises(ModelError, match="model m: kind 'hub' is declared by no module"):
        obtain_model(Model("m", "hub", {}), tmp_path, lambda: tmp_path, "matrix.yaml")
    # a derived model's file name holds its tool's digest: where it would be is not known before the build
    quant = Model("q", "quantized", {"from": "m", "type": "Q4_0"})
    assert made_model_path(quant, tmp_path, None) is None
    f = tmp_path / "m.gguf"
    assert made_model_path(Model("f", "file", {"path": str(f)}), tmp_path, None) is None
    f.write_bytes(b"GGUF")
    assert made_model_path(Model("f", "file", {"path": str(f)}), tmp_path, None) == f
