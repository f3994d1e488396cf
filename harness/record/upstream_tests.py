"""Upstream's own ctest suite on base and fork, side by side: each test's pair of outcomes and its class, typed
(``<platform>/upstream-tests/pairs.json``, named by RunLayout.upstream_file; written by
harness.stages.native_tests.upstream_suite, read by the signatures and by triage).

A side's outcome is ``passed``, ``failed`` or ``skipped`` as ctest's JUnit says, ``absent`` where that build's
ctest does not know the test, or ``declared`` where matrix.yaml's ``upstream_tests.needs`` names it and this machine
lacks what it needs.  :func:`classify` turns a pair into one of :data:`CLASSES`; only :data:`REGRESSED` is the fork's
failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .records import RecordError
from .json_files import read_record_json
from .native_tests import CASE_FAILED, CASE_PASSED

#: The classes of a pair, each with the words the step's detail and the report use.
PASSED_BOTH, FAILED_BOTH, REGRESSED, FIXED, SKIPPED_BOTH, FORK_ONLY, DECLARED = (
    "passed-both", "failed-both", "regressed", "fixed", "skipped-both", "fork-only", "declared")
CLASSES = {
    PASSED_BOTH: "pass on both",
    FAILED_BOTH: "fail on both (upstream's or the environment's, never the fork's regression)",
    REGRESSED: "pass on base and fail on the fork (regressions)",
    FIXED: "fail on base and pass on the fork",
    SKIPPED_BOTH: "skipped on both by ctest",
    FORK_ONLY: "only the fork's ctest knows, and pass there",
    DECLARED: "skipped by declaration",
}

#: The outcome of a side that does not run the test: ctest does not know it there.
ABSENT = "absent"
#: The outcome of a side where matrix.yaml declares a need this machine lacks: not run, never counted as passed.
DECLARED_SKIP = "declared"


def classify(base: str, fork: str) -> str:
    """The class of a test whose base outcome is ``base`` and fork outcome is ``fork`` (passed, failed, skipped,
    absent or declared).

    A test that fails on the fork and not on base is :data:`REGRESSED`, also one that base passes and the fork
    skips or lacks: the fork no longer runs what upstream's build passes.  A test both sides fail is
    :data:`FAILED_BOTH` (upstream's or the machine's), whatever the fork's message."""
    if DECLARED_SKIP in (base, fork):
        return DECLARED
    if fork == CASE_FAILED:
        return FAILED_BOTH if base == CASE_FAILED else REGRESSED
    if base == CASE_PASSED:
        return PASSED_BOTH if fork == CASE_PASSED else REGRESSED
    if base == CASE_FAILED:
        return FIXED if fork == CASE_PASSED else FAILED_BOTH
    return FORK_ONLY if fork == CASE_PASSED else SKIPPED_BOTH


@dataclass(frozen=True)
class TestPair:
    """One test of upstream's suite: its ``name``, the ``base`` and ``fork`` outcomes, their class (``outcome``, one
    of :data:`CLASSES`), each side's failure message and seconds, and the declared ``need`` with its reason."""

    name: str
    base: str
    fork: str
    outcome: str
    base_message: str = ""
    fork_message: str = ""
    base_seconds: float = 0.0
    fork_seconds: float = 0.0
    need: str = ""

    __test__ = False  # not a pytest class


@dataclass
class SuiteRecord:
    """The platform's suite on base and fork: the ctest ``label``, the ``pairs`` in ctest's order and each side's
    ctest seconds (``seconds``: variant -> seconds of its ctest, ``build_seconds``: of building its test targets)."""

    label: str
    pairs: list[TestPair] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    build_seconds: dict[str, float] = field(default_factory=dict)

    def of(self, outcome: str) -> list[TestPair]:
        """The pairs of class ``outcome``, in order."""
        return [p for p in self.pairs if p.outcome == outcome]

    def counts(self) -> dict[str, int]:
        """Pairs per class (every class of :data:`CLASSES`, zero included)."""
        return {c: len(self.of(c)) for c in CLASSES}


def read_suite(path: Path) -> SuiteRecord:
    """The suite record at ``path`` (``pairs.json``).  Raises FileNotFoundError naming the file when there is none,
    RecordError naming it when it is not JSON or not a suite record (a pair without name, sides and a known class)."""
    data = read_record_json(path, "no pairs.json; upstream's suite did not run here")
    try:
        if not isinstance(data, dict) or not isinstance(data.get("label"), str):
            raise ValueError("no label")
        pairs = []
        for i, p in enumerate(data.get("pairs") or []):
            if not all(isinstance(p.get(k), str) for k in ("name", "base", "fork", "outcome")):
                raise ValueError(f"pair {i} has no name, sides and outcome")
            if p["outcome"] not in CLASSES:
                raise ValueError(f"pair {i} ({p['name']}): unknown outcome {p['outcome']!r}")
            pairs.append(TestPair(p["name"], p["base"], p["fork"], p["outcome"], str(p.get("base_message") or ""),
                                  str(p.get("fork_message") or ""), float(p.get("base_seconds") or 0.0),
                                  float(p.get("fork_seconds") or 0.0), str(p.get("need") or "")))
        return SuiteRecord(data["label"], pairs, {str(k): float(v) for k, v in (data.get("seconds") or {}).items()},
                           {str(k): float(v) for k, v in (data.get("build_seconds") or {}).items()})
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a record of upstream's suite ({exc})") from None
