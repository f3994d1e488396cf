"""summary.md rendered (:func:`render_markdown` of a :class:`SummaryView`): the verdict and the failing rows
first, the steps and comparisons tables, and the table per configuration a reviewer reads (harness.record.review).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .review import review_lines
from .verdict import ICONS, RowVerdict, count_text, failing_names, failures_first, judge
from ..common.statuses import STEP, VERDICT
from .records import StepRecord, ComparisonRecord
from .layout import RunLayout

#: the rest is counted and stays in summary.json and the logs.
CELL_LINES = 6
#: Longest text a summary table cell shows (a detail of one enormous line); the full text stays in summary.json.
CELL_MAX = 2000


def _cell(text: str) -> str:
    """``text`` for one Markdown table cell: its first :data:`CELL_LINES` lines whole (whitespace collapsed, ``|``
    escaped), then how many lines more; cut at :data:`CELL_MAX` characters only where one line is that long."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    shown = " ".join(lines[:CELL_LINES])
    if len(shown) > CELL_MAX:
        shown = shown[:CELL_MAX - 1] + "…"
    elif len(lines) > CELL_LINES:
        shown += f" … ({len(lines) - CELL_LINES} more lines in summary.json)"
    return shown.replace("|", "\\|")


#: What the result cache's kinds count, for people.
CACHE_KINDS = {"generation": "generation sessions", "tests": "ctest labels", "compile": "compile steps",
               "speed": "speed pairs"}


def shown_as_reused(step: str) -> bool:
    """Whether ``step`` taken from the result cache is shown as ``reused`` (test and compile steps: their
    checks did not run again) rather than with its status and ``cached`` (generate steps, whose records
    are rebuilt from the stored streams)."""
    return RunLayout.is_test_step(step) or step == "compile"


def describe_cache(counts: Mapping[str, Mapping[str, int]]) -> str:
    """Result cache counts in one line: ``12 of 14 generation sessions from the cache, 2 of 2 ctest labels
    reused; 1 corrupt entry regenerated``."""
    parts, corrupt = [], 0
    for kind, events in counts.items():
        hits, misses = events.get("hits", 0), events.get("misses", 0)
        verb = "from the cache" if kind in ("generation", "speed") else "reused"
        parts.append(f"{hits} of {hits + misses} {CACHE_KINDS.get(kind, kind)} {verb}")
        corrupt += events.get("corrupt", 0)
    text = ", ".join(parts)
    return text + (f"; {corrupt} corrupt entr{'y' if corrupt == 1 else 'ies'} regenerated" if corrupt else "")


def describe_cached(cached: Mapping[str, str]) -> str:
    """Where a comparison's cached sides came from: ``cached: <run-id>`` when from one run, else per side."""
    runs = set(cached.values())
    if len(runs) == 1:
        return f"cached: {next(iter(runs))} ({', '.join(cached)})"
    return "cached: " + ", ".join(f"{side} from {run}" for side, run in cached.items())


def step_status_text(s: StepRecord) -> str:
    """A step's status for people: its icon and name, or ``reused (run …)`` for a test step taken from the
    result cache (never shown as newly passed), ``passed, cached (run …)`` for restored generations."""
    if s.cached and shown_as_reused(s.step):
        return f"♻️ reused (run {s.cached})"
    if s.cached:
        return f"{STEP.icon(s.status)}, cached (run {s.cached})"
    return STEP.icon(s.status)


@dataclass(frozen=True)
class SummaryView:
    """What summary.md is rendered from, the same for a run being recorded (:meth:`Run.summary_view`) and for a
    run read back from its summary.json (harness.record.summary.write_summary_md): ``run_id``, ``overall`` (one
    of :data:`VERDICT`), ``notes`` (what the verdict does not cover: killed, platforms skipped, stages to run),
    the records, and ``layout`` (the run directory's files, read for the table per configuration)."""

    run_id: str
    overall: str
    notes: list[str]
    steps: list[StepRecord]
    comparisons: list[ComparisonRecord]
    incomplete: list[str]
    skipped_platforms: dict[str, str]
    cache: dict[str, dict[str, int]]
    layout: RunLayout

    def headline(self) -> str:
        """The verdict, what it does not cover and what failed (harness.record.verdict.failing_names), e.g.
        ``failed (1 platform skipped): p fork build: patch x.patch does not apply``."""
        names = failing_names(judge(self.steps, self.comparisons))
        return (self.overall + (f" ({'; '.join(self.notes)})" if self.notes else "")
                + (f": {names}" if names else ""))


def _verdict_cell(v: RowVerdict) -> str:
    """A row's verdict in a summary.md cell: its icon, the verdict and why (also why a row passes, e.g. an
    expected divergence)."""
    return f"{ICONS[v.verdict]} {v.verdict}" + (f": {v.why}" if v.why else "")


def render_markdown(view: SummaryView) -> str:
    """summary.md of ``view``: the headline (the verdict and the first failing rows by name), the rows counted
    by verdict, a steps table and a comparisons table (failing rows first, each row with its verdict from
    harness.record.verdict) and the table per configuration a reviewer reads (harness.record.review)."""
    rows = judge(view.steps, view.comparisons)
    lines = [f"# Run {view.run_id}: {VERDICT[view.overall].icon if view.overall in VERDICT else ''} "
             f"{_cell(view.headline())}", "",
             f"Steps: {count_text(rows, 'step')} · comparisons: {count_text(rows, 'comparison')}", ""]
    if view.incomplete:
        lines += ["Did not run although asked for:", ""] + [f"- {_cell(r)}" for r in view.incomplete] + [""]
    if view.skipped_platforms:
        lines += ["| platform | skipped because |", "|---|---|"]
        lines += [f"| {p} | {_cell(r)} |" for p, r in sorted(view.skipped_platforms.items())]
        lines.append("")
    if view.cache:
        lines += [f"Result cache (docs/cache.md): {describe_cache(view.cache)}", ""]
    if view.steps:
        verdicts = [s.verdict() for s in view.steps]
        lines += ["## Steps", "", "| platform | config | step | status | verdict | time | detail |",
                  "|---|---|---|---|---|---:|---|"]
        for s, v in failures_first(list(zip(view.steps, verdicts)), verdicts):
            lines.append(f"| {s.platform} | {s.config} | {s.step} | {step_status_text(s)} | {_verdict_cell(v)} "
                         f"| {s.seconds:.1f} s | {_cell(s.detail)} |")
        lines.append("")
    if view.comparisons:
        counts: dict[str, int] = {}
        for c in view.comparisons:
            counts[c.status] = counts.get(c.status, 0) + 1
        verdicts = [c.verdict() for c in view.comparisons]
        lines += ["## Greedy comparisons", "",
                  "Outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), "",
                  "| platform | group | model | prompt | reference | candidate | status | verdict "
                  "| first divergent token | KL mean / max (nats) | top-1 agree |",
                  "|---|---|---|---|---|---|---|---|---|---:|---:|"]
        for c, v in failures_first(list(zip(view.comparisons, verdicts)), verdicts):
            div = c.difference()
            if c.nondeterministic:
                div += f" (nondeterministic: {', '.join(c.nondeterministic)})"
            if c.cached:
                div += f" ({describe_cached(c.cached)})"
            kl = c.kl or {}
            kl_cell = f"{kl['mean']:.3g} / {kl['max']:.3g}" if kl else "–"
            if kl and c.kl_mean_max is not None and kl["mean"] > c.kl_mean_max:
                kl_cell += f" > {c.kl_mean_max:g}"
            agree = f"{kl['top1_agreement']:.1%}" if kl else "–"
            lines.append(f"| {c.platform} | {c.group} | {c.model} | {c.prompt} | {c.reference} | {c.candidate} "
                         f"| {c.status} | {_verdict_cell(v)} | {_cell(div)} | {kl_cell} | {agree} |")
        lines.append("")
    lines += review_lines(view.layout, view.steps, view.comparisons)
    return "\n".join(lines)
