"""JUnit XML of a run's greedy comparisons, checks, speed rules and upstream's suite, in the run's own folder
(``results/<run-id>/junit/``, written again by ``report RUN``) and, for CI systems that do not know the run id,
copied to ``results/junit/`` by the run that wrote them last (:func:`publish_latest`).

``junit/comparisons-<platform>.xml`` holds one ``<testsuite>`` per comparison
group and one ``<testcase>`` per comparison (model, prompt, candidate against
reference), rendering its verdict (harness.record.verdict): a failing comparison is a ``<failure>``
whose message says why (``identical; the group expects diverged``) and the first divergent token (or
the crash or timeout detail); one not run (e.g. ``unsupported-upstream``) is ``<skipped>``; a passing
one that says why (an expected divergence) has it in ``<system-out>``.  The format is
the one JUnit's Ant task writes and CI test-report tools read (testsuites / testsuite /
testcase with failure and skipped children).

``junit/checks-<platform>.xml`` holds the checks of harness.stages.checks.checks the same
way: one ``<testsuite>`` per check step (``expectations``), one ``<testcase>`` per
configuration; a failed or errored step is a ``<failure>`` (its detail the message), an
incomplete or skipped one ``<skipped>`` with its reason.

``junit/speed-<platform>.xml`` holds one ``<testsuite>`` per group with speed rules and
one ``<testcase>`` per rule step (harness.stages.speed.speed: ``speed:<group>:<metric>`` of a
candidate): a failed rule is a ``<failure>``, a rule that could not be measured an ``<error>``,
the step's detail (medians, ratio, p) the message.

``junit/upstream-<platform>.xml`` holds upstream's suite (``upstream-tests``, harness.record.upstream_tests) as the
step judged it: one ``<testcase>`` per test, a ``<failure>`` only for a test that passes on base and fails on the
fork; a test that fails on both is ``<skipped>`` with that reason (upstream's or the machine's, not the fork's),
as are the tests skipped on both or by declaration.
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from ..common.fs import replace_whole
from .bench import parse_rule_step
from .layout import RunLayout, junit_dir
from .records import ComparisonRecord, StepRecord
from ..common.statuses import STEP_FAILED
from .upstream_tests import CLASSES, DECLARED, FAILED_BOTH, REGRESSED, SKIPPED_BOTH, read_suite
from .verdict import NOT_RUN

#: The JUnit files of one run, by kind: ``<kind>-<platform>.xml`` under the run's ``junit/``.
KINDS = ("comparisons", "checks", "speed", "upstream")


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
        suite = ET.SubElement(root, "testsuite", {"name": suite_name, "tests": str(len(cases)),
                                                  **{_COUNTED_AS[o]: str(k) for o, k in n.items()}})
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


def upstream_xml(platform: str, step: StepRecord, layout: RunLayout) -> ET.ElementTree | None:
    """The JUnit document of ``platform``'s upstream suite step ``step`` from its ``pairs.json`` (read through
    harness.record.upstream_tests.read_suite); None where the step left no pairs (it did not run its tests).
    Raises harness.record.records.RecordError where pairs.json is not a suite record."""
    try:
        suite = read_suite(layout.upstream_file(platform, "pairs"))
    except FileNotFoundError:
        return None
    cases = []
    for t in suite.pairs:
        case = _Case(f"{platform}.{step.step}.{suite.label}", t.name, time=t.fork_seconds or None)
        sides = f"base {t.base}, fork {t.fork}"
        if t.outcome == REGRESSED:
            case = replace(case, outcome=FAILURE, message=f"{CLASSES[REGRESSED]}: {t.fork_message or t.fork}",
                           kind=REGRESSED, text=sides)
        elif t.outcome in (FAILED_BOTH, SKIPPED_BOTH, DECLARED):
            why = CLASSES[t.outcome] + (f": {t.need}" if t.need else "")
            message = f"{why} ({sides}" + (f"; the fork: {t.fork_message}" if t.fork_message else "") + ")"
            case = replace(case, outcome=SKIPPED, message=message)
        cases.append(case)
    return _document(f"upstream suite {platform}", {f"{platform}/{step.step}": cases}, (FAILURE, SKIPPED))


def documents(run_dir: Path, steps: Iterable[StepRecord], comparisons: Iterable[ComparisonRecord],
              check_steps: Iterable[str]) -> dict[str, ET.ElementTree]:
    """Every JUnit document of the run in ``run_dir`` by file name (``<kind>-<platform>.xml``, kinds of
    :data:`KINDS`): its ``comparisons``, the steps named in ``check_steps`` (harness.stages.table.steps_of_role
    ``checks``), its speed rules and its upstream suite steps."""
    steps, comparisons, names = list(steps), list(comparisons), tuple(check_steps)
    out = {f"comparisons-{p}.xml": comparisons_xml(p, comparisons) for p in sorted({c.platform for c in comparisons})}
    out |= {f"checks-{p}.xml": checks_xml(p, steps, names)
            for p in sorted({s.platform for s in steps if s.step in names})}
    out |= {f"speed-{p}.xml": speed_xml(p, steps) for p in sorted({s.platform for s in steps if parse_rule_step(s.step)})}
    layout = RunLayout(run_dir)
    for s in steps:
        if s.step == RunLayout.UPSTREAM_STEP and (tree := upstream_xml(s.platform, s, layout)) is not None:
            out[f"upstream-{s.platform}.xml"] = tree
    return out


def write_run_junit(run_dir: Path, steps: Iterable[StepRecord], comparisons: Iterable[ComparisonRecord],
                    check_steps: Iterable[str]) -> list[Path]:
    """Write every JUnit document of :func:`documents` to ``<run_dir>/junit/`` (each replaced whole, those of
    an earlier writing that the run no longer has removed); returns the paths written, sorted."""
    folder = RunLayout(run_dir).junit_dir
    trees = documents(run_dir, steps, comparisons, check_steps)
    if folder.is_dir():
        for old in folder.glob("*.xml"):
            if old.name not in trees:
                old.unlink()
    return [_write(tree, folder / name) for name, tree in sorted(trees.items())]


def publish_latest(run_dir: Path, results_root: Path) -> list[Path]:
    """Copy the run's JUnit files (``<run_dir>/junit/*.xml``) to ``<results_root>/junit/``, the paths CI reads
    (.github/workflows/harness.yml), each replaced whole; returns the copies.  Files there of other platforms
    and the project's own ``pytest.xml`` are left."""
    out = []
    for path in sorted(RunLayout(run_dir).junit_dir.glob("*.xml")):
        target = junit_dir(results_root) / path.name
        data = path.read_bytes()
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_whole(target, functools.partial(Path.write_bytes, data=data))
        out.append(target)
    return out
