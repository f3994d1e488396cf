"""Run kinds (harness.common.statuses.RUN_KINDS, docs/triage.md): run.json records what a run is, and only the
fork's own runs are its history: triage's previous run, the report's Changes and the rule-history figure choose
by kind, so a forecast that applies cleanly and a bisect point beside the fork's runs change none of them."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from harness.triage import run_choice
from harness.views.report_figures import rule_history, rule_history_figures
from harness.triage.run_choice import previous_run, run_kind
from harness.commands import stage_run_kind
from harness.common.errors import InputError
from harness.common.statuses import (RUN_BISECT, RUN_FORECAST, RUN_FORK, RUN_KINDS, RUN_ROLL, RUN_SERIES,
                                     STEP_FAILED, STEP_PASSED)
from harness.record.inputs import read_run_info
from harness.record.layout import RunLayout
from harness.record.records import RecordError, StepRecord
from harness.record.run import Run

CPU = "linux-x86_64-cpu"


def test_the_five_kinds_are_declared_once():
    assert tuple(RUN_KINDS) == ("fork", "forecast", "roll", "bisect", "series")
    assert (RUN_FORK, RUN_FORECAST, RUN_ROLL, RUN_BISECT, RUN_SERIES) == tuple(RUN_KINDS)


def test_run_json_records_the_kind_the_caller_opens_the_run_with(tmp_path):
    run = Run.open(tmp_path, "b1", kind=RUN_BISECT)
    run.close()
    assert json.loads(RunLayout(run.dir).run_json.read_text())["kind"] == "bisect"
    assert read_run_info(RunLayout(run.dir).run_json).kind == RUN_BISECT
    assert Run.open(tmp_path, "f1").kind == RUN_FORK  # the default: the fork on its own series


def test_a_kind_not_declared_is_refused_when_opened_and_when_read(tmp_path):
    with pytest.raises(ValueError, match="run kind 'planted'"):
        Run.open(tmp_path, "r1", kind="planted")
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run_id": "x", "kind": "planted"}))
    with pytest.raises(RecordError, match="run.json"):
        read_run_info(path)


def test_a_run_continued_as_another_kind_is_refused_and_keeps_its_kind(tmp_path):
    Run.open(tmp_path, "r1", kind=RUN_FORECAST).close()
    with pytest.raises(InputError, match="r1 is a forecast run"):
        Run.open(tmp_path, "r1", kind=RUN_FORK)
    again = Run.open(tmp_path, "r1", kind=RUN_FORECAST)  # a later stage of the same forecast continues it
    again.close()
    info = read_run_info(RunLayout(again.dir).run_json)
    assert info.kind == RUN_FORECAST and len(info.commands) == 2


def test_a_stage_command_is_the_fork_with_the_patches_beside_its_matrix_and_another_series_elsewhere(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "plant").mkdir()
    matrix = tmp_path / "matrix.yaml"
    assert stage_run_kind(argparse.Namespace(matrix=matrix, patches_dir=tmp_path / "patches")) == RUN_FORK
    assert stage_run_kind(argparse.Namespace(matrix=matrix, patches_dir=tmp_path / "plant" / "..")) == RUN_SERIES
    assert stage_run_kind(argparse.Namespace(matrix=matrix, patches_dir=tmp_path / "plant")) == RUN_SERIES
    assert stage_run_kind(argparse.Namespace(matrix=matrix, patches_dir=tmp_path / "plant",
                                             run_kind=RUN_BISECT)) == RUN_BISECT


def _run(root: Path, run_id: str, started: str, kind: str, ratio: float = 1.0) -> Path:
    """A run of ``kind`` on the CPU platform that built and tested base and fork, with one speed rule of
    ``ratio`` (fork / base tg) in its bench.json; its start is rewritten to ``started`` (the order of runs)."""
    run = Run.open(root, run_id, kind=kind)
    for config in ("base", "fork"):
        run.record_step(StepRecord(CPU, config, "build", STEP_PASSED, 10.0, "built"))
    status = STEP_PASSED if ratio > 0.9 else STEP_FAILED
    run.record_step(StepRecord(CPU, "fork", "speed:base-vs-fork:tg", status, 1.0, f"{ratio:.3f}x"))
    run.close()
    info = json.loads(run.layout.run_json.read_text())
    run.layout.run_json.write_text(json.dumps({**info, "started": started}))
    bench = run.layout.bench_json(CPU)
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text(json.dumps({"rules": [{"step": "speed:base-vs-fork:tg", "candidate": "fork", "reference": "base",
                                            "metric": "tg", "ratio": ratio, "threshold": 0.9, "status": status}]}))
    return run.dir


@pytest.fixture
def forks(tmp_path) -> Path:
    """A results directory holding three runs of the fork, a day apart."""
    for day in (1, 2, 3):
        _run(tmp_path, f"fork-{day}", f"2026-12-0{day}T00:00:00+00:00", RUN_FORK, 1.0 - day / 100)
    return tmp_path


def _beside(root: Path) -> None:
    """A forecast that applied cleanly (every record as the fork's, tg at 0.853x) and a bisect point, both
    after fork-2 and before fork-3."""
    _run(root, "forecast", "2026-12-02T06:00:00+00:00", RUN_FORECAST, 0.853)
    _run(root, "bisect-point", "2026-12-02T07:00:00+00:00", RUN_BISECT, 0.95)


def test_a_forecast_and_a_bisect_point_leave_triages_previous_run_unchanged(forks):
    before = previous_run(forks / "fork-3", forks)
    assert before == (forks / "fork-2").resolve()
    _beside(forks)
    assert previous_run(forks / "fork-3", forks) == before


def test_with_only_a_forecast_and_a_bisect_point_before_it_a_run_has_no_previous_run(forks):
    for day in (1, 2):
        shutil.rmtree(forks / f"fork-{day}")
    _beside(forks)
    with pytest.raises(run_choice.TriageInputError, match=r"no fork run before fork-3 .*\(1 bisect runs, not the "
                                                          r"fork's; 1 forecast runs, not the fork's\)"):
        previous_run(forks / "fork-3", forks)


def test_without_kinds_the_clean_forecast_would_be_taken_as_the_previous_run(forks, monkeypatch):
    """What the kinds prevent: with every run read as the fork's, the bisect point (the newest of the two beside
    the fork's runs) is fork-3's previous run."""
    _beside(forks)
    monkeypatch.setattr(run_choice, "run_kind", lambda run_dir, series=None: RUN_FORK)
    assert previous_run(forks / "fork-3", forks) == (forks / "bisect-point").resolve()


def test_a_forecast_and_a_bisect_point_leave_the_forks_history_figure_unchanged(forks):
    before = rule_history_figures(forks, CPU, "fork-3")
    assert before and "over 3 runs" in before[0]
    _beside(forks)
    assert rule_history_figures(forks, CPU, "fork-3") == before
    [points] = rule_history(forks, CPU).values()
    assert [p.run for p in points] == ["fork-1", "fork-2", "fork-3"]


def test_a_run_of_another_series_is_drawn_apart_in_the_history(forks):
    _run(forks, "plant", "2026-12-02T06:00:00+00:00", RUN_SERIES, 0.5)
    [points] = rule_history(forks, CPU).values()
    assert [(p.run, p.same_series) for p in points] == [("fork-1", True), ("fork-2", True), ("plant", False),
                                                        ("fork-3", True)]
    [figure] = rule_history_figures(forks, CPU, "fork-3")
    assert "over 3 runs; 1 run(s) of another patch series hollow" in figure


def test_a_run_recorded_before_kinds_is_read_from_what_it_holds(tmp_path):
    run = Path(_run(tmp_path, "old", "2026-12-01T00:00:00+00:00", RUN_FORK))
    info = json.loads(RunLayout(run).run_json.read_text())
    del info["kind"]
    RunLayout(run).run_json.write_text(json.dumps(info))
    assert read_run_info(RunLayout(run).run_json).kind is None
    assert run_kind(run) == RUN_FORK
    RunLayout(run).forecast_json.write_text("{}")
    assert run_kind(run) == RUN_FORECAST


@pytest.mark.slow
def test_a_forecast_that_applies_cleanly_is_no_previous_run_of_the_forks_next_run(tmp_path):
    """The drift project's series onto its ``output`` commit applies cleanly and its stages run: a whole run of
    the same series beside the fork's (its environment.json records the same series digest, so telling runs
    apart by series took it as the previous run).  The fork's next run is triaged against the fork's run before
    it."""
    import subprocess
    import sys
    from fake_upstream import make_drift_project
    d = make_drift_project(tmp_path)
    p = d.project
    root = Path(__file__).resolve().parents[1]

    def harness(*argv: str) -> int:
        return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=root, env=p.env(), capture_output=True,
                              text=True).returncode

    assert harness(*p.argv("build", "compare-outputs")[3:]) == 0
    fork_1 = (p.results / "latest").resolve()
    assert harness("forecast", "--onto", f"{p.repo}@output", "--matrix", str(p.matrix), "--patches-dir",
                   str(p.patches), "--work-dir", str(p.work), "--results-dir", str(p.results), "-j", "1") == 0
    forecast = (p.results / "latest").resolve()
    assert run_kind(forecast) == RUN_FORECAST and RunLayout(forecast).forecast_json.is_file()
    assert harness(*p.argv("build", "compare-outputs")[3:]) == 0
    fork_2 = (p.results / "latest").resolve()
    assert (run_kind(fork_1), run_kind(fork_2)) == (RUN_FORK, RUN_FORK)
    assert previous_run(fork_2, p.results) == fork_1
