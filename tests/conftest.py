"""Test tiers: markers by fixture, for tests whose cost comes from a fixture they use.

Markers (declared in pyproject.toml): ``slow`` (builds or runs llama.cpp or a fake
project, or bisects: seconds to minutes each), ``network`` (needs PyPI unless the
download cache already holds the base source and models), ``debian`` (needs a Debian
package: g++-mingw-w64-x86-64-posix, chromium or shellcheck; skipped, saying so, without it).
The fast tier is ``python -m pytest -m "not slow"``; ``python -m pytest`` runs everything.

A test is marked where it is written (``@pytest.mark.slow``); a test that gets its
cost from one of :data:`FIXTURE_MARKERS`' fixtures is marked here, so every test using
the fixture is.
"""

import os
from pathlib import Path

import pytest

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
}


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
