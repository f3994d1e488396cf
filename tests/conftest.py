"""Test tiers: markers by fixture, for tests whose cost comes from a fixture they use.

Markers (declared in pyproject.toml): ``slow`` (builds or runs llama.cpp or a fake
project, bisects, or judges thousands of committed speed pairs: seconds to minutes each), ``network`` (needs PyPI unless the
download cache already holds the base source and models), ``debian`` (needs a Debian
package: g++-mingw-w64-x86-64-posix, chromium or shellcheck; skipped, saying so, without it).
The fast tier is ``python -m pytest -m "not slow"``; ``python -m pytest`` runs everything.

The suite runs side by side (pytest-xdist, ``-n auto --dist loadfile`` in pyproject.toml: the tests of one file
on one worker, so a module's fixtures are made once): the controller
hosts one job pool of the machine's cores (harness.common.jobserver) and every harness run a test starts, in
any worker, joins it (``HARNESS_JOB_POOL``), so all their builds together run at most that many jobs.  The real
llama.cpp builds are made once per test run: :func:`llama_cpu_builds` builds base and fork of the CPU platform in
the checkout's own work directory (where the README's first command built them, they are up to date), and
:func:`plant_work_dir` builds each planted fork on top of it (docs/ci.md#the-suite-side-by-side).

A test is marked where it is written (``@pytest.mark.slow``); a test that gets its
cost from one of :data:`FIXTURE_MARKERS`' fixtures is marked here, so every test using
the fixture is.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

import pytest

from harness.common.jobserver import POOL_ENV, JobBudget, available_cores
from harness.stages.building.build import find_tool

# every run the suite makes, in this process and in the harness processes it starts, holds its stages to what
# they declare: a step or a status no stage declares stops the run (harness.pipeline.STRICT_ENV)
os.environ["HARNESS_STRICT_STAGES"] = "1"

#: Debian packages the suite needs beyond the harness's own (harness.tools.ci_matrix.debian_packages_of:
#: MinGW-w64 and Wine), each with what needs it; without them those tests skip, saying so.  The report
#: test's Chromium is looked for at /usr/bin/chromium, which is not always a Debian package's file.
DEBIAN_PACKAGES = {"shellcheck": "tests/test_workflow_lint.py: the shell scripts of the workflow and of .ci/"}

#: Fixture name -> markers of every test that uses it.  ``patched_tree``/``tree_copy``
#: (tests/test_windows_check.py) clone the real base, apply the series and compile it
#: with MinGW-w64.
FIXTURE_MARKERS = {
    "patched_tree": ("slow", "network", "debian"),
    "tree_copy": ("slow", "network", "debian"),
    "llama_cpu_builds": ("slow", "network"),
    "plant_work_dir": ("slow", "network"),
    "cuda_compile_shared": ("slow", "network"),
}


ROOT = Path(__file__).resolve().parents[1]
#: The platform of the shared real builds: the one this machine builds and runs without extra packages.
CPU = "linux-x86_64-cpu"


def pytest_configure(config: pytest.Config) -> None:
    """Host the suite's one job pool (the cores this process may use) and name it in :data:`POOL_ENV`, so that
    every harness run a test starts, in this process or an xdist worker (which inherits the variable), joins it.
    A worker, or a suite started with the variable set (inside another harness's pool), hosts none."""
    if hasattr(config, "workerinput") or os.environ.get(POOL_ENV):
        return
    budget = JobBudget.open(None, available_cores(), find_tool("ninja"))
    if budget.governs and not budget.joined:
        os.environ[POOL_ENV] = budget.env()["MAKEFLAGS"]
        config.stash[_POOL_KEY] = budget


def pytest_unconfigure(config: pytest.Config) -> None:
    """Close the pool :func:`pytest_configure` hosted (its FIFO and directory go)."""
    budget = config.stash.get(_POOL_KEY, None)
    if budget is not None:
        os.environ.pop(POOL_ENV, None)
        budget.close()


@pytest.fixture(autouse=True)
def _own_job_pool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``own_job_pool`` (it kills harness runs mid-build: a token a killed process holds never
    comes back) starts its runs without the shared pool; each hosts its own, as outside the suite."""
    if request.node.get_closest_marker("own_job_pool") is not None:
        monkeypatch.delenv(POOL_ENV, raising=False)


@dataclass(frozen=True)
class SharedBuilds:
    """Base and fork of :data:`CPU` built and up to date in ``work_dir`` (the checkout's ``.harness/``); ``log``:
    the harness's output of the build."""

    work_dir: Path
    log: Path


def harness_env() -> dict[str, str]:
    """The environment of a harness run a test starts: this process's, without a run id it may have inherited."""
    return {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}


def _shared_build(platform: str, tmp_path_factory: pytest.TempPathFactory) -> SharedBuilds:
    """``harness build --platform PLATFORM`` in the checkout's work directory; fails the tests using it, with the
    harness's output, when the build fails (exit 1 or 2)."""
    results = tmp_path_factory.mktemp("shared-build")
    proc = subprocess.run([sys.executable, "-m", "harness", "build", "--platform", platform, "--results-dir",
                           str(results / "results")], cwd=ROOT, env=harness_env(), capture_output=True, text=True)
    log = results / "harness-output.txt"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"the shared build of {platform} failed (exit {proc.returncode}; {log}):\n{proc.stdout[-3000:]}"
                    f"{proc.stderr[-3000:]}")
    return SharedBuilds(ROOT / ".harness", log)


@pytest.fixture(scope="session")
def llama_cpu_builds(tmp_path_factory: pytest.TempPathFactory) -> SharedBuilds:
    """The real llama.cpp's base and fork of :data:`CPU`, built once for the test run in the checkout's work
    directory (``.harness/``, the default of every harness command): where the README's first command built them
    there, ``harness build`` finds both up to date and builds nothing; otherwise it builds them (ccache hits where
    the cache holds them).  In each xdist worker the second call finds them up to date (the build locks make a
    worker wait for the other's build).  Fails the tests using it, with the harness's output, when the build fails
    (exit 1 or 2)."""
    return _shared_build(CPU, tmp_path_factory)


#: The CUDA platform whose compile step runs without a GPU (harness.stages.building.compile_stage).
CUDA = "linux-x86_64-cuda"


@pytest.fixture(scope="session")
def cuda_compile_shared(tmp_path_factory: pytest.TempPathFactory) -> SharedBuilds:
    """The compile step of :data:`CUDA`, fork and base, once for the test run in the checkout's work directory, as
    the main job runs it (``harness build --platform linux-x86_64-cuda`` on a machine without a GPU compiles
    instead of building): up to date after the README's first command, else compiled once, the main job of
    tests/test_e2e.py waiting on the compile lock and finding it done.  Its unity groups and objects are in ccache
    for a fork tree laid out like ``.harness`` with the same series (tests/test_cuda_compile.py), which then
    compiles only the units its planted fault touches.  Skips where the toolkit's wheels are missing."""
    from harness.stages.building.cuda_compile import ToolkitMissing, wheel_versions
    try:
        wheel_versions()
    except ToolkitMissing as exc:
        pytest.skip(str(exc))
    return _shared_build(CUDA, tmp_path_factory)


@pytest.fixture(scope="session")
def plant_work_dir(tmp_path_factory: pytest.TempPathFactory, llama_cpu_builds: SharedBuilds) -> Path:
    """A work directory for runs whose fork carries a planted patch: its ``base`` is the shared one of
    :func:`llama_cpu_builds` (a link: up to date, never built again), its fork tree and build are its own.  The
    first planted run builds that fork from ccache (the shared fork's objects, the same paths below the work
    directory); each later one applies its series onto the same tree, and the harness's incremental build compiles
    only the files the change of series touched (ccache again for the series' own).  Session-scoped, so one per
    xdist worker: the tests of one worker use it one after another."""
    work = tmp_path_factory.mktemp("plant-work")
    (work / "base").symlink_to(llama_cpu_builds.work_dir / "base", target_is_directory=True)
    return work


_POOL_KEY = pytest.StashKey[JobBudget]()


@pytest.fixture(autouse=True)
def _lock_floor_not_left_behind() -> Iterator[None]:
    """Fail the test that leaves its thread marked by harness.common.locks.joined_by_holder_of (a stage the loop
    runs beside the builds, run in pytest's own thread): every later test of the worker would have its build locks
    refused.  The mark is cleared, so only the test that left it fails."""
    yield
    from harness.common import locks
    floor = getattr(locks._thread, "floor", None)
    if floor is not None:
        del locks._thread.floor
        pytest.fail(f"the test left its thread marked joined_by_holder_of({floor!r}): run such a stage in a thread "
                    "of its own", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add :data:`FIXTURE_MARKERS`' markers to the tests using those fixtures."""
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for name in FIXTURE_MARKERS.get(fixture, ()):
                item.add_marker(getattr(pytest.mark, name))


#: The committed evidence (results/evidence/): tests read it, and none may change it.
EVIDENCE = Path(__file__).resolve().parents[1] / "results" / "evidence"


def file_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its path relative to ``root`` -> (size in bytes, mtime in ns)."""
    return {p.relative_to(root).as_posix(): (st.st_size, st.st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and not p.is_symlink() for st in (p.stat(),)}


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """The paths added, removed or rewritten between two :func:`file_state` snapshots, sorted, each with a word."""
    return sorted([f"added {p}" for p in after.keys() - before.keys()]
                  + [f"removed {p}" for p in before.keys() - after.keys()]
                  + [f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p]])


def pytest_sessionstart(session: pytest.Session) -> None:
    """Take the committed evidence's snapshot before any test runs."""
    session.config.stash[_EVIDENCE_KEY] = file_state(EVIDENCE) if EVIDENCE.is_dir() else {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session, naming the files, when a test added, removed or rewrote a file of the committed
    evidence: a run written there would be read as evidence by the report, triage and the speed spreads."""
    before = session.config.stash.get(_EVIDENCE_KEY, None)
    if before is None:
        return
    changed = changed_files(before, file_state(EVIDENCE) if EVIDENCE.is_dir() else {})
    if changed:
        shown = "\n  ".join(changed[:20]) + (f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else "")
        session.config.get_terminal_writer().line(
            f"\nerror: the tests changed the committed evidence ({EVIDENCE}):\n  {shown}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_EVIDENCE_KEY = pytest.StashKey[dict]()
