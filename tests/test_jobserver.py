"""One job budget for every build of a run (harness/common/jobserver.py).

Fast tests drive two real ninjas (the version requirements.txt pins) over tiny build files whose
"compiler" records when it starts and ends, and the fallbacks; the slow one runs the build stage
of the fake upstream with a CUDA platform compiled beside the CPU build, ``-j 2``, and counts the
compilers and linkers running at once across both.
"""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.common import proc
from harness.common.jobserver import POOL_ENV, JobBudget, ninja_version
from harness.matrix.config import load_matrix
from harness.pipeline import Options, open_context, run_command
from harness.stages.table import stages_of
from harness.record.run import Run
from harness.stages.building.build import _run_step, find_tool
from harness.stages.building.cuda_compile import Toolkit

RECORDER = """#!{python}
import os, subprocess, sys, time
def note(what):
    with open({log!r}, "a") as fh:
        fh.write(f"{{what}} {{time.time():.6f}} {{os.getcwd()}}\\n")
note("start")
time.sleep({sleep})
rc = subprocess.call(sys.argv[1:]) if len(sys.argv) > 1 else 0
note("end")
sys.exit(rc)
"""


def recorder(tmp_path: Path, sleep_s: float) -> tuple[Path, Path]:
    """A program that notes its start and end (time, working directory) in a shared log, sleeps
    ``sleep_s`` seconds and runs its arguments: a compiler launcher, or a job of its own."""
    log = tmp_path / "jobs.log"
    script = tmp_path / "record.py"
    script.write_text(RECORDER.format(python=sys.executable, log=str(log), sleep=sleep_s))
    script.chmod(0o755)
    return script, log


def jobs(log: Path) -> list[tuple[float, float, str]]:
    """(start, end, working directory) of every job the recorder noted, in start order."""
    started: dict[str, list[float]] = {}
    done = []
    for line in log.read_text().splitlines():
        what, when, cwd = line.split(" ", 2)
        if what == "start":
            started.setdefault(cwd, []).append(float(when))
        else:
            done.append((started[cwd].pop(0), float(when), cwd))
    return sorted(done)


def most_at_once(intervals: list[tuple[float, float, str]]) -> int:
    """The largest number of ``intervals`` open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.fixture(autouse=True)
def _no_shared_pool(monkeypatch):
    """Each test here opens the pools it asserts on: the pool the suite shares (tests/conftest.py) is left out."""
    monkeypatch.delenv(POOL_ENV, raising=False)


def _ninja() -> str:
    ninja = find_tool("ninja")
    if not ninja or (ninja_version(ninja) or (0,)) < (1, 13):
        pytest.skip("ninja 1.13 from requirements.txt is needed")
    return ninja


def _ninja_project(root: Path, script: Path, n: int) -> Path:
    root.mkdir(parents=True)
    (root / "build.ninja").write_text(f"rule job\n  command = {script}\n" +
                                      "".join(f"build out{i}: job\n" for i in range(n)))
    return root


def test_two_ninjas_sharing_a_budget_of_two_run_at_most_two_jobs(tmp_path):
    ninja = _ninja()
    script, log = recorder(tmp_path, 0.4)
    budget = JobBudget.open(2, 8, ninja)
    assert budget.governs, budget.why_not
    try:
        dirs = [_ninja_project(tmp_path / name, script, 4) for name in ("a", "b")]
        rcs = {}
        threads = [threading.Thread(target=lambda d=d: rcs.setdefault(d.name, _run_step(
            [ninja, "-C", str(d), *budget.jobs_option(2)], d / "build.log", None, budget)[0])) for d in dirs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        budget.close()
    assert rcs == {"a": 0, "b": 0}
    ran = jobs(log)
    assert len(ran) == 8
    assert most_at_once(ran) == 2, ran
    for d in dirs:
        text = (d / "build.log").read_text()
        assert "ninja: Jobserver mode detected" in text and " -j" not in text.splitlines()[0]
        assert text.splitlines()[1].startswith("jobs: at most 2 at once")


def test_a_run_given_a_pool_joins_it_and_two_ninjas_of_two_budgets_run_at_most_its_two_jobs(tmp_path, monkeypatch):
    ninja = _ninja()
    script, log = recorder(tmp_path, 0.4)
    host = JobBudget.open(2, 8, ninja)
    assert host.governs and not host.joined, host.why_not
    monkeypatch.setenv(POOL_ENV, host.env()["MAKEFLAGS"])
    guest = JobBudget.open(4, 8, ninja)  # its own -j gives way to the pool it was given
    try:
        assert guest.joined and guest.fifo == host.fifo and guest.slots == 2
        assert guest.env() == host.env() and guest.jobs_option(4) == []
        assert guest.describe().startswith(f"jobs: at most 2 at once across every build of the processes sharing "
                                           f"the pool {POOL_ENV} names")
        dirs = [_ninja_project(tmp_path / name, script, 4) for name in ("a", "b")]
        rcs = {}
        threads = [threading.Thread(target=lambda d=d, b=b: rcs.setdefault(d.name, _run_step(
            [ninja, "-C", str(d), *b.jobs_option(2)], d / "build.log", None, b)[0]))
            for d, b in zip(dirs, (host, guest))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert rcs == {"a": 0, "b": 0}
        ran = jobs(log)
        assert len(ran) == 8 and most_at_once(ran) == 2, ran
        guest.close()
        assert host.fifo is not None and host.fifo.exists()  # the host's pool outlives its guest
        with host.slot(), host.slot():  # every token came back
            pass
    finally:
        guest.close()
        host.close()


def test_a_pool_that_is_not_there_is_not_joined(tmp_path, monkeypatch):
    ninja = _ninja()
    for spec in (f"-j2 --jobserver-auth=fifo:{tmp_path / 'gone'}", "-j2", "fifo:/tmp/x", f"-j2 --jobserver-auth=fifo:{tmp_path}"):
        monkeypatch.setenv(POOL_ENV, spec)
        budget = JobBudget.open(3, 8, ninja)
        try:
            assert budget.governs and not budget.joined and budget.slots == 3, spec
        finally:
            budget.close()


def test_an_older_ninja_gets_its_own_j_and_the_log_says_why(tmp_path):
    old = tmp_path / "ninja"
    old.write_text("#!/bin/sh\necho 1.11.1\n")
    old.chmod(0o755)
    budget = JobBudget.open(3, 2, str(old))
    assert not budget.governs and budget.slots == 3
    assert "ninja 1.11.1 has no jobserver client" in budget.why_not
    assert budget.jobs_option(3) == ["-j", "3"] and budget.jobs_option(None) == [] and budget.env() == {}
    assert budget.describe() == f"jobs: no shared budget ({budget.why_not}); this step runs as its own -j says"
    with budget.slot(), budget.slot(), budget.slot(), budget.slot():  # no pool: nothing to wait for
        pass


def test_a_host_without_fifos_falls_back(monkeypatch):
    monkeypatch.delattr(os, "mkfifo")
    budget = JobBudget.open(None, 4, _ninja())
    assert not budget.governs and budget.slots == 4 and "no POSIX FIFOs" in budget.why_not


def test_the_pool_holds_its_slots_and_close_removes_it(tmp_path):
    budget = JobBudget.open(None, 3, _ninja())
    fifo = budget.fifo
    assert fifo is not None and fifo.exists()
    assert budget.env() == {"MAKEFLAGS": f"-j3 --jobserver-auth=fifo:{fifo}", "CMAKE_BUILD_PARALLEL_LEVEL": ""}
    assert budget.jobs_option(2) == []
    got = []
    with budget.slot(), budget.slot(), budget.slot():
        waiter = threading.Thread(target=lambda: got.append(budget.slot().__enter__()))
        waiter.start()
        waiter.join(0.6)
        assert waiter.is_alive()  # a fourth waits while three are held
    waiter.join(2)
    assert not waiter.is_alive()
    budget.close()
    budget.close()
    assert not fifo.parent.exists() and not budget.governs


def test_a_pool_left_by_a_killed_harness_goes_when_the_next_one_opens(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = tmp_path / f"harness-jobs-{gone.pid}-abc"
    alive = tmp_path / f"harness-jobs-{os.getppid()}-def"
    for d in (left, alive):
        d.mkdir()
    budget = JobBudget.open(None, 1, _ninja())
    try:
        assert budget.fifo is not None and budget.fifo.parent.name.startswith(f"harness-jobs-{os.getpid()}-")
        assert not left.exists() and alive.exists()
    finally:
        budget.close()


def test_a_thread_waiting_for_a_slot_stops_with_the_harness():
    budget = JobBudget.open(1, 1, _ninja())
    outcome = []

    def wait_for_a_slot():
        try:
            with budget.slot():
                outcome.append("got one")
        except proc.Interrupted as exc:
            outcome.append(exc.signal_name)

    try:
        with budget.slot():
            waiter = threading.Thread(target=wait_for_a_slot)
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive()
            with proc.stop_children():
                waiter.join(5)
        assert outcome == ["SIGTERM"]
    finally:
        budget.close()


CUDA_PLATFORM = """  linux-x86_64-cuda:
    os: linux
    arch: x86_64
    hardware: {{gpu: nvidia}}
    cmake: {{CMAKE_BUILD_TYPE: Release, FAKE_PYTHON: "{python}"}}
    compile_only:
      cmake: {{CMAKE_C_FLAGS: -O0}}
    targets: [llama-completion, llama-tokenize]
    test_targets: [test-fake]
    test_labels: [main]
    groups: [base-vs-fork]
"""


@pytest.mark.slow
def test_with_j_2_the_cpu_build_and_the_compile_step_together_run_at_most_two_compilers(tmp_path, monkeypatch):
    project = make_fake_project(tmp_path / "p")
    text = project.matrix.read_text()
    project.matrix.write_text(text.replace("models:\n", CUDA_PLATFORM.format(python=sys.executable) + "models:\n", 1))
    script, log = recorder(tmp_path, 0.5)
    for name, value in project.env().items():
        monkeypatch.setenv(name, value)
    # the compile step without the CUDA wheels: the fake project is C, and nothing here needs nvcc
    toolkit = Toolkit(tmp_path / "toolkit", tmp_path / "toolkit" / "bin" / "nvcc", "13.0.0", {})
    monkeypatch.setattr("harness.stages.building.compile_stage.assemble_toolkit", lambda _cache: toolkit)
    run = Run(project.results, "jobs")
    launchers = {"CMAKE_C_COMPILER_LAUNCHER": str(script), "CMAKE_C_LINKER_LAUNCHER": str(script)}
    ctx = open_context(load_matrix(project.matrix), run,
                       Options(platforms=["linux-x86_64-cpu", "linux-x86_64-cuda"], jobs=2, work_dir=project.work,
                               patches_dir=project.patches, cmake_defines=launchers, no_cache=True), say=lambda _: None)
    try:
        run_command(ctx, stages_of("build"))
    finally:
        ctx.close()
    for platform, step in (("linux-x86_64-cpu", "build"), ("linux-x86_64-cuda", "compile")):
        for variant in ("fork", "base"):
            record = run.step(platform, variant, step)
            assert record is not None and record.status == "passed", (platform, variant, record)
    ran = jobs(log)
    cpu = [j for j in ran if "build-linux-x86_64-cpu" in j[2]]
    compile_step = [j for j in ran if "compile-linux-x86_64-cuda" in j[2]]
    assert len(cpu) >= 10 and len(compile_step) >= 6, ran
    # the two ran side by side: the compile step's jobs began before the CPU build's last one ended
    assert compile_step[0][0] < max(e for _, e, _ in cpu) and cpu[0][0] < max(e for _, e, _ in compile_step)
    assert most_at_once(ran) <= 2, ran
