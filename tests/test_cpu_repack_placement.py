"""The default expectations of the CPU platform on a quantized MoE whose experts upstream repacks for some
layers (docs/checks.md).  No model: the model is its summary, the probe a few records."""

from __future__ import annotations

from pathlib import Path


from harness.matrix.config import load_matrix
from harness.record.probe import Probe, ProbeBuffer, ProbeWeight
from harness.stages.checks import expectations as ex
from harness.stages.checks.expectation_probe import matches, placement_findings

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
CPU = MATRIX.platforms["linux-x86_64-cpu"]


def rules(config: str, platform, model) -> dict:
    exp = ex.expectations_for(platform, MATRIX.configs[config], model)
    return {"experts": [(r.describe(), r.buffer_type) for r in exp.experts or ()]}


# --------------------------------------------------------------------------- the CPU platform and CPU_REPACK


def probe(where: dict[int, str]) -> Probe:
    """A probe of a 4-layer model whose experts of layer ``n`` sit in a buffer of type ``where[n]``."""
    buffers = {t: ProbeBuffer(t, t, 1 << 20, True, None, None) for t in set(where.values())}
    weights = tuple(ProbeWeight(f"blk.{n}.ffn_{m}_exps.weight", n, "Q4_K", 1000, buffers[t], None, None)
                    for n, t in where.items() for m in ("gate", "up", "down"))
    return Probe(weights, tuple(buffers.values()), None, 0.0)


def test_the_cpu_platform_allows_repacked_experts_beside_mapped_ones():
    assert rules("fork", CPU, {"n_layer": 4})["experts"] == [("0-", "CPU_Mapped|CPU_REPACK")]
    assert rules("fork-load-none", CPU, {"n_layer": 4})["experts"] == [("0-", "CPU|CPU_REPACK")]
    exp = ex.expectations_for(CPU, MATRIX.configs["fork"], {"n_layer": 4})
    mixed = placement_findings(exp, probe({0: "CPU_Mapped", 1: "CPU_REPACK", 2: "CPU_Mapped", 3: "CPU_REPACK"}), 4)
    assert [f.status for f in mixed] == ["passed"]
    lost = placement_findings(exp, probe({0: "CPU", 1: "CPU_REPACK", 2: "CPU_Mapped", 3: "CPU_REPACK"}), 4)
    assert [(f.status, f.key) for f in lost] == [
        ("failed", "expert tensors of layers 0 in CPU, expected CPU_Mapped or CPU_REPACK")]


def test_a_buffer_type_pattern_may_name_alternatives():
    assert matches("CPU_REPACK", "CPU_Mapped|CPU_REPACK") and matches("CUDA1", "CPU|CUDA[0-9]*")
    assert not matches("CPU", "CPU_Mapped|CPU_REPACK") and not matches("CPU_Mapped|CPU_REPACK", "CPU_Mapped")
