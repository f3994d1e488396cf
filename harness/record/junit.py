"""JUnit XML of a run's greedy comparisons and speed rules, at paths CI systems find without knowing the run id.

``results/junit/comparisons-<platform>.xml`` holds one ``<testsuite>`` per comparison
group and one ``<testcase>`` per comparison (model, prompt, candidate against
reference), rendering its verdict (harness.record.verdict): a failing comparison is a ``<failure>``
whose message says why (``identical; the group expects diverged``) and the first divergent token (or
the crash or timeout detail); one not run (e.g. ``unsupported-upstream``) is ``<skipped>``; a passing
one that says why (an expected divergence) has it in ``<system-out>``.  The format is
the one JUnit's Ant task writes and CI test-report tools read (testsuites / testsuite /
testcase with failure and skipped children).

``results/junit/checks-<platform>.xml`` holds the checks of harness.stages.checks.checks the same
way: one ``<testsuite>`` per check step (``expectations``), one ``<testcase>`` per
configuration; a failed or errored step is a ``<failure>`` (its detail the message), an
incomplete or skipped one ``<skipped>`` with its reason.

``results/junit/speed-<platform>.xml`` holds one ``<testsuite>`` per group with speed rules and
one ``<testcase>`` per rule step (harness.stages.speed.speed: ``speed:<group>:<metric>`` of a
candidate): a failed rule is a ``<failure>``, a rule that could not be measured an ``<error>``,
the step's detail (medians, ratio, p) the message.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from ..common.fs import replace_whole
from .bench import parse_rule_step, parse_step
from .layout import junit_dir
from .records import ComparisonRecord, StepRecord
from .run import Run
from ..common.statuses import STEP_FAILED
from .verdict import NOT_RUN


#: A ``<testcase>``'s outcomes, JUnit's words: passed (no child element), or the element of its failure, error or
#: skip; not a step's status (each document says which step statuses it renders as which).
PASSED, FAILURE, ERROR, SKIPPED = "passed", "failure", "error", "skipped"
#: The attribute of a ``<testsuite>`` (and the root) that counts each outcome but passed.
_COUNTED_AS = {FAILURE: "failures", ERROR: "errors", SKIPPED: SKIPPED}


@dataclass(frozen=True)
class _Case:
    """One ``<testcase>``: ``outcome`` is :data:`PASSED`, :data:`FAILURE`, :data:`ERROR` or :data:`SKIPPED`;
    ``message``/``kind``/``text``
    fill the outcome's element (``text`` of a passed case, where given, goes to ``<system-out>``), ``time``
    in seconds."""

    classname: str
    name: str
    outcome: str = PASSED
    message: str = ""
    kind: str = ""
    text: str | None = None
    time: float | None = None


def _document(title: str, suites: dict[str, list[_Case]], counted: tuple[str, ...]) -> ET.ElementTree:
    """A JUnit ``<testsuites>`` named ``title`` with one ``<testsuite>`` per key of ``suites`` (sorted);
    ``counted``: the outcomes whose totals the root carries besides ``tests`` (each suite carries them all)."""
    root = ET.Element("testsuites", name=title)
    totals = dict.fromkeys(("tests", *(_COUNTED_AS[o] for o in counted)), 0)
    for suite_name, cases in sorted(suites.items()):
        n = {o: sum(c.outcome == o for c in cases) for o in _COUNTED_AS}
        suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(cases)),
                              **{_COUNTED_AS[o]: str(k) for o, k in n.items()})
        totals["tests"] += len(cases)
        for o in counted:
            totals[_COUNTED_AS[o]] += n[o]
        for c in cases:
            attrs = {"classname": c.classname, "name": c.name}
            if c.time is not None:
                attrs["time"] = f"{c.time:.1f}"
            case = ET.SubElement(suite, "testcase", attrs)
            if c.outcome in (FAILURE, ERROR):
                node = ET.SubElement(case, c.outcome, message=c.message, type=c.kind)
                node.text = c.text
            elif c.outcome == SKIPPED:
                ET.SubElement(case, SKIPPED, message=c.message)
            elif c.text is not None:
                ET.SubElement(case, "system-out").text = c.text
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def comparisons_xml(platform: str, comparisons: Iterable[ComparisonRecord]) -> ET.ElementTree:
    """The JUnit document of ``platform``'s comparisons (records of other platforms are left out)."""
    suites: dict[str, list[_Case]] = {}
    for c in comparisons:
        if c.platform != platform:
            continue
        case = _Case(f"{platform}.{c.group}.{c.model}", f"{c.prompt}: {c.candidate} vs {c.reference}")
        v = c.verdict()  # a numerics control (expect: diverged) fails when it does not diverge
        if v.fails:
            what = c.difference()
            where = f"first divergent token {what}" if c.first_divergence else what
            message = f"{v.why}: {where}" if where else v.why
            case = replace(case, outcome=FAILURE, message=message, kind=c.status, text=c.detail)
        elif v.verdict == NOT_RUN:
            case = replace(case, outcome=SKIPPED, message=f"{v.why}: {c.detail}" if c.detail else v.why)
        elif v.why:  # passed, and why: an expected divergence
            case = replace(case, text=f"{v.why}: {c.difference()}" if c.first_divergence else v.why)
        suites.setdefault(f"{platform}/{c.group}", []).append(case)
    return _document(f"greedy comparisons {platform}", suites, (FAILURE, SKIPPED))


def speed_xml(platform: str, steps: Iterable[StepRecord]) -> ET.ElementTree:
    """The JUnit document of ``platform``'s speed rule steps (other steps and platforms are left out)."""
    suites: dict[str, list[_Case]] = {}
    for s in steps:
        parsed = parse_rule_step(s.step)
        if s.platform != platform or not parsed:
            continue
        vs = f" vs {parsed.reference}" if parsed.reference else ""  # a rule's own reference, not the group's
        case = _Case(f"{platform}.{parsed.group}", f"{s.config} {parsed.metric}{vs}", time=s.seconds, text=s.detail)
        if s.verdict().fails:  # the message is the verdict's why; the detail stays the case's text
            case = replace(case, outcome=FAILURE if s.status == STEP_FAILED else ERROR, message=s.verdict().why,
                           kind=s.status)
        suites.setdefault(f"{platform}/{parsed.group}", []).append(case)
    return _document(f"speed rules {platform}", suites, (FAILURE, ERROR))


def _write(tree: ET.ElementTree, path: Path) -> Path:
    """Write ``tree`` to ``path`` whole (harness.common.fs.replace_whole: no half file, no temporary
    left behind); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, lambda tmp: tree.write(tmp, encoding="utf-8", xml_declaration=True))
    return path


def write_speed_junit(run: Run) -> list[Path]:
    """Write ``<results>/junit/speed-<platform>.xml`` for each platform with speed rule steps in ``run``;
    returns the paths written (each replaced whole)."""
    platforms = sorted({s.platform for s in run.steps if parse_step(s.step)})
    return [_write(speed_xml(p, run.steps), junit_dir(run.root) / f"speed-{p}.xml") for p in platforms]


def write_comparisons_junit(run: Run) -> list[Path]:
    """Write ``<results>/junit/comparisons-<platform>.xml`` for each platform with comparisons in ``run``.

    Returns the paths written.  Each file is replaced whole (write, then rename), so a
    reader never sees half a file.
    """
    return [_write(comparisons_xml(platform, run.comparisons), junit_dir(run.root) / f"comparisons-{platform}.xml")
            for platform in sorted({c.platform for c in run.comparisons})]


def checks_xml(platform: str, steps: Iterable[StepRecord], names: Iterable[str]) -> ET.ElementTree:
    """The JUnit document of ``platform``'s check steps whose step name is one of ``names``."""
    wanted = set(names)
    suites: dict[str, list[_Case]] = {}
    for s in steps:
        if s.platform != platform or s.step not in wanted:
            continue
        case = _Case(f"{platform}.{s.step}", s.config)
        v = s.verdict()
        if v.fails:
            case = replace(case, outcome=FAILURE, message=v.why, kind=s.status,
                           text="\n".join(f.text() for f in s.failures) or s.detail)
        elif v.verdict == NOT_RUN:
            case = replace(case, outcome=SKIPPED, message=f"{v.why}: {s.detail[:500]}")
        suites.setdefault(f"{platform}/{s.step}", []).append(case)
    return _document(f"checks {platform}", suites, (FAILURE, SKIPPED))


def write_checks_junit(run: Run, names: Iterable[str]) -> list[Path]:
    """Write ``<results>/junit/checks-<platform>.xml`` for each platform with a check step named in
    ``names`` (harness.stages.checks.checks.STEP_NAMES); returns the paths written, each replaced whole."""
    names = tuple(names)
    out = []
    for platform in sorted({s.platform for s in run.steps if s.step in names}):
        out.append(_write(checks_xml(platform, run.steps, names), junit_dir(run.root) / f"checks-{platform}.xml"))
    return out
