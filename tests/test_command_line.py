"""Every log of a program the harness runs starts with a line that runs it again when pasted into a shell:
quoted, with the environment the harness adds (harness.common.proc.command_line)."""

import subprocess
import sys

from harness.common import proc
from harness.stages.building.build import _run_step

#: A program that prints its arguments and one variable: what a pasted line must reproduce.
ECHO = [sys.executable, "-c", "import os, sys; print(sys.argv[1:], os.environ.get('HARNESS_X'))"]
#: Arguments a shell would split or run on their own unquoted.
AWKWARD = ["-DCMAKE_CUDA_ARCHITECTURES=75;80", "two words", "$HOME", "it's", ""]


def pasted(line: str) -> str:
    """The output of ``line`` run by a POSIX shell, as a user pasting it would run it."""
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout


def test_a_command_line_pasted_into_a_shell_runs_the_same_command_with_the_same_environment(tmp_path):
    line = proc.command_line([*ECHO, *AWKWARD], {"HARNESS_X": "a b;c", proc.HOLDS_ENV: "token"})
    assert line.startswith("env HARNESS_X=") and proc.HOLDS_ENV not in line
    direct = subprocess.run([*ECHO, *AWKWARD], capture_output=True, text=True, check=True,
                            env={"HARNESS_X": "a b;c", "PATH": "/usr/bin:/bin"}).stdout
    assert pasted(line) == direct == f"{AWKWARD!r} a b;c\n"
    assert pasted(proc.command_line(["pwd"], cwd=tmp_path)).strip() == str(tmp_path)
    assert proc.command_line(["ls", "-l"]) == "ls -l"  # nothing added: no env word


def test_a_build_steps_log_starts_with_its_command_that_can_be_pasted_back(tmp_path):
    log = tmp_path / "build.log"
    rc, _ = _run_step([*ECHO, *AWKWARD], log, {"HARNESS_X": "75;80"})
    first, output = log.read_text().split("\n", 1)
    assert rc == 0 and first.startswith("$ env HARNESS_X=")
    assert pasted(first[2:]) == output == f"{AWKWARD!r} 75;80\n"

