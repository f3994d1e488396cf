"""A step whose inputs could not be made says it did not run, naming the missing build: never a pass, and
never a failed speed rule.

The reproduction: a series whose last patch does not apply makes the fork's build err; the
comparisons that need it used to print "passed — no comparison ran", and the speed rules
"failed — 0 of N speed rule(s) passed".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fake_upstream import make_fake_project
from harness.common.statuses import STEP
from harness.stages.speed.speed import stage_speed
from test_speed import FakePipeline, speed_steps

REPO_ROOT = Path(__file__).resolve().parents[1]

#: A patch of the fork whose hunk meets a line upstream does not have: it does not apply (a stale patch, a
#: failure of the fork's, not bad input).
STALE_PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: t <t@example.org>
Date: Mon, 1 Jan 2024 00:00:01 +0000
Subject: Change the fork's notes

The notes say more.

diff --git a/FORK.md b/FORK.md
index 1234567..89abcde 100644
--- a/FORK.md
+++ b/FORK.md
@@ -1 +1 @@
-a line that is not there
+the fork's notes, longer
"""


class UnbuiltForkPipeline(FakePipeline):
    """The speed stage's fake pipeline whose fork build erred."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.said: list[str] = []

    def build_variant(self, p, variant):
        return SimpleNamespace(status="error" if variant == "fork" else "passed")

    def say(self, line: str) -> None:
        self.said.append(line)


def test_speed_rules_whose_build_did_not_pass_are_not_run_nor_failed(tmp_path):
    pipe = UnbuiltForkPipeline(tmp_path, "unbuilt")
    stage_speed(pipe)
    assert pipe.requests == []  # no engine started, base's neither
    steps = speed_steps(pipe.run)
    assert set(steps) == {"speed:base-vs-fork:pp", "speed:base-vs-fork:tg"}
    for s in steps.values():
        assert s.status == "error" and not STEP[s.status].success
        assert s.detail == "not run: error: build fork did not pass" and s.blocked_by() == ["fork"]
    console = pipe.console.out.getvalue() + "\n".join(pipe.said)
    assert "speed rule(s) passed" not in console and "failed" not in console
    assert "[linux-x86_64-cpu] speed:base-vs-fork:tg fork: error — not run: error: build fork did not pass" in pipe.said


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("cc"),
                    reason="the fake project needs Linux and a C compiler")
def test_a_fork_build_that_errs_leaves_no_passed_step_that_needed_it(tmp_path):
    project = make_fake_project(tmp_path)
    (project.patches / "change-the-fork-s-notes.patch").write_text(STALE_PATCH)
    with open(project.patches / "series", "a", encoding="utf-8") as fh:
        fh.write("change-the-fork-s-notes.patch\n")
    done = subprocess.run(project.argv("build", "test", "compare-outputs"), cwd=REPO_ROOT, env=project.env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no comparison ran" not in done.stdout and "passed — " not in \
        "\n".join(line for line in done.stdout.splitlines() if " compare " in line)
    assert "compare base-vs-fork: error — did not run: error: build fork did not pass" in done.stdout
    summary = json.loads((project.results / "latest" / "summary.json").read_text())
    steps = {(s["config"], s["step"]): s for s in summary["configurations"]}
    assert steps[("fork", "build")]["status"] == "error"
    needs_fork = {k: s["status"] for k, s in steps.items() if k != ("fork", "build") and k[0] == "fork"}
    assert needs_fork and "passed" not in needs_fork.values(), needs_fork
    assert steps[("fork", "generate")]["failures"] == [{**steps[("fork", "generate")]["failures"][0],
                                                        "kind": "blocked", "build": "fork"}]


def test_a_selection_with_nothing_to_compare_is_skipped_and_the_run_incomplete(tmp_path):
    """A group the platform does not run (a CUDA group on the CPU platform) leaves compare-outputs nothing to do:
    its line says so as skipped, never "passed", and the run is incomplete (exit 3), naming the selection."""
    done = subprocess.run([sys.executable, "-m", "harness", "compare-outputs", "--platform", "linux-x86_64-cpu",
                           "--group", "cuda-base-vs-fork", "--no-bench", "--results-dir", str(tmp_path / "results"),
                           "--work-dir", str(tmp_path / "work")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "] compare " in x and " — " in x)
    assert line.endswith("compare nothing: skipped — no comparison selected (0.0 s)") and "passed" not in line, line
    summary = json.loads(next((tmp_path / "results").glob("*/summary.json")).read_text())
    assert summary["overall"] == "incomplete"
    assert "compare-outputs selected no comparison" in summary["incomplete"][0]
