"""Expectations in whole runs: a silent loss of mmap fails the run, on the fake project and on the real CPU build.

The fake project's engine logs its model buffer as llama does (tests/fake_upstream.py);
``FAKE_LOSE_MMAP`` makes it ``CPU`` instead of ``CPU_Mapped``.  The real run builds the
fork with tests/plants/llama-no-mmap-by-default.patch on top of the series (the default
load mode no longer memory-maps) and runs the CPU group that compares mmap with
``--load-mode none``: every token stays identical, and the run fails on the fork's
expectations.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import make_fake_project

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plants"))
from series_with import series_with  # noqa: E402


def _summary(results: Path) -> dict:
    return json.loads((results / "latest" / "summary.json").read_text())


def _steps(summary: dict, step: str) -> dict:
    return {s["config"]: s for s in summary["configurations"] if s["step"] == step}


def _planted_mmap_group(tmp_path: Path, work: Path, plant: str) -> dict:
    """The summary of a CPU run of the group mmap-vs-load-mode-none on moe-small (8 tokens, no speed stage), the
    fork built with tests/plants/``plant`` on top of the series in the work directory ``work`` (the suite's
    plant_work_dir: only the planted fork is built); asserts that the run failed (exit 1)."""
    series = series_with(tmp_path / "series", [ROOT / "tests" / "plants" / plant])
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "harness", "build", "compare-outputs", "--platform",
                           "linux-x86_64-cpu", "--group", "mmap-vs-load-mode-none", "--model", "moe-small",
                           "--n-predict", "8", "-j", "2", "--no-bench", "--patches-dir", str(series),
                           "--work-dir", str(work), "--results-dir", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    return _summary(results)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_lost_mmap_fails_the_fake_run_and_triage_names_the_placement_change(tmp_path):
    project = make_fake_project(tmp_path)
    clean = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT, env=project.env(),
                           capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    steps = _steps(_summary(project.results), "expectations")
    assert {c: s["status"] for c, s in steps.items()} == {"base": "passed", "fork": "passed"}
    clean_run = (project.results / "latest").resolve()
    junit = (project.results / "junit" / "checks-linux-x86_64-cpu.xml").read_text()
    assert 'name="fork"' in junit and 'failures="0"' in junit

    lost = subprocess.run(project.argv("compare-outputs"), cwd=ROOT, env=project.env(FAKE_LOSE_MMAP="1"),
                          capture_output=True, text=True)
    assert lost.returncode == 1, lost.stdout + lost.stderr
    summary = _summary(project.results)
    assert all(c["status"] == "identical" for c in summary["comparisons"])  # the tokens see nothing
    fork = _steps(summary, "expectations")["fork"]
    assert fork["status"] == "failed"
    assert "weights: tiny: model weights in CPU (0 MiB), expected CPU_Mapped or CPU_REPACK" in fork["detail"]
    signatures = json.loads((project.results / "latest" / "signatures.json").read_text())
    kinds = {(e["config"], e["step"], e["signature"]["kind"]) for e in signatures}
    assert ("fork", "expectations", "placement") in kinds
    assert "expectations" in lost.stdout  # the console names the step

    report = subprocess.run([sys.executable, "-m", "harness", "triage", str(clean_run),
                             str((project.results / "latest").resolve())], cwd=ROOT, env=project.env(),
                            capture_output=True, text=True)
    assert report.returncode == 1, report.stdout + report.stderr
    assert "fork expectations: passed -> failed" in report.stdout
    assert "[placement] placement changed: fork/tiny: CPU_Mapped 0 MiB -> CPU 0 MiB" in report.stdout


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")
def test_a_silent_loss_of_mmap_in_the_real_fork_fails_the_cpu_run(tmp_path, plant_work_dir):
    series = series_with(tmp_path / "series", [ROOT / "tests" / "plants" / "llama-no-mmap-by-default.patch"])
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "harness", "build", "compare-outputs", "--platform",
                           "linux-x86_64-cpu", "--group", "mmap-vs-load-mode-none", "--model", "moe-small",
                           "--n-predict", "8", "-j", "2", "--patches-dir", str(series),
                           "--work-dir", str(plant_work_dir), "--results-dir", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = _summary(results)
    assert [c["status"] for c in summary["comparisons"]] == ["identical"] * 4  # mmap or not, the same tokens
    steps = _steps(summary, "expectations")
    assert steps["fork-load-none"]["status"] == "passed"  # --load-mode none reads into CPU buffers anyway
    fork = steps["fork"]
    assert fork["status"] == "failed"
    # the probe: the experts in CPU buffers, the weights outside the mapped types, none backed by the model file
    assert {f["status"] for f in fork["failures"]} == {"placement", "weights", "mapped"}
    assert "expert tensors of layers 0-3 in CPU" in fork["detail"] and "expected CPU_Mapped" in fork["detail"]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_mapping_served_from_anonymous_memory_fails_the_fake_run_on_the_probe(tmp_path):
    """The fake engine's probe under FAKE_PROBE_ANON: the buffer keeps its name CPU_Mapped and its size, the load
    log is the clean one, and only the process's memory map tells that no weight is backed by the model file."""
    project = make_fake_project(tmp_path)
    requests = tmp_path / "requests.log"
    run = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT,
                         env=project.env(FAKE_PROBE_ANON="1", FAKE_REQUEST_LOG=str(requests)),
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    # once per load: every engine process probes right after it is ready, and never again
    per_process: dict[str, list[str]] = {}
    for line in requests.read_text().splitlines():
        pid, what = line.split(" ", 1)
        per_process.setdefault(pid, []).append(what)
    assert per_process and all(events[:2] == ["ready", "probe"] and events.count("probe") == 1
                               for events in per_process.values()), per_process
    summary = _summary(project.results)
    assert all(c["status"] == "identical" for c in summary["comparisons"])
    fork = _steps(summary, "expectations")["fork"]
    assert fork["status"] == "failed"
    assert {f["status"] for f in fork["failures"]} == {"mapped"}
    assert "host weights in CPU_Mapped not backed by the model file" in fork["detail"] or \
        "not backed by the model file (anonymous memory)" in fork["detail"]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")
def test_a_mapping_copied_into_anonymous_memory_in_the_real_fork_fails_the_cpu_run_on_the_probe(tmp_path,
                                                                                              plant_work_dir):
    """tests/plants/llama-mmap-served-from-an-anonymous-copy.patch maps the model, copies it into anonymous
    memory and serves the CPU_Mapped buffers from the copy: the same tokens, the same buffer names and sizes;
    the probe's memory map fails the fork's ``mapped`` rule, and nothing else."""
    summary = _planted_mmap_group(tmp_path, plant_work_dir, "llama-mmap-served-from-an-anonymous-copy.patch")
    assert [c["status"] for c in summary["comparisons"]] == ["identical"] * 4
    steps = _steps(summary, "expectations")
    assert steps["fork-load-none"]["status"] == "passed"  # --load-mode none maps nothing: nothing to lose
    fork = steps["fork"]
    assert fork["status"] == "failed"
    assert {f["status"] for f in fork["failures"]} == {"mapped"}  # placement and weights still look right
    assert "in CPU_Mapped" in fork["detail"] and "not backed by the model file" in fork["detail"]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_pages_copied_under_the_model_file_s_name_fail_the_fake_run_on_the_page_flags(tmp_path):
    """The fake engine's probe under FAKE_PROBE_COW: the memory map names the model file for the whole weight, the
    buffer keeps its name and size, and only the page flags say every page is a private copy."""
    project = make_fake_project(tmp_path)
    run = subprocess.run(project.argv("build", "compare-outputs"), cwd=ROOT, env=project.env(FAKE_PROBE_COW="1"),
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    summary = _summary(project.results)
    assert all(c["status"] == "identical" for c in summary["comparisons"])
    fork = _steps(summary, "expectations")["fork"]
    assert fork["status"] == "failed" and {f["status"] for f in fork["failures"]} == {"mapped"}
    assert "private page copies under the model file's name" in fork["detail"]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")
def test_a_private_written_mapping_in_the_real_fork_fails_the_cpu_run_on_the_page_flags(tmp_path, plant_work_dir):
    """tests/plants/llama-mmap-first-layer-copied-on-write.patch maps the model private and writes every page of
    layer 0's tensors once at load (the subtler of the two page plants; the whole-model one,
    llama-mmap-pages-copied-on-write.patch, failed the CPU main job the same way, docs/checks.md, and is left out
    here to spare CI a build).  /proc/self/maps still names the model file for every weight, the tokens and
    buffers are the same; the probe's page flags (/proc/self/pagemap) fail the fork's ``mapped`` rule, naming
    layer 0, and nothing else."""
    summary = _planted_mmap_group(tmp_path, plant_work_dir, "llama-mmap-first-layer-copied-on-write.patch")
    assert [c["status"] for c in summary["comparisons"]] == ["identical"] * 4
    steps = _steps(summary, "expectations")
    assert steps["fork-load-none"]["status"] == "passed"  # --load-mode none maps nothing
    fork = steps["fork"]
    assert fork["status"] == "failed" and {f["status"] for f in fork["failures"]} == {"mapped"}
    assert "private page copies under the model file's name" in fork["detail"] and "layers 0)" in fork["detail"]
    # the run's headline leads with the check and what the page flags found (harness.record.verdict)
    assert fork["why"].startswith("fork expectations: mapped: ") and "private page copies" in fork["why"]
    headline = (tmp_path / "results" / "latest" / "summary.md").read_text().splitlines()[0]
    assert headline.endswith(f"❌ failed: linux-x86_64-cpu {fork['why']}")
