"""End to end on the real llama.cpp: a fork whose only change is speed fails the run on speed.

The series plus one extra patch (``tests/data/llama-wait-twice-the-graph-s-compute-time-after-every-decode.patch``:
after every graph computation, wait twice as long as it took) makes the fork's prompt
processing and generation about three times slower with every logit unchanged.  The main
job's comparisons stay identical; the speed stage's rules of ``base-vs-fork`` fail, with
``speed_regression`` signatures, in the summary, JUnit and the report.  Builds only the planted
fork, in the suite's work directory for planted forks (tests/conftest.py: plant_work_dir, whose base is
the shared build).
"""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOW_PATCH = ROOT / "tests" / "data" / "llama-wait-twice-the-graph-s-compute-time-after-every-decode.patch"
CPU = "linux-x86_64-cpu"

pytestmark = [pytest.mark.slow, pytest.mark.network,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")]


@pytest.fixture(scope="module")
def slow_fork_run(tmp_path_factory, plant_work_dir):
    root = tmp_path_factory.mktemp("slow-fork")
    patches = root / "patches"
    shutil.copytree(ROOT / "patches", patches)
    shutil.copy(SLOW_PATCH, patches / SLOW_PATCH.name)
    with open(patches / "series", "a", encoding="utf-8") as fh:
        fh.write(SLOW_PATCH.name + "\n")
    results = root / "results"
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    proc = subprocess.run([sys.executable, "-m", "harness", "build", "compare-outputs", "--platform", CPU,
                           "--group", "base-vs-fork", "--model", "gemma3-270m", "--n-predict", "16", "-j", "2",
                           "--patches-dir", str(patches), "--work-dir", str(plant_work_dir),
                           "--results-dir", str(results)], cwd=ROOT, env=env, capture_output=True, text=True)
    (root / "harness-output.txt").write_text(proc.stdout + proc.stderr)
    return proc, (results / "latest").resolve()


def test_the_run_fails_on_speed_alone(slow_fork_run):
    proc, run = slow_fork_run
    data = json.loads((run / "summary.json").read_text())
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cmps = [c for c in data["comparisons"] if c["group"] == "base-vs-fork"]
    assert len(cmps) == 4 and all(c["status"] == "identical" for c in cmps), cmps  # the same tokens
    steps = {(s["config"], s["step"]): s for s in data["configurations"] if s["platform"] == CPU}
    assert steps[("fork", "build")]["status"] == "passed" and steps[("fork", "generate")]["status"] == "passed"
    speed = {k[1]: s for k, s in steps.items() if k[1].startswith("speed:")}
    assert set(speed) == {"speed:base-vs-fork:pp", "speed:base-vs-fork:tg"}
    assert speed["speed:base-vs-fork:tg"]["status"] == "failed", speed  # generation ~3x slower
    failing = {k for k, s in steps.items() if s["status"] not in ("passed", "skipped")}
    assert failing <= {("fork", "speed:base-vs-fork:pp"), ("fork", "speed:base-vs-fork:tg")}, failing
    bench = json.loads((run / CPU / "speed" / "bench.json").read_text())
    tg = next(r for r in bench["rules"] if r["metric"] == "tg")
    assert tg["ratio"] < 0.5 and tg["p_value"] <= tg["p_max"]


def test_the_speed_failure_has_a_signature_junit_and_report(slow_fork_run):
    _, run = slow_fork_run
    sigs = json.loads((run / "signatures.json").read_text())
    tg = next(e["signature"] for e in sigs if e["step"] == "speed:base-vs-fork:tg")
    assert tg["kind"] == "speed_regression" and tg["key"] == "base-vs-fork/gemma3-270m: fork vs base tg"
    junit = ET.parse(run.parent / "junit" / f"speed-{CPU}.xml").getroot()
    assert int(junit.get("failures")) >= 1
    assert "speed_regression" in (run / "report.html").read_text()


def test_the_headline_leads_with_the_first_failing_rule_and_its_measure(slow_fork_run):
    """The run's verdict names each failing rule by its ratio and p as bench.json records them: the console's
    last line, summary.md's headline and summary.json's ``why`` (harness.record.verdict)."""
    proc, run = slow_fork_run
    data = json.loads((run / "summary.json").read_text())
    rules = {r["step"]: r for r in json.loads((run / CPU / "speed" / "bench.json").read_text())["rules"]}
    failing = [s for s in data["configurations"] if s["verdict"] == "fails"]
    assert failing and all(s["step"].startswith("speed:") for s in failing)
    for s in failing:
        rule = rules[s["step"]]
        assert s["why"] == f"fork {s['step']}: {rule['ratio']:.2f}x, p {rule['p_value']:.2g}"
    first = f"failed: {CPU} {failing[0]['why']}"
    assert f": ❌ {first}" in (run / "summary.md").read_text().splitlines()[0]
    assert f" — {first}" in proc.stdout.strip().splitlines()[-1]
