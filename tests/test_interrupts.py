"""Interrupted, timed-out and concurrent runs, with real processes and real signals.

The harness runs on the fake upstream of ``fake_upstream.py`` (a CMake
project built in seconds); every child it starts notes its pid, so the tests
can check that none outlives the harness.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_upstream import kill_with_its_guard, make_fake_project, pids_alive
from harness.common import proc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.own_job_pool,  # runs interrupted and killed mid-build
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX process groups and /proc"),
    pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler"),
]

REPO_ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def summary(results: Path) -> dict:
    runs = [d for d in results.iterdir() if d.is_dir() and not d.is_symlink() and d.name != "junit"]
    assert len(runs) == 1, runs
    return json.loads((runs[0] / "summary.json").read_text())


@pytest.fixture()
def project(tmp_path):
    return make_fake_project(tmp_path)


def with_second_model(project) -> Path:
    """Add model ``second`` (a copy of the tiny model) to the project's group, after ``tiny``; returns the
    file that marks, once it exists, that a generation with FAKE_SLOW_WORD=second has started to hang."""
    second = project.root / "second.gguf"
    shutil.copy(project.model, second)
    text = project.matrix.read_text()
    text = text.replace("models:\n  tiny:\n", f"models:\n  second:\n    kind: file\n    path: {second}\n  tiny:\n")
    project.matrix.write_text(text.replace("    models: [tiny]", "    models: [tiny, second]"))
    return project.root / "slow-started"


def hang_second(project, mark: Path, **extra: str) -> dict[str, str]:
    """The environment for a run whose generations of model ``second`` hang for 120 s."""
    return project.env(FAKE_GEN_SLEEP_S="120", FAKE_SLOW_WORD="second", FAKE_SLOW_MARK=str(mark),
                       FAKE_PIDS=str(project.root / "pids"), **extra)


def _built(project) -> None:
    done = subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(project.results)


# --------------------------------------------------------------------------- the process helper


def test_a_timeout_terminates_the_whole_group_grandchildren_too(tmp_path):
    pid_file = tmp_path / "pids"
    script = f"sleep 600 & echo $! >> {pid_file}; echo $$ >> {pid_file}; wait"
    done = proc.run(["sh", "-c", script], timeout_s=1.0)
    assert done.timed_out and done.returncode is None
    assert len(pid_file.read_text().split()) == 2
    assert pids_alive(pid_file) == []
    assert proc.live() == []


def test_an_exception_while_waiting_terminates_the_group(tmp_path):
    pid_file = tmp_path / "pids"

    def boom(signum, frame):
        raise RuntimeError("boom")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(1)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            proc.run(["sh", "-c", f"sleep 600 & echo $! >> {pid_file}; wait"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert pids_alive(pid_file) == []


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, monkeypatch):
    monkeypatch.setattr(proc, "GRACE_S", 0.5)
    pid_file = tmp_path / "pids"
    child = proc.start(["sh", "-c", f"trap '' TERM; echo $$ >> {pid_file}; while :; do sleep 0.1; done"])
    wait_for(lambda: pid_file.exists(), what="the child to start")
    t0 = time.monotonic()
    proc.terminate(child, grace_s=0.5)
    assert 0.4 < time.monotonic() - t0 < 5
    assert child.returncode == -signal.SIGKILL
    assert pids_alive(pid_file) == []


def test_end_holders_ends_every_process_a_hold_started_grandchildren_too_and_nothing_else(tmp_path):
    pid_file = tmp_path / "pids"
    with proc.holding("token-a"):
        held = proc.start(["sh", "-c", f"sleep 600 & echo $! >> {pid_file}; echo $$ >> {pid_file}; wait"])
        with proc.holding("token-b"):
            both = proc.start(["sleep", "600"])
    other = proc.start(["sleep", "600"])  # started after the holds: carries no token
    try:
        wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, what="the children")
        # a child carries its environment from its exec on; until then /proc shows the parent's
        wait_for(lambda: all(Path(f"/proc/{c.pid}/cmdline").read_bytes().startswith(b"sleep") for c in (both, other)),
                 what="the sleeps to start")
        assert sorted(proc.holders("token-a")) == sorted([*map(int, pid_file.read_text().split()), both.pid])
        assert proc.end_holders("token-a", grace_s=2) == 3
        assert pids_alive(pid_file) == [] and held.wait(timeout=10) and both.wait(timeout=10)
        assert proc.holders("token-a") == proc.holders("token-b") == [] and proc.end_holders("token-a") == 0
        assert other.poll() is None
    finally:
        proc.terminate_all()


# --------------------------------------------------------------------------- signals to the harness


def test_sigint_during_a_build_leaves_no_process_and_an_incomplete_summary(project):
    pids = project.root / "pids"
    run = start(project.argv("build", "test", "compare-outputs"),
                project.env(FAKE_BUILD_SLEEP_S="120", FAKE_PIDS=str(pids)))
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the build's slow step")
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, out + err
    assert "Traceback" not in err
    assert pids_alive(pids) == []  # ninja's slow step went with the harness
    s = summary(project.results)
    assert s["overall"] == "incomplete"
    build = [c for c in s["configurations"] if c["step"] == "build"]
    assert [(c["config"], c["status"]) for c in build] == [("fork", "interrupted")]
    assert "interrupted by SIGINT" in build[0]["detail"]
    assert any("build fork: interrupted by SIGINT" in r for r in s["incomplete"])
    assert any(r.startswith("test: not run (interrupted by SIGINT)") for r in s["incomplete"])
    assert any(r.startswith("compare-outputs: not run") for r in s["incomplete"])
    assert "⏹️ interrupted" in next(project.results.glob("*/summary.md")).read_text()

    # the next run builds again: the interrupted build is not taken as up to date
    shutil.rmtree(project.results)
    again = subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "build fork: passed — built in" in again.stdout


def test_sigterm_during_comparisons_keeps_the_finished_ones_and_names_the_cut_step(project):
    mark = with_second_model(project)
    _built(project)
    run = start(project.argv("compare-outputs"), hang_second(project, mark))
    # model tiny's comparisons finish; the base engine's first generation of model second hangs
    wait_for(mark.exists, what="the slow generation")
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 143, out + err
    assert "Traceback" not in err
    assert pids_alive(project.root / "pids") == []
    s = summary(project.results)
    assert s["overall"] == "incomplete"
    assert [(c["model"], c["prompt"], c["status"]) for c in s["comparisons"]] == \
        [("tiny", p, "identical") for p in ("one", "two", "three", "four")]
    steps = {(c["config"], c["step"]): c for c in s["configurations"]}
    assert steps[("base", "generate")]["status"] == "interrupted"
    assert any("generate base: interrupted by SIGTERM" in r for r in s["incomplete"])


def _stat(pid: str) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _processes() -> dict[int, list[str]]:
    out = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            out[int(entry.name)] = _stat(entry.name)
        except (OSError, IndexError):
            pass
    return out


def sessions_started_by(pid: int) -> set[int]:
    """The session ids of ``pid``'s children (the harness starts each child in a new session)."""
    return {int(f[3]) for f in _processes().values() if int(f[1]) == pid}


def alive_in(sessions: set[int]) -> list[int]:
    """The live (not zombie) processes of those sessions."""
    return [pid for pid, f in _processes().items() if int(f[3]) in sessions and f[0] != "Z"]


def test_a_build_left_running_by_a_sigkilled_harness_is_ended_before_the_next_build_and_its_stamp(project):
    pids = project.root / "pids"
    killed = start(project.argv("build", extra=("--results-dir", str(project.root / "ra"))),
                   project.env(FAKE_BUILD_SLEEP_S="10", FAKE_PIDS=str(pids)))
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the build's slow step")
    slow_step_ends = time.monotonic() + 10
    sessions = sessions_started_by(killed.pid)
    kill_with_its_guard(killed)
    killed.communicate(timeout=60)
    try:
        assert alive_in(sessions), "SIGKILL left no build running: the test proves nothing"
        rerun = subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env(), capture_output=True,
                               text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert alive_in(sessions) == []  # cmake --build, ninja and the slow step of the killed run are gone
        assert "that a killed harness process left running under" in rerun.stdout
        time.sleep(max(0.0, slow_step_ends - time.monotonic()) + 3)  # when the orphaned build would have gone on
        build_dir = project.work / "fork" / "build-linux-x86_64-cpu"
        stamp = build_dir / "harness-build.json"
        later = [p for p in build_dir.rglob("*") if p.is_file() and p.stat().st_mtime_ns > stamp.stat().st_mtime_ns]
        assert later == []  # nothing changed the tree after its stamp
    finally:
        for pid in alive_in(sessions):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- concurrent processes


def test_two_builds_of_the_same_key_at_once_one_waits_and_finds_it_up_to_date(project):
    env = project.env(FAKE_BUILD_SLEEP_S="3")
    a = start(project.argv("build", extra=("--results-dir", str(project.root / "ra"))), env)
    b = start(project.argv("build", extra=("--results-dir", str(project.root / "rb"))), env)
    outs = [p.communicate(timeout=300) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    text = "\n".join(o + e for o, e in outs)
    assert text.count("build fork: passed — built in") == 1
    assert text.count("build fork: passed — up to date") == 1
    assert "waiting" in text


def test_two_runs_that_need_two_builds_rebuilt_in_opposite_orders_both_finish(project):
    # each run holds the builds it has for reading until it ends; the other run's options (-DFAKE_OTHER=1) make
    # it rebuild them: without one order each run would hold one platform's builds and wait for the other's
    text = project.matrix.read_text()
    platform = text[text.index("  linux-x86_64-cpu:\n"):text.index("models:\n")]
    project.matrix.write_text(text.replace("models:\n", platform.replace("linux-x86_64-cpu:", "other-cpu:") +
                                           "models:\n", 1))

    def argv(first: str, second: str, *extra: str) -> list[str]:
        words = project.argv("build", extra=extra)
        at = words.index("--platform")
        return words[:at] + ["--platform", first, "--platform", second] + words[at + 2:]

    env = project.env(FAKE_BUILD_SLEEP_S="3")  # both runs are in their first build at once
    runs = [start(argv("linux-x86_64-cpu", "other-cpu"), env),
            start(argv("other-cpu", "linux-x86_64-cpu", "-DFAKE_OTHER=1", "--results-dir", str(project.root / "rb")),
                  env)]
    try:
        outs = [p.communicate(timeout=240) for p in runs]
    except subprocess.TimeoutExpired:
        for p in runs:
            p.kill()
        outs = [p.communicate() for p in runs]
        pytest.fail("the two runs waited on each other for 240 s:\n" + "\n".join(o + e for o, e in outs))
    assert [p.returncode for p in runs] == [0, 0], outs
    assert summary(project.results)["overall"] == summary(project.root / "rb")["overall"] == "passed"


def test_a_build_waits_for_a_running_generation_of_another_process(project):
    _built(project)
    pids = project.root / "pids"
    gen = start(project.argv("compare-outputs"),
                project.env(FAKE_GEN_SLEEP_S="3", FAKE_SLOW_WORD="one", FAKE_PIDS=str(pids)))
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the first generation")
    rebuild = start(project.argv("build", extra=("-DFAKE_OTHER=1", "--results-dir", str(project.root / "rb"))),
                    project.env())
    out, err = gen.communicate(timeout=300)
    gen_end = time.time()
    assert gen.returncode == 0, out + err
    assert summary(project.results)["overall"] == "passed"
    rout, rerr = rebuild.communicate(timeout=300)
    assert rebuild.returncode == 0, rout + rerr
    assert "waiting to build in" in rout and "another harness process is using it" in rout
    stamp = project.work / "fork" / "build-linux-x86_64-cpu" / "harness-build.json"
    assert stamp.stat().st_mtime >= gen_end - 0.5  # relinked only after the generations ended
    assert json.loads(stamp.read_text())["options"]["FAKE_OTHER"] == "1"


def test_two_runs_that_use_one_up_to_date_build_run_at_once(project):
    mark = with_second_model(project)
    _built(project)
    first = start(project.argv("compare-outputs"), hang_second(project, mark))
    try:
        wait_for(mark.exists, what="the first run's slow generation")  # it holds the build for reading
        second = subprocess.run(project.argv("compare-outputs", extra=("--results-dir", str(project.root / "rb"))),
                                cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True, timeout=100)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "waiting" not in second.stdout + second.stderr
        assert first.poll() is None  # the second did not queue behind the first
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 130


def test_a_run_id_held_by_a_live_process_is_refused(project):
    _built(project)
    pids = project.root / "pids"
    first = start(project.argv("compare-outputs", extra=("--run-id", "shared")),
                  project.env(FAKE_GEN_SLEEP_S="3", FAKE_SLOW_WORD="one", FAKE_PIDS=str(pids)))
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the first run's generation")
    second = subprocess.run(project.argv("test", extra=("--run-id", "shared")), cwd=REPO_ROOT,
                            env=project.env(), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert second.stderr.strip() == (f"error: run shared is in use by another live harness process "
                                     f"(pid {first.pid}); wait for it to end or choose another --run-id")
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    s = summary(project.results)
    assert s["overall"] == "passed" and not any(c["step"] == "test" for c in s["configurations"])
    # once the first process has ended, a later stage may continue the run
    later = subprocess.run(project.argv("test", extra=("--run-id", "shared")), cwd=REPO_ROOT,
                           env=project.env(), capture_output=True, text=True, timeout=300)
    assert later.returncode == 0, later.stdout + later.stderr
    assert any(c["step"] == "test" for c in summary(project.results)["configurations"])


# --------------------------------------------------------------------------- triage after an interrupt


def triage(project, *runs: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "triage", *runs, "--results-dir", str(project.results)],
                          cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True, timeout=120)


def test_triage_names_an_interrupted_newest_run_incomplete_and_finds_no_regression_in_what_it_lacks(project):
    mark = with_second_model(project)
    full = subprocess.run(project.argv("build", "test", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True)
    assert full.returncode == 0, full.stdout + full.stderr
    cut = start(project.argv("build", "test", "compare-outputs"), hang_second(project, mark))
    wait_for(mark.exists, what="the slow generation")
    cut.send_signal(signal.SIGINT)
    cut.communicate(timeout=60)
    assert cut.returncode == 130

    done = triage(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "IS INCOMPLETE: compared only on what it recorded" in done.stdout
    assert "generate base: interrupted by SIGINT" in done.stdout
    assert "not compared: linux-x86_64-cpu base-vs-fork second/three: fork vs base (identical in A; not run in B)" \
        in done.stdout
    assert "REGRESSIONS (0)" in done.stdout and "verdict: no regressions" in done.stdout
    report = json.loads(triage(project, "--json").stdout)
    assert report["b_incomplete"] and len(report["not_compared"]) >= 2 and report["verdict"] == "clean"


def test_triage_of_a_narrower_run_lists_what_it_did_not_run_apart_and_fails_on_it_only_when_strict(project):
    with_second_model(project)
    full = subprocess.run(project.argv("build", "test", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True)
    assert full.returncode == 0, full.stdout + full.stderr
    narrow = subprocess.run(project.argv("compare-outputs", extra=("--model", "tiny")), cwd=REPO_ROOT,
                            env=project.env(), capture_output=True, text=True)
    assert narrow.returncode == 0, narrow.stdout + narrow.stderr

    done = triage(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not compared: linux-x86_64-cpu base-vs-fork second/one: fork vs base (identical in A; not run in B)" \
        in done.stdout
    assert "not compared: linux-x86_64-cpu fork test (passed in A; not run in B)" in done.stdout
    assert "REGRESSIONS (0)" in done.stdout and "verdict: no regressions" in done.stdout
    strict = triage(project, "--strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "identical -> absent" in strict.stdout and "passed -> absent" in strict.stdout


def test_triage_refuses_to_skip_a_newest_run_that_recorded_nothing(project):
    for _ in range(2):
        done = subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    pids = project.root / "pids"
    shutil.rmtree(project.work)  # the third run builds again, and is killed mid-way without a chance to record
    killed = start(project.argv("build"), project.env(FAKE_BUILD_SLEEP_S="120", FAKE_PIDS=str(pids)))
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the build's slow step")
    killed.kill()
    killed.communicate(timeout=60)
    for pid in pids_alive(pids):  # SIGKILL leaves the build's group behind: that is why it is never sent by us
        os.kill(pid, signal.SIGKILL)
    newest = (project.results / "latest").resolve().name
    done = triage(project)
    # the run recorded that it was in progress from its first stage: it is compared, and read as killed
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("triage ") and f"-> {newest} " in done.stdout.splitlines()[0]
    assert f"verdict: incomplete, not clean: no regression in what {newest} recorded" in done.stdout
    (project.results / newest / "summary.json").unlink()  # a run killed before even that
    done = triage(project)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: the newest run {newest} in {project.results} is incomplete: it has no "
                                   "summary.json (it was stopped before it recorded a step); name two runs to compare")


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGINT, False), (signal.SIGTERM, False)],
                         ids=["ctrl-c-to-both", "sigint-to-nox", "sigterm-to-nox"])
def test_a_signal_to_nox_reaches_the_harness_which_leaves_no_process_and_an_incomplete_summary(project, signum,
                                                                                                 to_group):
    """A terminal's Ctrl-C reaches nox and the harness at once (one process group); a CI runner's cancel or
    ``timeout`` signals nox alone.  Either way nox must pass the signal on and wait until the harness has
    stopped its builds and written the summary, then exit with the harness's code."""
    pids = project.root / "pids"
    nox = shutil.which("nox", path=str(Path(sys.executable).parent)) or shutil.which("nox")
    argv = [nox, "-f", str(REPO_ROOT / "noxfile.py"), "-s", "build", "--", *project.argv("build")[4:]]
    run = subprocess.Popen(argv, cwd=REPO_ROOT, env=project.env(FAKE_BUILD_SLEEP_S="120", FAKE_PIDS=str(pids)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: pids.exists() and pids.read_text().strip(), what="the build's slow step")
        if to_group:
            os.killpg(run.pid, signum)
        else:
            run.send_signal(signum)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 128 + signum, out + err
        assert pids_alive(pids) == []
        s = summary(project.results)
        assert s["overall"] == "incomplete"
        assert [(c["config"], c["status"]) for c in s["configurations"] if c["step"] == "build"] == \
            [("fork", "interrupted")]
        assert f"interrupted by {signal.Signals(signum).name}" in \
            next(c["detail"] for c in s["configurations"] if c["step"] == "build")
    finally:  # what a failing nox left behind must not run on
        for pid in pids_alive(pids):
            os.kill(pid, signal.SIGKILL)
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run.wait(timeout=60)


def test_a_failure_found_before_the_interrupt_is_kept(project):
    mark = with_second_model(project)
    _built(project)
    run = start(project.argv("compare-outputs"), hang_second(project, mark, FAKE_CRASH_WORD="four"))
    wait_for(mark.exists, what="the slow generation")
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 143, out + err
    s = summary(project.results)
    assert s["overall"] == "failed"  # prompt two ("four five six") crashed before the interrupt
    base = next(c for c in s["configurations"] if (c["config"], c["step"]) == ("base", "generate"))
    assert base["status"] == "failed"
    assert {(f["model"], f["prompt"], f["status"]) for f in base["failures"]} == {("tiny", "two", "crashed")}
    assert re.match(r"interrupted by SIGTERM after \d+ generation\(s\); tiny/two: crashed", base["detail"])
    assert any("generate base: interrupted by SIGTERM" in r for r in s["incomplete"])


def test_triage_of_a_run_still_in_progress_says_so_and_finds_no_regression(project):
    mark = with_second_model(project)
    full = subprocess.run(project.argv("build", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True)
    assert full.returncode == 0, full.stdout + full.stderr
    live = start(project.argv("compare-outputs"), hang_second(project, mark))
    try:
        wait_for(mark.exists, what="the slow generation")
        done = triage(project)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"still running (pid {live.pid})" in done.stdout and "REGRESSIONS (0)" in done.stdout
    finally:
        live.send_signal(signal.SIGINT)
        live.communicate(timeout=60)
    assert live.returncode == 130


def test_a_stop_ends_a_child_another_thread_waits_for_and_interrupts_that_thread(tmp_path):
    outcome: list[object] = []

    def lane() -> None:
        try:
            outcome.append(proc.run(["sleep", "30"]))
        except proc.Interrupted as exc:
            outcome.append(exc)
        try:  # while the stop is in force, nothing new starts
            proc.run(["true"])
            outcome.append("started")
        except proc.Interrupted as exc:
            outcome.append(exc)

    import threading
    worker = threading.Thread(target=lane)
    worker.start()
    wait_for(lambda: proc.live(), what="the lane's child")
    t0 = time.monotonic()
    with proc.stop_children(signal.SIGINT):
        worker.join(timeout=30)
    assert not worker.is_alive() and time.monotonic() - t0 < 15
    assert [type(o) for o in outcome] == [proc.Interrupted, proc.Interrupted]
    assert outcome[0].signum == signal.SIGINT  # type: ignore[union-attr]
    assert proc.live() == []
    assert proc.run(["true"]).returncode == 0  # after the block, children start again
