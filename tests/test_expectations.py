"""Expectations (harness.stages.checks.expectations): every rule is judged from the runtime probe on recorded runs.

The CUDA records are one NVIDIA H200's, committed under results/evidence/: the clean series
gpu1-20261202T142857Z (every CUDA configuration, a probe record ``engine.probe.json`` per
configuration beside the engine's and llama-completion's parsed log records) and the runs
of five planted faults (tests/plants/), each run with its patch on top of the series.  The
CPU records (tests/data/probe-cpu-gemma3/) are the ``base`` engine loading gemma3-270m
(Q4_K_M, memory-mapped, with the weights the CPU repacks beside) on linux-x86_64-cpu: the
probe and placement records from a local run of 2026-12-03 on the 2-core development machine
(an engine that reads the pages' flags), the model summary from 2026-12-02.

Rules no plant reaches are checked by rewriting a clean probe record the way the fault
would have written it; each such test says which fault in its docstring.
"""

from __future__ import annotations

import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.triage import triage
from harness.views.report import render_html
from harness.triage.signatures import classify_step, expectation_signatures
from harness.matrix.config import MatrixError, load_matrix
from harness.record.junit import checks_xml
from harness.record.probe import PROBE_FILE, PROBE_STEP_BYTES, Probe, parse_probe
from harness.record.json_files import write_json
from harness.record.layout import RunLayout
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.stages.checks import expectations as ex
from harness.stages.checks.checks import CheckContext, check_platforms
from harness.stages.checks.expectation_probe import PIN_CHUNK_MIN_BYTES, cap_floor_bytes

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "results" / "evidence"
CLEAN = "gpu1-20261202T142857Z"
ROUTING_PLANT = "plant-llama-pin-layers-from-the-last-layer-20261202T143720Z"
PIN_LINE_PLANT = "plant-cuda-pin-line-claims-an-unheld-grant-20261202T143720Z"
PARTIAL_PLANT = "plant-cuda-partial-registration-reported-as-full-20261202T143720Z"
PAGEABLE_PLANT = "plant-cuda-host-buffers-pageable-20261202T144114Z"
ONE_DEVICE_PLANT = "plant-llama-host-buffer-type-only-with-several-devices-20261202T144114Z"
#: tests/plants/llama-pin-layers-one-more-than-asked.patch on one H100 (2026-12-06, group cuda-pin-routes)
ONE_MORE_PLANT = "plant-pinlayers-20261206T132528Z"
CPU_DATA = ROOT / "tests" / "data" / "probe-cpu-gemma3"
MATRIX = load_matrix(ROOT / "matrix.yaml")
CUDA = MATRIX.platforms["linux-x86_64-cuda"]
CPU = MATRIX.platforms["linux-x86_64-cpu"]
MIB = 2**20
LLAMA_COMPLETION = "long-prefill.r2"


def platform_dir(run: str = CLEAN) -> Path:
    return EVIDENCE / run / "linux-x86_64-cuda"


def gen(config: str, run: str = CLEAN) -> Path:
    return platform_dir(run) / config / "gen" / "moe-large"


def moe_large(run: str = CLEAN) -> dict:
    """The run's summary of moe-large, with its experts per layer where the summary lacks them: 8 layers of 32
    experts x 3 matrices of 2048 x 1536 F16 (matrix.yaml's params), 603979776 bytes each."""
    summary = json.loads((platform_dir(run) / "models" / "moe-large.json").read_text())
    per_layer = 32 * 3 * 2048 * 1536 * 2
    assert per_layer * 8 == summary["expert_tensor_bytes"]
    assert summary.get("expert_tensor_bytes_by_layer", [per_layer] * 8) == [per_layer] * 8
    return {**summary, "expert_tensor_bytes_by_layer": [per_layer] * 8}


def records(config: str, load: str = "engine", run: str = CLEAN) -> tuple[dict, list]:
    """(placement, pin-ladder records) of one load of a recorded run."""
    ladder = gen(config, run) / f"{load}.pin-ladder.json"
    return (json.loads((gen(config, run) / f"{load}.placement.json").read_text()),
            json.loads(ladder.read_text()) if ladder.exists() else [])


def probe_record(config: str, run: str = CLEAN) -> dict:
    """The probe record (parsed JSON, to rewrite) of the configuration's engine load."""
    return json.loads((gen(config, run) / PROBE_FILE).read_text())


def check(config: str, placement: dict, ladder: list, probe: dict | Probe | None, platform=CUDA,
          model: dict | None = None, load: str = "engine", problem: str = ""):
    """(findings, facts) of one load judged as check_config judges it: the configuration's rules, ``probe`` (a
    record to parse, or None with ``problem``), and the source named after ``load``."""
    model = model or moe_large()
    exp = ex.expectations_for(platform, MATRIX.configs[config], model)
    if isinstance(probe, dict):
        probe = parse_probe(probe)
    source = "the engine" if load == "engine" else f"llama-completion ({load})"
    return ex.check_load(exp, placement, ladder, model, probe, problem, source)


def recorded(config: str, load: str = "engine", run: str = CLEAN):
    """check() of a load exactly as the run recorded it."""
    return check(config, *records(config, load, run), probe_record(config, run), load=load)


def bad(findings) -> set[tuple[str, str, str]]:
    """(rule, status, key) of every finding that did not pass."""
    return {(f.rule, f.status, f.key) for f in findings if f.status != "passed"}


def one(findings, rule: str):
    (f,) = [f for f in findings if f.rule == rule]
    return f


def lock(record: dict, buffer: int, n: int) -> dict:
    """``record`` with the driver reporting ``n`` bytes of buffer ``buffer`` page-locked, handed to its weights in
    record order (the probe samples each weight's own range)."""
    record = copy.deepcopy(record)
    record["buffers"][buffer]["page_locked"] = n
    for w in record["weights"]:
        if w["buffer"] == buffer:
            w["page_locked"] = min(w["bytes"], n)
            n -= w["page_locked"]
    return record


def buffer_index(record: dict, buffer_type: str) -> int:
    (i,) = [i for i, b in enumerate(record["buffers"]) if b["buffer_type"] == buffer_type]
    return i


def loads(run: str, config: str) -> list[str]:
    return sorted(p.name[:-len(".stderr")] for p in gen(config, run).glob("*.stderr"))


CLEAN_LOADS = [(c.name, load) for c in sorted(platform_dir().iterdir()) if (c / "gen" / "moe-large").is_dir()
               for load in loads(CLEAN, c.name)]


# --------------------------------------------------------------------------- the clean run


@pytest.mark.parametrize("config, load", CLEAN_LOADS, ids=[f"{c}-{ld}" for c, ld in CLEAN_LOADS])
def test_every_rule_passes_on_every_load_of_the_clean_h200_run(config, load):
    findings, facts = recorded(config, load)
    assert not bad(findings), [f.message for f in findings if f.status != "passed"]
    assert {f.rule for f in findings} >= {"placement", "mapped", "claims"}
    assert one(findings, "claims").key == "as probed"
    assert facts["probe_buffers"] and facts["layers"]


def test_the_clean_series_has_both_loads_of_all_fourteen_configurations():
    configs = {c for c, _ in CLEAN_LOADS}
    assert len(configs) == 14 and {ld for _, ld in CLEAN_LOADS} == {"engine", LLAMA_COMPLETION}
    assert len(CLEAN_LOADS) == 28


def test_the_checked_rules_of_the_clean_run_are_the_documented_defaults():
    rules = {c: {f.rule for f in recorded(c)[0]} for c, _ in CLEAN_LOADS}
    every = {"placement", "pinned", "mapped", "claims", "warnings"}
    assert rules["cuda-pin-all"] == rules["cuda-pin-layers-half"] == rules["cuda-sim-partial"] == every
    assert rules["cuda-nopin"] == every - {"warnings"}  # exactly 0 pinned: nothing to warn about
    assert rules["cuda-sim-sticky"] == every  # declared in matrix.yaml
    assert rules["base"] == rules["fork"] == rules["cuda-base-host-experts"] == {"placement", "mapped", "claims"}


def test_the_clean_run_measures_from_the_driver_not_from_the_pin_lines():
    _, facts = recorded("cuda-pin-layers-2")
    assert facts["layers"] == {"CPU": [2, 3, 4, 5, 6, 7], "CUDA_Host": [0, 1]}
    assert facts["pinned_fraction"] == 0.25 and facts["pinned_expert_bytes"] == 2 * 603979776
    assert facts["page_locked_bytes"] == 1339031552  # the whole CUDA_Host buffer, token embeddings included
    _, partial = recorded("cuda-sim-partial")
    assert partial["page_locked_bytes"] == 2048 * MIB == partial["claimed_granted_bytes"]


def _copy_run(tmp_path: Path, run: str, configs: list[str]) -> RunLayout:
    """The records check_config reads of ``configs`` of a recorded run, copied (the copy is rewritten)."""
    dest = tmp_path / run / "linux-x86_64-cuda"
    (dest / "models").mkdir(parents=True)
    write_json(dest / "models" / "moe-large.json", moe_large(run))
    for config in configs:
        shutil.copytree(gen(config, run), dest / config / "gen" / "moe-large",
                        ignore=shutil.ignore_patterns("*.tokens.json", "*.stdout", "*.prompt", "*.cmd"))
    return RunLayout(tmp_path / run)


def _step(layout: RunLayout, config: str) -> StepRecord:
    return ex.check_config(layout, CUDA, MATRIX.configs[config], None)


def _record(layout: RunLayout, config: str) -> dict:
    return json.loads((layout.config("linux-x86_64-cuda", config) / "expectations.json").read_text())


def test_the_clean_steps_pass_every_rule_on_both_loads(tmp_path):
    configs = sorted({c for c, _ in CLEAN_LOADS})
    layout = _copy_run(tmp_path, CLEAN, configs)
    for config in configs:
        step = _step(layout, config)
        assert step.status == "passed", (config, step.detail)
        assert step.detail.endswith("as expected in 2 load(s)") and "claims" in step.detail
        record = _record(layout, config)
        assert [ld["load"] for ld in record["loads"]] == ["engine", LLAMA_COMPLETION]
        assert record["rules"]["moe-large"]["mapped"] is ex.uses_mmap(MATRIX.configs[config].args)
    assert _step(layout, "cuda-pin-all").detail == "placement, pinned, mapped, claims, warnings as expected in 2 load(s)"


# --------------------------------------------------------------------------- the planted faults' runs

ROUTE_2 = {("placement", "failed", "expert tensors of layers 0-1 in CPU, expected CUDA_Host"),
           ("placement", "failed", "expert tensors of layers 6-7 in CUDA_Host, expected CPU"),
           ("claims", "failed", "routing: the summary names other layers than the probe finds")}
ROUTE_HALF = {("placement", "failed", "expert tensors of layers 0-3 in CPU, expected CUDA_Host"),
              ("placement", "failed", "expert tensors of layers 4-7 in CUDA_Host, expected CPU"),
              ("claims", "failed", "routing: the summary names other layers than the probe finds")}
UNHELD = ("claims", "failed", "pinning: the pin line reports more than the driver holds")
ROUTING_CLAIM = ("claims", "failed", "routing: the summary names other layers than the probe finds")


def _below(fraction: str) -> tuple[str, str, str]:
    return ("pinned", "failed", f"pinned fraction below {fraction}")


def _above(fraction: str) -> tuple[str, str, str]:
    return ("pinned", "failed", f"pinned fraction above {fraction}")


def _in_cpu(layers: str) -> tuple[str, str, str]:
    return ("placement", "failed", f"expert tensors of layers {layers} in CPU, expected CUDA_Host")


PLANTED = [
    (ROUTING_PLANT, "cuda-pin-layers-2", ROUTE_2),
    (ROUTING_PLANT, "cuda-pin-layers-half", ROUTE_HALF),
    (ROUTING_PLANT, "cuda-pin-all", set()),
    (ROUTING_PLANT, "cuda-nopin", set()),
    (PIN_LINE_PLANT, "cuda-pin-all", {_below("1"), UNHELD}),
    (PIN_LINE_PLANT, "cuda-pin-layers-2", {_below("0.25"), UNHELD}),
    (PIN_LINE_PLANT, "cuda-pin-layers-half", {_below("0.5"), UNHELD}),
    (PIN_LINE_PLANT, "cuda-nopin", set()),
    (PARTIAL_PLANT, "cuda-sim-partial", {UNHELD, ("warnings", "failed", "warning partial-pin missing")}),
    (PARTIAL_PLANT, "cuda-sim-sticky", set()),
    (PARTIAL_PLANT, "cuda-nopin", set()),
    (PAGEABLE_PLANT, "cuda-pin-all", {_in_cpu("0-7"), _below("1")}),
    (PAGEABLE_PLANT, "cuda-pin-layers-2", {_in_cpu("0-1"), _below("0.25"), ROUTING_CLAIM}),
    (PAGEABLE_PLANT, "cuda-pin-layers-half", {_in_cpu("0-3"), _below("0.5"), ROUTING_CLAIM}),
    (PAGEABLE_PLANT, "cuda-nopin", set()),
    # no host buffer type with one device: no host buffer to route, so no routing line to check
    (ONE_DEVICE_PLANT, "cuda-pin-all", {_in_cpu("0-7"), _below("1")}),
    (ONE_DEVICE_PLANT, "cuda-pin-layers-2", {_in_cpu("0-1"), _below("0.25")}),
    (ONE_DEVICE_PLANT, "cuda-pin-layers-half", {_in_cpu("0-3"), _below("0.5")}),
    (ONE_DEVICE_PLANT, "cuda-nopin", set()),
    # one layer more than asked kept in the host buffer type: the boundary layer pinned, the summary unchanged
    (ONE_MORE_PLANT, "cuda-pin-layers-2", {_above("0.25"), ROUTING_CLAIM,
                                           ("placement", "failed", "expert tensors of layers 2 in CUDA_Host, expected CPU")}),
    (ONE_MORE_PLANT, "cuda-pin-layers-half", {_above("0.5"), ROUTING_CLAIM,
                                              ("placement", "failed", "expert tensors of layers 4 in CUDA_Host, expected CPU")}),
    (ONE_MORE_PLANT, "cuda-pin-all", set()),
    (ONE_MORE_PLANT, "cuda-nopin", set()),
]


@pytest.mark.parametrize("run, config, expected", PLANTED,
                         ids=[f"{r.split('-2026')[0]}-{c}" for r, c, _ in PLANTED])
def test_each_planted_fault_fails_its_configurations_through_the_probe(run, config, expected):
    assert loads(run, config) == ["engine", LLAMA_COMPLETION]
    for load in loads(run, config):
        findings, _ = recorded(config, load, run)
        assert bad(findings) == expected, (load, [f.message for f in findings if f.status != "passed"])


def test_the_plants_leave_no_configuration_of_their_runs_unchecked():
    for run in {r for r, _, _ in PLANTED}:
        ran = {c.name for c in platform_dir(run).iterdir() if (c / "gen" / "moe-large").is_dir()}
        assert ran == {c for r, c, _ in PLANTED if r == run}, run


def test_the_routing_plant_names_where_the_summary_and_the_probe_put_each_layer():
    findings, _ = recorded("cuda-pin-layers-half", LLAMA_COMPLETION, ROUTING_PLANT)
    claim = one(findings, "claims")
    assert claim.message == ("routing: llama-completion (long-prefill.r2)'s summary puts layers 0-3 in CUDA_Host, "
                             "4-7 in CPU; the probe finds 0-3 in CPU, 4-7 in CUDA_Host (layers 0-7 disagree)")
    assert claim.evidence[0].startswith("GGML_CUDA_MOE_PIN_LAYERS=4: expert tensors of layers 0-3 in CUDA_Host")
    # the fraction is right (four layers' worth is pinned): only placement and the claim catch it
    assert one(findings, "pinned").status == "passed"


def test_the_pin_line_plant_is_caught_by_the_drivers_count_against_the_grant():
    findings, facts = recorded("cuda-pin-all", "engine", PIN_LINE_PLANT)
    claim = one(findings, "claims")
    assert claim.message == ("pinning: the engine's pin line reports 4733 MiB granted for the 4733 MiB CUDA_Host "
                             "buffer; the driver reports 0 MiB page-locked")
    assert "pin ladder: cudaMallocHost requested=4962910208 granted=4962910208" in claim.evidence[0]
    assert facts["claimed_granted_bytes"] >= 4962910208 and facts["pinned_expert_bytes"] == 0
    assert one(findings, "placement").status == "passed"  # the buffer is CUDA_Host by name


def test_the_partial_registration_plant_fails_the_claim_and_the_missing_warning():
    findings, facts = recorded("cuda-sim-partial", "engine", PARTIAL_PLANT)
    assert one(findings, "claims").message == ("pinning: the engine's pin line reports 4733 MiB granted for the "
                                               "4733 MiB CUDA_Host buffer; the driver reports 2048 MiB page-locked")
    assert one(findings, "pinned").status == "passed"  # 2048 MiB are what the cap allows: the count is right
    assert facts["page_locked_bytes"] == 2048 * MIB and "partial-pin" not in facts["warnings"]


def test_a_planted_steps_signatures_name_rule_and_kind(tmp_path):
    layout = _copy_run(tmp_path, PIN_LINE_PLANT, ["cuda-pin-all"])
    step = _step(layout, "cuda-pin-all")
    assert step.status == "failed"
    assert {(f.status, f.model) for f in step.failures} == {("pinned", "moe-large"), ("claims", "moe-large")}
    sigs = expectation_signatures(layout.dir, step)
    assert {(s.kind, s.key) for s in sigs} == {
        ("pinning", "pinned: cuda-pin-all/moe-large: pinned fraction below 1"),
        ("pinning", "claims: cuda-pin-all/moe-large: pinning: the pin line reports more than the driver holds")}
    layout = _copy_run(tmp_path / "r", ROUTING_PLANT, ["cuda-pin-layers-2"])
    sigs = expectation_signatures(layout.dir, _step(layout, "cuda-pin-layers-2"))
    assert {(s.kind, s.key) for s in sigs} == {
        ("placement", "placement: cuda-pin-layers-2/moe-large: expert tensors of layers 0-1 in CPU, expected CUDA_Host"),
        ("placement", "placement: cuda-pin-layers-2/moe-large: expert tensors of layers 6-7 in CUDA_Host, expected CPU"),
        ("placement", "claims: cuda-pin-layers-2/moe-large: routing: the summary names other layers than the probe "
                      "finds")}


# --------------------------------------------------------------------------- rules no plant reaches


def cpu_records() -> tuple[dict, dict, dict]:
    """(placement, probe record, model summary) of the engine loading gemma3-270m on the CPU platform (mmap)."""
    return tuple(json.loads((CPU_DATA / name).read_text())
                 for name in ("engine.placement.json", PROBE_FILE, "model.json"))


def check_cpu(config: str, placement: dict, probe: dict):
    return check(config, placement, [], probe, CPU, cpu_records()[2])


def test_the_recorded_cpu_load_passes_and_its_repacked_weights_are_not_host_memory():
    placement, probe, _ = cpu_records()
    assert [(b["buffer_type"], b["host"]) for b in probe["buffers"]] == [("CPU_Mapped", True), ("CPU_REPACK", False)]
    findings, facts = check_cpu("base", placement, probe)
    assert not bad(findings) and {f.rule for f in findings} == {"placement", "weights", "mapped", "claims"}
    assert facts["probe_buffers"] == {"CPU_Mapped": 246587904, "CPU_REPACK": 13271040}
    assert one(findings, "mapped").message == ("209 host weight(s) (223 MiB) backed by the model file, no page a "
                                               "private copy; smaps: the model's mappings hold 0 MiB anonymous")


def test_a_silent_loss_of_mmap_fails_weights_and_mapped_on_the_cpu_platform():
    """The fault: llama reads the model into a plain CPU buffer although the load mode maps it.  llama then logs
    the buffer as CPU, and the probe finds a buffer of type CPU that the model file backs nowhere."""
    placement, probe, _ = cpu_records()
    placement = json.loads(json.dumps(placement).replace('"CPU_Mapped"', '"CPU"'))
    probe = copy.deepcopy(probe)
    mapped = buffer_index(probe, "CPU_Mapped")
    probe["buffers"][mapped].update(name="CPU", buffer_type="CPU", file_backed=0, file_pages=0)
    for w in probe["weights"]:
        if w["buffer"] == mapped:
            w.update(file_backed=0, file_pages=0)
    findings, _ = check_cpu("base", placement, probe)
    assert bad(findings) == {
        ("weights", "failed", "model weights in CPU, expected CPU_Mapped or CPU_REPACK"),
        ("mapped", "failed", "host weights in CPU not backed by the model file (anonymous memory), expected "
                             "memory-mapped")}
    assert one(findings, "weights").message == \
        "model weights in CPU (223 MiB), expected CPU_Mapped or CPU_REPACK (the probe)"
    # with --load-mode none the same buffers are right, and the mapped load is wrong twice over
    assert not bad(check_cpu("fork-load-none", placement, probe)[0])
    assert bad(check_cpu("fork-load-none", *cpu_records()[:2])[0]) == {
        ("weights", "failed", "model weights in CPU_Mapped, expected CPU or CPU_REPACK"),
        ("mapped", "failed", "host weights in CPU_Mapped backed by the model file, expected read into memory (mmap off)")}


def test_a_weight_in_a_buffer_type_outside_the_list_fails_weights():
    """The fault: the token embeddings land in a device buffer type the CPU platform never uses; the log names
    no such model buffer, so the buffer-size claim fails beside it."""
    placement, probe, _ = cpu_records()
    probe = copy.deepcopy(probe)
    embd = next(w for w in probe["weights"] if w["name"] == "token_embd.weight")
    probe["buffers"].append({"name": "Vulkan0", "buffer_type": "Vulkan0", "bytes": embd["bytes"], "host": False,
                             "page_locked": None, "file_backed": None})
    embd.update(buffer=len(probe["buffers"]) - 1, page_locked=None, file_backed=None)
    findings, _ = check_cpu("base", placement, probe)
    assert bad(findings) == {("weights", "failed", "model weights in Vulkan0, expected CPU_Mapped or CPU_REPACK"),
                             ("claims", "failed", "buffer sizes: the engine logs Vulkan0 unlike the probe")}


def test_a_mapped_host_weight_in_anonymous_memory_fails_mapped_and_repacked_weights_are_exempt():
    """The fault of tests/plants/llama-mmap-served-from-an-anonymous-copy.patch on one weight: the buffer keeps
    its name and size, the log is clean, only the process's memory map says the weight is a copy.  Weights in
    CPU_REPACK live in anonymous memory by design, even where the buffer reports host memory."""
    placement, probe, _ = cpu_records()
    repack = buffer_index(probe, "CPU_REPACK")
    exempt = copy.deepcopy(probe)
    exempt["buffers"][repack].update(host=True, page_locked=None, file_backed=0, file_pages=0, private_pages=0)
    for w in exempt["weights"]:
        if w["buffer"] == repack:
            w.update(file_backed=0, file_pages=0, private_pages=0)
    assert not bad(check_cpu("base", placement, exempt)[0])
    copied = copy.deepcopy(exempt)
    w = next(w for w in copied["weights"] if w["name"] == "token_embd.weight")
    assert copied["buffers"][w["buffer"]]["buffer_type"] == "CPU_Mapped" and w["file_backed"] == w["bytes"]
    w["file_backed"] = w["file_pages"] = w["bytes"] - PROBE_STEP_BYTES  # one MiB of it anonymous
    findings, _ = check_cpu("base", placement, copied)
    assert bad(findings) == {("mapped", "failed", "host weights in CPU_Mapped not backed by the model file "
                                                  "(anonymous memory), expected memory-mapped")}
    assert "first: token_embd.weight" in one(findings, "mapped").message
    no_count = copy.deepcopy(probe)
    no_count["weights"][0]["file_backed"] = None
    assert bad(check_cpu("base", placement, no_count)[0]) == {("mapped", "incomplete", "no map count in the probe")}


def test_pages_copied_under_the_model_file_s_name_fail_mapped_and_name_the_layers():
    """The fault of tests/plants/llama-mmap-first-layer-copied-on-write.patch, as its probe would read: the
    memory map names the model file for every weight of layer 0 (the map's half passes), the page flags find
    every page of them a private copy.  The rule names the layer, the private bytes and the first weight."""
    placement, probe, _ = cpu_records()
    written = copy.deepcopy(probe)
    copied = 0
    for w in written["weights"]:
        buffer = written["buffers"][w["buffer"]]
        if w["layer"] == 0 and buffer["buffer_type"] == "CPU_Mapped":
            w.update(file_pages=0, private_pages=w["file_backed"])
            copied += w["bytes"]
    written["file_mappings"][0]["anonymous"] = copied
    findings, _ = check_cpu("base", placement, written)
    assert bad(findings) == {("mapped", "failed", "host weights in CPU_Mapped: pages privately copied under the model "
                                                  "file's name, expected the file's pages")}
    message = one(findings, "mapped").message
    assert "; layers 0) hold " in message and "first: blk.0." in message and "(the OS's page flags)" in message
    assert message.endswith(f"smaps: the model's mappings hold {copied / MIB:.0f} MiB anonymous")
    # one page of one weight is enough
    one_page = copy.deepcopy(probe)
    w = next(w for w in one_page["weights"] if w["name"] == "token_embd.weight")
    w.update(file_pages=w["file_backed"] - 4096, private_pages=4096)
    assert bad(check_cpu("base", placement, one_page)[0]) == {
        ("mapped", "failed", "host weights in CPU_Mapped: pages privately copied under the model file's name, "
                             "expected the file's pages")}
    # private copies of weights in CPU_REPACK (anonymous by design) and with mmap off are not the pages' rule
    assert not bad(check_cpu("fork-load-none", *_read_into_memory(placement, probe))[0])


def _read_into_memory(placement: dict, probe: dict) -> tuple[dict, dict]:
    """The records rewritten as a load with mmap off writes them: CPU buffers, nothing backed by the file."""
    placement = json.loads(json.dumps(placement).replace('"CPU_Mapped"', '"CPU"'))
    probe = json.loads(json.dumps(probe).replace('"CPU_Mapped"', '"CPU"'))
    for entry in probe["weights"] + probe["buffers"]:
        if entry.get("file_backed") is not None:
            entry.update(file_backed=0, file_pages=0, private_pages=0)
    return placement, probe


def test_page_counts_the_os_did_not_give_are_incomplete_and_an_older_record_says_it_read_none():
    placement, probe, _ = cpu_records()
    unread = copy.deepcopy(probe)
    unread["weights"][0].update(file_pages=None, private_pages=None)  # the engine could not read pagemap
    assert bad(check_cpu("base", placement, unread)[0]) == {("mapped", "incomplete", "no page counts in the probe")}
    older = copy.deepcopy(probe)
    del older["file_mappings"]
    for entry in older["weights"] + older["buffers"]:
        del entry["file_pages"], entry["private_pages"]
    findings, _ = check_cpu("base", placement, older)
    assert not bad(findings)
    assert one(findings, "mapped").message.endswith("(pages not read: a record of an engine older than the page counts)")


def test_no_pinned_needs_exactly_nothing_page_locked():
    """The fault: under GGML_CUDA_NO_PINNED something registers the CPU buffer with the driver behind the
    loader's back (llama and the pin lines still say CPU, nothing granted): the driver's count fails it.  The
    rule counts expert bytes: the buffer's first 125 MiB are the token embeddings, which only the claim sees."""
    placement, ladder = records("cuda-nopin")
    record = probe_record("cuda-nopin")
    host = buffer_index(record, "CPU")
    assert record["weights"][0]["name"] == "token_embd.weight" and record["weights"][0]["buffer"] == host
    embeddings = record["weights"][0]["bytes"]
    findings, _ = check("cuda-nopin", placement, ladder, lock(record, host, embeddings))
    assert bad(findings) == {("claims", "failed", "pinning: the pin line reports less than the driver holds")}
    findings, _ = check("cuda-nopin", placement, ladder, lock(record, host, embeddings + 64 * MIB))
    assert bad(findings) == {("pinned", "failed", "pinned fraction above 0"),
                             ("claims", "failed", "pinning: the pin line reports less than the driver holds")}
    assert one(findings, "pinned").message.startswith("0.014 of the expert tensors page-locked according to the "
                                                      "driver (64 MiB of 4608 MiB), expected 0")
    assert not bad(check("cuda-nopin", placement, ladder, lock(record, host, 0))[0])


def test_a_simulated_cap_needs_what_the_cap_allows():
    """GGML_CUDA_PIN_SIM_TOTAL_MAX_MB=2048: the 4733 MiB host buffer (4608 MiB of experts) must get at least
    2048 MiB less one smallest ladder chunk, all but its 125 MiB of other weights expert bytes.  The fault:
    the ladder stops early, the driver holding less than the cap allows (the pin line says the same)."""
    placement, ladder = records("cuda-sim-partial")
    record = probe_record("cuda-sim-partial")
    host = buffer_index(record, "CUDA_Host")
    rule = ex.expectations_for(CUDA, MATRIX.configs["cuda-sim-partial"], moe_large()).pinned
    floor = cap_floor_bytes(rule, parse_probe(record))
    assert floor == 2048 * MIB - PIN_CHUNK_MIN_BYTES - (4962910208 - 4831838208)
    other = record["buffers"][host]["bytes"] - sum(w["bytes"] for w in record["weights"]
                                                   if w["buffer"] == host and "_exps" in w["name"])
    assert other == 125 * MIB

    def grant(n: int) -> list:
        return [dict(r, granted=n) if r["requested"] == 4962910208 else r for r in ladder]

    at_floor = lock(record, host, floor + other)  # the non-expert weights come first in the buffer
    assert not bad(check("cuda-sim-partial", placement, grant(floor + other), at_floor)[0])
    short = lock(record, host, floor + other - PROBE_STEP_BYTES)
    findings, facts = check("cuda-sim-partial", placement, grant(floor + other - PROBE_STEP_BYTES), short)
    assert bad(findings) == {("pinned", "failed", "pinned fraction below at least what a 2048 MiB cap allows")}
    assert facts["pinned_expert_bytes"] == floor - PROBE_STEP_BYTES


def test_a_probe_that_missed_expert_tensors_is_incomplete_never_passed():
    """The fault: the probe's eval callback misses the up-projection experts of layer 5 (a graph that reads them
    through a node the callback is not asked about).  Placement and pinning cannot be judged from it."""
    placement, ladder = records("cuda-pin-all")
    record = probe_record("cuda-pin-all")
    record["weights"] = [w for w in record["weights"] if w["name"] != "blk.5.ffn_up_exps.weight"]
    findings, _ = check("cuda-pin-all", placement, ladder, record)
    assert bad(findings) == {("placement", "incomplete", "the probe missed expert tensors"),
                             ("pinned", "incomplete", "the probe missed expert tensors")}
    assert one(findings, "placement").message == \
        "the probe saw 384 MiB of the 576 MiB of expert tensors of layers 5"


def test_a_missing_or_refused_probe_makes_the_step_incomplete_with_the_reason(tmp_path):
    """No probe record (the engine died before the probe) and a refused probe (the harness writes the engine's
    error as ``{"error": ...}``): every rule of every load but ``warnings`` is incomplete, never passed."""
    layout = _copy_run(tmp_path, CLEAN, ["cuda-pin-all"])
    probe_path = layout.gen_dir("linux-x86_64-cuda", "cuda-pin-all", "moe-large") / PROBE_FILE
    probe_path.unlink()
    step = _step(layout, "cuda-pin-all")
    assert step.status == "incomplete" and not step.failures
    assert "engine.probe.json missing: the load has no probe record" in step.detail
    for load in _record(layout, "cuda-pin-all")["loads"]:
        assert {(f["rule"], f["status"]) for f in load["findings"]} == {
            ("placement", "incomplete"), ("pinned", "incomplete"), ("mapped", "incomplete"),
            ("claims", "incomplete"), ("warnings", "passed")}
    write_json(probe_path, {"error": "probe: cannot create a context of its own"})
    step = _step(layout, "cuda-pin-all")
    assert step.status == "incomplete"
    assert step.detail.startswith("moe-large engine: linux-x86_64-cuda/cuda-pin-all/gen/moe-large: engine.probe.json: "
                                  "the engine could not probe the load: probe: cannot create a context of its own")
    probe_path.write_text("{not json")
    assert "engine.probe.json cannot be read" in _step(layout, "cuda-pin-all").detail


def test_a_llama_completion_buffer_claim_unlike_the_probe_fails_claims():
    """The fault: llama-completion loads the model otherwise than the engine (its host model buffer half as
    large: the other half of the experts in a buffer its log does not name).  Its buffer line is a claim
    checked against the engine's probe of the same configuration."""
    placement, ladder = records("cuda-pin-all", LLAMA_COMPLETION)
    placement = copy.deepcopy(placement)
    (host,) = [b for b in placement["buffers"] if b["buffer_type"] == "CUDA_Host" and b["what"] == "model"]
    host["mib"] = 2429.0
    findings, _ = check("cuda-pin-all", placement, ladder, probe_record("cuda-pin-all"), load=LLAMA_COMPLETION)
    assert bad(findings) == {("claims", "failed", "buffer sizes: llama-completion (long-prefill.r2) logs CUDA_Host "
                                                  "unlike the probe")}
    assert one(findings, "claims").message == ("buffer sizes: llama-completion (long-prefill.r2) logs CUDA_Host "
                                               "2429 MiB; the probe finds 4733 MiB of weight buffers of that type")


def test_the_routing_claim_under_no_pinned_passes_only_with_cpu_buffers_of_its_own():
    """GGML_CUDA_NO_PINNED with GGML_CUDA_MOE_PIN_LAYERS=4: the summary still names CUDA_Host for layers 0-3 and
    says the type is not page-locked; the probe finds them in a CPU buffer apart from layers 4-7's.  The claim
    fails where the summary lacks that note, or where the two groups share one buffer (routing that did nothing)."""
    placement, ladder = records("cuda-nopin-pin-layers")
    record = probe_record("cuda-nopin-pin-layers")
    assert [b["buffer_type"] for b in record["buffers"]] == ["CPU", "CUDA0", "CPU"]
    (summary,) = placement["routing"]
    assert "is not page-locked on this device" in summary
    assert not bad(check("cuda-nopin-pin-layers", placement, ladder, record)[0])
    no_note = dict(placement, routing=[summary.split(";")[0] + "; 0 tensors pinned, 24 tensors (4608.00 MiB) pageable"])
    assert bad(check("cuda-nopin-pin-layers", no_note, ladder, record)[0]) == {ROUTING_CLAIM}
    shared = copy.deepcopy(record)
    for w in shared["weights"]:
        if "_exps" in w["name"] and w["layer"] < 4:
            w["buffer"] = 2
    findings, _ = check("cuda-nopin-pin-layers", placement, ladder, shared)
    assert bad(findings) == {ROUTING_CLAIM}
    assert one(findings, "claims").message.endswith("(layers 0-7 disagree)")


# --------------------------------------------------------------------------- warnings (facts of the log)


def test_invalid_pin_layers_must_warn_and_a_valid_value_must_not():
    placement, ladder = records("cuda-pin-layers-garbage")
    probe = probe_record("cuda-pin-layers-garbage")
    silent = dict(placement, routing=[])
    assert bad(check("cuda-pin-layers-garbage", silent, ladder, probe)[0]) == \
        {("warnings", "failed", "warning pin-layers-invalid missing")}
    half, half_ladder = records("cuda-pin-layers-half")
    noisy = dict(half, routing=half["routing"] + placement["routing"])
    assert bad(check("cuda-pin-layers-half", noisy, half_ladder, probe_record("cuda-pin-layers-half"))[0]) == \
        {("warnings", "failed", "unexpected warning pin-layers-invalid")}
    over, over_ladder = records("cuda-pin-layers-over")
    assert ("warnings", "failed", "warning pin-layers-clamped missing") in \
        bad(check("cuda-pin-layers-over", dict(over, routing=[]), over_ladder, probe_record("cuda-pin-layers-over"))[0])


def test_a_partial_grant_is_an_unexpected_warning_under_a_full_pin():
    placement, ladder = records("cuda-sim-partial")  # 2048 of 4733 MiB granted, with its WARN lines
    findings, _ = check("cuda-pin-all", placement, ladder, probe_record("cuda-sim-partial"))
    assert bad(findings) == {_below("1"), ("warnings", "failed", "unexpected warning partial-pin"),
                             ("warnings", "failed", "unexpected warning no-pin")}


# --------------------------------------------------------------------------- defaults and declarations


def rules(config: str, platform=CUDA, model=None) -> dict:
    exp = ex.expectations_for(platform, MATRIX.configs[config], model or moe_large())
    return {"experts": [(r.describe(), r.buffer_type) for r in exp.experts or ()],
            "pinned": exp.pinned.describe() if exp.pinned else None, "present": exp.present, "absent": exp.absent,
            "mapped": exp.mapped}


def test_defaults_follow_the_documented_rule():
    assert rules("cuda-pin-all") == {"experts": [("0-", "CUDA_Host")], "pinned": "1", "present": (),
                                     "absent": ("partial-pin", "no-pin"), "mapped": False}
    assert rules("cuda-pin-layers-2")["experts"] == [("0-1", "CUDA_Host"), ("2-", "CPU")]
    assert rules("cuda-pin-layers-2")["pinned"] == "0.25"
    assert rules("cuda-nopin-pin-layers")["experts"] == [("0-3", "CPU"), ("4-", "CPU")]
    assert rules("cuda-nopin")["pinned"] == "0"
    assert rules("cuda-sim-partial")["pinned"] == "at least what a 2048 MiB cap allows"
    assert rules("cuda-sim-partial")["present"] == ("partial-pin",)
    sticky = MATRIX.configs["cuda-sim-sticky"]
    assert ex.default_expectations(CUDA, sticky, moe_large()).pinned is None  # no bound under a sticky refusal
    assert rules("cuda-sim-sticky") == {"experts": [("0-", "CUDA_Host")], "pinned": "0", "present": ("no-pin",),
                                        "absent": ("partial-pin",), "mapped": False}  # declared in matrix.yaml
    assert rules("cuda-pin-layers-garbage")["present"] == ("pin-layers-invalid",)
    assert rules("cuda-pin-layers-huge")["present"] == ("pin-layers-clamped",)
    assert rules("cuda-base-host-experts") == {"experts": [("0-", "CUDA_Host")], "pinned": None, "present": (),
                                               "absent": (), "mapped": False}
    assert rules("fork")["experts"] == [("0-", "CUDA[0-9]*")] and rules("fork")["mapped"] is True
    assert rules("fork", CPU)["experts"] == [("0-", "CPU_Mapped|CPU_REPACK")] and rules("fork", CPU)["mapped"] is True
    assert rules("fork-load-none", CPU)["experts"] == [("0-", "CPU|CPU_REPACK")] and \
        rules("fork-load-none", CPU)["mapped"] is False
    exp = ex.expectations_for(CPU, MATRIX.configs["fork-load-none"], moe_large())
    assert exp.origin["mapped"] == "default: mmap off" and exp.weights == ("CPU", "CPU_REPACK")
    assert ex.uses_mmap(["-lm", "dio"]) is False and ex.uses_mmap(["--load-mode=mmap"]) is True
    assert ex.pin_layers({"GGML_CUDA_MOE_PIN_LAYERS": "4x"}, "GGML_CUDA_MOE_PIN_LAYERS") is None


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
                                           "      pinned: {min: 0.4}\n"
                                           "      mapped: true\n"))
    config = m.configs["cuda-pin-all"]
    exp = ex.expectations_for(CUDA, config, moe_large())
    assert [(r.describe(), r.buffer_type) for r in exp.experts] == [("0-3", "CUDA_Host"), ("4-", "CPU")]
    assert exp.pinned.describe() == "at least 0.4" and exp.absent == ("partial-pin", "no-pin")
    assert exp.origin["placement"] == exp.origin["mapped"] == "declared" and exp.origin["warnings"].startswith("default")
    # the clean full pin now fails the declared placement (CUDA_Host holds layers 4-7 too) and the declared mmap
    findings, _ = ex.check_load(exp, *records("cuda-pin-all"), moe_large(), parse_probe(probe_record("cuda-pin-all")))
    assert bad(findings) == {
        ("placement", "failed", "expert tensors of layers 4-7 in CUDA_Host, expected CPU"),
        ("mapped", "failed", "host weights in CUDA_Host not backed by the model file (anonymous memory), expected "
                             "memory-mapped")}
    assert ex.expectations_for(CPU, config, moe_large()).origin["placement"].startswith("default")  # gpu: nvidia


@pytest.mark.parametrize("declaration, message", [
    ("      warnings: {present: [partial-pins]}\n", "configs.cuda-pin-all.expectations.warnings.present[0]"),
    ("      pinned: 1.5\n", "configs.cuda-pin-all.expectations.pinned"),
    ("      mapped: sometimes\n", "configs.cuda-pin-all.expectations.mapped"),
    ("      experts: {\"four\": CPU}\n", "configs.cuda-pin-all.expectations.experts"),
    ("      expert: CPU\n", "configs.cuda-pin-all.expectations.expert: unknown key"),
    ("      experts: {\"5-3\": CPU}\n", "configs.cuda-pin-all.expectations.experts.5-3: layer range ends before it starts"),
])
def test_a_bad_declaration_is_refused_naming_file_line_and_key(tmp_path, declaration, message):
    path = _matrix_with(tmp_path, "    expectations:\n" + declaration)
    line = path.read_text().splitlines().index("  cuda-pin-all:") + 4  # config, build, expectations, the key
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert f"{path}:{line}: {message}" in str(err.value)


def test_the_warning_names_are_the_schemas():
    schema = json.loads((ROOT / "harness" / "matrix" / "matrix.schema.json").read_text())
    assert schema["$defs"]["warning"]["enum"] == list(ex.WARNINGS)


# --------------------------------------------------------------------------- the step, its signature, JUnit, triage


def _write_loads(run: Run, config: str, source_run: str) -> None:
    """The records of ``config``'s loads in ``source_run`` (a recorded run), as the run writes them."""
    dest = run.layout.gen_dir("linux-x86_64-cuda", config, "moe-large")
    shutil.copytree(gen(config, source_run), dest,
                    ignore=shutil.ignore_patterns("*.tokens.json", "*.stdout", "*.prompt", "*.cmd"))
    placement = json.loads((platform_dir(source_run) / config / "placement.json").read_text())
    write_json(run.layout.config("linux-x86_64-cuda", config) / "placement.json", placement)


def _run(tmp_path: Path, name: str, source_run: str) -> Run:
    run = Run.open(tmp_path, name)
    write_json(run.layout.model_json("linux-x86_64-cuda", "moe-large"), moe_large(source_run))
    for config in ("cuda-pin-all", "cuda-nopin"):
        _write_loads(run, config, source_run)
        run.record_step(StepRecord("linux-x86_64-cuda", config, "generate", "passed", detail="all generations ran"))
    for step in ex.check(CheckContext(MATRIX, CUDA, run, ["cuda-pin-all", "cuda-nopin"])):
        run.record_step(step)
    run.write_summary()
    return run


def test_the_step_records_status_log_and_signature(tmp_path):
    clean = _run(tmp_path, "clean", CLEAN)
    steps = {s.config: s for s in clean.steps if s.step == "expectations"}
    assert steps["cuda-pin-all"].status == "passed"
    assert steps["cuda-pin-all"].detail == "placement, pinned, mapped, claims, warnings as expected in 2 load(s)"
    assert clean.overall() == "passed"
    planted = _run(tmp_path, "planted", PAGEABLE_PLANT)
    step = next(s for s in planted.steps if s.step == "expectations" and s.config == "cuda-pin-all")
    assert step.status == "failed" and planted.overall() == "failed"
    assert {f.status for f in step.failures} == {"placement", "pinned"}
    log = (planted.dir / step.log).read_text()
    assert ("engine.stderr): placement: failed: expert tensors of layers 0-7 in CPU, expected CUDA_Host "
            "(the probe)") in log
    assert "long-prefill.r2.stderr): pinned: failed: 0.000 of the expert tensors page-locked" in log
    sig = classify_step(planted.dir, step)
    assert (sig.kind, sig.key) == ("placement", "placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 "
                                                "in CPU, expected CUDA_Host")
    assert sig.summary == ("placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 in CPU, expected "
                           "CUDA_Host (the probe)")
    record = json.loads((planted.layout.config("linux-x86_64-cuda", "cuda-pin-all") / "expectations.json").read_text())
    facts = record["loads"][0]["facts"]
    assert facts["probe_buffers"] == {"CPU": 4962910208, "CUDA0": 334635008}
    assert facts["layers"] == {"CPU": list(range(8))} and facts["pinned_fraction"] == 0.0
    assert not any(s.status == "failed" for s in planted.steps if s.config == "cuda-nopin")
    suite = checks_xml("linux-x86_64-cuda", planted.steps, ["expectations"]).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failure = suite.find("./testsuite/testcase[@name='cuda-pin-all']/failure")
    assert failure is not None and "expected CUDA_Host" in failure.get("message")
    assert ET.tostring(suite)  # a well-formed document

    html = render_html(planted.dir)
    assert "placement: failed (expert tensors of layers 0-7 in CPU, expected CUDA_Host (the probe))" in html

    report = triage.diff_runs(clean.dir, planted.dir)
    kinds = {(t.kind, t.what) for t in report.regressions}
    assert ("step", "cuda-pin-all expectations") in kinds
    assert ("placement", "cuda-pin-all moe-large: probed layers") in kinds
    assert ("pinning", "cuda-pin-all moe-large: probed page-locked") in kinds
    assert not any("cuda-nopin" in w for _, w in kinds)  # its buffers already were CPU, and nothing pinned
    moved = next(t for t in report.regressions if t.what == "cuda-pin-all moe-large: probed layers")
    assert (moved.before, moved.after) == ("CUDA_Host: 0-7", "CPU: 0-7")
    assert moved.signature["key"] == "probed layers moved: cuda-pin-all/moe-large: layers 0-7"
    assert moved.where == {"platform": "linux-x86_64-cuda", "config": "cuda-pin-all", "model": "moe-large"}
    assert moved.detail == "the runtime probe of the engine load"
    assert triage.main([str(clean.dir), str(planted.dir)]) == 1
    assert triage.main([str(clean.dir), str(clean.dir)]) == 0
    back = triage.diff_runs(planted.dir, clean.dir)  # the fault removed: more is pinned, the layers went back
    assert ("step", "cuda-pin-all expectations") in {(t.kind, t.what) for t in back.fixes}


def test_missing_or_unreadable_log_records_make_the_step_incomplete_never_passed(tmp_path):
    run = Run.open(tmp_path, "r")
    write_json(run.layout.model_json("linux-x86_64-cuda", "moe-large"), moe_large())
    gen_dir = run.layout.gen_dir("linux-x86_64-cuda", "cuda-pin-all", "moe-large")
    gen_dir.mkdir(parents=True)
    (gen_dir / "engine.stderr").write_text("a load that logged no buffer line\n")
    shutil.copy(gen("cuda-pin-all") / PROBE_FILE, gen_dir)
    run.record_step(StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate", "passed"))
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0])
    assert step.status == "incomplete" and "no placement record" in step.detail
    shutil.copy(gen("cuda-pin-all") / "engine.placement.json", gen_dir)
    (gen_dir / "engine.pin-ladder.json").write_text("{not json")
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0])
    assert step.status == "incomplete" and "engine.pin-ladder.json cannot be read" in step.detail
    run.record_step(step)
    assert run.overall() == "incomplete"
    shutil.copy(gen("cuda-pin-all") / "engine.pin-ladder.json", gen_dir)
    assert ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0]).status == "passed"
    run.layout.model_json("linux-x86_64-cuda", "moe-large").unlink()
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], run.steps[0])
    assert step.status == "incomplete" and "model summary" in step.detail


def test_a_check_that_raises_on_one_platform_is_an_error_step_there_and_the_others_are_checked(tmp_path):
    run = Run.open(tmp_path, "r")

    def broken_on_cuda(ctx):
        if ctx.platform is CUDA:
            raise KeyError("buffers")
        return [StepRecord(ctx.platform.name, c, "other-check", "passed") for c in ctx.configs]

    ctx = SimpleNamespace(matrix=MATRIX, run=run, generated={CUDA.name: ["fork"], CPU.name: ["base", "fork"]})
    steps = list(check_platforms(ctx, "other-check", broken_on_cuda))
    assert [(s.platform, s.config, s.step, s.status) for s in steps] == [
        (CUDA.name, "-", "other-check", "error"), (CPU.name, "base", "other-check", "passed"),
        (CPU.name, "fork", "other-check", "passed")]
    assert "KeyError: 'buffers'" in steps[0].detail


def test_loads_of_a_failed_generation_are_left_to_the_generate_step(tmp_path):
    from harness.record.records import Failure
    run = Run.open(tmp_path, "r")
    gen_dir = run.layout.gen_dir("linux-x86_64-cuda", "cuda-pin-all", "moe-large")
    gen_dir.mkdir(parents=True)
    (gen_dir / "engine.stderr").write_text("error: unable to load model\n")
    failed = StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate", "failed",
                        failures=[Failure("generation", model="moe-large", prompt="story", status="crashed")])
    step = ex.check_config(run.layout, CUDA, MATRIX.configs["cuda-pin-all"], failed)
    assert step.status == "skipped" and "a generation of this model failed" in step.detail


def test_a_crashed_prompt_leaves_out_its_own_loads_and_the_models_other_loads_are_judged(tmp_path):
    from harness.record.records import Failure
    layout = _copy_run(tmp_path, CLEAN, ["cuda-pin-all"])
    loads = {stem for _, stem, _ in layout.load_logs("linux-x86_64-cuda", "cuda-pin-all")}
    assert loads == {"engine", LLAMA_COMPLETION}

    def crashed(prompt: str) -> StepRecord:
        return StepRecord("linux-x86_64-cuda", "cuda-pin-all", "generate", "failed",
                          failures=[Failure("generation", model="moe-large", prompt=prompt, status="crashed")])

    step = ex.check_config(layout, CUDA, MATRIX.configs["cuda-pin-all"], crashed("story"))
    assert step.status == "passed" and "in 2 load(s)" in step.detail  # story has no load record of its own
    step = ex.check_config(layout, CUDA, MATRIX.configs["cuda-pin-all"], crashed("long-prefill"))
    assert step.status == "passed" and "in 1 load(s)" in step.detail
    record = _record(layout, "cuda-pin-all")
    assert [x["load"] for x in record["loads"] if "skipped" in x] == [LLAMA_COMPLETION]
    # a real fault in the other loads is still found: the run of the patch that leaves the host buffers pageable
    planted = _copy_run(tmp_path, PAGEABLE_PLANT, ["cuda-pin-all"])
    step = ex.check_config(planted, CUDA, MATRIX.configs["cuda-pin-all"], crashed("story"))
    assert step.status == "failed" and "pinned" in {f.status for f in step.failures}
