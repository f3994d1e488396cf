"""Upstream's scripts/compare-llama-bench.py puts the fork beside upstream from the llama-bench rows of a fresh
CPU run whose builds came from the cache: a run in the work directory of the suite's shared build
(tests/conftest.py: llama_cpu_builds) finds both builds up to date, configures nothing and keeps no configure log, and its rows still name the commits the builds were
made from (the pinned upstream commit, the fork tree's HEAD), the CPU backend, the model's own description
and the threads used."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix.config import load_matrix
from harness.record.summary import read_run

ROOT = Path(__file__).resolve().parents[1]
CPU = "linux-x86_64-cpu"

pytestmark = [pytest.mark.slow, pytest.mark.network,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")]


@pytest.fixture(scope="module")
def cached_build_run(tmp_path_factory, llama_cpu_builds):
    """(the work directory, the run): a run after the shared build, in its work directory."""
    results = tmp_path_factory.mktemp("cached-builds") / "results"
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    proc = subprocess.run([sys.executable, "-m", "harness", "build", "compare-outputs", "--platform", CPU,
                           "--group", "base-vs-fork", "--model", "gemma3-270m", "--n-predict", "16", "-j", "2",
                           "--no-cache", "--work-dir", str(llama_cpu_builds.work_dir), "--results-dir", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return llama_cpu_builds.work_dir, (results / "latest").resolve()


def test_the_second_run_found_both_builds_up_to_date(cached_build_run):
    _, run = cached_build_run
    builds = {s.config: s for s in read_run(run).steps if s.step == "build" and s.platform == CPU}
    assert builds["base"].up_to_date and builds["fork"].up_to_date
    assert not (run / CPU / "build-base" / "configure.log").exists()


def test_upstreams_script_prints_the_fork_beside_upstream(cached_build_run):
    work, run = cached_build_run
    rows = [json.loads(line) for line in (run / CPU / "speed" / "llama-bench.jsonl").read_text().splitlines()]
    pinned = load_matrix(ROOT / "matrix.yaml").base_commit[:7]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work / "fork" / "llama.cpp",
                          capture_output=True, text=True, check=True).stdout.strip()[:7]
    commits = {r["config"]: r["build_commit"] for r in rows}
    assert (commits["base"], commits["fork"]) == (pinned, head)
    for r in rows:
        assert (r["backends"], r["gpu_info"]) == ("CPU", "") and r["n_threads"] > 0
        assert r["model_type"].startswith("gemma3 ") and r["test_time"].endswith("Z") and "." not in r["test_time"]
    script = work / "base" / "llama.cpp" / "scripts" / "compare-llama-bench.py"
    if not script.is_file():
        from harness.stages.building.source import obtain_base
        script = obtain_base(load_matrix(ROOT / "matrix.yaml")).path / "scripts" / "compare-llama-bench.py"
    done = subprocess.run([sys.executable, str(script), "-t", "llama-bench", "-i",
                           str(run / CPU / "speed" / "llama-bench.jsonl"), "-b", pinned, "-c", head],
                          capture_output=True, text=True, cwd=run, timeout=120)
    assert done.returncode == 0, done.stderr
    table = [[c.strip() for c in ln.strip("|").split("|")] for ln in done.stdout.splitlines() if ln.startswith("|")]
    assert table[0][-3:] == [f"t/s {pinned}", f"t/s {head}", "Speedup"], table[0]
    tests = {r[-4] for r in table[2:]}
    assert any(t.startswith("pp") for t in tests) and any(t.startswith("tg") for t in tests), done.stdout
