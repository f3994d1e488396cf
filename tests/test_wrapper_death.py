"""A wrapper that runs the harness (noxfile.py, through harness.common.proc.run_passing_signals) killed outright
takes the harness with it: the harness gets SIGTERM, as its own children do when it dies (docs/interrupts.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_upstream import pids_alive

ROOT = Path(__file__).resolve().parents[1]

#: The wrapper: runs a child that writes its pid, records the SIGTERM it gets, then sleeps.
WRAPPER = """
import sys
from harness.common.proc import run_passing_signals
child = ("import os, signal, sys, time\\n"
         "def told(*_):\\n"
         "    open(sys.argv[1] + '.term', 'w').close()\\n"
         "    sys.exit(143)\\n"
         "signal.signal(signal.SIGTERM, told)\\n"
         "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
         "time.sleep(60)\\n")
sys.exit(run_passing_signals([sys.executable, "-c", child, sys.argv[1]]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_sigkilled_wrapper_leaves_no_harness_running_and_the_harness_is_told_by_sigterm(tmp_path):
    pid_file = tmp_path / "child.pid"
    wrapper = subprocess.Popen([sys.executable, "-c", WRAPPER, str(pid_file)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = 0
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        wrapper.kill()
        wrapper.wait(timeout=10)
        deadline = time.monotonic() + 5
        while pids_alive(pid_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_alive(pid_file) == [], "the child of a SIGKILLed wrapper still runs 5 s later"
        assert (tmp_path / "child.pid.term").exists(), "the child was not told by SIGTERM"
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        if child and pids_alive(pid_file):
            os.kill(child, signal.SIGKILL)
