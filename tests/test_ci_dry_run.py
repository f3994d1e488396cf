"""Dry run of the workflow's cheap jobs, ``matrix`` and ``series``, in a fresh clone on this machine.

Their ``run:`` steps run in order (tests/workflow_dry_run.py) with the job's env and their own
GITHUB_OUTPUT, GITHUB_STEP_SUMMARY and workspace.  The ``uses:`` steps are skipped and listed; what
they provide is stood in for: the clone for actions/checkout, a Python on PATH for
actions/setup-python (for ``matrix`` a new venv with nothing installed, so its light install must
suffice; for ``series`` this test's own environment, which holds requirements.txt) and, for
``series``, this machine's cached base tree for the restore of actions/cache.  This proves the
jobs' scripts run in sequence on a fresh Linux box; it is not a run on GitHub Actions.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix.config import load_matrix
from harness.stages.building.source import cache_dir
from harness.tools import ci_matrix as ci
from workflow_checks import load_workflow
from workflow_dry_run import dry_run, tail

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.network,
              pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")]


def git(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, **kwargs)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of this repository carrying the working tree as git sees it: HEAD, the
    uncommitted changes of tracked files and the untracked files git does not ignore."""
    dst = tmp_path_factory.mktemp("dry-run") / ROOT.name
    git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(dst), cwd=ROOT)
    diff = git("diff", "--binary", "HEAD", cwd=ROOT).stdout
    if diff:
        git("apply", "--binary", "-", cwd=dst, input=diff)
    for name in filter(None, git("ls-files", "--others", "--exclude-standard", "-z", cwd=ROOT).stdout.split(b"\0")):
        src, target = ROOT / os.fsdecode(name), dst / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dst


def check_passed(run) -> None:
    failed = [s for s in run.ran if s.returncode != 0]
    assert not failed, f"step {failed[0].name!r} exited {failed[0].returncode}:\n{tail(failed[0].log)}"


def test_the_matrix_job_runs_with_its_light_install(clone, tmp_path):
    python = tmp_path / "python"  # setup-python's stand-in: a Python with nothing installed
    subprocess.run([sys.executable, "-m", "venv", str(python)], check=True)
    workflow = load_workflow(clone / ".github" / "workflows" / "harness.yml")
    run = dry_run(workflow, "matrix", clone, tmp_path / "job", [python / "bin"])
    print("matrix job: skipped uses: steps:", run.skipped_uses, "; not run (if:):", run.not_run)
    check_passed(run)
    assert [s.name for s in run.ran] == ["Install what ci-matrix needs", "Derive the job matrix from matrix.yaml"]
    assert run.skipped_uses == ["actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8",
                                "actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c",
                                "Cache the base source", "Upload the log"]
    # a push to main without the repository variable: the hosted platforms, the GPU ones left out
    assert json.loads(run.outputs["ci"]["matrix"]) == ci.ci_matrix(load_matrix(clone / "matrix.yaml"))
    assert "## Self-hosted runners\n\nNot used: the repository variable HARNESS_SELF_HOSTED_RUNNERS is unset" \
        in run.summary
    assert "- `windows-x86_64-cuda`: needs a self-hosted runner" in run.summary
    assert (clone / "results" / "logs" / "ci-matrix.log").is_file()
    installed = subprocess.run([str(python / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                               capture_output=True, text=True, check=True).stdout.lower()
    assert "nox==" in installed and "filelock==" in installed
    assert "cmake==" not in installed and "nvidia-cublas==" not in installed  # the light install stayed light


def seed_base_cache(clone: Path, matrix) -> None:
    """actions/cache's restore of the base source: this machine's cached base tree, hard-linked into
    the job's HARNESS_CACHE_DIR where it exists (else the job downloads it)."""
    name = matrix.base_commit[:12]
    here = cache_dir() / "base"
    dest = clone / ".ci-cache" / "harness" / "base"
    if (here / name).is_dir() and (here / f"{matrix.base_commit}.json").is_file():
        dest.mkdir(parents=True)
        subprocess.run(["cp", "-al", str(here / name), str(dest / name)], check=True)
        shutil.copy2(here / f"{matrix.base_commit}.json", dest)


def test_the_series_job_runs_its_steps_in_order(clone, tmp_path):
    workflow = load_workflow(clone / ".github" / "workflows" / "harness.yml")
    seed_base_cache(clone, load_matrix(clone / "matrix.yaml"))
    run = dry_run(workflow, "series", clone, tmp_path / "job", [Path(sys.executable).parent])
    print("series job: skipped uses: steps:", run.skipped_uses, "; not run (if:):", run.not_run)
    check_passed(run)
    assert [s.name for s in run.ran] == ["Install the harness's requirements",
                                         "Install the Debian packages check-windows needs",
                                         "patches/ is what `nox -s patches -- export` would write",
                                         "Windows checks"]
    assert run.skipped_uses == ["actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8",
                                "actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c",
                                "Cache the base source", "Upload the compile logs"]
    assert run.not_run == []  # the upload step is a uses: step, listed above
    windows = run.ran[-1].log.read_text(encoding="utf-8")
    assert "windows-x86_64" in windows and (clone / ".harness" / "check-windows").is_dir()
