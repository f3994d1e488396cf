"""Upstream's own ctest suite on base and fork, side by side: each test's pair of outcomes and its class, typed
(``<platform>/upstream-tests/pairs.json``, named by RunLayout.upstream_file; written by
harness.stages.native_tests.upstream_suite, read by the signatures and by triage).

A side's outcome is ``passed``, ``failed`` or ``skipped`` as ctest's JUnit says, ``absent`` where that build's
ctest does not know the test, ``declared`` where matrix.yaml's ``upstream_tests.needs`` names it and this machine
lacks what it needs, or ``missing`` where a file of the source tree that the test's own arguments name (a vocabulary
of ``models/``) or that its declared need names is not there: the suite's data left out of the offline mirror.  :func:`classify` turns a pair into one of :data:`CLASSES`; only :data:`REGRESSED` is the fork's
failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .records import RecordError
from .json_files import jsonable, read_record_json, write_json
from .native_tests import CASE_FAILED, CASE_PASSED

#: The classes of a pair, each with the words the step's detail and the report use.
PASSED_BOTH, FAILED_BOTH, REGRESSED, FIXED, SKIPPED_BOTH, FORK_ONLY, DECLARED, MISSING_DATA, UNSUPPORTED = (
    "passed-both", "failed-both", "regressed", "fixed", "skipped-both", "fork-only", "declared", "missing-data",
    "unsupported")
CLASSES = {
    PASSED_BOTH: "pass on both",
    FAILED_BOTH: "fail on both (upstream's or the environment's, never the fork's regression)",
    REGRESSED: "pass on base and fail on the fork (regressions)",
    FIXED: "fail on base and pass on the fork",
    SKIPPED_BOTH: "skipped on both by ctest",
    FORK_ONLY: "only the fork's ctest knows, and pass there",
    DECLARED: "skipped by declaration",
    MISSING_DATA: "skipped for missing data (not run)",
    UNSUPPORTED: "unsupported by the backend on both (test-backend-ops' cases only)",
}

#: The outcome of a side that does not run the test: ctest does not know it there.
ABSENT = "absent"
#: The outcome of a side where matrix.yaml declares a need this machine lacks: not run, never counted as passed.
DECLARED_SKIP = "declared"
#: The outcome of a side whose source tree lacks a file the test reads: not run, never counted as passed or failed.
MISSING = "missing"


def classify(base: str, fork: str) -> str:
    """The class of a test whose base outcome is ``base`` and fork outcome is ``fork`` (passed, failed, skipped,
    absent or declared).

    A test that fails on the fork and not on base is :data:`REGRESSED`, also one that base passes and the fork
    skips or lacks: the fork no longer runs what upstream's build passes.  A test both sides fail is
    :data:`FAILED_BOTH` (upstream's or the machine's), whatever the fork's message.  A test whose data is
    :data:`MISSING` is :data:`MISSING_DATA`, unless base passes it and only the fork's tree lacks the data."""
    if DECLARED_SKIP in (base, fork):
        return DECLARED
    if MISSING in (base, fork):
        return REGRESSED if fork == MISSING and base == CASE_PASSED else MISSING_DATA
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
    of :data:`CLASSES`), each side's failure message and seconds, and the declared ``need`` with its reason (for
    :data:`MISSING_DATA`: ``missing data: <path in the source tree>``)."""

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

    def missing_data(self) -> dict[str, str]:
        """Test name -> the file of the source tree it reads and that is missing, for each :data:`MISSING_DATA`
        pair."""
        return {p.name: p.need.removeprefix(MISSING_PREFIX) for p in self.of(MISSING_DATA)}

    def glance(self) -> "SuiteGlance":
        """The counts a panel renders of this suite (:class:`SuiteGlance`)."""
        counts = self.counts()
        return SuiteGlance(counts[PASSED_BOTH], counts[FAILED_BOTH], [p.name for p in self.of(FAILED_BOTH)],
                           counts[REGRESSED], self.missing_data(), counts[DECLARED])

    def unproven(self) -> str:
        """What a pass of the suite does not prove, for the run's headline: the pass count with the tests failing on
        both and those skipped for missing data, e.g. ``30 pass on both; 17 fail on both (not proven)``; "" when
        every test that is not declared ran and passes on both sides."""
        g = self.glance()
        if not g.failed_both and not g.missing_data:
            return ""
        parts = [f"{g.passed_both} pass on both"]
        if g.failed_both:
            parts.append(f"{g.failed_both} fail on both (not proven)")
        if g.missing_data:
            parts.append(f"{len(g.missing_data)} skipped for missing data (not run): " + ", ".join(g.missing_data))
        return "; ".join(parts)


#: The prefix of a :data:`MISSING_DATA` pair's ``need``, before the missing path.
MISSING_PREFIX = "missing data: "


@dataclass(frozen=True)
class SuiteGlance:
    """One platform's suite at a glance (``glance`` in pairs.json): tests that pass on both sides, that fail on both
    (``failed_both_names``: never the fork's regression, nor proven), regressions, those skipped for missing data
    (test name -> the missing file of the source tree) and those skipped by declaration."""

    passed_both: int
    failed_both: int
    failed_both_names: list[str]
    regressed: int
    missing_data: dict[str, str]
    declared: int


def write_suite(path: Path, record: SuiteRecord) -> None:
    """Write ``record`` to ``path`` (``pairs.json``) with its :class:`SuiteGlance` under ``glance``, which
    :func:`read_suite` leaves out (it is derived from the pairs)."""
    write_json(path, {**jsonable(record), "glance": jsonable(record.glance())})


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
