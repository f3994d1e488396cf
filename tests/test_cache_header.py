"""The result cache line of summary.md and report.html agrees with the test rows of the run it heads.

A run continued by later commands (``--run-id``) adds up every command's cache lookups, while a test step run
again shows only its last record: a run whose test step ran, then was reused twice, said "2 of 3 ctest labels
reused" beside a test row of 1 label reused.  The line counts the native tests as the test steps recorded them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.views.report import render_html

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,  # builds the fake project once and runs its tests three times: about 20 s
    pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler"),
]


def test_the_cache_line_counts_the_tests_the_rows_show_in_a_run_continued_by_later_commands(tmp_path):
    project = make_fake_project(tmp_path)
    for stages in (("build", "test"), ("test",), ("test",)):
        argv = [a for a in project.argv(*stages, extra=("--run-id", "r1")) if a != "--no-cache"]
        done = subprocess.run(argv, env=project.env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    run = project.results / "r1"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cache"]["tests"]["hits"] == 2 and summary["cache"]["tests"]["misses"] == 1  # every lookup
    [test] = [s for s in summary["configurations"] if s["step"] == "test"]
    reused = int(re.match(r"(\d+) reused from run r1", test["detail"]).group(1))
    ran = len(json.loads((run / "linux-x86_64-cpu" / "tests" / "tests.json").read_text())["cases"])
    line = f"{reused} of {ran} native tests reused"
    md = (run / "summary.md").read_text()
    assert f"Result cache (docs/cache.md): {line}" in md and "ctest labels" not in md
    assert f"Result cache (docs/cache.md): {line}</p>" in render_html(run, None)
