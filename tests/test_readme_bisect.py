"""The README's bisect example, run as written: its check exists at every k of the series."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.stages.building.patches import read_series

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the example's platform is Linux")]


def readme_bisect_command() -> list[str]:
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.strip().startswith("nox -s bisect -- ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0], comments=True)  # as the shell reads it: a trailing comment is no argument


def test_the_readme_bisect_example_runs_its_check_at_both_ends_of_the_series():
    argv = readme_bisect_command()
    assert argv[:4] == ["nox", "-s", "bisect", "--"]
    nox = shutil.which("nox") or shutil.which("nox", path=str(Path(sys.executable).parent))
    assert nox, "nox is in requirements.txt"
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "2",
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([nox, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    out = done.stdout + done.stderr
    n = len(read_series(ROOT / "patches"))
    check = argv[argv.index("--check") + 1].split(":", 1)[1]
    # the check ran at the unpatched base and at the whole series: the target exists at both ends
    assert re.search(r"k=0 .*: pass", out), out[-3000:]
    assert "unknown target" not in out and "not registered" not in out
    if done.returncode == 0:  # the series broke the check: bisect names the patch
        assert re.search(rf"first bad patch: \d+ of {n}: \S+\.patch", out), out[-3000:]
    else:  # the series keeps the check passing: nothing to bisect, said so
        assert done.returncode == 2, out[-3000:]
        assert f"the check passes at k={n} (patches 1..{n}); it must fail at the bad end" in out, out[-3000:]
        assert f"{check}" in out
