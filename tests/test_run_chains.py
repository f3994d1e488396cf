"""A run id belongs to one chain of commands (harness.record.run_id): a second invocation with the same id is
refused (exit 2) before it records anything, also between two sessions of the first; an empty id is refused as
any name that is not plain."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness import cli
from harness.record.run_id import chain_alive, chain_environment, chain_of

REPO_ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a chain is told alive through /proc")


def test_an_empty_run_id_is_refused_like_a_malformed_one(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    assert cli.main(["build", "--platform", "linux-x86_64-cpu", "--run-id", "", "--results-dir", str(results)]) == 2
    assert capsys.readouterr().err.startswith("error: run id '' (--run-id or HARNESS_RUN_ID) is not a plain name")
    monkeypatch.setenv("HARNESS_RUN_ID", "")
    assert cli.main(["build", "--platform", "linux-x86_64-cpu", "--results-dir", str(results)]) == 2
    assert capsys.readouterr().err.startswith("error: run id ''")
    assert not results.exists() or not any(results.iterdir())  # nothing recorded
    assert chain_environment({"HARNESS_RUN_ID": ""})["HARNESS_RUN_ID"] == ""  # nox passes it on to be refused


@linux_only
def test_a_chain_is_named_by_its_process_and_its_start_time():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        chain = chain_of(sleeper.pid)
        assert chain_alive(chain) and not chain_alive(f"{sleeper.pid}:1")  # another start time: a reused pid
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not chain_alive(chain) and not chain_alive("") and not chain_alive("x:y")


def _harness(project, *stages: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(project.argv(*stages), cwd=REPO_ROOT, env=project.env(HARNESS_RUN_ID="same-1.0", **env),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture()
def project(tmp_path):
    if not shutil.which("cc"):
        pytest.skip("the fake project needs a C compiler")
    return make_fake_project(tmp_path)


@pytest.mark.slow
@linux_only
def test_a_second_chain_between_two_sessions_of_the_first_is_refused_before_it_records_anything(project):
    """The gap between two nox sessions, held open: a live process stands for the first chain's nox."""
    nox_of_a = subprocess.Popen(["sleep", "120"])
    try:
        a = {"HARNESS_CHAIN": chain_of(nox_of_a.pid)}
        first = _harness(project, "build", **a)
        assert first.returncode == 0, first.stdout + first.stderr
        run_dir = project.results / "same-1.0"
        before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

        second = _harness(project, "build")  # another invocation: a chain of its own
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stdout + second.stderr
        [line] = second.stderr.strip().splitlines()
        assert line == (f"error: run same-1.0 belongs to another invocation that is still running (process "
                        f"{nox_of_a.pid}, between or in its commands); a run id belongs to one chain of commands: "
                        "wait for it to end or choose another --run-id")
        after = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
        assert after == before  # nothing recorded: run.json, the summary, the build's files as they were

        rest = _harness(project, "test", **a)  # the first chain goes on
        assert rest.returncode == 0, rest.stdout + rest.stderr
        commands = json.loads((run_dir / "run.json").read_text())["commands"]
        assert [c["argv"][1] for c in commands] == ["build", "test"]
    finally:
        nox_of_a.kill()
        nox_of_a.wait()
    later = _harness(project, "compare-outputs")  # the first chain has ended: the run may be continued
    assert later.returncode == 0, later.stdout + later.stderr


@pytest.mark.slow
@linux_only
def test_two_nox_invocations_with_one_run_id_the_second_is_refused_up_front(project):
    """The issue's reproduction: `HARNESS_RUN_ID=same-1.0 nox -s build test -- …` twice, the second 1 s later."""
    posargs = project.argv()[3:]
    nox = [sys.executable, "-m", "nox", "-f", str(REPO_ROOT / "noxfile.py"), "-s", "build", "test", "--", *posargs]
    env = project.env(HARNESS_RUN_ID="same-1.0", FAKE_TEST_SLEEP_S="4")
    first = subprocess.Popen(nox, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1)
    second = subprocess.run(nox, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    assert second.returncode == 2, second.stdout + second.stderr
    assert "Traceback" not in second.stderr
    assert ("belongs to another invocation that is still running" in second.stderr
            or "is in use by another live harness process" in second.stderr), second.stderr
    assert "Running session test" not in second.stderr  # refused in its first session
    commands = json.loads((project.results / "same-1.0" / "run.json").read_text())["commands"]
    assert [c["argv"][1] for c in commands] == ["build", "test"]  # the first chain's two sessions only
