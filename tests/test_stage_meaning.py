"""A stage owns what its steps mean: each step declares the statuses it may end in and what its failure is read
from (harness.stages.shape.StepSpec); the signatures ask that declaration, never the step's name, and the run
loop holds what a stage records to it (harness.pipeline: an undeclared step or status stops a run of the test
suite, tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import pipeline
from harness.triage import signatures
from harness.matrix.config import load_matrix
from harness.pipeline import Options, UndeclaredStep, run_stages
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_STATUSES
from harness.stages import table
from harness.stages.shape import EVIDENCE, Stage, StepSpec
from harness.stages.table import STAGES, step_spec, undeclared

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
CPU = "linux-x86_64-cpu"


def test_every_step_declares_statuses_of_the_record_and_evidence_the_signatures_read():
    for stage in STAGES:
        for spec in stage.steps:
            assert spec.statuses and set(spec.statuses) <= set(STEP_STATUSES) - {"interrupted"}, spec
            assert spec.evidence in EVIDENCE, spec
    assert signatures.evidence_read() == set(EVIDENCE)  # each kind a step may declare has its reader
    assert step_spec("speed:base-vs-fork:pp").evidence == "speed-rule" and step_spec("generate-memcheck").evidence \
        == "sanitizer-log" and step_spec("generate").evidence == "generations" and step_spec("no-such-step") is None


def test_a_declaration_outside_its_vocabulary_is_refused():
    with pytest.raises(ValueError, match="statuses 'interrupted'"):
        StepSpec("x", ("interrupted",))
    with pytest.raises(ValueError, match="evidence 'tea-leaves'"):
        StepSpec("x", (STEP_PASSED,), "tea-leaves")


def _toy(records: list[StepRecord]) -> tuple[Stage, ...]:
    """One build-command stage that records ``records`` and declares the step ``toy`` as passed or failed."""
    return (Stage("toy", "build", "building", reads=("matrix",), writes=("steps",),
                  steps=(StepSpec("toy", (STEP_PASSED, STEP_FAILED)),),
                  run=lambda ctx: [ctx.run.record_step(r) for r in records] and None),)


def test_a_step_or_status_no_stage_declares_stops_a_strict_run_and_keeps_what_it_recorded(tmp_path):
    run = Run(tmp_path / "results", "toy")
    planted = [StepRecord(CPU, "fork", "toy", STEP_PASSED), StepRecord(CPU, "base", "toy", STEP_ERROR),
               StepRecord(CPU, "-", "toy-extra", STEP_PASSED)]
    with pytest.raises(UndeclaredStep, match=f"{CPU} toy base: error; {CPU} toy-extra -: passed"):
        run_stages(MATRIX, run, Options(platforms=[CPU]), ["build"], say=lambda _: None, table=_toy(planted))
    summary = json.loads((run.dir / "summary.json").read_text())
    assert [(s["step"], s["config"]) for s in summary["configurations"]] == \
        [("toy", "fork"), ("toy", "base"), ("toy-extra", "-")]


def test_without_strictness_an_undeclared_step_is_recorded_and_named(tmp_path, monkeypatch):
    monkeypatch.delenv(pipeline.STRICT_ENV)
    lines: list[str] = []
    run = Run(tmp_path / "results", "toy")
    code = run_stages(MATRIX, run, Options(platforms=[CPU]), ["build"], say=lines.append,
                      table=_toy([StepRecord(CPU, "fork", "toy", STEP_PASSED), StepRecord(CPU, "base", "toy", STEP_ERROR)]))
    assert code == 1 and any(line.startswith(f"warning: {CPU} toy base: error: no stage declares") for line in lines)


def test_the_declared_stages_record_only_what_they_declare():
    assert undeclared([StepRecord(CPU, "fork", "build", STEP_PASSED), StepRecord(CPU, "-", "speed", "interrupted"),
                       StepRecord(CPU, "fork", "expectations", "incomplete")]) == []
    assert undeclared([StepRecord(CPU, "-", "speed:g:pp", "skipped")]) == [f"{CPU} speed:g:pp -: skipped"]


def test_a_new_stages_failure_is_read_from_the_evidence_it_declares(tmp_path, monkeypatch):
    """A stage added to the table with a step of its own: its failed step is signed from the logs its declaration
    names, where the same step undeclared is signed from its detail only."""
    logs = tmp_path / CPU / "build-fork"
    logs.mkdir(parents=True)
    (logs / "build.log").write_text("[3/9] Building CXX object src/llama.cpp.o\nFAILED: src/llama.cpp.o\n"
                                    "/src/llama.cpp/src/llama.cpp:12:5: error: 'pin_all' was not declared in this scope\n")
    step = StepRecord(CPU, "fork", "lint-build", STEP_FAILED, detail="the lint build failed")
    assert signatures.classify_step(tmp_path, step).kind == "other"
    lint = Stage("lint", "build", "building", reads=("matrix",), writes=("steps",),
                 steps=(StepSpec("lint-build", (STEP_PASSED, STEP_FAILED), "build-logs"),), run=lambda ctx: None)
    monkeypatch.setattr(table, "STAGES", (*STAGES, lint))
    found = signatures.classify_step(tmp_path, step)
    assert found.kind == "compile_error" and "pin_all" in found.key
    assert logs / "build.log" in signatures.step_logs(tmp_path, step)


#: A stage module of its own, as a new stage would be written: one step, its statuses and the function that signs
#: its failure from the file it writes; nothing of it is known to harness.triage.signatures.
LINT_STAGE = '''
import json
from pathlib import Path

from harness.record.records import StepRecord
from harness.common.statuses import STEP_FAILED, STEP_PASSED
from harness.stages.shape import FailureSign, Stage, StepSpec

STEP_NAME = "lint"


def sign(run_dir: Path, step: StepRecord) -> FailureSign | None:
    try:
        finding = json.loads((run_dir / "lint.json").read_text(encoding="utf-8"))
    except OSError:
        return None
    where = f"{finding['file']}: {finding['rule']}"
    return FailureSign("other", f"lint: {where}", f"lint: {where} (line {finding['line']})", (finding["text"],))


def run(ctx):
    (ctx.run.dir / "lint.json").write_text(json.dumps({"rule": "no-tabs", "file": "ggml/src/ggml.c", "line": 12,
                                                        "text": "ggml/src/ggml.c:12: a tab"}), encoding="utf-8")
    ctx.run.record_step(StepRecord(ctx.platforms("build")[0].name, "-", STEP_NAME, STEP_FAILED,
                                   detail="1 lint finding"))


STAGE = Stage("lint", "build", "building", reads=("matrix",), writes=("steps", "files"),
              steps=(StepSpec(STEP_NAME, (STEP_PASSED, STEP_FAILED), signs=sign),), run=run)
'''


def test_a_new_stage_signs_its_own_failure_without_a_reader_in_the_signatures(tmp_path, monkeypatch):
    """A stage with a failure signature of its own is its module and its line in the table: the step it
    records is held to its declaration, and the signatures ask its declaration's ``signs`` for the failure's signature."""
    import importlib.util
    (tmp_path / "lint_stage.py").write_text(LINT_STAGE, encoding="utf-8")
    found = importlib.util.spec_from_file_location("lint_stage", tmp_path / "lint_stage.py")
    lint = importlib.util.module_from_spec(found)
    found.loader.exec_module(lint)
    assert step_spec("lint") is None
    monkeypatch.setattr(table, "STAGES", (*STAGES, lint.STAGE))  # its one line in the table
    assert step_spec("lint").evidence == "own"
    run = Run(tmp_path / "results", "lint")
    code = run_stages(MATRIX, run, Options(platforms=[CPU]), ["build"], say=lambda _: None,
                      table=(lint.STAGE,))
    assert code == 1
    [entry] = signatures.classify_run(run.dir, write=False)
    assert entry["step"] == "lint" and entry["signature"] == {
        "kind": "other", "key": "lint: ggml/src/ggml.c: no-tabs", "summary": "lint: ggml/src/ggml.c: no-tabs (line 12)",
        "evidence": "ggml/src/ggml.c:12: a tab"}
    (run.dir / "lint.json").unlink()  # its own record gone: the failure is signed from its detail
    assert signatures.classify_step(run.dir, StepRecord(CPU, "-", "lint", STEP_FAILED, detail="1 lint finding")).key \
        == "1 lint finding"


def test_a_reader_of_its_own_is_declared_alone_and_signs_a_known_kind(tmp_path, monkeypatch):
    from harness.stages.shape import FailureSign
    with pytest.raises(ValueError, match="evidence 'build-logs' and a reader of its own"):
        StepSpec("lint", (STEP_FAILED,), "build-logs", signs=lambda run_dir, step: None)
    odd = Stage("lint", "build", "building", reads=("matrix",), writes=("steps",), run=lambda ctx: None,
                steps=(StepSpec("lint", (STEP_FAILED,), signs=lambda run_dir, step: FailureSign("tea", "k", "s")),))
    monkeypatch.setattr(table, "STAGES", (*STAGES, odd))
    with pytest.raises(ValueError, match="kind 'tea'"):
        signatures.classify_step(tmp_path, StepRecord(CPU, "-", "lint", STEP_FAILED))
