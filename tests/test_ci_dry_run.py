"""Dry run of the workflow's cheap jobs, ``matrix`` and ``series``, in a fresh clone on this machine.

Their ``run:`` steps run in order (tests/workflow_dry_run.py) with the job's env and their own
GITHUB_OUTPUT, GITHUB_STEP_SUMMARY and workspace.  The ``uses:`` steps are skipped and listed; what
they provide is stood in for: the clone for actions/checkout, a Python on PATH for
actions/setup-python (for ``matrix`` a new venv with nothing installed, so its light install must
suffice; for ``series`` this test's own environment, which holds requirements.txt) and, for
``series``, this machine's cached base tree for the restore of actions/cache.  This proves the
jobs' scripts run in sequence on a fresh Linux box; it is not a run on GitHub Actions.

No test installs a package: the series job's "Install the Debian packages check-windows needs" step runs
.ci/apt-install against stand-ins for ``apt-get``, ``sudo``, ``dpkg-query`` and ``id`` first on PATH
(tests/test_apt_install.py), which record the install and report every package missing, and tripwires for
``apt``, ``aptitude`` and ``dpkg``; the dpkg database (/var/lib/dpkg/status) is compared before and after.
The Windows checks then use the MinGW-w64 already on this machine; without it the series job's test skips,
naming the package.
"""

import hashlib
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
from harness.stages.building.cuda_headers import SetupError
from harness.tools.windows_check import MINGW_PACKAGE, find_mingw
from test_apt_install import package_manager_stand_ins, recorded
from workflow_checks import load_workflow
from workflow_dry_run import dry_run, tail

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "harness.yml"
#: dpkg's database of installed packages: what ``dpkg -l`` lists.
DPKG_STATUS = Path("/var/lib/dpkg/status")
INSTALL_STEP = "Install the Debian packages check-windows needs"


def in_a_clone(test):
    """The marks of a test that dry-runs a whole job in a clone of this checkout: it needs one, and its steps
    install Python packages and run nox (slow, network)."""
    for mark in (pytest.mark.slow, pytest.mark.network,
                 pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")):
        test = mark(test)
    return test


def git(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, **kwargs)


def dpkg_state() -> str | None:
    """The sha256 of dpkg's database (None on a machine without dpkg): unchanged unless a package was
    installed or removed."""
    return hashlib.sha256(DPKG_STATUS.read_bytes()).hexdigest() if DPKG_STATUS.is_file() else None


def reached_a_package_manager(calls: Path) -> list[str]:
    """The tripwires the stand-ins recorded (``reached apt ...``): a package manager other than the stand-ins."""
    return [line for line in recorded(calls) if line.startswith("reached ")]


def install_step_job(run: str | None = None) -> dict:
    """A workflow of one job, ``install``, holding the series job's Debian install step (its ``run:`` replaced
    by ``run`` where given), run as a developer who is not root (``id -u`` answers 1001)."""
    series = load_workflow(WORKFLOW)["jobs"]["series"]
    step = dict(next(s for s in series["steps"] if s.get("name") == INSTALL_STEP))
    if run is not None:
        step["run"] = run
    return {"jobs": {"install": {"env": {"FAKE_UID": "1001"}, "steps": [step]}}}


def test_the_install_step_reaches_the_stand_ins_through_sudo_and_nothing_is_installed(tmp_path):
    calls = tmp_path / "calls.txt"
    stand_ins = package_manager_stand_ins(tmp_path / "bin", calls)
    before = dpkg_state()
    run = dry_run(install_step_job(), "install", ROOT, tmp_path / "job", [stand_ins])
    check_passed(run)
    assert recorded(calls) == ["sudo", "apt-get update -qq",
                               "sudo", f"apt-get install -y -qq --no-install-recommends {MINGW_PACKAGE}"]
    assert dpkg_state() == before


def test_an_install_step_that_bypasses_apt_install_is_caught_by_a_tripwire(tmp_path):
    calls = tmp_path / "calls.txt"
    stand_ins = package_manager_stand_ins(tmp_path / "bin", calls)
    before = dpkg_state()
    run = dry_run(install_step_job(f"sudo apt install -y {MINGW_PACKAGE}"), "install", ROOT, tmp_path / "job",
                  [stand_ins])
    assert run.ran[0].returncode == 97
    assert reached_a_package_manager(calls) == [f"reached apt install -y {MINGW_PACKAGE}"]
    assert dpkg_state() == before


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


@in_a_clone
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


@in_a_clone
@pytest.mark.debian
def test_the_series_job_runs_its_steps_in_order(clone, tmp_path):
    try:
        find_mingw()
    except SetupError as e:
        pytest.skip(f"needs the Debian package {MINGW_PACKAGE} for the Windows checks step: {e}")
    workflow = load_workflow(clone / ".github" / "workflows" / "harness.yml")
    seed_base_cache(clone, load_matrix(clone / "matrix.yaml"))
    calls = tmp_path / "calls.txt"
    stand_ins = package_manager_stand_ins(tmp_path / "bin", calls)
    before = dpkg_state()
    run = dry_run(workflow, "series", clone, tmp_path / "job", [stand_ins, Path(sys.executable).parent])
    print("series job: skipped uses: steps:", run.skipped_uses, "; not run (if:):", run.not_run)
    check_passed(run)
    # the install went to the stand-ins (every package reported missing, this run as root): nothing installed
    assert recorded(calls) == ["apt-get update -qq",
                               f"apt-get install -y -qq --no-install-recommends {MINGW_PACKAGE}"]
    assert dpkg_state() == before
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
