"""A run whose harness process is killed (SIGKILL) mid-way: never read as passed, its leftovers ended by the next run.

The record says ``in-progress`` from the first stage until the command ends
(harness.record.run.Run.begin); a summary whose process is dead reads ``incomplete``
(interrupted: killed) everywhere (harness.record.json_files.settle_dead_progress), and the next run
ends the process groups the dead one recorded (harness.record.leftovers).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_upstream import guards_of, kill_with_its_guard, make_fake_project, pids_alive
from test_interrupts import start, wait_for
from harness.common import proc
from harness.record.json_files import read_summary
from harness.record.records import StepRecord
from harness.record.run import Run
from harness.common.statuses import KILLED

REPO_ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX process groups and /proc")
pytestmark = pytest.mark.own_job_pool  # harness runs killed with SIGKILL


def dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# --------------------------------------------------------------------------- the record, in one process


def test_a_run_reads_in_progress_from_its_first_stage_and_gets_a_verdict_only_when_it_ends(tmp_path):
    run = Run(tmp_path, "r1")
    run.begin("build test", ["build", "test"], "tok")
    run.stage_started("build")
    run.record_step(StepRecord("p", "fork", "build", "passed"))
    data = read_summary(run.dir)  # this process is alive: nothing settled
    assert data["overall"] == "in-progress" and data["in_progress"]["to_run"] == ["test"]
    assert "⏳ in-progress (to run: test)" in run.layout.summary_md.read_text()
    run.end()
    run.write_summary()
    assert read_summary(run.dir)["overall"] == "passed" and "in_progress" not in read_summary(run.dir)
    run.close()


def test_a_summary_whose_process_died_reads_incomplete_killed_with_its_steps_in_progress_interrupted(tmp_path):
    run = Run(tmp_path, "r1")
    run.begin("compare-outputs", ["generate", "compare", "speed"], "tok")
    run.stage_started("generate")
    run.record_step(StepRecord("p", "fork", "build", "passed"))
    run.doing([("p", "base", "generate", False), ("p", "fork", "build", True)])  # a build found up to date
    run.close()
    raw = json.loads(run.layout.summary_json.read_text())
    raw["in_progress"]["pid"] = dead_pid()  # what a harness killed at this point leaves
    run.layout.summary_json.write_text(json.dumps(raw))
    data = read_summary(run.dir)
    assert data["overall"] == "incomplete" and data["interrupted"] == "killed"
    assert any(r.startswith(f"compare-outputs: {KILLED}") for r in data["incomplete"])
    assert "compare: not run (interrupted: killed)" in data["incomplete"]
    steps = {(s["config"], s["step"]): s["status"] for s in data["configurations"]}
    assert steps == {("fork", "build"): "passed", ("base", "generate"): "interrupted"}
    # a failure recorded before the kill keeps the run failed
    raw["configurations"].append({"platform": "p", "config": "fork", "step": "test", "status": "failed"})
    run.layout.summary_json.write_text(json.dumps(raw))
    assert read_summary(run.dir)["overall"] == "failed"


@linux_only
def test_leftovers_are_ended_by_their_recorded_group_only_when_they_carry_the_run_token(tmp_path):
    log = tmp_path / ".groups"
    with proc.recording_groups(log, "run:x:1"):
        mine = proc.start(["sleep", "60"])
        kept = log.read_text()
    assert not log.exists()  # a process that ends removes its record
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group id the OS gave to another
    log.write_text(kept + f"{stranger.pid}\n")
    try:
        assert proc.end_run_leftovers(log, "run:x:1", grace_s=2) == 1
        assert mine.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None  # no token: left alone
    finally:
        stranger.kill()
        stranger.wait()
        if mine.poll() is None:
            mine.kill()


# --------------------------------------------------------------------------- real runs, killed


def harness(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args, "--results-dir", str(project.results)],
                          cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True, timeout=300)


def stages(project, *names: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(project.argv(*names, extra=extra), cwd=REPO_ROOT, env=project.env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture()
def project(tmp_path):
    if not shutil.which("cc"):
        pytest.skip("the fake project needs a C compiler")
    return make_fake_project(tmp_path)


@pytest.mark.slow
@linux_only
def test_a_run_killed_during_its_comparisons_reads_incomplete_and_the_next_run_ends_its_generation(project):
    """The issue's reproduction: `build test compare-outputs`, SIGKILL during the comparisons."""
    good = subprocess.run(project.argv("build", "test", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    mark, pids = project.root / "slow-started", project.root / "pids"
    # a generation that ignores SIGTERM outlives its parent-death signal; the guard is killed with the harness
    env = project.env(FAKE_GEN_SLEEP_S="120", FAKE_SLOW_WORD="three", FAKE_SLOW_MARK=str(mark), FAKE_PIDS=str(pids),
                      FAKE_IGNORE_TERM="1")
    cut = start(project.argv("build", "test", "compare-outputs"), env)
    try:
        wait_for(mark.exists, what="the slow generation")
        run_dir = (project.results / "latest").resolve()
        live = json.loads((run_dir / "summary.json").read_text())
        assert live["overall"] == "in-progress" and live["in_progress"]["to_run"]  # passed so far, no verdict
        kill_with_its_guard(cut)
        cut.communicate(timeout=60)
        assert pids_alive(pids), "SIGKILL left no generation running: the test proves nothing"
        summary = read_summary(run_dir)
        assert summary["overall"] == "incomplete" and summary["interrupted"] == "killed"

        triage = harness(project, "triage")
        assert triage.returncode == 3, triage.stdout + triage.stderr
        assert "verdict: incomplete, not clean" in triage.stdout and "did not ask for" not in triage.stdout
        assert json.loads(harness(project, "triage", "--json").stdout)["verdict"] == "incomplete"

        nxt = stages(project, "build", extra=("--run-id", "another"))  # whatever its run id
        assert nxt.returncode == 0, nxt.stdout + nxt.stderr
        assert f"run {run_dir.name}: its harness process was killed" in nxt.stdout
        assert pids_alive(pids) == []
        md = (run_dir / "summary.md").read_text()
        assert md.startswith(f"# Run {run_dir.name}: ⚠️ incomplete (interrupted: killed)")
        assert "passed" not in md.splitlines()[0]
        assert f"incomplete ({KILLED})" in (run_dir / "report.html").read_text()
        assert not (run_dir / ".groups").exists()
    finally:
        for pid in pids_alive(pids):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@linux_only
def test_a_run_killed_during_its_build_reads_incomplete_and_its_build_ends_with_the_next_run(project):
    """A plant of another stage: SIGKILL while ninja runs the fork's slow build step."""
    pids = project.root / "pids"
    cut = start(project.argv("build", "test"), project.env(FAKE_BUILD_SLEEP_S="120", FAKE_PIDS=str(pids)))
    try:
        wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the build's slow step")
        run_dir = (project.results / "latest").resolve()
        kill_with_its_guard(cut)
        cut.communicate(timeout=60)
        assert pids_alive(pids)
        summary = read_summary(run_dir)
        assert summary["overall"] == "incomplete"
        assert [(s["config"], s["status"]) for s in summary["configurations"] if s["step"] == "build"] == \
            [("fork", "interrupted")]
        assert "test: not run (interrupted: killed)" in summary["incomplete"]
        assert not [r for r in summary["incomplete"] if "generate-sanitized" in r]  # no --sanitize: not asked for
        later = harness(project, "triage", "--help")  # no run: settles nothing
        assert later.returncode == 0 and pids_alive(pids)
        nxt = stages(project, "build")
        assert f"run {run_dir.name}: its harness process was killed" in nxt.stdout, nxt.stdout + nxt.stderr
        assert pids_alive(pids) == []
    finally:
        for pid in pids_alive(pids):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("stage,env", [
    ("test", {"FAKE_TEST_SLEEP_S": "120"}),  # ctest and the test it runs (ctest's child, in its group)
    ("compare-outputs", {"FAKE_GEN_SLEEP_S": "120"}),  # an engine, mid-generation
])
def test_a_sigkilled_harness_leaves_nothing_running_5_s_later(project, stage, env):
    """The parent-death signal and the guard (harness.common.proc.start): nothing of a harness killed with
    SIGKILL runs 5 s later, nor writes into its run's folder."""
    if stage != "test":
        assert stages(project, "build").returncode == 0
    pids = project.root / "pids"
    cut = start(project.argv("build", "test", "compare-outputs") if stage == "test" else project.argv(stage),
                project.env(FAKE_PIDS=str(pids), **env))
    try:
        wait_for(lambda: len(pids_alive(pids)) >= 1 and (stage != "test" or _has_ctest(cut.pid)), timeout_s=120,
                 what=f"the {stage} stage's program")
        started = pids_alive(pids) + _children(cut.pid)
        cut.kill()
        cut.communicate(timeout=60)
        time.sleep(5)
        assert [p for p in started if _running(p)] == []
        assert pids_alive(pids) == [] and guards_of(cut.pid) == []
    finally:
        for pid in pids_alive(pids):
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _has_ctest(pid: int) -> bool:
    return any(b"ctest" in Path(f"/proc/{c}/cmdline").read_bytes() for c in _children(pid)
               if Path(f"/proc/{c}/cmdline").exists())


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
