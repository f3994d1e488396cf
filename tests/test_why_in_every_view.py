"""The why, in every view (harness.record.verdict): a failing step's verdict names its check and the measure its
stage recorded, and the console's end line, summary.md's and report.html's headlines, the JUnit failure message,
the ``::error`` annotations and ``--json``'s ``why`` carry the same words.

Each fault is planted as a patch would make it: the recorded run of tests/plants/cuda-host-buffers-pageable.patch
judged again by the expectations stage, a fork whose engine decodes twice as slowly measured by the speed stage
(tests/fake_engine.py), and, in the slow tier, a patch of the fake project's llama-completion that aborts on one
prompt, run through the whole command line.
"""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import cli
from harness.views.run_views import annotate_failures, verdict_json, verdict_line, write_views
from harness.common.console import Console
from harness.record.bench import read_bench
from harness.record.junit import checks_xml, speed_xml
from harness.record.run import Run
from harness.stages.speed.speed import stage_speed

ROOT = Path(__file__).resolve().parent.parent


def _views(run: Run) -> dict[str, str]:
    """Every view of ``run`` as text: the console's end line, summary.md's and report.html's headlines, the
    GitHub annotations and ``--json``'s failing steps."""
    report = write_views(run.dir)
    page = report.read_text(encoding="utf-8")
    found = re.search(r'<p class="headline[^"]*" id="headline">(.*?)</p>', page, re.S)
    assert found, "report.html has no headline"
    out = io.StringIO()
    annotate_failures(run, Console(out, interactive=False, github=True))
    data = verdict_json(run, report, cli.STAGES)
    return {"console": verdict_line(run, report, cli.STAGES),
            "summary.md": (run.dir / "summary.md").read_text(encoding="utf-8").splitlines()[0],
            "report.html": html.unescape(re.sub(r"<[^>]+>", "", found.group(1))),
            "annotations": out.getvalue(),
            "json": " | ".join(r["why"] for r in data["failing_steps"])}


def _junit_messages(tree: ET.ElementTree) -> list[str]:
    return [f.get("message") or "" for f in tree.getroot().iter("failure")]


def test_a_planted_pageable_host_buffer_is_named_by_its_rule_and_finding_in_every_view(tmp_path):
    """tests/plants/cuda-host-buffers-pageable.patch, as its H200 run recorded it, judged by the expectations
    stage: the step's why is its check and the first finding, the rule and what the probe found."""
    from test_expectations import CLEAN, CUDA, PAGEABLE_PLANT, _run
    clean = _run(tmp_path, "clean", CLEAN)
    assert not [s for s in clean.steps if s.verdict().fails]
    planted = _run(tmp_path, "planted", PAGEABLE_PLANT)
    step = next(s for s in planted.steps if s.step == "expectations" and s.config == "cuda-pin-all")
    why = step.verdict().why
    assert why.startswith("cuda-pin-all expectations: placement: expert tensors of layers 0-7 in CPU, expected "
                          "CUDA_Host (the probe)")
    assert why.endswith(f" (and {len(step.failures) - 1} more)")  # the pinned finding beside it
    for view, text in _views(planted).items():
        assert why in text, view
    assert why in _junit_messages(checks_xml(CUDA.name, planted.steps, ["expectations"]))
    assert _views(planted)["console"].split(" — ", 1)[1].startswith(f"failed: {CUDA.name} {why}")


def test_a_planted_slowdown_is_named_by_the_rules_ratio_and_p_in_every_view(tmp_path):
    """A fork whose engine decodes twice as slowly (FAKE_BENCH_SCALE 2) fails the tg rule; its why carries the
    ratio and p that the speed stage recorded in bench.json, whatever they come out as."""
    from test_speed import CPU, FakePipeline
    pipe = FakePipeline(tmp_path, "slow", scale={"fork": 2.0})
    stage_speed(pipe)
    run = pipe.run
    rule = next(r for r in read_bench(run.dir, CPU)["rules"] if r["step"] == "speed:base-vs-fork:tg")
    assert rule["status"] == "failed" and rule["ratio"] < 0.6
    why = f"fork speed:base-vs-fork:tg: {rule['ratio']:.2f}x, p {rule['p_value']:.2g}"
    step = next(s for s in run.steps if s.step == "speed:base-vs-fork:tg")
    assert step.verdict().why == why
    for view, text in _views(run).items():
        assert why in text, view
    assert why in _junit_messages(speed_xml(CPU, run.steps))


def _plant_abort(project, word: str) -> None:
    """Append to the fake project's series a patch of its llama-completion that aborts (SIGABRT) on a prompt
    holding ``word``: committed on the fork's branch and exported as the series' second patch."""
    from fake_upstream import _git
    from harness.stages.building.patches import export_series
    repo = project.repo
    _git(repo, "checkout", "-q", "fork")
    script = repo / "fake_completion.py"
    text = script.read_text()
    hook = "generation_hooks(prompt, args[args.index(\"-m\") + 1])\n"
    assert hook in text
    script.write_text(text.replace(hook, hook + f"if {word!r} in prompt:\n    os.abort()\n"))
    _git(repo, "commit", "-q", "-am", "Abort on a prompt\n\nA planted fault.")
    base = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    export_series(repo, base, project.patches)
    _git(repo, "checkout", "-q", "main")


@pytest.mark.slow
def test_a_patch_that_aborts_llama_completion_is_named_crash_first_in_every_view(tmp_path):
    """The fake project with a patch that makes llama-completion abort on prompt ``four`` ("nine ten"): the
    crashed comparison leads the headline, then the generate step naming the program, the signal and the
    prompt; the console's last line and ``--json`` (a second run, its builds up to date) say the same."""
    from fake_upstream import make_fake_project
    project = make_fake_project(tmp_path)
    _plant_abort(project, "ten")
    env = project.env()
    plain = subprocess.run(project.argv("build", "compare-outputs", extra=("--no-bench",)), cwd=ROOT, env=env,
                           capture_output=True, text=True)
    assert plain.returncode == 1, plain.stdout[-3000:] + plain.stderr[-3000:]
    run_dir = (project.results / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    [generate] = [s for s in summary["configurations"] if s["step"] == "generate" and s["verdict"] == "fails"]
    why = "fork generate: llama-completion SIGABRT on four"
    assert generate["why"] == why  # decided where the step is recorded
    crashed = next(c for c in summary["comparisons"] if c["status"] == "crashed")
    first = f"linux-x86_64-cpu base-vs-fork tiny/four: fork vs base ({crashed['why']})"
    headline = f"failed: {first}; linux-x86_64-cpu {why}"
    last = plain.stdout.strip().splitlines()[-1]
    assert f" — {headline}" in last
    assert (run_dir / "summary.md").read_text().splitlines()[0].endswith(headline)
    page = html.unescape((run_dir / "report.html").read_text())
    assert f"<b>Fails:</b> {headline.removeprefix('failed: ')}" in page
    as_json = subprocess.run(project.argv("compare-outputs", extra=("--no-bench", "--json")), cwd=ROOT, env=env,
                             capture_output=True, text=True)
    assert as_json.returncode == 1, as_json.stderr[-3000:]
    data = json.loads(as_json.stdout)
    assert data["headline"].startswith(headline)
    assert [r["why"] for r in data["failing_steps"]] == [why]
