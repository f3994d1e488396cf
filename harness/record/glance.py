"""The fork at a glance: per platform, each measure of the fork's purpose with its rule and its verdict, then what
did not run and why; the first panel of report.html and summary.md (harness.views.report,
harness.record.summary_md).

The measures, each read from the record of the step that measured it:

* **pinned vs pageable prefill** and **fork vs upstream, pp and tg, in each mode**: the speed rules
  (``<platform>/speed/bench.json``, harness.stages.speed.speed); a rule is *fork vs upstream* where its reference
  configuration is built from ``base`` and its candidate from ``fork`` (``<config>/config.json``), *pinned vs
  pageable* where both are the fork's and the reference's experts are expected pageable (``pinned: 0`` in its
  ``expectations.json``) and the candidate's are not;
* **experts per buffer type**, **page-locked bytes (driver vs claimed)** and **host weights and the model file**:
  the ``expectations`` step's record of each configuration (harness.stages.checks.expectations): the engine load's
  probed layers per buffer type, the bytes the driver reports page-locked against the bytes the pin lines claim,
  and whether the model file backs the host weights, with the findings of the rules ``placement``,
  ``pinned``/``claims``/``warnings`` and ``mapped``/``weights``;
* **sanitizer errors**: the steps run under compute-sanitizer (``test-<tool>``, ``generate-<tool>``);
* **upstream suite**: the ``upstream-tests`` step and its pairs (harness.record.upstream_tests).

Nothing is judged here: a row's verdict is its step's (harness.record.verdict.step_verdict) or, for a rule of the
expectations record, the finding the check recorded (``passed``, ``failed``, ``incomplete`` shown as passes, fails,
not run).  A measure without a row says ``not run`` with the reason: the platform's skip, a step of the platform
that did not run, the run's incomplete notes, or the option that asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Iterable, Mapping, Sequence

from ..common.statuses import STEP, TIMEOUT
from ..common.words import size_text
from .bench import parse_rule_step, read_bench, rule_ratio
from .expectations import EXPECTATIONS_STEP, FINDING_FAILED, FINDING_PASSED, read_expectations
from .inputs import read_run_config
from .layout import RunLayout
from .probe import layers_by_type_text
from .records import RecordError, StepRecord
from .upstream_tests import CLASSES, read_suite
from .verdict import FAILS, ICONS, NOT_RUN, PASSES, ROW_VERDICTS, RowVerdict, step_name

#: The measures of the panel, in the order shown.
PINNED_PREFILL = "pinned vs pageable prefill"
FORK_VS_UPSTREAM = "fork vs upstream"
EXPERTS = "experts per buffer type"
PAGE_LOCKED = "page-locked bytes (driver vs claimed)"
MAPPING = "host weights and the model file"
SANITIZER = "sanitizer errors"
UPSTREAM_SUITE = "upstream suite"
MEASURES = (PINNED_PREFILL, FORK_VS_UPSTREAM, EXPERTS, PAGE_LOCKED, MAPPING, SANITIZER, UPSTREAM_SUITE)

#: What asks for a measure, said where a platform that ran has no row of it.
ASKED_BY = {PINNED_PREFILL: "no speed rule of a pinned configuration against a pageable one ran (--no-bench, or no "
                            "such group selected)",
            FORK_VS_UPSTREAM: "no speed rule of the fork against upstream ran (--no-bench, or no such group selected)",
            EXPERTS: "no expectations step recorded a load (no configuration generated here)",
            PAGE_LOCKED: "no expectations step recorded a load (no configuration generated here)",
            MAPPING: "no expectations step recorded a load (no configuration generated here)",
            SANITIZER: "no step ran under a GPU kind's sanitizer (--sanitize, GPU platforms only)",
            UPSTREAM_SUITE: "upstream's suite was not asked for (--upstream-tests)"}

#: A finding's status (harness.record.expectations) as the row verdict it is shown with.
_FINDING_VERDICT = {FINDING_PASSED: PASSES, FINDING_FAILED: FAILS}


@dataclass(frozen=True)
class Measure:
    """One row of the panel: the ``measure`` (one of :data:`MEASURES`), its ``subject`` (the configurations and
    model, the tool), the ``value`` measured, the ``rule`` it is held to and the ``verdict`` recorded for it;
    ``source``: the step it renders, where one (harness.record.verdict.step_name)."""

    measure: str
    subject: str
    value: str
    rule: str
    verdict: RowVerdict
    source: str = ""


@dataclass(frozen=True)
class NotRun:
    """What did not run: ``what`` (a step by name, a platform, a stage) and ``why``; ``unfinished`` for a step that
    was running when the run stopped or whose records are missing (its status leaves the run unproven)."""

    what: str
    why: str
    unfinished: bool = False


@dataclass(frozen=True)
class PlatformGlance:
    """One platform's rows: the failing ones first, then measure by measure (:data:`MEASURES`; a measure without
    rows is not run, with why)."""

    platform: str
    rows: list[Measure] = field(default_factory=list)


@dataclass(frozen=True)
class Glance:
    """The panel: the ``platforms`` and what did not run (``not_run``, the unfinished first)."""

    platforms: list[PlatformGlance]
    not_run: list[NotRun]

    def unfinished(self) -> list[NotRun]:
        """The steps that did not finish (interrupted, incomplete) and the run's incomplete notes."""
        return [n for n in self.not_run if n.unfinished]


def _config_build(layout: RunLayout, platform: str, config: str) -> str:
    """The build (``base`` or ``fork``) a configuration ran, from its config.json; "" where it has none."""
    try:
        return read_run_config(layout.config_json(platform, config)).build
    except (OSError, RecordError):
        return ""


def _pageable(layout: RunLayout, platform: str, config: str) -> bool | None:
    """Whether ``config``'s expectations record expects its experts pageable (``pinned`` 0 for every model), not
    (a pinned fraction above 0) or None where it has no record saying so."""
    record = read_expectations(layout.expectations_json(platform, config))
    pinned = [r.get("pinned") for r in (record.rules.values() if record else ()) if isinstance(r, Mapping)]
    pinned = [p for p in pinned if p is not None]
    if not pinned:
        return None
    return all(str(p) == "0" for p in pinned)


def _speed_rows(layout: RunLayout, platform: str, steps: Sequence[StepRecord]) -> list[Measure]:
    """The speed rules of ``platform`` that measure the fork's purpose (module docstring), each with its step's
    verdict; a rule of another kind is left to the report's speed section."""
    bench = read_bench(layout.dir, platform) or {}
    by_step = {(s.config, s.step): s for s in steps if s.platform == platform and parse_rule_step(s.step)}
    rows = []
    for rule in bench.get("rules") or []:
        step = by_step.get((rule.get("candidate"), rule.get("step")))
        if step is None:
            continue
        cand, ref, metric = str(rule["candidate"]), str(rule["reference"]), str(rule["metric"])
        if _config_build(layout, platform, ref) == "base" and _config_build(layout, platform, cand) == "fork":
            measure = FORK_VS_UPSTREAM
        elif metric == "pp" and _pageable(layout, platform, ref) and _pageable(layout, platform, cand) is False:
            measure = PINNED_PREFILL
        else:
            continue
        ratio = rule_ratio(rule)
        if ratio is not None:
            value = (f"{ratio.text()}: {rule['candidate_spread']['median']:.1f} vs "
                     f"{rule['reference_spread']['median']:.1f} tok/s (medians)")
            why = (f"at least {rule.get('min_ratio', 1):g}x asked; fails below {rule['threshold']:.3g}x with "
                   f"Mann-Whitney p ≤ {rule.get('p_max', 0.01):g} (p = {rule.get('p_value', float('nan')):.3g})")
        else:
            value, why = step.detail, f"at least {rule.get('min_ratio', 1):g}x asked"
        rows.append(Measure(measure, f"{metric}: {cand} vs {ref} ({rule.get('model', '?')})", value, why,
                            step.verdict(), step_name(step)))
    return rows


def _finding_verdict(findings: Iterable, rules: tuple[str, ...]) -> RowVerdict | None:
    """The verdict of the findings of ``rules`` over a configuration's loads, as the check recorded them: the
    first failed finding's message, else an incomplete one's, else passes; None without such findings."""
    chosen = [f for f in findings if f.rule in rules]
    if not chosen:
        return None
    for status in (FINDING_FAILED, *(s for s in {f.status for f in chosen} if s not in _FINDING_VERDICT)):
        bad = next((f for f in chosen if f.status == status), None)
        if bad is not None:
            return RowVerdict(_FINDING_VERDICT.get(status, NOT_RUN), f"{bad.rule}: {bad.message}")
    return RowVerdict(PASSES)


def _expectation_rows(layout: RunLayout, platform: str, steps: Sequence[StepRecord]) -> list[Measure]:
    """Per configuration with an expectations step: the engine load's experts per buffer type (rule
    ``placement``) and page-locked bytes, driver against claimed (rules ``pinned`` and ``claims``)."""
    rows = []
    for s in steps:
        if s.platform != platform or s.step != EXPECTATIONS_STEP:
            continue
        record = read_expectations(layout.expectations_json(platform, s.config))
        loads = [x for x in (record.loads if record else ()) if x.skipped is None and x.facts]
        if not loads:  # the step's own verdict where it fails, else why nothing was measured
            reason = s.verdict() if s.verdict().fails else RowVerdict(NOT_RUN, f"{s.status}: {s.detail}")
            rows += [Measure(m, s.config, "–", "", reason) for m in (EXPERTS, PAGE_LOCKED, MAPPING)]
            continue
        for model in dict.fromkeys(x.model for x in loads):
            mine = [x for x in loads if x.model == model]
            load = next((x for x in mine if x.load == "engine"), mine[0])
            findings = [f for x in mine for f in x.findings]
            rule = (record.rules.get(model) or {}) if record else {}
            subject = f"{s.config} ({model})"
            experts = "; ".join(f"{r}: {t}" for r, t in rule.get("experts") or ()) or "not checked"
            placed = _finding_verdict(findings, ("placement",)) or RowVerdict(NOT_RUN, "no placement finding")
            rows.append(Measure(EXPERTS, subject, layers_by_type_text(load.facts.get("layers") or {}) or "no expert layer probed",
                                f"layers {experts}", placed))
            locked, claimed = load.facts.get("page_locked_bytes"), load.facts.get("claimed_granted_bytes")
            value = (f"driver {size_text(int(locked))}, claimed {size_text(int(claimed or 0))}"
                     if isinstance(locked, int) else "no page-locked bytes probed")
            pinned = (_finding_verdict(findings, ("pinned", "claims", "warnings"))
                      or RowVerdict(NOT_RUN, "no pinning finding"))
            rows.append(Measure(PAGE_LOCKED, subject, value,
                                f"pinned fraction {rule.get('pinned') or 'not checked'}; the pin lines claim no "
                                "more than the driver holds; the pin warnings as expected", pinned))
            mapped = next((f.message for f in load.findings if f.rule == "mapped"), "–")
            expected = {True: "backed by the model file (mmap)", False: "read into memory (mmap off)"}
            backing = expected.get(rule["mapped"], "not checked") if isinstance(rule.get("mapped"), bool) else "not checked"
            rows.append(Measure(MAPPING, subject, mapped, f"host weights {backing}"
                                f"; weights in {', '.join(rule.get('weights') or ['any buffer type'])}",
                                _finding_verdict(findings, ("mapped", "weights"))
                                or RowVerdict(NOT_RUN, "no mapping finding")))
    return rows


def _sanitizer_rows(platform: str, steps: Sequence[StepRecord]) -> list[Measure]:
    """Per compute-sanitizer tool: its steps counted by verdict, each step that did not pass named with its
    detail; the row's verdict is the first of its steps' verdicts in the order fails, not run, passes."""
    by_tool: dict[str, list[StepRecord]] = {}
    for s in steps:
        head, _, tool = s.step.partition("-")
        if s.platform == platform and head in ("test", "generate") and tool and not tool.startswith("vs"):
            by_tool.setdefault(tool, []).append(s)
    rows = []
    for tool, mine in sorted(by_tool.items()):
        verdicts = [s.verdict() for s in mine]
        counts = ", ".join(f"{sum(v.verdict == w for v in verdicts)} {w}" for w in ROW_VERDICTS
                           if any(v.verdict == w for v in verdicts))
        named = [f"{step_name(s)}: {s.detail}" for s, v in zip(mine, verdicts) if not v.passes]
        worst = next((v for w in ROW_VERDICTS for v in verdicts if v.verdict == w), RowVerdict(PASSES))
        rows.append(Measure(SANITIZER, tool, f"{len(mine)} step(s): {counts}" + (": " + "; ".join(named) if named
                                                                                  else ""),
                            "0 errors in every step run under the tool", worst))
    return rows


def _upstream_rows(layout: RunLayout, platform: str, steps: Sequence[StepRecord]) -> list[Measure]:
    """The ``upstream-tests`` step of ``platform``: its tests counted by class (pairs.json), its verdict."""
    rows = []
    for s in steps:
        if s.platform != platform or s.step != RunLayout.UPSTREAM_STEP:
            continue
        try:
            suite = read_suite(layout.upstream_file(platform, "pairs"))
            value = ", ".join(f"{n} {CLASSES[c].split(' (')[0]}" for c, n in suite.counts().items() if n)
        except (FileNotFoundError, RecordError):
            value = s.detail
        rows.append(Measure(UPSTREAM_SUITE, f"ctest on base and {s.config}", value or "–",
                            "fails only on a test that passes on base and fails on the fork", s.verdict()))
    return rows


#: The steps before any measure: where one of them did not run on a platform, its measures did not either.
_BEFORE_MEASURES = ("build", "compile", "test", "generate")


def _platform_reason(platform: str, platforms: Sequence[str], steps: Sequence[StepRecord],
                     incomplete: Sequence[str], measure: str) -> str:
    """Why ``measure`` of ``platform`` has no row: the first step before the measures (:data:`_BEFORE_MEASURES`)
    of the platform that did not run, with its status and detail; else what asks for the measure
    (:data:`ASKED_BY`), and the run's incomplete notes of the platform or of no platform where it did not
    finish."""
    for s in steps:
        if s.platform == platform and s.step in _BEFORE_MEASURES and s.verdict().verdict == NOT_RUN:
            return f"{s.step} {s.status}: {s.detail}"
    notes = [n for n in incomplete if n.startswith(platform) or not any(n.startswith(q) for q in platforms)]
    return ASKED_BY[measure] + (f"; or the run did not finish: {'; '.join(notes)}" if notes else "")


def build_glance(layout: RunLayout, steps: Sequence[StepRecord], skipped_platforms: Mapping[str, str],
                 incomplete: Sequence[str]) -> Glance:
    """The panel of the run in ``layout`` from its recorded ``steps``, ``skipped_platforms`` (platform -> why) and
    ``incomplete`` notes (summary.json), reading the stages' records beside them (bench.json, config.json,
    expectations.json, pairs.json).  Raises nothing for a record that is missing or unreadable: its measure says
    not run, or shows the step's detail."""
    platforms = list(dict.fromkeys([s.platform for s in steps if s.platform not in skipped_platforms]))
    out = []
    for p in platforms:
        rows = (_speed_rows(layout, p, steps) + _expectation_rows(layout, p, steps) + _sanitizer_rows(p, steps)
                + _upstream_rows(layout, p, steps))
        present = {r.measure for r in rows}
        placed = {r.source for r in rows}
        unmeasured = [s for s in steps if s.platform == p and parse_rule_step(s.step) and step_name(s) not in placed
                      and s.verdict().fails]  # a rule step that failed without a measurement (bench.json) to show
        for m in MEASURES:
            if m not in present and m in (PINNED_PREFILL, FORK_VS_UPSTREAM) and unmeasured:
                rows += [Measure(m, step_name(s), s.detail, "", s.verdict(), step_name(s)) for s in unmeasured]
            elif m not in present:
                rows.append(Measure(m, "–", "–", "", RowVerdict(NOT_RUN, _platform_reason(p, platforms, steps,
                                                                                          incomplete, m))))
        order = {m: i for i, m in enumerate(MEASURES)}
        out.append(PlatformGlance(p, sorted(rows, key=lambda r: (not r.verdict.fails, order[r.measure]))))
    not_run = [NotRun(step_name(s), f"{s.status}: {s.detail}" if s.detail else s.status, STEP[s.status].unproven)
               for s in steps if s.verdict().verdict == NOT_RUN]
    named = tuple(f"{s.platform}: {s.step} {s.config}:" for s in steps if STEP[s.status].unproven)
    not_run += [NotRun(n.split(":")[0], n.partition(": ")[2] or n, True) for n in incomplete
                if not n.startswith(named)]  # a step's own note, when the step is named above
    not_run += [NotRun(p, why) for p, why in sorted(skipped_platforms.items())]
    return Glance(out, sorted(not_run, key=lambda n: not n.unfinished))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def glance_markdown(g: Glance) -> list[str]:
    """The panel as Markdown lines: a table per platform (measure, subject, value, rule, verdict), then what did
    not run, the unfinished first."""
    lines = ["## The fork at a glance", ""]
    for pg in g.platforms:
        lines += [f"### {pg.platform}", "", "| measure | subject | value | rule | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {r.measure} | {_cell(r.subject)} | {_cell(r.value)} | {_cell(r.rule)} "
                  f"| {ICONS[r.verdict.verdict]} {_cell(r.verdict.text())} |" for r in pg.rows]
        lines.append("")
    if g.not_run:
        lines += ["### Did not run", ""]
        lines += [f"- {'**did not finish**: ' if n.unfinished else ''}{_cell(n.what)}: {_cell(n.why)}"
                  for n in g.not_run]
        lines.append("")
    return lines


#: The class of each verdict in report.html (its colours: harness.views.report's CSS).
HTML_CLASS = {FAILS: "failure", NOT_RUN: "neutral", PASSES: "success"}


def glance_html(g: Glance) -> str:
    """The panel as one HTML ``<section id="glance">``: a table per platform, each row's verdict coloured by
    :data:`HTML_CLASS` (``data-verdict`` holds it), then the list of what did not run (``id="not-run"``), the
    unfinished first (class ``unfinished``)."""
    parts = ['<section id="glance"><h2>The fork at a glance</h2>']
    for pg in g.platforms:
        rows = "".join(
            f'<tr class="glance-row" data-measure="{escape(r.measure)}" data-verdict="{escape(r.verdict.verdict)}">'
            f'<td class="nw">{escape(r.measure)}</td><td>{escape(r.subject)}</td><td>{escape(r.value)}</td>'
            f'<td>{escape(r.rule)}</td><td class="verdict-cell"><span class="st st-{HTML_CLASS[r.verdict.verdict]} '
            f'row-verdict">{escape(r.verdict.verdict)}</span>'
            + (f' <span class="why">{escape(r.verdict.why)}</span>' if r.verdict.why else "") + "</td></tr>"
            for r in pg.rows)
        parts.append(f'<h3>{escape(pg.platform)}</h3><table class="glance" data-platform="{escape(pg.platform)}">'
                     '<thead><tr><th>measure</th><th>subject</th><th>value</th><th>rule</th><th>verdict</th></tr>'
                     f'</thead><tbody>{rows}</tbody></table>')
    if g.not_run:
        items = "".join(f'<li class="{"unfinished" if n.unfinished else "not-run"}"><b>{escape(n.what)}</b>'
                        + (f' <span class="st st-{TIMEOUT}">did not finish</span>' if n.unfinished else "")
                        + f': {escape(n.why)}</li>' for n in g.not_run)
        parts.append(f'<h3>Did not run</h3><ul id="not-run">{items}</ul>')
    parts.append("</section>")
    return "".join(parts)
