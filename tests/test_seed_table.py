"""The seed-table group (cuda-seed-table) and the default expectations of its configurations on its 48-layer
quantized model (docs/seed-table.md).  No GPU and no model: the model is its summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.config import load_matrix
from harness.stages.checks import expectations as ex

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
CUDA = MATRIX.platforms["linux-x86_64-cuda"]
GROUP = MATRIX.groups["cuda-seed-table"]

# moe-48l-quant's experts per layer: 3 x 32 experts of 1024 x 1536 in blocks of 256 weights, Q3_K (110 bytes a
# block) in layers 0-15, Q4_K (144) in 16-31, Q6_K (210) in 32-47
BLOCKS = 3 * 32 * 1024 * 1536 // 256
BY_LAYER = [BLOCKS * 110] * 16 + [BLOCKS * 144] * 16 + [BLOCKS * 210] * 16
MODEL = {"n_layer": 48, "expert_tensor_bytes": sum(BY_LAYER), "expert_tensor_bytes_by_layer": BY_LAYER}


def rules(config: str) -> dict:
    exp = ex.expectations_for(CUDA, MATRIX.configs[config], MODEL)
    return {"experts": [(r.describe(), r.buffer_type) for r in exp.experts or ()],
            "pinned": exp.pinned.describe() if exp.pinned else None, "present": exp.present, "absent": exp.absent}


def test_the_group_replays_every_row_of_the_seeds_table_against_the_pageable_reference():
    env = {c: MATRIX.configs[c].env for c in (GROUP.reference, *GROUP.candidates)}
    assert env[GROUP.reference] == {"GGML_CUDA_NO_PINNED": "1"}
    values = [e["GGML_CUDA_MOE_PIN_LAYERS"] for e in env.values() if "GGML_CUDA_MOE_PIN_LAYERS" in e]
    assert values == ["2", "6", "48", "abc", "-1", "100000"]
    assert GROUP.models == ("moe-48l-quant",) and len(GROUP.prompts) == 3 and GROUP.generation.n_predict == 120
    for c in (GROUP.reference, *GROUP.candidates):
        assert MATRIX.configs[c].args == ("--load-mode", "none", "--cpu-moe", "-ngl", "99")
    assert "cuda-seed-table" in CUDA.groups and "cuda-seed-table" in MATRIX.platforms["windows-x86_64-cuda"].groups


def test_pin_layers_below_the_layer_count_pin_those_layers_share_of_the_experts_bytes():
    assert rules("cuda-pin-layers-2") == {
        "experts": [("0-1", "CUDA_Host"), ("2-", "CPU")], "pinned": f"{2 * BLOCKS * 110 / sum(BY_LAYER):.4g}",
        "present": (), "absent": ("partial-pin", "no-pin", "pin-layers-invalid", "pin-layers-clamped")}
    six = rules("cuda-pin-layers-6")
    assert six["experts"] == [("0-5", "CUDA_Host"), ("6-", "CPU")]
    assert six["pinned"] == f"{6 * BLOCKS * 110 / sum(BY_LAYER):.4g}" == "0.0889"  # not 6/48: layers of unequal size


def test_pin_layers_equal_to_the_layer_count_pins_everything_without_a_warning():
    assert rules("cuda-pin-layers-48") == {
        "experts": [("0-", "CUDA_Host")], "pinned": "1", "present": (),
        "absent": ("partial-pin", "no-pin", "pin-layers-invalid", "pin-layers-clamped")}


@pytest.mark.parametrize("config", ["cuda-pin-layers-abc", "cuda-pin-layers-minus-1"])
def test_a_value_that_is_not_a_positive_integer_is_ignored_with_the_invalid_warning(config):
    assert rules(config) == {"experts": [("0-", "CUDA_Host")], "pinned": "1", "present": ("pin-layers-invalid",),
                             "absent": ("partial-pin", "no-pin", "pin-layers-clamped")}


def test_a_value_above_the_layer_count_is_clamped_with_the_clamped_warning():
    assert rules("cuda-pin-layers-100000") == {
        "experts": [("0-", "CUDA_Host")], "pinned": "1", "present": ("pin-layers-clamped",),
        "absent": ("partial-pin", "no-pin", "pin-layers-invalid")}


def test_the_pageable_reference_and_the_seeds_limits():
    assert rules("cuda-nopin") == {"experts": [("0-", "CPU")], "pinned": "0", "present": (), "absent": ()}
    assert rules("cuda-seed-sim-partial") == {"experts": [("0-", "CUDA_Host")],
                                              "pinned": "at least what a 320 MiB cap allows",
                                              "present": ("partial-pin",), "absent": ()}
    assert rules("cuda-seed-sim-sticky") == {"experts": [("0-", "CUDA_Host")], "pinned": "0",
                                             "present": ("no-pin",), "absent": ("partial-pin",)}
