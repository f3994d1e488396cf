"""One shape for every stage: the table's entries declare it, and the run loop runs any stage through it alone."""

from __future__ import annotations

import ast
import json
import signal
import threading
from pathlib import Path

import pytest

from harness import pipeline
from harness.common import proc
from harness.matrix.config import load_matrix
from harness.pipeline import Options, run_stages
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.common.statuses import STEP_STATUSES
from harness.stages.shape import COMMANDS, READS, ROLES, WRITES, Stage
from harness.stages.table import STAGES, stages_of, steps_of_role

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
CPU = "linux-x86_64-cpu"


def test_every_stage_of_the_table_declares_the_shape():
    assert STAGES and all(isinstance(s, Stage) for s in STAGES)
    assert len({s.name for s in STAGES}) == len(STAGES)
    for s in STAGES:
        assert s.command in COMMANDS and s.role in ROLES, s
        assert set(s.reads) <= set(READS) and set(s.writes) <= set(WRITES) and s.steps, s
        assert set(s.statuses) <= set(STEP_STATUSES) - {"interrupted"}, s
        assert callable(s.run)
        # a stage lives in the folder of its role
        assert s.run.__module__.startswith(f"harness.stages.{s.role}."), (s.name, s.run.__module__)
    assert {c: [s.name for s in stages_of(c)] for c in COMMANDS} == {
        "build": ["compile", "build"], "test": ["test", "upstream-tests", "generate-sanitized"],
        "compare-outputs": ["compare", "crash-memcheck", "expectations", "reloads", "speed"]}
    assert steps_of_role("checks") == ("expectations", "reloads")


def test_a_declaration_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="reads 'weather'"):
        Stage("x", "build", "building", reads=("weather",), writes=(), steps=("x",), statuses=("passed",),
              run=lambda ctx: None)
    with pytest.raises(ValueError, match="statuses 'interrupted'"):
        Stage("x", "build", "building", reads=(), writes=(), steps=("x",), statuses=("interrupted",),
              run=lambda ctx: None)
    with pytest.raises(ValueError, match="command 'deploy'"):
        Stage("x", "deploy", "building", reads=(), writes=(), steps=("x",), statuses=("passed",), run=lambda ctx: None)
    speed = next(s for s in STAGES if s.name == "speed")
    assert speed.records("speed:base-vs-fork:pp") and not speed.records("generate")


def _literals(path: Path) -> set[str]:
    """Every string constant of a module's code, docstrings left out (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings}


def test_the_run_loop_names_no_stage_step_or_command():
    names = {s.name for s in STAGES} | {step for s in STAGES for step in s.step_names} | set(COMMANDS)
    literals = _literals(Path(pipeline.__file__))
    assert not {lit for lit in literals for n in names if n in lit.split()}, literals
    assert "checks" in literals  # the role whose steps JUnit's checks file holds: a role, not a stage


def _shown(ctx, step: StepRecord) -> None:
    """What every stage does with a step it decided: shown as a console step, recorded as it finishes."""
    with ctx.console.step(f"[{step.platform}] {step.step} {step.config}") as shown:
        shown.finish(step.status, step.detail)
    ctx.run.record_step(step)


def _toy_table(seen: list[str], interrupt: bool = False) -> tuple[Stage, ...]:
    """A build command of three toy stages: one beside, one that records two steps, one that records as it goes
    (and, with ``interrupt``, is stopped by SIGINT while its step is in progress); a test command after it."""

    def beside(ctx):
        seen.append(f"beside in {threading.current_thread().name}")
        _shown(ctx, StepRecord(CPU, "-", "toy-beside", "passed", detail="ran beside"))

    def returns(ctx):
        seen.append("returns")
        _shown(ctx, StepRecord(CPU, "fork", "toy", "passed", detail="one"))
        _shown(ctx, StepRecord(CPU, "base", "toy", "failed", detail="two"))

    def records(ctx):
        seen.append("records")
        with ctx.doing(CPU, "fork", "toy-long"):
            ctx.run.record_step(StepRecord(CPU, "fork", "toy-first", "passed"))
            if interrupt:
                raise proc.Interrupted(signal.SIGINT)
        return None

    def later(ctx):
        seen.append("later")
        _shown(ctx, StepRecord(CPU, "-", "toy-later", "passed"))

    def stage(name, command, run, steps, beside=False):
        return Stage(name, command, "building", reads=("matrix",), writes=("steps",), steps=steps,
                     statuses=("passed", "failed"), run=run, beside=beside)

    return (stage("toy-beside", "build", beside, ("toy-beside",), beside=True),
            stage("toy", "build", returns, ("toy",)),
            stage("toy-long", "build", records, ("toy-first", "toy-long")),
            stage("toy-later", "test", later, ("toy-later",)))


def _summary(run: Run) -> dict:
    return json.loads((run.dir / "summary.json").read_text())


def test_a_toy_stage_in_a_table_runs_and_its_steps_and_statuses_are_recorded(tmp_path):
    seen: list[str] = []
    lines: list[str] = []
    run = Run(tmp_path / "results", "toy")
    code = run_stages(MATRIX, run, Options(platforms=[CPU]), ["build", "test"], say=lines.append,
                      table=_toy_table(seen))
    assert code == 1  # a toy step failed
    assert seen[1:] == ["returns", "records", "later"] and seen[0].startswith("beside in toy-beside")
    steps = {(s["config"], s["step"]): s["status"] for s in _summary(run)["configurations"]}
    assert steps == {("-", "toy-beside"): "passed", ("fork", "toy"): "passed", ("base", "toy"): "failed",
                     ("fork", "toy-first"): "passed", ("-", "toy-later"): "passed"}
    assert not lines  # the loop says nothing of a step: each stage shows its own


def test_a_stage_that_hands_its_steps_back_to_the_loop_stops_the_run_and_no_step_is_lost(tmp_path):
    """The old shape of a check stage, its steps returned for the loop to record and say, is refused: the loop
    records no step, so they would be lost."""
    def returns(ctx):
        yield StepRecord(CPU, "fork", "toy", "passed", detail="one")

    table = (Stage("toy", "build", "building", reads=("matrix",), writes=("steps",), steps=("toy",),
                   statuses=("passed",), run=returns),)
    run = Run(tmp_path / "results", "returns")
    with pytest.raises(pipeline.StageReturned, match="stage toy returned generator"):
        run_stages(MATRIX, run, Options(platforms=[CPU]), ["build"], say=lambda _: None, table=table)
    assert _summary(run)["overall"] == "incomplete"


def test_a_toy_stage_interrupted_records_its_step_and_the_commands_not_reached(tmp_path):
    seen: list[str] = []
    run = Run(tmp_path / "results", "toy-int")
    code = run_stages(MATRIX, run, Options(platforms=[CPU]), ["build", "test"], say=lambda _: None,
                      table=_toy_table(seen, interrupt=True))
    assert code == 130
    assert "later" not in seen
    summary = _summary(run)
    steps = {(s["config"], s["step"]): s for s in summary["configurations"]}
    assert steps[("fork", "toy-first")]["status"] == "passed"  # recorded before the interrupt: kept
    assert steps[("fork", "toy-long")]["status"] == "interrupted"
    assert "interrupted by SIGINT; did not finish" in steps[("fork", "toy-long")]["detail"]
    assert summary["overall"] == "failed"  # a toy step had failed before: failed wins over incomplete
    assert any(r.startswith("test: not run (interrupted by SIGINT)") for r in summary["incomplete"])


def test_a_stage_that_an_option_asks_for_is_to_run_only_when_the_option_is_given(tmp_path):
    """A killed `test` run without --sanitize listed generate-sanitized as "not run (interrupted: killed)": the
    stages to run are those the options ask for (Stage.asked_by)."""
    to_run: list[list[str]] = []

    def first(ctx):
        to_run.append(list(ctx.run.progress["to_run"]))
        ctx.run.record_step(StepRecord(CPU, "-", "toy-first", "passed"))

    def toy(name, run, asked_by=""):
        return Stage(name, "test", "native_tests", reads=("matrix",), writes=("steps",), steps=(name,),
                     statuses=("passed",), run=run, asked_by=asked_by)

    table = (toy("toy-first", first), toy("toy-sanitized", lambda ctx: None, asked_by="sanitize"),
             toy("toy-last", lambda ctx: None))
    run_stages(MATRIX, Run(tmp_path / "results", "plain"), Options(platforms=[CPU]), ["test"], say=lambda _: None,
               table=table)
    run_stages(MATRIX, Run(tmp_path / "results", "sanitized"), Options(platforms=[CPU], sanitize="memcheck"),
               ["test"], say=lambda _: None, table=table)
    assert to_run == [["toy-last"], ["toy-sanitized", "toy-last"]]
    with pytest.raises(ValueError, match="asked_by 'no_such_option'"):
        toy("toy-bad", first, asked_by="no_such_option")
    assert [s.name for s in STAGES if not s.asked(Options())] == ["generate-sanitized"]


def test_every_check_stage_of_the_table_records_and_shows_each_step_it_decides(tmp_path):
    """The check stages of STAGES, run by the loop on a platform whose configurations generated but left no record:
    every step each decides is in the run, said in one line, inside one console step with its start and end line."""
    from io import StringIO
    from types import SimpleNamespace

    from harness.common.console import Console

    run = Run(tmp_path / "results", "checks")
    for config in ("base", "fork"):
        run.record_step(StepRecord(CPU, config, "generate", "passed"))
    # the fork loaded its model once and its log holds no placement record: incomplete; the base has no load
    (run.layout.gen_dir(CPU, "fork", "gemma3-270m") / "engine.stderr").parent.mkdir(parents=True)
    (run.layout.gen_dir(CPU, "fork", "gemma3-270m") / "engine.stderr").write_text("load_tensors: done\n")
    out = StringIO()
    console = Console(out, interactive=False, github=False, heartbeat_s=0)
    ctx = SimpleNamespace(matrix=MATRIX, run=run, console=console, say=console.say,
                          generated={CPU: ["base", "fork"]})
    for stage in (s for s in STAGES if s.role == "checks"):
        before = len(run.steps)
        pipeline.run_stage(ctx, stage)
        decided = [s for s in run.steps[before:]]
        assert all(s.step == stage.name for s in decided), decided
        lines = [line for line in out.getvalue().splitlines() if stage.name in line]
        out.truncate(0), out.seek(0)
        if not decided:  # reloads: no pin configuration on the CPU platform, nothing to show
            assert not lines
            continue
        assert lines[0] == f"▶ [{CPU}] {stage.name}"
        said = [f"[{s.platform}] {s.step} {s.config}: {s.status} — {s.detail}" for s in decided]
        assert lines[1:-1] == said
        assert lines[-1].startswith(f"⚠ [{CPU}] {stage.name}: incomplete — {len(decided)} not run ("), lines
    assert [(s.config, s.step, s.status) for s in run.steps[2:]] == [
        ("base", "expectations", "skipped"), ("fork", "expectations", "incomplete")]


def test_every_stage_of_the_table_run_by_the_loop_records_its_steps_and_hands_none_back(tmp_path):
    """Each stage of STAGES, run by the loop against a context that selects the CPU platform, where no platform
    runs (ctx.platforms gives none) and every build failed: none returns anything (StageReturned), and each step
    one records (the speed rules, blocked by their builds) is said in its line."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import nullcontext
    from io import StringIO
    from types import SimpleNamespace

    from harness.common.console import Console
    from harness.matrix.selection import Selection

    def no_model(name):
        raise RuntimeError(f"no model {name}")

    run = Run(tmp_path / "results", "fakes")
    out = StringIO()
    console = Console(out, interactive=False, github=False, heartbeat_s=0)
    ctx = SimpleNamespace(matrix=MATRIX, run=run, opts=Options(), console=console, say=console.say,
                          selection=Selection.of(MATRIX, [CPU]), platforms=lambda step: [], generated={},
                          doing=lambda *where: nullcontext(), builds=SimpleNamespace(bases={"base": None}),
                          model_path=no_model, build_variant=lambda p, v: SimpleNamespace(status="failed"))
    # in a thread of its own, as the loop runs a stage beside the builds: the compile stage marks the thread it
    # runs in as one a holder of builds may wait for (harness.common.locks.joined_by_holder_of), which would stay
    # on pytest's own thread for the tests after this one
    def every_stage() -> None:
        for stage in STAGES:
            pipeline.run_stage(ctx, stage)

    with ThreadPoolExecutor(max_workers=1) as worker:
        worker.submit(every_stage).result()  # its exception, if any, raised here
    assert [s.step for s in run.steps] == ["speed:base-vs-fork:pp", "speed:base-vs-fork:tg"]
    assert out.getvalue().splitlines() == [f"[{s.platform}] {s.step} {s.config}: {s.status} — {s.detail}"
                                           for s in run.steps]
