"""Triage of upstream's suite between two runs: each test whose pair of outcomes changed class
(harness.record.upstream_tests), beside the ``upstream-tests`` step's own transition.

A test that becomes :data:`~harness.record.upstream_tests.REGRESSED` (passes on base, fails on the fork) is a
regression; one that stops being so is a fix; every other change (a test that now fails on both, one newly
declared, one the fork newly fixes) is listed among the other changes, never as the fork's regression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..record.records import RecordError
from ..record.layout import RunLayout
from ..record.upstream_tests import CLASSES, REGRESSED, SuiteRecord, read_suite


def _suite(run_dir: Path, platform: str) -> SuiteRecord | None:
    try:
        return read_suite(RunLayout(run_dir).upstream_file(platform, "pairs"))
    except (OSError, RecordError):
        return None


def upstream_test_transitions(a: Path, b: Path, platforms: list[str], make: Callable[..., object]) -> list:
    """The changed tests of upstream's suite between run ``a`` and run ``b`` on each of ``platforms`` where both
    recorded it, each made by ``make`` (harness.triage.triage.Transition's fields: category, kind, platform, what,
    before, after, where, detail)."""
    out = []
    for platform in platforms:
        sa, sb = _suite(a, platform), _suite(b, platform)
        if sa is None or sb is None:
            continue  # a run without --upstream-tests: nothing to compare, as for a step it did not run
        before = {p.name: p for p in sa.pairs}
        for p in sb.pairs:
            old = before.get(p.name)
            was = old.outcome if old else "absent"
            if was == p.outcome:
                continue
            category = "regression" if p.outcome == REGRESSED else "fix" if was == REGRESSED else "other"
            detail = p.fork_message or p.base_message or p.need or CLASSES[p.outcome]
            out.append(make(category, "upstream-test", platform, f"upstream test {p.name}", was, p.outcome,
                            {"platform": platform, "test": p.name}, detail))
    return out
