"""The rules of the expectations check (harness.stages.checks.expectation_rules), each case of the documented
default (docs/checks.md) on a configuration made here: what each rule expects, and the origin every rule
records, which the step's log and expectations.json show (``default: <why>``, ``not checked: <why>`` or
``declared``).  No run and no model file: a model is its summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.config import RunConfig, load_matrix
from harness.stages.checks import expectation_rules as ex
from harness.stages.checks.expectation_rules import LayerRange, Pinned

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
CUDA = MATRIX.platforms["linux-x86_64-cuda"]
CPU = MATRIX.platforms["linux-x86_64-cpu"]
HOST = ("--load-mode", "none", "--cpu-moe")  # experts in host memory, mmap off
LAYER_BYTES = 100
MODEL = {"n_layer": 8, "expert_tensor_bytes_by_layer": [LAYER_BYTES] * 8}
PIN_VARS = "GGML_CUDA_NO_PINNED, GGML_CUDA_MOE_PIN_LAYERS, GGML_CUDA_PIN_SIM_TOTAL_MAX_MB, GGML_CUDA_PIN_SIM_STICKY"


def rules(args=HOST, env=None, build="fork", platform=CUDA, model=MODEL, declared=None) -> ex.Expectations:
    config = RunConfig("c", build, tuple(args), dict(env or {}), expectations=dict(declared or {}))
    return ex.expectations_for(platform, config, model)


def ranges(exp: ex.Expectations) -> list[tuple[str, str]] | None:
    return None if exp.experts is None else [(r.describe(), r.buffer_type) for r in exp.experts]


@pytest.mark.parametrize("args, home, why", [((), "CPU_Mapped", "mmap"), (("-lm", "none"), "CPU", "mmap off")])
def test_on_the_cpu_platform_weights_and_experts_stay_where_the_load_mode_puts_them_and_nothing_is_pinned(
        args, home, why):
    exp = rules(args, platform=CPU)
    assert ranges(exp) == [("0-", f"{home}|CPU_REPACK")] and exp.weights == (home, "CPU_REPACK")
    assert exp.pinned is None and not ex.rule_on(exp, "warnings") and exp.mapped is (why == "mmap")
    assert exp.origin == {"placement": f"default: CPU platform, {why}", "weights": f"default: CPU platform, {why}",
                          "pinned": "not checked: nothing is pinned on the CPU platform",
                          "warnings": "not checked: no pin warnings on the CPU platform", "mapped": f"default: {why}"}


def test_on_a_gpu_without_cpu_moe_the_experts_are_offloaded_and_no_host_rule_is_checked():
    exp = rules(("-ngl", "99"))
    assert ranges(exp) == [("0-", "CUDA[0-9]*")] and exp.weights is None and exp.pinned is None
    assert exp.origin == {"placement": "default: CUDA platform, experts offloaded (no --cpu-moe)",
                          "weights": "not checked: model weights are split between device and host buffers by design",
                          "pinned": "not checked: no expert tensors in host memory",
                          "warnings": "not checked: no expert tensors in host memory", "mapped": "default: mmap"}


@pytest.mark.parametrize("option", [("-ot", "exps=CPU"), ("--override-tensor", "exps=CPU"), ("-ncmoe", "2"),
                                    ("--n-cpu-moe", "2")])
def test_tensors_placed_by_pattern_have_no_default_placement_and_say_to_declare_one(option):
    exp = rules((*HOST, *option))
    assert exp.experts is None and exp.pinned is None and not ex.rule_on(exp, "warnings")
    assert exp.origin["placement"] == "not checked: tensors placed by pattern (-ot/--n-cpu-moe); declare the placement"
    assert exp.origin["pinned"] == exp.origin["warnings"] == "not checked: placement by pattern"


def test_cpu_moe_with_mmap_keeps_the_experts_in_the_mapped_file_and_pins_nothing():
    for flag in ("--cpu-moe", "-cmoe"):
        exp = rules((flag,))
        assert ranges(exp) == [("0-", "CPU_Mapped")] and exp.pinned is None
        assert exp.origin["placement"] == "default: --cpu-moe with mmap (no host buffer)"
        assert exp.origin["pinned"] == exp.origin["warnings"] == "not checked: a memory-mapped model is not pinned"


def test_the_short_cpu_moe_flag_puts_the_experts_in_host_memory_as_the_long_one_does():
    assert ranges(rules(("--load-mode", "none", "-cmoe"))) == ranges(rules(HOST)) == [("0-", "CUDA_Host")]


def test_a_full_pin_needs_every_expert_byte_pinned_and_no_pin_warning():
    exp = rules()
    assert exp.pinned == Pinned(1.0, 1.0) and exp.present == () and exp.absent == ("partial-pin", "no-pin")
    assert exp.origin["placement"] == "default: --cpu-moe, mmap off"
    assert exp.origin["pinned"] == "default: full pin" and exp.origin["warnings"] == f"default: from {PIN_VARS}"


def test_pin_layers_pins_the_share_of_its_layers_and_names_them_and_the_variable():
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"})
    assert ranges(exp) == [("0-1", "CUDA_Host"), ("2-", "CPU")] and exp.pinned == Pinned(0.25, 0.25)
    assert exp.origin["placement"] == "default: --cpu-moe, mmap off, GGML_CUDA_MOE_PIN_LAYERS=2"
    assert exp.origin["pinned"] == "default: experts of layers 0-1 pinned"
    assert exp.absent == ("partial-pin", "no-pin", "pin-layers-invalid", "pin-layers-clamped")
    one = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "1"})  # the smallest valid value
    assert ranges(one) == [("0", "CUDA_Host"), ("1-", "CPU")] and one.origin["pinned"] == "default: experts of layers 0-0 pinned"


def test_pin_layers_of_every_layer_or_more_is_a_full_pin_and_more_warns_that_it_was_clamped():
    every = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "8"})
    assert ranges(every) == [("0-", "CUDA_Host")] and every.pinned == Pinned(1.0, 1.0)
    assert "pin-layers-clamped" in every.absent
    more = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "100"})
    assert more.origin["pinned"] == "default: experts of layers 0-7 pinned" and more.present == ("pin-layers-clamped",)


def test_without_a_layer_count_pin_layers_neither_splits_the_experts_nor_claims_a_clamp():
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "1"}, model={})
    assert ranges(exp) == [("0-", "CUDA_Host")] and "pin-layers-clamped" in exp.absent
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"}, model={})
    assert exp.present == () and "pin-layers-clamped" in exp.absent


@pytest.mark.parametrize("model", [{"n_layer": 8, "expert_tensor_bytes": 800}, {"expert_tensor_bytes": 800}],
                         ids=["no-bytes-per-layer", "no-layer-count"])
def test_pin_layers_on_a_model_summary_that_cannot_tell_its_share_checks_no_pinned_share(model):
    """The share of experts that GGML_CUDA_MOE_PIN_LAYERS pins is the bytes of its layers over all expert
    bytes: a summary without them cannot give it, so no share is asked (a full pin would fail a correct fork)."""
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"}, model=model)
    assert exp.pinned is None
    assert exp.origin["pinned"] == ("not checked: GGML_CUDA_MOE_PIN_LAYERS=2 pins a share of the experts that the "
                                    "model summary cannot tell (no layer count or no expert bytes per layer)")
    assert exp.absent[:2] == ("partial-pin", "no-pin")  # layers pinned whole warn of no refusal either way
    full = rules(env={}, model=model)  # without the variable the share is all of them, whatever the summary says
    assert full.pinned == Pinned(1.0, 1.0)


def test_pin_layers_of_every_layer_is_a_full_pin_even_without_bytes_per_layer():
    """Pinning the experts of every layer pins all of them: the share is known from the layer count alone."""
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "8"}, model={"n_layer": 8, "expert_tensor_bytes": 800})
    assert exp.pinned == Pinned(1.0, 1.0) and exp.origin["pinned"] == "default: experts of layers 0-7 pinned"


@pytest.mark.parametrize("value", ["0", "-1", "4x", ""])
def test_a_pin_layers_value_the_fork_ignores_is_a_full_pin_that_must_warn_invalid(value):
    assert ex.pin_layers({"GGML_CUDA_MOE_PIN_LAYERS": value}, "GGML_CUDA_MOE_PIN_LAYERS") is None
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": value})
    assert ranges(exp) == [("0-", "CUDA_Host")] and exp.present == ("pin-layers-invalid",)
    assert ex.pin_layers({"GGML_CUDA_MOE_PIN_LAYERS": "1"}, "GGML_CUDA_MOE_PIN_LAYERS") == 1


def test_no_pinned_keeps_the_experts_in_plain_host_memory_and_names_the_variable():
    exp = rules(env={"GGML_CUDA_NO_PINNED": "1"})
    assert ranges(exp) == [("0-", "CPU")] and exp.pinned == Pinned(0.0, 0.0)
    assert exp.origin["placement"] == "default: --cpu-moe, mmap off, GGML_CUDA_NO_PINNED"
    assert exp.origin["pinned"] == "default: GGML_CUDA_NO_PINNED: nothing pinned"
    both = rules(env={"GGML_CUDA_NO_PINNED": "1", "GGML_CUDA_MOE_PIN_LAYERS": "2"})
    assert both.origin["placement"] == "default: --cpu-moe, mmap off, GGML_CUDA_MOE_PIN_LAYERS=2, GGML_CUDA_NO_PINNED"
    assert rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"}).origin["placement"].endswith("=2")


def test_upstream_s_build_logs_no_pin_records_and_ignores_pin_layers():
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"}, build="base")
    assert ranges(exp) == [("0-", "CUDA_Host")] and exp.pinned is None and not ex.rule_on(exp, "warnings")
    assert exp.origin["pinned"] == "not checked: upstream's build logs no pin records"
    assert exp.origin["warnings"] == "not checked: upstream's build logs no pin warnings"


def test_a_sticky_refusal_must_warn_no_pin_and_bounds_nothing_and_an_empty_value_is_no_refusal():
    exp = rules(env={"GGML_CUDA_PIN_SIM_STICKY": "1"})
    assert exp.pinned is None and exp.present == ("no-pin",)
    assert exp.origin["pinned"] == ("not checked: GGML_CUDA_PIN_SIM_STICKY refuses every call after the first "
                                    "refusal")
    assert rules(env={"GGML_CUDA_PIN_SIM_STICKY": ""}).pinned == Pinned(1.0, 1.0)


def test_a_total_cap_needs_what_it_allows_and_must_warn_partial_and_a_cap_of_0_is_no_cap():
    exp = rules(env={"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "2048"})
    assert exp.pinned == Pinned(cap_bytes=2048 * 2**20, capped_type="CUDA_Host") and exp.present == ("partial-pin",)
    assert exp.origin["pinned"] == "default: GGML_CUDA_PIN_SIM_TOTAL_MAX_MB=2048: at least what the cap allows"
    assert rules(env={"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "1"}).pinned == Pinned(cap_bytes=2**20, capped_type="CUDA_Host")
    assert rules(env={"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "0"}).pinned == Pinned(1.0, 1.0)


def test_a_rule_is_written_as_matrix_yaml_writes_it():
    assert [LayerRange(5, 5, "CPU").describe(), LayerRange(0, 3, "CPU").describe(),
            LayerRange(4, None, "CPU").describe()] == ["5", "0-3", "4-"]
    assert Pinned(0.4, 0.9).describe() == "at least 0.4 and at most 0.9"
    assert Pinned(None, 0.5).describe() == "at most 0.5" and Pinned(0.5, 0.5).describe() == "0.5"
    assert Pinned(0.4, cap_bytes=2048 * 2**20).describe() == "at least 0.4 and at least what a 2048 MiB cap allows"
    assert Pinned().describe() == "any"


def test_declared_experts_are_one_type_for_every_layer_or_ranges_in_layer_order():
    assert ex.parse_experts("CPU") == (LayerRange(0, None, "CPU"),)
    assert ex.parse_experts({"4-": "CPU", "3": "CUDA_Host", "0-2": "CUDA_Host"}) == (
        LayerRange(0, 2, "CUDA_Host"), LayerRange(3, 3, "CUDA_Host"), LayerRange(4, None, "CPU"))
    assert ex.parse_experts({"3-3": "CPU"}) == (LayerRange(3, 3, "CPU"),)
    with pytest.raises(ValueError, match=r"^layer range 'four': write N, N-M or N-$"):
        ex.parse_experts({"four": "CPU"})
    with pytest.raises(ValueError, match=r"^layer range '5-3': ends before it starts$"):
        ex.parse_experts({"5-3": "CPU"})


def test_a_declared_pinned_fraction_is_exact_or_bounded_on_either_side():
    assert ex.parse_pinned(0.5) == Pinned(0.5, 0.5) and ex.parse_pinned(1) == Pinned(1.0, 1.0)
    assert ex.parse_pinned({"max": 0.5}) == Pinned(None, 0.5) and ex.parse_pinned({"min": 0.2}) == Pinned(0.2, None)


def test_each_declared_rule_replaces_its_default_and_is_marked_declared():
    exp = rules(declared={"weights": ["CPU"], "pinned": {"max": 0.5}, "warnings": {"present": ["partial-pin"]}})
    assert exp.weights == ("CPU",) and exp.pinned == Pinned(None, 0.5)
    assert exp.present == ("partial-pin",) and exp.absent == ()  # a declaration replaces both lists
    assert exp.origin["weights"] == exp.origin["pinned"] == exp.origin["warnings"] == "declared"
    assert exp.origin["placement"] == "default: --cpu-moe, mmap off"
    absent_only = rules(declared={"warnings": {"absent": ["no-pin"]}})
    assert absent_only.present == () and absent_only.absent == ("no-pin",)


def test_the_warnings_rule_is_checked_when_a_warning_is_required_or_forbidden():
    assert ex.rule_on(ex.Expectations(present=("no-pin",)), "warnings")
    assert ex.rule_on(ex.Expectations(absent=("no-pin",)), "warnings")
    assert not ex.rule_on(ex.Expectations(), "warnings")


def test_pin_layers_on_a_summary_without_per_layer_expert_sizes_still_splits_the_experts():
    """An older model summary has ``n_layer`` but no ``expert_tensor_bytes_by_layer``: the placement rule still
    follows GGML_CUDA_MOE_PIN_LAYERS, and deriving the pinned share does not divide by the missing total."""
    exp = rules(env={"GGML_CUDA_MOE_PIN_LAYERS": "2"}, model={"n_layer": 8})
    assert ranges(exp) == [("0-1", "CUDA_Host"), ("2-", "CPU")]
