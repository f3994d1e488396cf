"""Reloads (harness.stages.checks.reloads): a model loaded, probed and freed again in one process.

Which configurations reload is read from the real matrix.  The rules are judged on records of the
fake engine (tests/fake_engine.py, request ``reload``), which loads and frees a small host buffer and
reads the process's real memory, and, through the environment, reports driver counts as a CUDA build
would: a clean series (every freed range given back), a registration kept after each free
(``FAKE_RELOAD_LEAK``: 2 MiB left page-locked, every later load granted 2 MiB less), a buffer kept
resident after its free (``FAKE_RELOAD_KEEP``).  The real engine's record comes from an H200
(docs/checks.md "reloads": the command; not run here, no GPU on this machine).
"""

from __future__ import annotations

import json
from dataclasses import replace
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.triage.signatures import classify_step
from harness.matrix.config import MatrixError, load_matrix
from harness.record.reloads import ReloadError, parse_reloads, read_reloads
from harness.record.records import StepRecord
from harness.matrix.loading import arg_value, pin_configuration, reload_count, uses_mmap
from harness.stages.checks.reloads import judge
from harness.stages.outputs.engine import EngineSession

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
FAKE_ENGINE = [sys.executable, str(ROOT / "tests" / "fake_engine.py")]
MIB = 2**20


def fake_record(tmp_path: Path, count: int = 3, **env: str) -> dict:
    """The reload record the fake engine writes for ``count`` loads under ``env``."""
    path = tmp_path / "engine.reloads.json"
    with EngineSession(FAKE_ENGINE, env, tmp_path / "engine.reloads.log", tmp_path / "engine.reloads.cmd",
                       load_timeout_s=30, request_timeout_s=30) as session:
        assert session.reload(count, path)["loads"] == count
    return json.loads(path.read_text())


def bad(findings) -> set[tuple[str, str, str]]:
    return {(f.rule, f.status, f.key) for f in findings if f.status != "passed"}


def test_the_pin_configurations_of_the_matrix_reload_three_times_and_no_other():
    cuda, cpu = MATRIX.platforms["linux-x86_64-cuda"], MATRIX.platforms["linux-x86_64-cpu"]
    counts = {name: reload_count(MATRIX, cuda, c) for name, c in MATRIX.configs.items()}
    assert MATRIX.reloads.count == 3 and MATRIX.reloads.rss_slack_mib == 256
    for name in ("cuda-pin-all", "cuda-pin-layers-2", "cuda-pin-layers-half", "cuda-sim-partial"):
        assert counts[name] == 3, name
    for name in ("cuda-nopin", "cuda-base-host-experts", "base", "fork", "fork-load-none"):
        assert counts[name] == 0, name  # no pinning, upstream's build, or the model memory-mapped
    assert not any(reload_count(MATRIX, cpu, c) for c in MATRIX.configs.values())
    assert pin_configuration(cuda, MATRIX.configs["cuda-pin-all"])


def test_an_argument_s_value_is_read_in_both_forms_the_last_one_counting_and_none_when_absent_or_trailing():
    """arg_value: the value of ``--flag value`` and of ``--flag=value``, of the last of the names given where
    several are there; None (not an empty value) where no name is there or the last word is the flag itself,
    which expectation_rules tells apart from a value with ``is not None``."""
    assert arg_value(["-m", "x.gguf", "--load-mode", "none"], "--load-mode", "-lm") == "none"
    assert arg_value(["--load-mode=dio", "-ngl", "99"], "--load-mode", "-lm") == "dio"
    assert arg_value(["--load-mode", "none", "-lm", "auto"], "--load-mode", "-lm") == "auto"
    assert arg_value(["-lm=mmap", "--load-mode=none"], "--load-mode", "-lm") == "none"
    assert arg_value(["-m", "x.gguf"], "--load-mode", "-lm") is None
    assert arg_value(["-m", "x.gguf", "--load-mode"], "--load-mode", "-lm") is None


def test_the_short_flags_count_as_the_long_ones_for_the_load_mode_and_the_pinned_experts():
    """llama's ``-lm`` is ``--load-mode`` and ``-cmoe`` is ``--cpu-moe`` (common/arg.cpp): a fork configuration
    written with the short flags is the same pin configuration, reloaded as often."""
    assert not uses_mmap(["-lm", "none"]) and not uses_mmap(["-lm=dio"]) and uses_mmap(["-lm", "mmap"])
    cuda = MATRIX.platforms["linux-x86_64-cuda"]
    short = replace(MATRIX.configs["cuda-pin-all"], args=("-lm", "none", "-cmoe", "-ngl", "99"))
    assert pin_configuration(cuda, short) and reload_count(MATRIX, cuda, short) == MATRIX.reloads.count
    assert not pin_configuration(cuda, replace(short, args=("-lm", "none", "-ngl", "99")))


def test_a_configuration_sets_its_own_count_and_the_schema_bounds_it(tmp_path):
    text = (ROOT / "matrix.yaml").read_text()
    own = tmp_path / "matrix.yaml"
    own.write_text(text.replace("  cuda-pin-all:\n    build: fork\n", "  cuda-pin-all:\n    build: fork\n    reloads: 0\n", 1)
                   .replace("    count: 3 ", "    count: 5 ", 1))
    m = load_matrix(own)
    assert m.reloads.count == 5 and m.configs["cuda-pin-all"].reloads == 0
    assert reload_count(m, m.platforms["linux-x86_64-cuda"], m.configs["cuda-pin-all"]) == 0
    assert reload_count(m, m.platforms["linux-x86_64-cuda"], m.configs["cuda-pin-layers-2"]) == 5
    own.write_text(text.replace("    count: 3 ", "    count: 50 ", 1))
    with pytest.raises(MatrixError, match=r"defaults.*reloads.*count"):
        load_matrix(own)


def test_a_clean_record_passes_every_rule(tmp_path):
    record = parse_reloads(fake_record(tmp_path, FAKE_RELOAD_DRIVER="1"))
    assert len(record.cycles) == 3 and record.driver == "cuda" and record.baseline.rss
    assert [c.granted for c in record.cycles] == [4 * MIB] * 3 and not any(c.left for c in record.cycles)
    findings = judge(record, 256 * MIB)
    assert not bad(findings) and [f.rule for f in findings] == ["freed", "baseline", "grant", "memory"]
    assert findings[0].message == ("no page-locked byte left in the freed host buffers after 3 load(s) "
                                   "(granted 4 MiB each time it was asked)")


def test_a_registration_kept_after_free_fails_freed_and_grant(tmp_path):
    findings = judge(parse_reloads(fake_record(tmp_path, FAKE_RELOAD_DRIVER="1", FAKE_RELOAD_LEAK="1")), 256 * MIB)
    assert bad(findings) == {("freed", "failed", "page-locked bytes left in freed host buffers"),
                             ("grant", "failed", "a later load was granted less than the first")}
    by_rule = {f.rule: f.message for f in findings}
    assert by_rule["freed"] == ("after the free of load 1 of 3 the driver reports 2 MiB page-locked in the freed "
                                "CUDA_Host buffer(s) (granted 4 MiB while loaded)")
    assert by_rule["grant"] == "load 2 of 3 was granted 2 MiB page-locked, the first 4 MiB (the driver)"


def test_memory_kept_after_free_fails_memory_and_locked_memory_that_moved_fails_baseline(tmp_path):
    data = fake_record(tmp_path, FAKE_RELOAD_KEEP="1")
    assert bad(judge(parse_reloads(data), 1 * MIB)) == {
        ("memory", "failed", "resident memory not given back after a free")}
    assert not bad(judge(parse_reloads(data), 256 * MIB))  # 12 MiB kept, within the matrix's bound
    data["cycles"][1]["freed"]["locked"] = (data["baseline"]["locked"] or 0) + MIB  # an mlock left behind
    assert bad(judge(parse_reloads(data), 256 * MIB)) == {("baseline", "failed", "VmLck not back at its baseline after a free")}


def test_a_build_without_cuda_says_what_it_did_not_check(tmp_path):
    findings = judge(parse_reloads(fake_record(tmp_path)), 256 * MIB)
    assert not bad(findings)
    assert {f.rule: f.key for f in findings}["freed"] == "not checked"


def test_a_malformed_or_refused_record_raises_saying_why(tmp_path):
    data = fake_record(tmp_path, count=1, FAKE_RELOAD_DRIVER="1")
    data["cycles"][0]["buffers"][0]["page_locked_after_free"] = 8 * MIB
    with pytest.raises(ReloadError, match=r"cycles\[0\]\.buffers\[0\]: page-locked bytes beyond the buffer's 4194304"):
        parse_reloads(data)
    path = tmp_path / "engine.reloads.json"
    path.write_text(json.dumps({"error": "engine died (SIGSEGV) while reloading the model"}))
    with pytest.raises(ReloadError) as err:
        read_reloads(path)
    assert err.value.engine_failed and "SIGSEGV" in str(err.value)
    path.unlink()
    with pytest.raises(ReloadError, match="missing") as err:
        read_reloads(path)
    assert not err.value.engine_failed


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_the_reloads_step_passes_a_clean_fake_run_and_fails_a_kept_registration_with_a_signature(tmp_path):
    project = make_fake_project(tmp_path)
    project.matrix.write_text(project.matrix.read_text().replace("  fork: {build: fork}", "  fork: {build: fork, reloads: 2}"))
    clean = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT, env=project.env(FAKE_RELOAD_DRIVER="1"),
                           capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    summary = json.loads((project.results / "latest" / "summary.json").read_text())
    steps = {(s["config"], s["step"]): s for s in summary["configurations"]}
    assert steps[("fork", "reloads")]["status"] == "passed" and ("base", "reloads") not in steps
    gen = project.results / "latest" / "linux-x86_64-cpu" / "fork" / "gen" / "tiny"
    assert len(read_reloads(gen / "engine.reloads.json").cycles) == 2 and (gen / "engine.reloads.log").exists()

    leak = subprocess.run(project.argv("compare-outputs"), cwd=ROOT,
                          env=project.env(FAKE_RELOAD_DRIVER="1", FAKE_RELOAD_LEAK="1"), capture_output=True, text=True)
    assert leak.returncode == 1, leak.stdout + leak.stderr
    summary = json.loads((project.results / "latest" / "summary.json").read_text())
    assert all(c["status"] == "identical" for c in summary["comparisons"])
    step = next(s for s in summary["configurations"] if (s["config"], s["step"]) == ("fork", "reloads"))
    assert step["status"] == "failed" and {f["status"] for f in step["failures"]} == {"freed", "grant"}
    sig = classify_step(project.results / "latest", StepRecord.from_json(step))
    assert (sig.kind, sig.key) == ("reload", "reloads: fork/tiny: freed: page-locked bytes left in freed host buffers")


def test_a_session_restored_from_the_cache_owes_its_reloads_until_a_record_of_that_count_is_there(tmp_path):
    from harness.stages.outputs.greedy import GreedyRunner, Hooks, Side

    counts = {"pin": 3, "plain": 0}
    runner = GreedyRunner(Hooks(engine=None, completion=None, out_dir=lambda side: tmp_path,
                                reloads=lambda side: counts[side.config]), prompts={}, work_dir=tmp_path)
    pin, plain = Side("linux-x86_64-cuda", "pin"), Side("linux-x86_64-cuda", "plain")
    assert runner._reloads_owed(pin, tmp_path) and not runner._reloads_owed(plain, tmp_path)
    (tmp_path / "engine.reloads.json").write_text(json.dumps({"error": "engine died"}))
    assert runner._reloads_owed(pin, tmp_path)
    (tmp_path / "engine.reloads.json").write_text(json.dumps({"count": 2}))
    assert runner._reloads_owed(pin, tmp_path)
    (tmp_path / "engine.reloads.json").write_text(json.dumps({"count": 3}))
    assert not runner._reloads_owed(pin, tmp_path)


#: The reloads of tests/plants/cuda-pin-large-buffer-kept-registered-after-free.patch (one H200, 2026-12-04) and of
#: the clean series just after it on the same machine.
RELOAD_PLANT = ROOT / "results" / "evidence" / "plant-reload-20261204T073318Z" / "linux-x86_64-cuda"
RELOAD_CLEAN = ROOT / "results" / "evidence" / "gpu1-20261204T073536Z" / "linux-x86_64-cuda"
FREED = ("freed", "failed", "page-locked bytes left in freed host buffers")
KEPT = ("memory", "failed", "resident memory not given back after a free")


@pytest.mark.parametrize("config, expected", [
    ("cuda-pin-all", {FREED, KEPT}), ("cuda-pin-layers-2", {FREED, KEPT}), ("cuda-pin-layers-half", {FREED, KEPT}),
    # granted nothing on their reloads, but the block the plant keeps stays resident
    ("cuda-sim-partial", {KEPT}), ("cuda-sim-sticky", {KEPT}),
])
def test_the_plant_that_keeps_a_freed_buffer_page_locked_fails_the_recorded_reloads(config, expected):
    slack = MATRIX.reloads.rss_slack_mib * MIB
    record = RELOAD_PLANT / config / "gen" / "moe-large" / "engine.reloads.json"
    assert bad(judge(read_reloads(record), slack)) == expected
    clean = RELOAD_CLEAN / config / "gen" / "moe-large" / "engine.reloads.json"
    assert not bad(judge(read_reloads(clean), slack))
