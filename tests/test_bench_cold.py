"""``nox -s bench-cold`` (harness/tools/bench_cold.py): the README's first command on a fresh clone with
empty caches.  Its plumbing runs on the fake upstream (the real command takes 30 min on 2 cores); the
environment and pip install are left out there (``--reuse-python``)."""

import json
import re
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.stages.building.build import find_tool
from harness.tools import bench_cold

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_times_the_readmes_first_command():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*)\n", readme).group(1)
    assert first.startswith(" && ".join(bench_cold.README_COMMAND)), first


@pytest.mark.slow
def test_bench_cold_times_a_fresh_clone_with_empty_caches(tmp_path, monkeypatch, capsys):
    project = make_fake_project(tmp_path / "p")
    for name, value in project.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CCACHE_DISABLE")  # the empty ccache directory is filled
    monkeypatch.delenv("HARNESS_CACHE_DIR")  # the bench gives its own, empty
    monkeypatch.chdir(ROOT)
    where = tmp_path / "bench"
    rc = bench_cold.main(["--clone-dir", str(where), "--keep", "--reuse-python", "--", "--matrix",
                          str(project.matrix), "--patches-dir", str(project.patches), "-j", "1"])
    assert rc == 0
    cold = json.loads((where / "clone" / "bench-cold.json").read_text())
    job = cold["main_job"]
    assert job["verdict"] == "passed", job
    assert list(job["stages"]) == ["build", "test", "compare-outputs"] and all(s > 0 for s in job["stages"].values())
    assert {"linux-x86_64-cpu fork build", "linux-x86_64-cpu base build"} <= set(job["steps"]), job["steps"]
    assert cold["total"] == job["total"] and cold["setup"] == {}
    assert cold["caches"]["HARNESS_CACHE_DIR"] == str(where / "harness-cache")
    assert any((where / "harness-cache").iterdir())  # the run filled the empty cache it was given
    if find_tool("ccache"):
        assert any(p.is_file() for p in (where / "ccache").rglob("*"))
    assert (where / "clone" / "results" / job["run_id"] / "summary.json").is_file()
    out = capsys.readouterr().out
    assert "bench-cold on " in out and "target <= 900 s" in out and "venv and pip install not run" in out
