"""Expectations (harness.stages.expectations): every rule passes on recorded clean runs and fails on a planted fault.

The CUDA records are the H200 run of results/evidence/gpu1-20261201T040745Z (engine and
llama-completion stderr parsed by harness.record.gpu into placement and pin-ladder
records).  Each fault is planted by rewriting those records the way the fault would
have written them: what tests/plants/cuda-host-buffers-pageable.patch does to a load
(the 4733 MiB host buffer allocated as plain CPU memory, with no pin-ladder line for
it), a routing that ignores GGML_CUDA_MOE_PIN_LAYERS, a partial grant, a warning lost.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.analysis import triage
from harness.analysis.report import render_html
from harness.analysis.signatures import classify_step
from harness.matrix.config import MatrixError, load_matrix
from harness.record import gpu
from harness.record.junit import checks_xml
from harness.record.results import Run, StepRecord, write_json
from harness.stages import expectations as ex
from harness.stages.checks import CheckContext, run_checks
from harness.stages.registered_checks import CHECKS

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "results" / "evidence" / "gpu1-20261201T040745Z" / "linux-x86_64-cuda"
MATRIX = load_matrix(ROOT / "matrix.yaml")
CUDA = MATRIX.platforms["linux-x86_64-cuda"]
CPU = MATRIX.platforms["linux-x86_64-cpu"]
MIB = 2**20


def moe_large() -> dict:
    """The evidence run's summary of moe-large, with its experts per layer: 8 layers of 32 experts x 3
    matrices of 2048 x 1536 F16 (matrix.yaml's params), 603979776 bytes each."""
    summary = json.loads((EVIDENCE / "models" / "moe-large.json").read_text())
    per_layer = 32 * 3 * 2048 * 1536 * 2
    assert per_layer * 8 == summary["expert_tensor_bytes"]
    return {**summary, "expert_tensor_bytes_by_layer": [per_layer] * 8}


def records(config: str, load: str = "engine") -> tuple[dict, list]:
    """(placement, pin-ladder records) of one load of the evidence run."""
    gen = EVIDENCE / config / "gen" / "moe-large"
    ladder = gen / f"{load}.pin-ladder.json"
    return (json.loads((gen / f"{load}.placement.json").read_text()),
            json.loads(ladder.read_text()) if ladder.exists() else [])


def check(config: str, placement: dict, ladder: list, platform=CUDA, model: dict | None = None):
    exp = ex.expectations_for(platform, MATRIX.configs[config], model or moe_large())
    findings, facts = ex.check_load(exp, placement, ladder, model or moe_large())
    return {f.rule: f for f in findings if f.status != "passed"}, findings, facts


def lose_host_buffer(placement: dict, ladder: list) -> tuple[dict, list]:
    """What tests/plants/cuda-host-buffers-pageable.patch does to a load: every host buffer above 64 MiB is
    allocated as a plain CPU buffer (llama names it CPU) and logs no pin-ladder line."""
    placement = copy.deepcopy(placement)
    big = set()
    for b in placement["buffers"]:
        if b["buffer_type"] == "CUDA_Host" and b["mib"] > 64:
            b["buffer_type"] = "CPU"
            big.add(round(b["mib"] * MIB))
    ladder = [r for r in ladder if all(abs(r["requested"] - n) > ex.LOGGED_MIB_TOLERANCE_BYTES for n in big)]
    return placement, ladder


EVIDENCE_CONFIGS = sorted(d.name for d in EVIDENCE.iterdir() if (d / "gen" / "moe-large").is_dir())


@pytest.mark.parametrize("config", EVIDENCE_CONFIGS)
def test_every_rule_passes_on_every_load_of_the_clean_h200_run(config):
    for stderr in sorted((EVIDENCE / config / "gen" / "moe-large").glob("*.stderr")):
        load = stderr.name[:-len(".stderr")]
        failed, findings, _ = check(config, *records(config, load))
        assert not failed, (load, [f.message for f in failed.values()])
        assert findings and all(f.status == "passed" for f in findings)


EVIDENCE_2GPU = ROOT / "results" / "evidence" / "gpu2-20261201T012119Z" / "linux-x86_64-cuda"
LOADS_2GPU = sorted((d.name, p) for d in EVIDENCE_2GPU.iterdir() if (d / "gen" / "moe-large").is_dir()
                    for p in sorted((d / "gen" / "moe-large").glob("*.placement.json")))


@pytest.mark.parametrize("config, record", LOADS_2GPU, ids=[f"{c}-{p.name}" for c, p in LOADS_2GPU])
def test_every_rule_passes_on_the_two_gpu_run(config, record):
    ladder = record.with_name(record.name.replace(".placement.json", ".pin-ladder.json"))
    failed, findings, _ = check(config, json.loads(record.read_text()),
                                json.loads(ladder.read_text()) if ladder.exists() else [])
    assert not failed, [f.message for f in failed.values()]
    assert {f.rule for f in findings} >= {"placement"}


def test_the_checked_rules_of_the_clean_run_are_the_documented_defaults():
    rules = {c: {f.rule for f in check(c, *records(c))[1]} for c in EVIDENCE_CONFIGS}
    assert rules["cuda-pin-all"] == rules["cuda-pin-layers-half"] == {"placement", "pinned", "warnings"}
    assert rules["cuda-nopin"] == {"placement", "pinned"}  # exactly 0: nothing to warn about
    assert rules["cuda-sim-sticky"] == {"placement", "pinned", "warnings"}  # declared in matrix.yaml
    assert rules["base"] == rules["fork"] == rules["cuda-base-host-experts"] == {"placement"}


def test_host_buffers_left_pageable_fail_placement_and_pinning_with_the_issue_signature():
    placement, ladder = lose_host_buffer(*records("cuda-pin-all"))
    failed, _, facts = check("cuda-pin-all", placement, ladder)
    assert set(failed) == {"placement", "pinned"}
    assert failed["placement"].message == "expert tensors of layers 0-7 in CPU (4733 MiB), expected CUDA_Host"
    assert failed["placement"].key == "expert tensors of layers 0-7 in CPU, expected CUDA_Host"
    assert facts["pinned_fraction"] == 0.0 and facts["pinned_expert_bytes"] == 0
    assert failed["pinned"].message.startswith("0.000 of the expert tensors pinned (0 MiB of 4608 MiB), expected 1")
    assert "CPU 4733 MiB: no pin record" in failed["pinned"].message
    # the small host buffers still pinned (output, compute: 28 MiB) do not count: they hold no expert tensor
    assert 0 < sum(r["granted"] for r in ladder) < 64 * MIB


def test_the_plant_fails_every_pin_configuration_but_not_the_pageable_reference():
    for config in ("cuda-pin-layers-half", "cuda-sim-partial", "cuda-pin-layers-garbage"):
        failed, _, _ = check(config, *lose_host_buffer(*records(config)))
        assert "placement" in failed, config
    assert not check("cuda-nopin", *lose_host_buffer(*records("cuda-nopin")))[0]


def test_no_host_buffer_type_for_cpu_weights_fails_placement_and_pinning_under_pin_layers():
    """What tests/plants/llama-host-buffer-type-only-with-several-devices.patch does with one GPU: the CPU-resident
    weights get the CPU buffer type, so GGML_CUDA_MOE_PIN_LAYERS finds no host buffer to route (no routing
    line) and the 2429 MiB that were CUDA_Host (layers 0-3 and the token embeddings) are a CPU buffer too."""
    placement, ladder = lose_host_buffer(*records("cuda-pin-layers-half"))
    placement["routing"] = []
    failed, findings, facts = check("cuda-pin-layers-half", placement, ladder)
    assert set(failed) == {"placement", "pinned"}
    assert failed["placement"].message == "expert tensors of layers 0-3 in CPU (4733 MiB), expected CUDA_Host"
    assert failed["pinned"].key == "pinned fraction below 0.5" and facts["pinned_fraction"] == 0.0


def test_pin_layers_ignored_by_the_loader_fails_placement_per_layer():
    placement, ladder = records("cuda-pin-all")  # every expert in CUDA_Host, as if PIN_LAYERS=4 did nothing
    failed, _, _ = check("cuda-pin-layers-half", placement, ladder)
    assert failed["placement"].message == "expert tensors of layers 4-7 in CUDA_Host (4733 MiB), expected CPU"
    assert failed["pinned"].key == "pinned fraction above 0.5"


def test_fewer_layers_pinned_than_asked_names_what_each_buffer_type_holds():
    placement, ladder = records("cuda-pin-layers-2")  # layers 0-1 in CUDA_Host, as if PIN_LAYERS=4 gave 2
    failed, _, _ = check("cuda-pin-layers-half", placement, ladder)
    assert failed["placement"].message == ("expert tensors of layers 0-3: CUDA_Host holds 1277 MiB of their 2304 MiB; "
                                           "more than expected in CPU (3456 MiB)")
    assert failed["placement"].key == "expert tensors of layers 0-3 not all in CUDA_Host (also in CPU)"
    assert failed["pinned"].key == "pinned fraction below 0.5"


def test_a_partial_grant_fails_pinning_and_the_partial_pin_warning_is_unexpected():
    placement, ladder = records("cuda-sim-partial")  # 2048 of 4733 MiB granted, with its WARN line
    failed, findings, facts = check("cuda-pin-all", placement, ladder)
    assert set(failed) == {"pinned", "warnings"}
    assert facts["pinned_fraction"] == pytest.approx((2048 - 125) / 4608, abs=1e-3)
    assert {f.key for f in findings if f.rule == "warnings"} == {"unexpected warning partial-pin",
                                                                 "unexpected warning no-pin"}


def test_a_simulated_cap_needs_at_least_what_the_cap_allows():
    placement, ladder = records("cuda-sim-partial")
    assert not check("cuda-sim-partial", placement, ladder)[0]
    low = copy.deepcopy(ladder)
    low[0]["granted"] = 1024 * MIB  # half of what the 2048 MiB cap lets the ladder pin
    failed, _, _ = check("cuda-sim-partial", placement, low)
    assert failed["pinned"].key == "pinned fraction below at least what a 2048 MiB cap allows"
    no_warning = [r for r in ladder if r["kind"] != "partial"]
    assert check("cuda-sim-partial", placement, no_warning)[0]["warnings"].key == "warning partial-pin missing"


def test_no_pinned_means_exactly_nothing_pinned():
    placement, ladder = records("cuda-nopin")
    assert not check("cuda-nopin", placement, ladder)[0]
    pinned_anyway = [dict(r, kind="malloc_host", granted=r["requested"]) for r in ladder]
    placement_pinned, _ = records("cuda-pin-all")
    failed, _, _ = check("cuda-nopin", placement_pinned, pinned_anyway)
    assert set(failed) == {"placement", "pinned"}
    assert failed["pinned"].key == "pinned fraction above 0"


def test_invalid_pin_layers_must_warn_and_a_valid_value_must_not():
    placement, ladder = records("cuda-pin-layers-garbage")
    silent = dict(placement, routing=[])
    assert check("cuda-pin-layers-garbage", silent, ladder)[0]["warnings"].key == "warning pin-layers-invalid missing"
    half, half_ladder = records("cuda-pin-layers-half")
    noisy = dict(half, routing=half["routing"] + placement["routing"])
    assert check("cuda-pin-layers-half", noisy, half_ladder)[0]["warnings"].key == "unexpected warning pin-layers-invalid"
    over, over_ladder = records("cuda-pin-layers-over")
    assert check("cuda-pin-layers-over", dict(over, routing=[]), over_ladder)[0]["warnings"].key == \
        "warning pin-layers-clamped missing"


def test_upstream_keeps_experts_on_the_gpu_by_default():
    placement, ladder = records("fork")
    moved = copy.deepcopy(placement)
    for b in moved["buffers"]:
        if b["buffer_type"] == "CUDA0" and b["what"] == "model":
            b["buffer_type"] = "CPU"
    failed, _, _ = check("fork", moved, ladder)
    assert failed["placement"].key == "expert tensors of layers 0-7 in CPU, expected CUDA[0-9]*"


# --------------------------------------------------------------------------- the CPU platform

#: The model buffer lines of the fork's engine loading gemma3-270m (Q4_K_M) on the 2-core development
#: machine, linux-x86_64-cpu, 2026-12-01: memory-mapped, with the tensors the CPU repacks beside.
GEMMA_CPU_MMAP = """\
0.04.687.826 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.04.700.471 I load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
0.04.706.568 I load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
0.04.750.682 I llama_context:        CPU  output buffer size =     1.00 MiB
0.04.777.233 I sched_reserve:        CPU compute buffer size =   514.50 MiB
"""
GEMMA = {"n_layer": 18, "expert_tensor_bytes": 0, "expert_tensor_bytes_by_layer": [0] * 18,
         "tensor_bytes": 260 * MIB}


def test_a_silent_loss_of_mmap_fails_the_weights_rule_on_the_cpu_platform():
    clean = gpu.buffer_placement(GEMMA_CPU_MMAP)
    assert not check("fork", clean, [], CPU, GEMMA)[0]
    lost = gpu.buffer_placement(GEMMA_CPU_MMAP.replace("CPU_Mapped", "       CPU"))
    failed, _, _ = check("fork", lost, [], CPU, GEMMA)
    assert failed["weights"].message == "model weights in CPU (235 MiB), expected CPU_Mapped or CPU_REPACK"
    # with --load-mode none the same buffers are right, and a mapped model would be wrong
    assert not check("fork-load-none", lost, [], CPU, GEMMA)[0]
    assert check("fork-load-none", clean, [], CPU, GEMMA)[0]["weights"].key == \
        "model weights in CPU_Mapped, expected CPU or CPU_REPACK"


# --------------------------------------------------------------------------- defaults and declarations


def rules(config: str, platform=CUDA, model=None) -> dict:
    exp = ex.expectations_for(platform, MATRIX.configs[config], model or moe_large())
    return {"experts": [(r.describe(), r.buffer_type) for r in exp.experts or ()],
            "pinned": exp.pinned.describe() if exp.pinned else None, "present": exp.present, "absent": exp.absent}


def test_defaults_follow_the_documented_rule():
    assert rules("cuda-pin-all") == {"experts": [("0-", "CUDA_Host")], "pinned": "1", "present": (),
                                     "absent": ("partial-pin", "no-pin")}
    assert rules("cuda-pin-layers-2")["experts"] == [("0-1", "CUDA_Host"), ("2-", "CPU")]
    assert rules("cuda-pin-layers-2")["pinned"] == "0.25"
    assert rules("cuda-nopin-pin-layers")["experts"] == [("0-3", "CPU"), ("4-", "CPU")]
    assert rules("cuda-nopin")["pinned"] == "0"
    assert rules("cuda-sim-partial")["pinned"] == "at least what a 2048 MiB cap allows"
    assert rules("cuda-sim-partial")["present"] == ("partial-pin",)
    sticky = MATRIX.configs["cuda-sim-sticky"]
    assert ex.default_expectations(CUDA, sticky, moe_large()).pinned is None  # no bound under a sticky refusal
    assert rules("cuda-sim-sticky") == {"experts": [("0-", "CUDA_Host")], "pinned": "0", "present": ("no-pin",),
                                        "absent": ("partial-pin",)}  # declared in matrix.yaml
    assert rules("cuda-pin-layers-garbage")["present"] == ("pin-layers-invalid",)
    assert rules("cuda-pin-layers-huge")["present"] == ("pin-layers-clamped",)
    assert rules("cuda-base-host-experts") == {"experts": [("0-", "CUDA_Host")], "pinned": None, "present": (),
                                               "absent": ()}
    assert rules("fork")["experts"] == [("0-", "CUDA[0-9]*")]
    assert rules("fork", CPU)["experts"] == [("0-", "CPU_Mapped|CPU_REPACK")]
    assert rules("fork-load-none", CPU)["experts"] == [("0-", "CPU|CPU_REPACK")]
    assert ex.uses_mmap(["-lm", "dio"]) is False and ex.uses_mmap(["--load-mode=mmap"]) is True
    assert ex.pin_layers({"GGML_CUDA_MOE_PIN_LAYERS": "4x"}) is None


def _matrix_with(tmp_path: Path, expectations: str) -> Path:
    text = (ROOT / "matrix.yaml").read_text()
    anchor = "  cuda-pin-all:\n    build: fork\n"
    assert anchor in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(anchor, anchor + expectations).replace("path: upstream-files/",
                                                                         f"path: {ROOT}/upstream-files/"))
    return path


def test_declared_expectations_replace_the_defaults_they_name(tmp_path):
    m = load_matrix(_matrix_with(tmp_path, "    expectations:\n      gpu: nvidia\n"
                                           "      experts: {\"0-3\": CUDA_Host, \"4-\": CPU}\n"
                                           "      pinned: {min: 0.4}\n"))
    config = m.configs["cuda-pin-all"]
    exp = ex.expectations_for(CUDA, config, moe_large())
    assert [(r.describe(), r.buffer_type) for r in exp.experts] == [("0-3", "CUDA_Host"), ("4-", "CPU")]
    assert exp.pinned.describe() == "at least 0.4" and exp.absent == ("partial-pin", "no-pin")
    assert exp.origin["placement"] == "declared" and exp.origin["warnings"].startswith("default")
    # the clean full pin now fails the declared placement: CUDA_Host holds the experts of layers 4-7 too
    failed = {f.rule for f in ex.check_load(exp, *records("cuda-pin-all"), moe_large())[0] if f.status == "failed"}
    assert failed == {"placement"}
    assert ex.expectations_for(CPU, config, moe_large()).origin["placement"].startswith("default")  # gpu: nvidia


@pytest.mark.parametrize("declaration, message", [
    ("      warnings: {present: [partial-pins]}\n", "configs.cuda-pin-all.expectations.warnings.present[0]"),
    ("      pinned: 1.5\n", "configs.cuda-pin-all.expectations.pinned"),
    ("      experts: {\"four\": CPU}\n", "configs.cuda-pin-all.expectations.experts"),
    ("      expert: CPU\n", "expectations.expert: unknown key"),
    ("      experts: {\"5-3\": CPU}\n", "configs.cuda-pin-all.expectations.experts.5-3: layer range ends before it starts"),
])
def test_a_bad_declaration_is_refused_naming_the_key(tmp_path, declaration, message):
    with pytest.raises(MatrixError) as err:
        load_matrix(_matrix_with(tmp_path, "    expectations:\n" + declaration))
    assert message in str(err.value)


def test_the_warning_names_are_the_schemas():
    schema = json.loads((ROOT / "harness" / "matrix" / "matrix.schema.json").read_text())
    assert schema["$defs"]["warning"]["enum"] == list(ex.WARNINGS)


# --------------------------------------------------------------------------- the step, its signature, JUnit, triage


def _write_load(run: Run, config: str, source: str, load: str = "engine", plant: bool = False) -> None:
    placement, ladder = records(source, load)
    if plant:
        placement, ladder = lose_host_buffer(placement, ladder)
    gen = run.layout.gen_dir("linux-x86_64-cuda", config, "moe-large")
    gen.mkdir(parents=True, exist_ok=True)
    (gen / f"{load}.stderr").write_text("(records below)\n")
    write_json(gen / f"{load}.placement.json", placement)
    if ladder:
        write_json(gen / f"{load}.pin-ladder.json", ladder)


def _run(tmp_path: Path, name: str, plant: bool) -> Run:
    run = Run.open(tmp_path, name)
    write_json(run.layout.model_json("linux-x86_64-cuda", "moe-large"), moe_large())
    for config in ("cuda-pin-all", "cuda-nopin"):
        for load in ("engine", "long-prefill.r2"):
            _write_load(run, config, config, load, plant)
        run.record_step(StepRecord("linux-x86_64-cuda", config, "generate", "passed", detail="all generations ran"))
    run_checks(CheckContext(MATRIX, CUDA, run, ["cuda-pin-all", "cuda-nopin"]), CHECKS, lambda line: None)
    run.write_summary()
    return run


def test_the_step_records_status_log_and_signature(tmp_path):
    clean = _run(tmp_path, "clean", plant=False)
    steps = {s.config: s for s in clean.steps if s.step == "expectations"}
    assert steps["cuda-pin-all"].status == "passed"
    assert steps["cuda-pin-all"].detail == "placement, pinned, warnings as expected in 2 load(s)"
    assert clean.overall() == "passed"
    planted = _run(tmp_path, "planted", plant=True)
    step = next(s for s in planted.steps if s.step == "expectations" and s.config == "cuda-pin-all")
    assert step.status == "failed" and planted.overall() == "failed"
    assert {f.status for f in step.failures} == {"placement", "pinned"}
    log = (planted.dir / step.log).read_text()
    assert "engine.stderr): placement: failed: expert tensors of layers 0-7 in CPU (4733 MiB), expected CUDA_Host" in log
    sig = classify_step(planted.dir, step)
    assert (sig.kind, sig.key) == ("placement", "placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 "
                                                "in CPU, expected CUDA_Host")
    assert sig.summary == ("placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 in CPU (4733 MiB), "
                           "expected CUDA_Host")
    record = json.loads((planted.layout.config("linux-x86_64-cuda", "cuda-pin-all") / "expectations.json").read_text())
    assert record["loads"][0]["facts"]["model_buffers"] == {"CUDA0": round(319.13 * MIB), "CPU": 4733 * MIB}
    suite = checks_xml("linux-x86_64-cuda", planted.steps, ["expectations"]).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failure = suite.find("./testsuite/testcase[@name='cuda-pin-all']/failure")
    assert failure is not None and "expected CUDA_Host" in failure.get("message")
    assert ET.tostring(suite)  # a well-formed document

    html = render_html(planted.dir)
    assert "<th>experts pinned</th>" in html
    assert "placement: failed (expert tensors of layers 0-7 in CPU (4733 MiB), expected CUDA_Host)" in html

    report = triage.diff_runs(clean.dir, planted.dir)
    kinds = {(t.kind, t.what) for t in report.regressions}
    assert ("step", "cuda-pin-all expectations") in kinds
    assert ("placement", "cuda-pin-all moe-large: placement") in kinds
    assert ("pinning", "cuda-pin-all: pinned bytes") in kinds
    assert not any("cuda-nopin" in w for _, w in kinds)  # its buffers already were CPU, and nothing pinned
    placement = next(t for t in report.regressions if t.kind == "placement")
    assert placement.before == "CUDA0 319 MiB, CUDA_Host 4733 MiB" and placement.after == "CPU 4733 MiB, CUDA0 319 MiB"
    assert placement.signature["key"] == "placement change: cuda-pin-all/moe-large: model weights moved from " \
                                         "CUDA_Host to CPU"
    assert triage.main([str(clean.dir), str(planted.dir)]) == 1
    assert triage.main([str(clean.dir), str(clean.dir)]) == 0
    back = triage.diff_runs(planted.dir, clean.dir)  # the fault removed: the buffers went back, more is pinned
    assert back.regressions == []
    assert {(t.kind, t.what) for t in back.fixes} == {("step", "cuda-pin-all expectations"),
                                                      ("placement", "cuda-pin-all moe-large: placement")}


def test_missing_or_unreadable_records_make_the_step_incomplete_never_passed(tmp_path):
    run = Run.open(tmp_path, "r")
    write_json(run.layout.model_json("linux-x86_64-cuda", "moe-large"), moe_large())
    gen = run.layout.gen_dir("linux-x86_64-cuda", "cuda-pin-all", "moe-large")
    gen.mkdir(parents=True)
    (gen / "engine.stderr").write_text("a load that logged no buffer line\n")
    run.record_step(StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate", "passed"))
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0])
    assert step.status == "incomplete" and "no placement record" in step.detail
    _write_load(run, "cuda-pin-all", "cuda-pin-all")
    (gen / "engine.pin-ladder.json").write_text("{not json")
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0])
    assert step.status == "incomplete" and "engine.pin-ladder.json cannot be read" in step.detail
    run.record_step(step)
    assert run.overall() == "incomplete"
    run.layout.model_json("linux-x86_64-cuda", "moe-large").unlink()
    assert ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0]).status == "incomplete"


def test_a_check_that_raises_is_an_error_step_and_the_others_still_run(tmp_path):
    run = Run.open(tmp_path, "r")

    def broken(ctx):
        raise KeyError("buffers")

    def fine(ctx):
        return [StepRecord(ctx.platform.name, "fork", "other-check", "passed")]

    lines = []
    run_checks(CheckContext(MATRIX, CUDA, run, ["fork"]), (broken, fine), lines.append)
    assert [(s.config, s.step, s.status) for s in run.steps] == [("-", "test_expectations", "error"),
                                                                 ("fork", "other-check", "passed")]
    assert "KeyError: 'buffers'" in run.steps[0].detail and len(lines) == 2


def test_loads_of_a_failed_generation_are_left_to_the_generate_step(tmp_path):
    from harness.record.results import Failure
    run = Run.open(tmp_path, "r")
    gen = run.layout.gen_dir("linux-x86_64-cuda", "cuda-pin-all", "moe-large")
    gen.mkdir(parents=True)
    (gen / "engine.stderr").write_text("error: unable to load model\n")
    failed = StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate", "failed",
                        failures=[Failure("generation", model="moe-large", prompt="story", status="crashed")])
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], failed)
    assert step.status == "skipped" and "a generation of this model failed" in step.detail
