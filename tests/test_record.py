"""The run record: statuses declared once, structured failure facts, older runs, the layout."""

import json
import re
import stat
import sys
from pathlib import Path

import pytest

from harness.triage import triage
from harness.common import statuses
from harness.record import records
from harness.stages.building.build import BuildResult
from harness.matrix.config import load_matrix
from harness.pipeline import Options, open_context
from harness.stages.outputs.compare_stage import record_generate_steps, run_groups
from harness.views.report import render_html
from harness.record.json_files import load_records
from harness.record.layout import RunLayout
from harness.record.records import ComparisonRecord, Failure, RecordError, StepRecord, legacy_failures
from harness.record.run import Run
from harness.common.statuses import COMPARISON, Status
from harness.triage.signatures import classify_run, step_logs

ROOT = Path(__file__).resolve().parent.parent
CPU = "linux-x86_64-cpu"


def test_a_new_comparison_status_is_one_declaration(tmp_path, monkeypatch):
    # what a new status takes: one entry in harness.common.statuses.COMPARISON, nothing else
    monkeypatch.setitem(COMPARISON.by_name, "needs-newer-upstream",
                        Status("needs-newer-upstream", "neutral", "➖", "upstream cannot run this case"))
    run = Run.open(tmp_path, "r1")
    run.record_step(StepRecord(CPU, "fork", "build", "passed"))
    run.record_comparisons([ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "needs-newer-upstream")])
    assert run.overall() == "passed"  # neutral: not a failure
    assert "| needs-newer-upstream | ⏭️ not run: needs-newer-upstream: upstream cannot run this case |" in \
        run.layout.summary_md.read_text()
    assert 'st-neutral st-needs-newer-upstream' in render_html(run.dir)
    assert classify_run(run.dir) == []
    # an undeclared one is still refused, naming the declared ones
    with pytest.raises(ValueError, match="needs-newer-upstream"):
        ComparisonRecord(CPU, "g", "m", "p", "base", "fork", "sort-of-same")


def test_a_new_unproven_step_status_is_one_declaration_and_makes_the_run_incomplete(tmp_path, monkeypatch):
    monkeypatch.setitem(statuses.STEP.by_name, "quarantined",
                        Status("quarantined", "neutral", "🧪", "the step ran, but its result is held back", unproven=True))
    run = Run.open(tmp_path, "r1")
    run.record_step(StepRecord(CPU, "fork", "build", "passed"))
    assert run.overall() == "passed"
    run.record_step(StepRecord(CPU, "fork", "test", "quarantined"))
    assert run.overall() == "incomplete"
    with pytest.raises(ValueError, match="only a neutral status"):
        Status("odd", "failure", "x", "a failure cannot be unproven", unproven=True)


def test_every_declared_status_says_what_it_means():
    for declared in (statuses.STEP, statuses.COMPARISON, statuses.VERDICT):
        for s in declared.by_name.values():
            assert s.meaning and s.icon and s.outcome in ("success", "failure", "neutral")
    assert statuses.STEP.failures == {"failed", "error"}
    assert statuses.STEP.unproven == {"interrupted", "incomplete"}
    assert statuses.COMPARISON.failures == {"diverged", "crashed", "timeout"}


def test_failure_facts_round_trip_and_are_not_cut(tmp_path):
    run = Run.open(tmp_path, "r1")
    facts = [Failure("generation", model="gemma3-270m", prompt=f"prompt-{i:03}", repeat=1, status="crashed",
                     signal="SIGSEGV", error_line="x" * 80) for i in range(40)]
    run.record_step(StepRecord(CPU, "fork", "generate", "failed", detail="d", failures=facts))
    steps, _, data = load_records(run.dir)
    assert data["record_version"] == records.RECORD_VERSION
    assert steps[0].failures == facts  # all 40 (format 1 cut its detail at 500 characters)
    assert len(classify_run(run.dir)) == 1


def test_records_of_format_1_load_and_newer_formats_are_refused(tmp_path):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"run_id": "old", "configurations": [
        {"platform": CPU, "config": "fork", "step": "generate", "status": "failed", "seconds": 1.0,
         "detail": "gemma3-270m/story: crashed SIGABRT ggml.c:1: GGML_ASSERT(x) failed; "
                   "error: model moe-small: ModelError: bad", "log": ""},
        {"platform": CPU, "config": "fork", "step": "test", "status": "skipped",
         "detail": "fork build failed: compile error", "log": ""}], "comparisons": []}))
    steps, _, _ = load_records(run_dir)
    gen, test = steps
    assert [f.kind for f in gen.failures] == ["generation", "model"]
    assert (gen.failures[0].model, gen.failures[0].prompt, gen.failures[0].signal) == ("gemma3-270m", "story", "SIGABRT")
    assert gen.failures[0].error_line == "ggml.c:1: GGML_ASSERT(x) failed"
    assert test.blocked_by() == ["fork"]

    (run_dir / "summary.json").write_text(json.dumps({"record_version": records.RECORD_VERSION + 1}))
    with pytest.raises(RecordError, match="newer than this harness reads"):
        load_records(run_dir)
    assert legacy_failures("generate", "all generations ran") == []


def test_layout_names_every_path_of_a_run(tmp_path):
    lay = RunLayout(tmp_path)
    assert lay.build_logs(CPU, "fork") == tmp_path / CPU / "build-fork"
    assert lay.tests(CPU, lay.test_step()) == tmp_path / CPU / "tests"
    assert lay.tests(CPU, lay.test_step("memcheck")) == tmp_path / CPU / "tests-memcheck"
    assert lay.generation(CPU, "fork", "m", "story", 2) == tmp_path / CPU / "fork" / "gen" / "m" / "story.r2"
    assert lay.compare_json(CPU, "fork") == tmp_path / CPU / "fork" / "compare.json"
    stem = lay.generation(CPU, "fork", "m", "story", 1)
    stem.parent.mkdir(parents=True)
    stem.with_name("story.r1.stderr").write_text("")
    assert list(lay.all_generation_files(".stderr")) == [(CPU, "fork", "m", "story.r1", stem.with_name("story.r1.stderr"))]



def test_a_run_s_generation_files_are_its_prompts_rounds_and_never_the_engine_s_loads(tmp_path):
    """all_generation_files lists ``<prompt>.r<k><suffix>`` only: the engine's ``engine<suffix>`` beside them is a
    load, not a generation (all_load_files lists both)."""
    lay = RunLayout(tmp_path)
    stem = lay.generation(CPU, "fork", "m", "story", 1)
    stem.parent.mkdir(parents=True)
    for name in ("story.r1.stderr", "engine.stderr", "story.r1.placement.json", "engine.placement.json"):
        stem.with_name(name).write_text("")
    assert [s for *_, s, _ in lay.all_generation_files(".stderr")] == ["story.r1"]
    assert [s for *_, s, _ in lay.all_load_files("placement")] == ["engine", "story.r1"]


def test_triage_totals_the_pin_ladder_of_each_generation_of_a_committed_run_once():
    """pin_totals of gpu1-20261202T165838Z: one entry per ``<prompt>.r<k>.stderr`` of the run (18, counted here
    from the files), none for the engine's loads, whose ladders the report and triage read elsewhere."""
    run = ROOT / "results" / "evidence" / "gpu1-20261202T165838Z"
    generations = {(p.parts[-5], p.parts[-4], p.parent.name, p.name[:-len(".stderr")])
                   for p in run.glob("*/*/gen/*/*.stderr") if re.fullmatch(r".+\.r\d+\.stderr", p.name)}
    totals = triage.pin_totals(run)
    listed = {(platform, config, model, stem) for (platform, config), gens in totals.items() for model, stem in gens}
    assert len(generations) == 18 and listed == generations


def _fake_build(tmp_path: Path, variant: str, script: str) -> BuildResult:
    """llama-completion running ``script``, and an engine that runs ``script`` first, then serves (tests/fake_engine.py)."""
    bin_dir = tmp_path / variant / "bin"
    bin_dir.mkdir(parents=True)
    engine = f"exec {sys.executable} {Path(__file__).with_name('fake_engine.py')}\n"
    for name, body in (("llama-completion", script), ("llama-harness-engine", script + engine)):
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return BuildResult(CPU, variant, "passed", "k", tmp_path / variant, 0.0, False)


def test_the_pipeline_writes_failure_facts_where_generations_fail(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.stages.outputs.jobs.model_summary", lambda path: {})
    matrix = load_matrix(ROOT / "matrix.yaml")
    run = Run.open(tmp_path / "results", "r1")
    pipe = open_context(matrix, run, Options(platforms=[CPU], repeats=1, n_predict=4, models=["gemma3-270m"]),
                        say=lambda _: None)
    p = matrix.platform(CPU)
    pipe.builds.built[(CPU, "base")] = _fake_build(tmp_path, "base", "echo 'hello'; printf '\\n\\n' >&2\n")
    pipe.builds.built[(CPU, "fork")] = _fake_build(
        tmp_path, "fork", "echo 'ggml.c:7: GGML_ASSERT(n > 0) failed' >&2; kill -SEGV $$\n")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    pipe.models.known["gemma3-270m"] = model
    gen_steps: dict = {}
    runner = run_groups(pipe, p, ["base-vs-fork"], gen_steps)
    record_generate_steps(pipe, p, runner, gen_steps)
    fork = run.step(CPU, "fork", "generate")
    assert fork.status == "failed"
    prompts = set(matrix.groups["base-vs-fork"].prompts)
    assert {f.prompt for f in fork.failures if f.kind == "generation"} == prompts, fork.failures
    fact = fork.failures[0]  # the engine's model load: its stderr names the assertion
    assert (fact.kind, fact.model, fact.status, fact.signal, fact.repeat) == \
        ("generation", "gemma3-270m", "crashed", "SIGSEGV", 1)
    assert fact.error_line == "ggml.c:7: GGML_ASSERT(n > 0) failed"
    assert (run.dir / fact.log).is_file() and fact.log.endswith("engine.stderr")
    assert step_logs(run.dir, fork)[0] == run.dir / fact.log
    completion = [f for f in fork.failures if f.log.endswith(".r2.stderr")]  # llama-completion, the last repeat
    assert {f.prompt for f in completion} == prompts and completion[0].signal == "SIGSEGV"
    assert {c.status for c in run.comparisons} == {"crashed"}
    sig = {e["config"]: e["signature"] for e in classify_run(run.dir) if e["step"] == "generate"}["fork"]
    assert sig["kind"] == "test_assertion"

    # a model that cannot be made: every configuration of the group errors with a model fact
    pipe.models.known["gemma3-270m"] = records.RecordError("not a GGUF file")
    gen_steps = {}
    runner = run_groups(pipe, p, ["base-vs-fork"], gen_steps)
    record_generate_steps(pipe, p, runner, gen_steps)
    base = run.step(CPU, "base", "generate")
    assert base.status == "error"
    assert [(f.kind, f.model) for f in base.failures] == [("model", "gemma3-270m")]
