"""JUnit XML of a run's greedy comparisons and speed rules, at paths CI systems find without knowing the run id.

``results/junit/comparisons-<platform>.xml`` holds one ``<testsuite>`` per comparison
group and one ``<testcase>`` per comparison (model, prompt, candidate against
reference).  A comparison whose status is a failure (harness.record.results.COMPARISON) is a
``<failure>`` whose message is the first divergent token (or the crash or timeout
detail); a neutral one (e.g. ``unsupported-upstream``) is ``<skipped>``.  The format is
the one JUnit's Ant task writes and CI test-report tools read (testsuites / testsuite /
testcase with failure and skipped children).

``results/junit/checks-<platform>.xml`` holds the checks of harness.stages.checks the same
way: one ``<testsuite>`` per check step (``expectations``), one ``<testcase>`` per
configuration; a failed or errored step is a ``<failure>`` (its detail the message), an
incomplete or skipped one ``<skipped>`` with its reason.

``results/junit/speed-<platform>.xml`` holds one ``<testsuite>`` per group with speed rules and
one ``<testcase>`` per rule step (harness.stages.speed: ``speed:<group>:<metric>`` of a
candidate): a failed rule is a ``<failure>``, a rule that could not be measured an ``<error>``,
the step's detail (medians, ratio, p) the message.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable

from ..common.fs import replace_whole
from .bench import parse_step
from .results import COMPARISON, STEP, ComparisonRecord, Run, StepRecord, junit_dir


def _skipped(c: ComparisonRecord) -> bool:
    """True for a comparison that neither passed nor failed (e.g. ``unsupported-upstream``): reported
    as a skipped test case."""
    return (not c.failed() and not COMPARISON[c.status].success and c.status != c.expected
            and not (c.expected == "near-tie" and c.tolerated_near_tie()))


def comparisons_xml(platform: str, comparisons: Iterable[ComparisonRecord]) -> ET.ElementTree:
    """The JUnit document of ``platform``'s comparisons (records of other platforms are left out)."""
    suites: dict[str, list[ComparisonRecord]] = {}
    for c in comparisons:
        if c.platform == platform:
            suites.setdefault(c.group, []).append(c)
    root = ET.Element("testsuites", name=f"greedy comparisons {platform}")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for group, records in sorted(suites.items()):
        failures = sum(c.failed() for c in records)
        skipped = sum(_skipped(c) for c in records)
        suite = ET.SubElement(root, "testsuite", name=f"{platform}/{group}", tests=str(len(records)),
                              failures=str(failures), errors="0", skipped=str(skipped))
        for key, value in (("tests", len(records)), ("failures", failures), ("skipped", skipped)):
            totals[key] += value
        for c in records:
            case = ET.SubElement(suite, "testcase", classname=f"{platform}.{group}.{c.model}",
                                 name=f"{c.prompt}: {c.candidate} vs {c.reference}")
            if c.failed():  # a numerics control (expected: diverged) fails when it does not diverge
                what = c.difference()
                message = f"{c.status}: first divergent token {what}" if c.first_divergence else f"{c.status}: {what}"
                node = ET.SubElement(case, "failure", message=message, type=c.status)
                node.text = c.detail
            elif _skipped(c):
                ET.SubElement(case, "skipped", message=f"{c.status}: {c.detail}")
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def speed_xml(platform: str, steps: Iterable[StepRecord]) -> ET.ElementTree:
    """The JUnit document of ``platform``'s speed rule steps (other steps and platforms are left out)."""
    suites: dict[str, list[tuple[str, StepRecord]]] = {}
    for s in steps:
        parsed = parse_step(s.step)
        if s.platform == platform and parsed:
            suites.setdefault(parsed[0], []).append((parsed[1], s))
    root = ET.Element("testsuites", name=f"speed rules {platform}")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for group, records in sorted(suites.items()):
        failures = sum(s.status == "failed" for _, s in records)
        errors = sum(STEP.is_failure(s.status) and s.status != "failed" for _, s in records)
        suite = ET.SubElement(root, "testsuite", name=f"{platform}/{group}", tests=str(len(records)),
                              failures=str(failures), errors=str(errors), skipped="0")
        for key, value in (("tests", len(records)), ("failures", failures), ("errors", errors)):
            totals[key] += value
        for metric, s in records:
            case = ET.SubElement(suite, "testcase", classname=f"{platform}.{group}", name=f"{s.config} {metric}",
                                 time=f"{s.seconds:.1f}")
            if STEP.is_failure(s.status):
                ET.SubElement(case, "failure" if s.status == "failed" else "error", message=s.detail, type=s.status)
            else:
                ET.SubElement(case, "system-out").text = s.detail
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


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
    suites: dict[str, list[StepRecord]] = {}
    for s in steps:
        if s.platform == platform and s.step in wanted:
            suites.setdefault(s.step, []).append(s)
    root = ET.Element("testsuites", name=f"checks {platform}")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for name, records in sorted(suites.items()):
        failures = sum(STEP.is_failure(s.status) for s in records)
        skipped = sum(not STEP.is_failure(s.status) and not STEP[s.status].success for s in records)
        suite = ET.SubElement(root, "testsuite", name=f"{platform}/{name}", tests=str(len(records)),
                              failures=str(failures), errors="0", skipped=str(skipped))
        for key, value in (("tests", len(records)), ("failures", failures), ("skipped", skipped)):
            totals[key] += value
        for s in records:
            case = ET.SubElement(suite, "testcase", classname=f"{platform}.{name}", name=s.config)
            if STEP.is_failure(s.status):
                node = ET.SubElement(case, "failure", message=s.detail[:500], type=s.status)
                node.text = "\n".join(f.text() for f in s.failures) or s.detail
            elif not STEP[s.status].success:
                ET.SubElement(case, "skipped", message=f"{s.status}: {s.detail[:500]}")
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def write_checks_junit(run: Run, names: Iterable[str]) -> list[Path]:
    """Write ``<results>/junit/checks-<platform>.xml`` for each platform with a check step named in
    ``names`` (harness.stages.checks.STEP_NAMES); returns the paths written, each replaced whole."""
    names = tuple(names)
    out = []
    for platform in sorted({s.platform for s in run.steps if s.step in names}):
        out.append(_write(checks_xml(platform, run.steps, names), junit_dir(run.root) / f"checks-{platform}.xml"))
    return out
