"""A native-test directory's records, typed (harness.record.layout.TESTS_FILES, named by RunLayout.tests_file):
``tests.json``, the :class:`TestRun` of the native tests (harness.stages.native_tests.native_tests), and ``sanitizer.json``,
the tool and summary of a run under compute-sanitizer (:class:`SanitizerRecord`); written by the test stage
(harness.stages.native_tests.tests_stage), read by the signatures.

Each reader raises FileNotFoundError naming the file where there is none, and
harness.record.records.RecordError naming it where it is not JSON or not of its record's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .json_files import read_record_json
from .records import RecordError


#: The outcomes of one native test (ctest's and JUnit's words, as tests.json records them): not a step's status;
#: the ``test`` step's status is decided from them (harness.stages.native_tests.native_tests).
CASE_PASSED, CASE_FAILED, CASE_SKIPPED = "passed", "failed", "skipped"
CASE_STATUSES = (CASE_PASSED, CASE_FAILED, CASE_SKIPPED)


@dataclass
class TestCase:
    """One native test binary's outcome: ``status`` one of :data:`CASE_STATUSES`, with seconds and a message."""

    name: str
    status: str
    seconds: float = 0.0
    message: str = ""


@dataclass
class TestRun:
    """All tests of one build: overall status, cases, JUnit and log paths."""

    status: str
    cases: list[TestCase] = field(default_factory=list)
    junit: Path | None = None
    log: Path | None = None
    seconds: float = 0.0
    detail: str = ""

    def counts(self) -> dict[str, int]:
        """Number of cases per status."""
        out = dict.fromkeys(CASE_STATUSES, 0)
        for c in self.cases:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    def failed(self) -> list[TestCase]:
        """The cases that failed, in order."""
        return [c for c in self.cases if c.status == CASE_FAILED]


def read_test_run(path: Path) -> TestRun:
    """The test run recorded at ``path`` (``tests.json``).  Raises FileNotFoundError naming the file when there is
    none, RecordError naming it when it is not JSON or not a test run (no status, a case without a name and
    status)."""
    data = read_record_json(path, "no tests.json; the native tests did not record a run here")
    try:
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise ValueError("no status")
        cases = []
        for i, c in enumerate(data.get("cases") or []):
            if not isinstance(c.get("name"), str) or not isinstance(c.get("status"), str):
                raise ValueError(f"case {i} has no name and status")
            cases.append(TestCase(c["name"], c["status"], float(c.get("seconds") or 0.0), str(c.get("message") or "")))
        junit, log = data.get("junit"), data.get("log")
        return TestRun(data["status"], cases, None if junit is None else Path(junit), None if log is None else Path(log),
                       float(data.get("seconds") or 0.0), str(data.get("detail") or ""))
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a test run ({exc})") from None


@dataclass(frozen=True)
class SanitizerRecord:
    """The native tests under compute-sanitizer: the ``tool`` (memcheck, racecheck, ...) and the ``summary`` of its
    ERROR SUMMARY lines (harness.record.gpu.sanitizer_summary; "" when none was logged)."""

    tool: str
    summary: str = ""


def read_sanitizer(path: Path) -> SanitizerRecord:
    """The sanitizer record at ``path`` (``sanitizer.json``).  Raises FileNotFoundError naming the file when there
    is none (the tests ran without compute-sanitizer), RecordError naming it when it is not JSON or not an object
    whose tool and summary are text."""
    data = read_record_json(path, "no sanitizer.json; the tests ran without compute-sanitizer")
    tool, summary = (data.get("tool"), data.get("summary")) if isinstance(data, dict) else (None, None)
    if not isinstance(tool, (str, type(None))) or not isinstance(summary, (str, type(None))) \
            or not isinstance(data, dict):
        raise RecordError.at(path, "not a sanitizer record (tool and summary as text)")
    return SanitizerRecord(tool or "", summary or "")
