"""The result cache serves only what passed: what a command stored is pending until the command ends as it should
(harness.record.cache.ResultCache.hold, publish, discard), so an entry of a killed run, or of a run a full disk
cut short, is never served to a later run.

The fake project gets a second model, ``tiny-slow`` (other bytes than ``tiny``): its generations sleep or fill the disk while the sessions
of ``tiny`` finish and are stored.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from fake_upstream import kill_with_its_guard, make_fake_project, pids_alive
from test_environment_errors import in_tmpfs, needs_mount
from test_interrupts import start, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals, /proc, tmpfs"),
    pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler"),
]


@pytest.fixture()
def project(tmp_path):
    project = make_fake_project(tmp_path)
    slow = tmp_path / "slow-model.gguf"  # other bytes than tiny's: a model of the same bytes shares its sessions
    w = gguf.GGUFWriter(str(slow), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(1, 17, dtype=np.float32).reshape(4, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = project.matrix.read_text()
    text = text.replace("models:\n  tiny:\n", f"models:\n  tiny-slow:\n    kind: file\n    path: {slow}\n  tiny:\n")
    text = text.replace("    models: [tiny]\n", "    models: [tiny, tiny-slow]\n")
    project.matrix.write_text(text)
    return project


def cached_argv(project, *stages: str, results: Path | None = None) -> list[str]:
    """The project's command line with the result cache in use (the fake project's default is --no-cache)."""
    argv = [a for a in project.argv(*stages) if a != "--no-cache"]
    if results is not None:
        argv[argv.index("--results-dir") + 1] = str(results)
    return argv


def entries(project) -> list[dict]:
    """The manifests of the generation sessions in the project's result cache."""
    found = [json.loads(m.read_text()) for m in (project.root / "cache" / "results").glob("entries/*/*/manifest.json")]
    return [m for m in found if m["kind"] == "generation"]


def served_from(project, cut_run: str) -> list[str]:
    """compare-outputs again, nothing planted: the generate steps of its summary that name run ``cut_run`` as where
    their sessions came from (a session the rerun itself stored may serve it again: that is its own)."""
    done = subprocess.run(cached_argv(project, "compare-outputs", results=project.root / "rerun"), cwd=REPO_ROOT,
                          env=project.env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((project.root / "rerun" / "latest" / "summary.json").read_text())
    assert summary["cache"]["generation"]["stored"] >= 4
    return [f"{s['config']} {s['step']}: {s['detail']}" for s in summary["configurations"] if cut_run in s["detail"]]


def test_sessions_stored_by_a_killed_run_are_never_served(project):
    assert subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env()).returncode == 0
    pids = project.root / "pids"
    cut = start(cached_argv(project, "compare-outputs"),
                project.env(FAKE_GEN_SLEEP_S="120", FAKE_SLOW_WORD="slow-model", FAKE_PIDS=str(pids)))
    try:
        wait_for(lambda: len(entries(project)) >= 2, timeout_s=120, what="tiny's sessions stored")
        kill_with_its_guard(cut)
        cut.communicate(timeout=60)
    finally:
        for pid in pids_alive(pids):
            subprocess.run(["kill", "-9", str(pid)])
    stored = entries(project)
    assert stored and all(m.get("pending") for m in stored)  # stored, but its command never ended
    assert served_from(project, stored[0]["run_id"]) == []


@needs_mount
def test_sessions_stored_by_a_run_a_full_results_disk_cut_short_are_never_served(project):
    assert subprocess.run(project.argv("build"), cwd=REPO_ROOT, env=project.env()).returncode == 0
    where = project.root / "small"
    kept = project.root / "kept"
    kept.mkdir()
    script = project.root / "run-and-read.sh"  # the tmpfs goes with its namespace: read what is left inside it
    script.write_text(f'"$@" > {kept}/stdout 2> {kept}/stderr; echo $? > {kept}/rc; '
                      f'cp {where}/latest/summary.json {kept}/summary.json\n')
    subprocess.run(in_tmpfs(["sh", str(script), *cached_argv(project, "compare-outputs", results=where)], where,
                            "1m"), cwd=REPO_ROOT, env=project.env(FAKE_BIG_MB="2", FAKE_BIG_WORD="slow-model"),
                   timeout=300)
    assert (kept / "rc").read_text().strip() == "2", (kept / "stdout").read_text() + (kept / "stderr").read_text()
    cut = json.loads((kept / "summary.json").read_text())
    assert cut["overall"] == "incomplete"
    assert cut["cache"]["generation"]["stored"] >= 1  # tiny's sessions passed and were stored before the disk filled
    assert entries(project) == []  # the command did not end as it should: what it stored is gone
    assert served_from(project, cut["run_id"]) == []
