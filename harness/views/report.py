"""The human report of one run: ``results/<run-id>/report.html`` and a Markdown summary.

The HTML file is self-contained: inline CSS, a few lines of inline JavaScript (a
"failures only" filter) and inline SVG; it references no network resource and no font
file, so it can be attached to a CI job or mailed.  It is built with ``html.escape``
and small string-building functions (no template engine: the page is simple and the
project keeps its dependencies few).  Sections:

* verdict and counts (an unfinished run names what did not finish), the fork at a glance
  (harness.record.glance), the steps table and the comparisons table, with signatures;
* per platform and configuration: environment, configuration, failing steps with the
  last :data:`LOG_TAIL_LINES` lines of their logs;
* a token-level view of every divergence: both sides' generated text, the common
  prefix dimmed and the first divergent token marked (re-derived from compare.json's
  texts and the first_divergence pieces);
* the pin ladder per allocation (requested vs granted bytes) as an SVG bar chart;
* for an upstream forecast (``forecast.json``, harness.upstream.forecast): its verdict, one row per
  patch with each conflict's hunk and the upstream lines it met, then one row per stage.
* speed: each speed rule's verdict and every configuration's pp and tg tok/s (median and
  quartiles) from ``<platform>/speed/bench.json`` (harness.stages.speed.speed).

:func:`markdown_summary` gives the same summary as Markdown for a CI job summary or a
pull-request comment.

Longer than 400 lines: one self-contained page whose sections share the escaping, the status badges and the
page's CSS and JavaScript; each section is a function of the run directory, and what a section computes
(signatures, speed verdicts, probe facts) comes from its own module.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..common.fs import write_text_whole
from ..common.words import size_text
from ..record.environment import read_environment
from ..record.glance import build_glance, glance_html, glance_markdown
from ..record.inputs import ConfigRecord, read_run_config
from ..record.layout import RunLayout
from ..record.records import ComparisonRecord, RecordError, StepRecord, describe_divergence_record
from ..common.statuses import COMPARISON, DIVERGED, IDENTICAL, KILLED, PATCH, STEP, TIMEOUT, VERDICT
from ..record.summary import read_run, write_summary_md
from ..record.verdict import FAILS, NOT_RUN, RowVerdict, count_text, failing_names, failures_first, judge, \
    unproven_notes
from ..triage.signatures import load_signatures, step_logs
from ..triage.triage import SpeedChange, Transition
from ..record.compare import CompareEntry, find_compare_entry
from ..record.forecast import read_forecast
from ..common.statistics import WITHIN_ROUND
from ..record.bench import bench_platforms, read_bench, rule_ratio
from ..record.expectations import FINDING_PASSED, read_expectations
from ..record.probe import layers_by_type_text
from . import svg
from .report_figures import checkout_series, kl_figure, machine_text, probe_figures, rule_history_figures, speed_pair_figures
from ..record.summary_md import cache_text, describe_cached, shown_as_reused
from .pin_chart import ladder_scale, pin_chart_svg, pin_ladders
from .upstream_suite import upstream_html

#: Lines of a failing log shown in the report (the end of a log holds the error).
LOG_TAIL_LINES = 40
#: Most log files excerpted per failing step.
LOGS_PER_STEP = 3

#: A speed rule's statuses shown as failures: a rule's status is its step's (harness.common.statuses.STEP).
_BAD = STEP.failures


def _counts(items: Iterable[StepRecord | ComparisonRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item.status] = out.get(item.status, 0) + 1
    return out


def _count_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"


def _sig_lookup(entries: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for e in entries:
        if e.get("step") == "compare":
            out[("compare", e.get("platform"), e.get("group"), e.get("model"), e.get("prompt"), e.get("config"))] = \
                e["signature"]
        else:
            out[(e.get("platform"), e.get("config"), e.get("step"))] = e["signature"]
    return out


# --------------------------------------------------------------------------- divergence alignment


@dataclass(frozen=True)
class Alignment:
    """Two generated texts split at the first divergent token.

    ``prefix`` is the text both sides share before it; ``reference_token`` /
    ``candidate_token`` the token on each side (None: that side's output ended);
    ``reference_rest`` / ``candidate_rest`` what follows.  ``exact`` is False when the
    pieces could not be located in the texts and the split is at the first differing
    character instead.
    """

    index: int | None
    prefix: str
    reference_token: str | None
    reference_rest: str
    candidate_token: str | None
    candidate_rest: str
    exact: bool


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _fits(text: str, at: int, piece: str | None) -> bool:
    return at == len(text) if piece is None else text.startswith(piece, at)


def align_divergence(reference: str, candidate: str, divergence: dict | None) -> Alignment:
    """Split two texts at the first divergent token described by ``divergence``.

    ``divergence`` is a first_divergence record ({index, reference: {id, piece} | None,
    candidate: {id, piece} | None}) or None.  The token starts where both pieces (or the
    end of output, for a None side) are found at the same offset, at or before the first
    differing character; the nearest such offset wins.  Without a divergence record or
    when no offset fits, the split is at the first differing character and the "token" is
    that one character (``exact`` False).  Returns an Alignment.
    """
    p = _common_prefix(reference, candidate)
    if divergence:
        ref_tok = divergence.get("reference")
        cand_tok = divergence.get("candidate")
        rp = None if ref_tok is None else str(ref_tok.get("piece", ""))
        cp = None if cand_tok is None else str(cand_tok.get("piece", ""))
        reach = max(len(rp or ""), len(cp or ""))
        starts = list(range(p, max(-1, p - reach - 1), -1))
        if isinstance(divergence.get("text_offset"), int):  # the engine's own offset, tried first
            starts.insert(0, divergence["text_offset"])
        for s in starts:
            if _fits(reference, s, rp) and _fits(candidate, s, cp):
                return Alignment(divergence.get("index"), reference[:s],
                                 rp, reference[s + len(rp or ""):], cp, candidate[s + len(cp or ""):], True)
    ref_token = reference[p:p + 1] if p < len(reference) else None
    cand_token = candidate[p:p + 1] if p < len(candidate) else None
    return Alignment((divergence or {}).get("index"), reference[:p], ref_token, reference[p + 1:],
                     cand_token, candidate[p + 1:], False)


def _compare_entry(run_dir: Path, cmp: ComparisonRecord) -> CompareEntry | None:
    try:
        return find_compare_entry(RunLayout(run_dir).compare_json(cmp.platform, cmp.candidate), cmp.group, cmp.model,
                                  cmp.prompt, cmp.reference)
    except (OSError, RecordError):
        return None


# --------------------------------------------------------------------------- HTML pieces

_CSS = """
:root { --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; --skip:#6e7781; --bg:#ffffff; --fg:#1f2328;
        --muted:#59636e; --line:#d1d9e0; --soft:#f6f8fa; --mark:#ffd8b5; --mark2:#c8e1ff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0 auto; padding: 20px 28px 60px; max-width: 1240px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; } h3 { font-size: 15px; margin: 18px 0 6px; } h4 { font-size: 13px; margin: 6px 0 4px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
                   font-size: 12px; }
nav a { margin-right: 14px; }
.verdict { display: inline-block; font-weight: 600; padding: 2px 10px; border-radius: 12px; color: #fff; }
.verdict.passed { background: var(--ok); } .verdict.failed { background: var(--bad); }
.verdict.incomplete, .verdict.in-progress { background: var(--warn); } .verdict.skipped { background: var(--skip); }
.headline.failing { color: var(--bad); } .headline.unfinished { color: var(--warn); }
table.glance td:first-child { font-weight: 600; } #not-run li.unfinished { color: var(--warn); } .why { color: var(--fg); } td.verdict-cell { min-width: 14em; }
.muted { color: var(--muted); }
table { border-collapse: collapse; width: 100%; margin: 6px 0 10px; }
th, td { border: 1px solid var(--line); padding: 4px 7px; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; } /* a long path or key wraps in its cell: no table wider than the page */
th { background: var(--soft); font-weight: 600; }
td.num, td.nw { white-space: nowrap; } td.num { text-align: right; }
.st { font-weight: 600; white-space: nowrap; }
.st-success { color: var(--ok); } .st-failure { color: var(--bad); } .st-neutral { color: var(--skip); }
tr.bad td { background: #fff5f5; } tr.suspect td { background: #fff8e5; }
.sig { font-size: 12px; } .kind { display: inline-block; font-family: ui-monospace, Menlo, Consolas, monospace;
       font-size: 11px; background: #eef1f4; border: 1px solid var(--line); border-radius: 4px; padding: 0 4px; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px;
      overflow-x: auto; white-space: pre-wrap; word-break: break-word; margin: 4px 0 10px; }
pre.log { line-height: 1.35; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.gen .common { color: var(--muted); }
.gen mark { background: var(--mark); color: #000; border-radius: 3px; outline: 1px solid #e0823d; padding: 0 1px; }
.gen mark.cand { background: var(--mark2); outline-color: #4a89dc; }
.gen .rest { color: var(--fg); }
.gen .end { font-style: italic; color: var(--bad); }
.divergence { border: 1px solid var(--line); border-radius: 8px; padding: 6px 12px 4px; margin: 10px 0; }
details { border: 1px solid var(--line); border-radius: 8px; padding: 4px 12px; margin: 8px 0; }
details > summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
svg.chart { display: block; margin: 6px 0 14px; }
svg .req { fill: #c9d6e3; } svg .grant { fill: #2f6fb0; } svg .short { fill: #e0823d; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill: #1f2328; }
svg .axis { stroke: #8c959f; stroke-width: 1; }
.filter { float: right; font-size: 13px; font-weight: normal; }
body.only-bad tr.ok { display: none; }
figure { margin: 8px 0 14px; } figcaption { font-size: 13px; color: var(--muted); }
""" + f".st-{TIMEOUT} {{ color: var(--warn); }}\n" + svg.CSS

_JS = """
document.getElementById('only-bad').addEventListener('change', function (e) {
  document.body.classList.toggle('only-bad', e.target.checked);
});
"""


def _status(status: str) -> str:
    outcome = next((k[status].outcome for k in (STEP, COMPARISON, PATCH) if status in k), "neutral")
    return f'<span class="st st-{outcome} st-{escape(status)}">{escape(status)}</span>'


#: The outcome class (st-success, st-failure, st-neutral: the colours of the page) of each row verdict.
_VERDICT_CLASS = {FAILS: "failure", NOT_RUN: "neutral"}


def _row_status(status: str, verdict: RowVerdict) -> str:
    """A row's status badge, coloured by the row's verdict (harness.record.verdict), never by the status alone:
    an expected divergence is not red, an identity where the group expects a divergence is."""
    return (f'<span class="st st-{_VERDICT_CLASS.get(verdict.verdict, "success")} st-{escape(status)}">'
            f'{escape(status)}</span>')


def _verdict_cell(verdict: RowVerdict) -> str:
    """A row's verdict cell: the verdict, coloured, and why (also why a row passes, e.g. an expected divergence)."""
    why = f' <span class="why">{escape(verdict.why)}</span>' if verdict.why else ""
    return (f'<td class="verdict-cell"><span class="st st-{_VERDICT_CLASS.get(verdict.verdict, "success")} '
            f'row-verdict">{escape(verdict.verdict)}</span>{why}</td>')


def _row_open(verdict: RowVerdict) -> str:
    """A table row's start tag: class ``bad`` (the red row, shown by "failures only") only for a failing row."""
    return f'<tr class="{"bad" if verdict.fails else "ok"}" data-verdict="{escape(verdict.verdict)}">'


def _sig_html(sig: Mapping[str, Any] | None) -> str:
    if not sig:
        return ""
    return f'<span class="kind">{escape(sig["kind"])}</span> <span class="sig">{escape(sig["summary"])}</span>'


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, int]:
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return "", 0
    all_lines = text.splitlines()
    return "\n".join(all_lines[-lines:]), len(all_lines)


def _piece(token: str | None, cls: str) -> str:
    if token is None:
        return '<span class="end">⟨end of output⟩</span>'
    shown = token if token.strip() else token.replace(" ", "␠").replace("\n", "⏎\n") or "∅"
    return f'<mark class="{cls}" title="first divergent token">{escape(shown)}</mark>'


def _divergence_html(run_dir: Path, cmp: ComparisonRecord) -> str:
    head = (f'{escape(cmp.platform)} · {escape(cmp.group)} · {escape(cmp.model)}/{escape(cmp.prompt)}: '
            f'{escape(cmp.candidate)} vs {escape(cmp.reference)}')
    entry = _compare_entry(run_dir, cmp)
    div = cmp.first_divergence
    if entry is None or entry.reference_text is None:
        return (f'<article class="divergence"><h3>{head}</h3><p class="muted">compare.json has no texts for this '
                f'comparison; {escape(cmp.detail)}</p></article>')
    al = align_divergence(entry.reference_text, entry.candidate_text or "", div)
    where = f"generated token {al.index}" if al.index is not None else "the first differing character"
    if div and "near_tie" in div:
        where += f" ({'near tie' if div['near_tie'] else 'hard divergence'}; near-tie margin {div.get('near_tie_margin')})"
    kl = cmp.kl
    if kl:
        where += (f"; KL mean {kl['mean']:.3g}, max {kl['max']:.3g} nats at position {kl['max_at']}, "
                  f"top-1 agreement {kl['top1_agreement']:.1%}")
    note = "" if al.exact else ' <span class="muted">(token pieces not found in the texts; split at the first ' \
                               'differing character)</span>'
    sides = []
    for label, name, token, rest, cls in (("reference", cmp.reference, al.reference_token, al.reference_rest, "ref"),
                                          ("candidate", cmp.candidate, al.candidate_token, al.candidate_rest,
                                           "cand")):
        ident = ""
        side = (div or {}).get(label) if div else None
        if side and side.get("id") is not None:
            margin = f', margin {side["margin"]:.4g}' if isinstance(side.get("margin"), (int, float)) else ""
            ident = f' <span class="muted">(token id {escape(str(side["id"]))}{margin})</span>'
        sides.append(f'<div><h4>{label}: {escape(name)}{ident}</h4><pre class="gen"><span class="common">'
                     f'{escape(al.prefix)}</span>{_piece(token, cls)}<span class="rest">{escape(rest)}</span></pre></div>')
    return (f'<article class="divergence"><h3>{head}</h3><p>First divergent token: {where}{note}. '
            f'Shared prefix greyed, the divergent token marked.</p><div class="sides">{"".join(sides)}</div>'
            f'{kl_figure(cmp)}</article>')


def _step_status(s: StepRecord) -> str:
    """A step's status badge (coloured by its verdict); a test step taken from the result cache shows ``reused``
    (never ``passed``) and the run it came from, restored generations their status and ``cached: <run-id>``
    (docs/cache.md)."""
    badge = _row_status(s.status, s.verdict())
    if not s.cached:
        return badge
    if shown_as_reused(s.step):
        return (f'<span class="st st-success st-reused">reused</span> '
                f'<span class="muted">from run {escape(s.cached)}</span>')
    return f'{badge} <span class="muted">cached: {escape(s.cached)}</span>'


def _steps_table(steps: list[StepRecord], sigs: dict) -> str:
    """The steps table: failing rows first, each with its status and verdict (harness.record.verdict)."""
    verdicts = [s.verdict() for s in steps]
    rows = []
    for s, v in failures_first(list(zip(steps, verdicts)), verdicts):
        sig = sigs.get((s.platform, s.config, s.step))
        rows.append(f'{_row_open(v)}<td class="nw">{escape(s.platform)}</td>'
                    f'<td class="nw">{escape(s.config)}</td><td class="nw">{escape(s.step)}</td>'
                    f'<td>{_step_status(s)}</td>{_verdict_cell(v)}<td class="num">{float(s.seconds or 0):.1f} s</td>'
                    f'<td>{escape(s.detail)}</td><td>{_sig_html(sig)}</td></tr>')
    return ('<table class="steps"><thead><tr><th>platform</th><th>config</th><th>step</th><th>status</th>'
            '<th>verdict</th><th>time</th><th>detail</th><th>signature</th></tr></thead><tbody>' + "".join(rows)
            + "</tbody></table>")


def _kl_cells(c: ComparisonRecord, verdict: RowVerdict) -> str:
    """The KL and top-1 cells; a mean past the group's kl_mean_max is flagged in the colour of the row's verdict."""
    if not (kl := c.kl):
        return '<td class="num">–</td><td class="num">–</td>'
    over = c.kl_mean_max is not None and kl["mean"] > c.kl_mean_max
    flag = (f' <span class="st st-{_VERDICT_CLASS.get(verdict.verdict, "neutral")}">&gt; {c.kl_mean_max:g}</span>'
            if over else "")
    return (f'<td class="num">{kl["mean"]:.3g} / {kl["max"]:.3g}{flag}</td>'
            f'<td class="num">{kl["top1_agreement"]:.1%}</td>')


def _comparisons_table(comparisons: list[ComparisonRecord]) -> str:
    """The comparisons table: failing rows first, each with its status and verdict judged against its group's
    ``expect`` (harness.record.verdict)."""
    verdicts = [c.verdict() for c in comparisons]
    rows = []
    for c, v in failures_first(list(zip(comparisons, verdicts)), verdicts):
        nondet = f' <span class="muted">(nondeterministic: {escape(", ".join(c.nondeterministic))})</span>' \
            if c.nondeterministic else ""
        if c.cached:
            nondet += f' <span class="muted cached">({escape(describe_cached(c.cached))})</span>'
        rows.append(f'{_row_open(v)}<td class="nw">{escape(c.platform)}</td>'
                    f'<td class="nw">{escape(c.group)}</td>'
                    f'<td>{escape(c.model)}</td><td>{escape(c.prompt)}</td><td>{escape(c.reference)}</td>'
                    f'<td>{escape(c.candidate)}</td><td>{_row_status(c.status, v)}</td>{_verdict_cell(v)}'
                    f'<td>{escape(c.difference())}{nondet}</td>{_kl_cells(c, v)}</tr>')
    return ('<table class="comparisons"><thead><tr><th>platform</th><th>group</th><th>model</th><th>prompt</th>'
            '<th>reference</th><th>candidate</th><th>status</th><th>verdict</th><th>first divergent token</th>'
            '<th>KL mean / max (nats)</th><th>top-1 agree</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _spread_text(sp: dict | None) -> str:
    return "–" if not sp else f"{sp['median']:.1f} ({sp['q1']:.1f}–{sp['q3']:.1f}, n={sp['n']})"


def _peak_text(bench: dict) -> str:
    """The engines' peak host memory of a bench.json (harness.stages.speed.speed), or "" where it has none."""
    peak = bench.get("peak_host_rss_bytes")
    return f"; engines' peak host memory {peak / 2**30:.2f} GiB (two at a time)" if peak else ""


def _partner_text(m: dict) -> str:
    """" (with X)": the configuration a measurement was interleaved with, "" for records without pairs."""
    other = [c for c in m.get("pair") or [] if c != m.get("config")]
    return f' <span class="muted">(with {escape(other[0])})</span>' if other else ""


def speed_rows(run_dir: Path) -> list[tuple[str, dict, list[dict]]]:
    """Per platform with a bench.json: (platform, its machine fingerprint, its rule records) for the report."""
    out = []
    for platform in bench_platforms(run_dir):
        bench = read_bench(run_dir, platform) or {}
        out.append((platform, bench, list(bench.get("rules", []))))
    return out


def _p_text(rule: dict) -> str:
    """A rule's one-sided Mann-Whitney p set against its p_max as what holds (``0.004 ≤ 0.01``, ``1 > 0.01``):
    a slowdown counts only at or below p_max, so a large p on a passing rule reads as the pass it is."""
    if "p_value" not in rule:
        return "–"
    p, p_max = float(rule["p_value"]), float(rule["p_max"])
    return f"{p:.3g} {'≤' if p <= p_max else '>'} {p_max:g}"


def _speed_html(run_dir: Path) -> str:
    rows = speed_rows(run_dir)
    if not rows:
        return '<p class="muted">no speed stage in this run</p>'
    parts = []
    for platform, bench, rules in rows:
        machine = bench.get("machine") or {}
        parts.append(f'<h3>{escape(platform)}</h3><p class="muted">machine: {escape(machine_text(machine))}; '
                     f'speed stage {float(bench.get("wall_s") or 0):.1f} s{_peak_text(bench)}</p>')
        body = []
        for r in rules:
            judged = rule_ratio(r)
            ratio = escape(judged.text()) if judged else "–"
            p_value = _p_text(r)
            bad = r.get("status") in _BAD
            body.append(f'<tr class="{"bad" if bad else "ok"}"><td>{escape(r["group"])}</td><td>{escape(r["model"])}</td>'
                        f'<td>{escape(r["candidate"])} vs {escape(r["reference"])}</td><td>{escape(r["metric"])}</td>'
                        f'<td>{_status(r.get("status", "?"))}</td>'
                        f'<td class="num">{_spread_text(r.get("candidate_spread"))}</td>'
                        f'<td class="num">{_spread_text(r.get("reference_spread"))}</td><td class="num">{ratio}</td>'
                        f'<td class="num">≥ {r["min_ratio"] / (1 + r["factor"]):.3g}x</td><td class="num">{escape(p_value)}'
                        '</td></tr>')
        parts.append('<table><thead><tr><th>group</th><th>model</th><th>rule</th><th>metric</th><th>status</th>'
                     '<th>candidate tok/s median (quartiles)</th><th>reference tok/s</th><th>ratio</th>'
                     '<th>fails below</th><th>Mann-Whitney p (a slowdown: ≤ p max)</th></tr></thead><tbody>' + "".join(body)
                     + "</tbody></table>")
        meas = [f'<tr><td>{escape(m["config"])}{_partner_text(m)}</td><td>{escape(m["model"])}</td><td class="num">{m["n_prompt"]} / '
                f'{m["n_gen"]}</td><td class="num">{_spread_text(m.get("pp"))}</td>'
                f'<td class="num">{_spread_text(m.get("tg"))}</td><td>{escape("; ".join(m.get("errors") or []))}</td></tr>'
                for m in bench.get("measurements", [])]
        parts.append('<table><thead><tr><th>configuration</th><th>model</th><th>tokens pp / tg</th>'
                     '<th>pp tok/s median (quartiles)</th><th>tg tok/s median (quartiles)</th><th>errors</th></tr>'
                     '</thead><tbody>' + "".join(meas) + "</tbody></table>")
        strips = speed_pair_figures(bench)
        if strips:
            parts.append('<details open><summary>Rounds per pair (each dot one timed request, the bar the median)'
                         '</summary>' + "".join(strips) + "</details>")
        history = rule_history_figures(results_root(run_dir), platform, run_dir.name, checkout_series())
        if history:
            parts.append(f'<details><summary>History of the rules over the runs in <code>'
                         f'{escape(str(results_root(run_dir).name))}/</code> ({len(history)} lines, each one rule on '
                         'one model, token counts, instrument and machine, recorded by more than one run of the '
                         "checkout's patch series; red: failed; hollow grey: a run of another series, such as a "
                         'planted fault)</summary>' + "".join(history) + "</details>")
    return "".join(parts)


def results_root(run_dir: Path) -> Path:
    """The results directory a run belongs to: its nearest ancestor named ``results`` (runs under
    ``results/evidence/`` included), else the run's parent."""
    return next((p for p in run_dir.resolve().parents if p.name == "results"), run_dir.resolve().parent)


def _environment_html(run_dir: Path, platform: str) -> str:
    try:
        env = read_environment(RunLayout(run_dir).environment_json(platform))
    except (OSError, RecordError):
        return ""
    gpus = ", ".join(str(g.get("name", g)) for g in env.gpus) or "none"
    items = [("OS", env.os), ("CPU", env.cpu), ("GPU", gpus), ("CUDA toolkit", env.cuda_toolkit),
             ("base commit", env.base_commit[:12]),
             ("patches", str(len(env.patches)) if env.patches is not None else None)]
    return "<p class=\"muted\">" + " · ".join(f"{k}: {escape(str(v))}" for k, v in items if v) + "</p>"


def _config_html(run_dir: Path, platform: str, config: str, steps: list[StepRecord], sigs: dict) -> str:
    bad = [s for s in steps if s.verdict().fails]
    badges = " ".join(f'{escape(s.step)} {_row_status(s.status, s.verdict())}' for s in steps)
    body = []
    try:
        cfg: ConfigRecord | None = read_run_config(RunLayout(run_dir).config_json(platform, config))
    except (OSError, RecordError):
        cfg = None
    if cfg is not None:
        facts = []
        if cfg.description:
            facts.append(escape(cfg.description))
        facts.append(f'build <code>{escape(cfg.build)}</code>')
        if cfg.args:
            facts.append("args <code>" + escape(" ".join(cfg.args)) + "</code>")
        if cfg.env:
            facts.append("env <code>" + escape(" ".join(f"{k}={v}" for k, v in cfg.env.items())) + "</code>")
        body.append("<p>" + " · ".join(facts) + "</p>")
    gens = RunLayout(run_dir).generation_files(platform, config, ".stdout")
    if gens:
        body.append(f'<p class="muted">{len(gens)} generation(s) recorded under '
                    f'<code>{escape(platform)}/{escape(config)}/gen/</code></p>')
    body.append(_expectations_html(run_dir, platform, config))
    for s in bad:
        sig = sigs.get((platform, config, s.step))
        body.append(f'<h4>{escape(s.step)}: {_row_status(s.status, s.verdict())} — {escape(s.detail)}</h4>')
        if sig:
            body.append(f"<p>{_sig_html(sig)}</p>")
        for path in step_logs(run_dir, s)[:LOGS_PER_STEP]:
            text, total = _tail(path)
            rel = path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
            shown = min(total, LOG_TAIL_LINES)
            body.append(f'<p class="muted mono">{escape(str(rel))} — last {shown} of {total} lines</p>'
                        f'<pre class="log">{escape(text)}</pre>')
    opened = " open" if bad else ""
    return (f'<details{opened}><summary>{escape(config)} <span class="muted">— {badges}</span></summary>'
            + "".join(body) + "</details>")


def _expectations_html(run_dir: Path, platform: str, config: str) -> str:
    """The configuration's expectations (harness.stages.checks.expectations) per load: its model buffers, the pinned
    fraction of its expert tensors, the warnings found and each rule's outcome; "" without a record."""
    record = read_expectations(RunLayout(run_dir).expectations_json(platform, config))
    if record is None or not record.loads:
        return ""
    rows = []
    for load in record.loads:
        facts = load.facts
        buffers = ", ".join(f"{t} {size_text(n)}" for t, n in sorted((facts.get("model_buffers") or {}).items()))
        layers = layers_by_type_text(facts.get("layers") or {})
        fraction = facts.get("pinned_fraction")
        locked, claimed = facts.get("page_locked_bytes"), facts.get("claimed_granted_bytes")
        pinning = ("–" if fraction is None else f"{fraction:.3f}") + \
            ("" if locked is None else f"; driver {size_text(locked)}") + ("" if claimed is None else f", claimed {size_text(claimed)}")
        outcomes = "; ".join(f"{f.rule}: {f.status}" + ("" if f.status == FINDING_PASSED else f" ({f.message})")
                             for f in load.findings) or load.skipped or ""
        rows.append(f'<tr><td class="nw">{escape(load.model)}</td><td class="nw">{escape(load.load)}'
                    f'</td><td>{escape(buffers) or "–"}</td><td>{escape(layers) or "–"}</td><td>{escape(pinning)}</td>'
                    f'<td>{escape(", ".join(facts.get("warnings") or [])) or "–"}</td><td>{escape(outcomes)}</td></tr>')
    return ('<table class="steps"><thead><tr><th>model</th><th>load</th><th>model buffers (logged)</th>'
            '<th>expert layers (probe)</th><th>experts pinned; page-locked (driver) and claimed</th><th>warnings</th>'
            '<th>expectations</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _forecast_html(run_dir: Path) -> str:
    """The forecast section: verdict, one row per patch (conflicts with the upstream lines they met),
    one row per stage with its signature, and upstream's own output changes; '' without a readable forecast.json."""
    try:
        rec = read_forecast(RunLayout(run_dir).forecast_json)
    except (OSError, RecordError):
        return ""
    onto, old = rec.onto, rec.old_base
    rows = []
    for p in rec.patches:
        bad = PATCH.is_failure(p.status)
        conflicts = "".join(
            f'<details><summary><code>{escape(c.file)}</code> <code>{escape(c.hunk)}</code></summary>'
            + (f'<p class="muted">{escape(c.reason)}</p>' if c.reason else "")
            + f'<p>the patch writes:</p><pre>{escape(chr(10).join(c.wanted))}</pre><p>upstream has '
            + (f'at line {c.upstream_line}' if c.upstream_line else "nothing there (not in the new base)")
            + f':</p><pre>{escape(chr(10).join(c.upstream))}</pre></details>' for c in p.conflicts)
        rows.append(f'<tr class="{"bad" if bad else "ok"}"><td class="num">{p.index}</td>'
                    f'<td>{escape(p.name)}</td><td>{_status(p.status)}</td>'
                    f'<td>{escape(p.detail)}{conflicts}</td>'
                    f'<td>{escape(", ".join(p.applied_without))}</td></tr>')
    stage_rows = _steps_table([StepRecord(s.platform, s.config, s.step, s.status, s.seconds, s.detail)
                               for s in rec.stages],
                              {(s.platform, s.config, s.step): s.signature for s in rec.stages if s.signature})
    first = rec.first_failure
    first_html = "none"
    if first:
        first_html = (f'{escape(first.step)} {escape(first.platform)}/{escape(first.config)}: '
                      + (_sig_html(first.signature) or escape(first.detail)))
    upstream = "".join(f'<li>{escape(u.platform)} {escape(u.group)} {escape(u.model)}/{escape(u.prompt)}: '
                       f'{escape(u.status)}{" — " + escape(u.difference) if u.status != IDENTICAL else ""}</li>'
                       for u in rec.upstream_comparisons)
    return (f'<section id="forecast"><h2>Forecast onto {escape(str(onto.get("commit", ""))[:12])}</h2>'
            f'<p>From the pinned base {escape(str(old.get("commit", ""))[:12])} onto '
            f'<code>{escape(str(onto.get("spec", "")))}</code> ({escape(str(onto.get("source", "")))}).</p>'
            f'<p class="verdict-line"><b>{escape(rec.verdict)}</b></p>'
            '<h3>Patches</h3><table><thead><tr><th>#</th><th>patch</th><th>status</th><th>detail</th>'
            f'<th>applied without</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<h3>Stages</h3>{stage_rows}<p>First failing step: {first_html}</p>'
            f'<h3>Upstream\'s own output changes (old base against new base)</h3>'
            f'<ul>{upstream or "<li class=muted>none compared</li>"}</ul></section>')


def _transition_row(t: Transition) -> str:
    """One triage transition (harness.triage.triage.Transition) as a row of the changes table."""
    cls = "bad" if t.category == "regression" else "ok"
    return (f'<tr class="{cls}"><td>{escape(t.category)}</td><td>{escape(t.platform)}</td><td>{escape(t.what)}</td>'
            f'<td>{_status(t.before)} → {_status(t.after)}</td><td>{_sig_html(t.signature)}</td></tr>')


def _suspect_row(c: SpeedChange) -> str:
    """One speed change triage calls suspect (harness.triage.speed_diff.SpeedChange) as a row."""
    what = f"{c.config} {c.model} {c.metric}" + (f" vs {c.reference}" if c.reference else "")
    ratio = (f"{WITHIN_ROUND}: {c.before_vs_reference:.3g}x → {c.after_vs_reference:.3g}x "
             f"({c.vs_reference_ratio:.3f}x)"
             if c.vs_reference_ratio is not None else f"{c.before_median:.1f} → {c.after_median:.1f} tok/s")
    return (f'<tr class="suspect"><td>suspect</td><td>{escape(c.platform)}</td><td>{escape(what)}</td>'
            f'<td>{escape(ratio)}</td><td>{escape(c.why)}</td></tr>')


def _changes_html(baseline: Path, run_dir: Path, chosen: bool = True) -> str:
    """The changes section: triage's findings against ``baseline`` (harness.triage.triage.diff_by_matrix, with
    the checkout's matrix as ``triage`` judges), regressions first, then the speed changes it calls suspect,
    then fixes and other changes; records new in this run (``absent → ...``) folded below.  ``chosen``: the
    baseline is triage's own choice (:func:`default_baseline`), not one named with ``--against``."""
    from ..args import find_checkout
    from ..triage.triage import diff_by_matrix
    root = find_checkout()
    rep = diff_by_matrix(baseline, run_dir, root / "matrix.yaml" if root else None)
    others = [t for t in rep.transitions if t.category == "other"]
    new = [t for t in others if t.before == "absent"]
    shown = rep.regressions + [t for t in rep.transitions if t.category == "fix"] + \
        [t for t in others if t.before != "absent"]
    rows = [_transition_row(t) for t in rep.regressions] + [_suspect_row(c) for c in rep.speed_suspects] + \
        [_transition_row(t) for t in shown[len(rep.regressions):]]
    why = ("the newest earlier run beside it of the same patch series that covers its platforms and groups "
           "(triage's choice)" if chosen else "named with --against")
    table = ('<table><thead><tr><th>change</th><th>platform</th><th>what</th><th>status</th>'
             f'<th>signature, or why suspect</th></tr></thead><tbody>{"".join(rows)}</tbody></table>' if rows else
             '<p class="muted">nothing that ran in both runs changed its status</p>')
    folded = (f'<details><summary>{len(new)} record(s) new in this run (absent in {escape(rep.a)})</summary>'
              '<table><thead><tr><th>change</th><th>platform</th><th>what</th><th>status</th><th>signature</th>'
              f'</tr></thead><tbody>{"".join(_transition_row(t) for t in new)}</tbody></table></details>'
              if new else "")
    not_run = (f'<p class="muted">{len(rep.not_compared)} record(s) of {escape(rep.a)} not run here, not compared.</p>'
               if rep.not_compared else "")
    return (f'<section id="changes"><h2>Changes since {escape(rep.a)}</h2><p class="muted">{escape(why)}</p>'
            f'<p>{len(rep.regressions)} regression(s), {len(rep.speed_suspects)} suspect speed change(s) '
            f'(<code>triage --confirm</code> re-measures them), {len(rep.fixes)} fix(es).</p>'
            f'{table}{folded}{not_run}</section>')


#: :func:`render_html`'s default baseline: the previous comparable run (harness.triage.run_choice.previous_run).
PREVIOUS = "previous"


def default_baseline(run_dir: Path) -> Path | None:
    """The newest earlier run beside ``run_dir`` (in its parent directory) of the same patch series that covers
    its platforms and groups (triage's own choice, harness.triage.run_choice.previous_run), or None where there
    is none."""
    from ..triage.run_choice import TriageInputError, previous_run
    try:
        return previous_run(run_dir, run_dir.resolve().parent)
    except TriageInputError:
        return None


def render_html(run_dir: Path, baseline: Path | str | None = PREVIOUS) -> str:
    """The HTML report of the run in ``run_dir`` as one self-contained string.

    ``baseline``: an earlier run directory, :data:`PREVIOUS` (the default: the previous run beside it that
    covers its platforms, :func:`default_baseline`, if any) or None; a "changes since" section lists
    triage's transitions against it.  Raises FileNotFoundError when the run has no summary.json.
    """
    chosen = baseline == PREVIOUS
    if baseline == PREVIOUS:
        baseline = default_baseline(run_dir)
    data = read_run(run_dir)
    steps, comparisons = data.steps, data.comparisons
    sigs = _sig_lookup(load_signatures(run_dir))
    run_id = data.run_id
    overall = data.overall or "?"
    shown = f"{overall} ({KILLED})" if data.killed else overall
    rows = judge(steps, comparisons)
    names = failing_names(rows)
    glance = build_glance(RunLayout(run_dir), steps, data.skipped_platforms, data.incomplete)
    unfinished = "; ".join(f"{n.what} ({n.why})" for n in glance.unfinished())
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
             f'<meta name="viewport" content="width=device-width, initial-scale=1">'
             f'<title>Run {escape(run_id)}: {escape(shown)}</title><style>{_CSS}</style></head><body>',
             f'<header><h1>Run {escape(run_id)} <span class="verdict {escape(overall)}">{escape(shown)}</span></h1>'
             + (f'<p class="headline failing" id="headline"><b>Fails:</b> {escape(names)}</p>' if names else
                f'<p class="headline unfinished" id="headline"><b>Did not finish:</b> {escape(unfinished)}; no step '
                'or comparison fails of those that ran.</p>' if unfinished else
                '<p class="headline" id="headline">No step or comparison fails.</p>')
             + "".join(f'<p class="headline unproven"><b>Not proven:</b> {escape(n)}</p>' for n in unproven_notes(steps))
             + f'<p class="muted">steps: {escape(count_text(rows, "step"))} · comparisons: '
             f'{escape(count_text(rows, "comparison"))} ({escape(_count_text(_counts(comparisons)))}) · summary '
             f'updated {escape(data.updated or "?")}</p>',
             '<nav><a href="#glance">at a glance</a>' + ('<a href="#forecast">forecast</a>' if RunLayout(run_dir).forecast_json.is_file() else '')
             + (f'<a href="{RunLayout(run_dir).bisect_md.name}" id="bisect-md">bisect</a>'
                f'<a href="{RunLayout(run_dir).bisect_json.name}" id="bisect-json">bisect record</a>'
                if RunLayout(run_dir).bisect_json.is_file() else '')
             + '<a href="#steps">steps</a><a href="#comparisons">comparisons</a><a href="#speed">speed</a><a href="#divergences">divergences</a>'
             '<a href="#configurations">configurations</a><a href="#probe">probe</a><a href="#pin-ladder">pin ladder</a></nav></header>']
    parts.append(glance_html(glance))
    cached = cache_text(data.cache, data.steps, RunLayout(run_dir))
    if cached:
        parts.append(f'<p class="cache">Result cache (docs/cache.md): {escape(cached)}</p>')
    if data.skipped_platforms:
        parts.append("<p>Skipped platforms: " + "; ".join(
            f"<b>{escape(k)}</b>: {escape(v)}" for k, v in sorted(data.skipped_platforms.items())) + "</p>")
    if isinstance(baseline, Path):
        parts.append(_changes_html(baseline, run_dir, chosen))
    else:
        parts.append('<section id="changes"><h2>Changes</h2><p class="muted">no earlier run beside this one of the '
                     'same patch series covers its platforms and groups</p></section>')
    parts.append(_forecast_html(run_dir))
    parts.append('<section id="steps"><h2>Steps <label class="filter"><input type="checkbox" id="only-bad"> '
                 'failures only</label></h2>' + _steps_table(steps, sigs) + "</section>")
    parts.append('<section id="comparisons"><h2>Greedy comparisons</h2>'
                 + (_comparisons_table(comparisons) if comparisons else '<p class="muted">none recorded</p>')
                 + "</section>")
    parts.append('<section id="speed"><h2>Speed</h2>' + _speed_html(run_dir) + "</section>")
    upstream = upstream_html(run_dir, {st.platform for st in steps})
    if upstream:
        parts.append('<section id="upstream"><h2>Upstream\'s suite</h2>' + upstream + "</section>")
    diverged = [c for c in comparisons if c.status == DIVERGED]
    parts.append('<section id="divergences"><h2>Divergences</h2>'
                 + ("".join(_divergence_html(run_dir, c) for c in diverged) or '<p class="muted">none</p>')
                 + "</section>")
    parts.append('<section id="configurations"><h2>Configurations</h2>')
    by_platform: dict[str, dict[str, list[StepRecord]]] = {}
    for s in steps:
        if s.config == "-":
            continue
        by_platform.setdefault(s.platform, {}).setdefault(s.config, []).append(s)
    for platform, configs in sorted(by_platform.items()):
        parts.append(f"<h3>{escape(platform)}</h3>{_environment_html(run_dir, platform)}")
        parts += [_config_html(run_dir, platform, c, ss, sigs) for c, ss in sorted(configs.items())]
    parts.append("</section>")
    probes = probe_figures(run_dir)
    parts.append('<section id="probe"><h2>Where the expert tensors sit</h2>'
                 + ('<p class="muted">per configuration, from the engine\'s runtime probe (<code>gen/&lt;model&gt;/'
                    'engine.probe.json</code>): each layer\'s expert tensors in their buffer type, in blues and '
                    'greys by the bytes the GPU kind\'s runtime reports page-locked (on CUDA '
                    'cudaPointerGetAttributes), whatever the configuration expects; below, what the expectations '
                    'check decided of that load, red where it failed</p>' + "".join(probes)
                    if probes else '<p class="muted">no runtime probe in this run</p>') + "</section>")
    parts.append('<section id="pin-ladder"><h2>Pin ladder</h2>')
    ladders = pin_ladders(run_dir)
    scale = ladder_scale([lad["records"] for lad in ladders])
    if not ladders:
        parts.append('<p class="muted">no pin-ladder lines in this run</p>')
    for lad in ladders:
        title = f'{lad["platform"]} · {lad["config"]} · {lad["model"]}'
        same = (f"the same total in all {lad['files']} generation(s)" if len(lad["granted_totals"]) <= 1 else
                "granted totals differ between generations: "
                + ", ".join(size_text(t) for t in lad["granted_totals"]))
        parts.append(f'<h3>{escape(title)}</h3><p class="muted">per allocation, from <code>{escape(lad["file"])}'
                     f'</code>; {escape(same)}; every chart on one scale</p>' + pin_chart_svg(lad["records"], title, scale))
    parts.append("</section>")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f'<footer class="muted"><p>Written by <code>python -m harness report</code> on {generated} from '
                 f'<code>{escape(run_dir.name)}/summary.json</code>.</p></footer><script>{_JS}</script></body></html>')
    return "\n".join(parts)


def write_report(run_dir: Path, out: Path | None = None, baseline: Path | str | None = PREVIOUS) -> Path:
    """Write the HTML report of ``run_dir`` to ``out`` (default ``run_dir/report.html``); return its path.
    ``baseline``: as :func:`render_html` (default: changes since the previous comparable run)."""
    out = out or RunLayout(run_dir).report_html
    html_text = render_html(run_dir, baseline)
    write_text_whole(out, html_text)
    return out


# --------------------------------------------------------------------------- Markdown


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_summary(run_dir: Path, baseline: Path | None = None) -> str:
    """The run's summary as Markdown for a CI job summary or a pull-request comment.

    Verdict, counts of steps and comparisons per status, a table of failed steps with
    their signatures, the divergences (token index and pieces), and — when ``baseline``
    (an earlier run directory) is given — the regressions and fixes against it.  Raises
    FileNotFoundError when the run has no summary.json.
    """
    data = read_run(run_dir)
    steps, comparisons = data.steps, data.comparisons
    sigs = _sig_lookup(load_signatures(run_dir))
    run_id = data.run_id
    overall = data.overall or "?"
    icon = VERDICT[overall].icon if overall in VERDICT else "❌"
    skipped = len(data.skipped_platforms)
    notes = ([KILLED] if data.killed else []) + \
        ([f"{skipped} platform{'s' if skipped != 1 else ''} skipped"] if skipped else []) + unproven_notes(steps)
    rows = judge(steps, comparisons)
    names = failing_names(rows)
    headline = overall + (f" ({'; '.join(notes)})" if notes else "") + (f": {names}" if names else "")
    lines = [f"## {icon} Run {run_id}: {_md(headline)}", "",
             f"**Steps:** {count_text(rows, 'step')} · **comparisons:** {count_text(rows, 'comparison')} "
             f"({_count_text(_counts(comparisons))})", ""]
    lines += glance_markdown(build_glance(RunLayout(run_dir), steps, data.skipped_platforms, data.incomplete))
    cached = cache_text(data.cache, data.steps, RunLayout(run_dir))
    if cached:
        lines += [f"**Result cache:** {_md(cached)}", ""]
    if data.skipped_platforms:
        lines += ["Skipped platforms: " + "; ".join(f"`{k}` ({_md(v)})"
                                                    for k, v in sorted(data.skipped_platforms.items())), ""]
    if baseline is not None:
        from ..args import find_checkout
        from ..triage.triage import diff_by_matrix
        root = find_checkout()
        rep = diff_by_matrix(baseline, run_dir, root / "matrix.yaml" if root else None)
        lines += [f"### Against {rep.a}: {len(rep.regressions)} regression(s), {len(rep.speed_suspects)} suspect "
                  f"speed change(s), {len(rep.fixes)} fix(es)", ""]
        for t in rep.regressions:
            sig = f" — `{t.signature['kind']}` {_md(t.signature['summary'])}" if t.signature else ""
            new = " (new signature)" if t.signature_known is False else ""
            lines.append(f"- **{t.category}** {t.platform} {_md(t.what)}: {t.before} → {t.after}{sig}{new}")
        for c in rep.speed_suspects:
            lines.append(f"- **suspect** {c.platform} {c.config} {c.model} {c.metric}"
                         + (f" vs {c.reference}" if c.reference else "") + f": {_md(c.why)}")
        for t in rep.fixes:
            lines.append(f"- **{t.category}** {t.platform} {_md(t.what)}: {t.before} → {t.after}")
        lines.append("")
    failed = [s for s in steps if s.verdict().fails]
    if failed:
        lines += ["### Failures", "", "| platform | config | step | status | signature |", "|---|---|---|---|---|"]
        for s in failed:
            found = sigs.get((s.platform, s.config, s.step))
            cell = f"`{found['kind']}` {_md(found['summary'])}" if found else _md(s.detail)
            lines.append(f"| {s.platform} | {s.config} | {s.step} | {s.status} | {cell} |")
        lines.append("")
    judged = [(c, c.verdict()) for c in comparisons if c.status != IDENTICAL or c.failed()]
    bad_cmp = failures_first(judged, [v for _, v in judged])
    if bad_cmp:
        lines += ["### Divergences and failed comparisons", ""]
        for c, v in bad_cmp:
            d = c.first_divergence
            if d:
                what = f"first divergent token {_md(describe_divergence_record(d))}"
            else:
                what = _md(c.detail)
            if c.cached:
                what += f" ({_md(describe_cached(c.cached))})"
            mark = "❌ **fails**" if v.fails else ("✅ passes" if v.passes else "⏭️ not run")
            lines.append(f"- {mark} ({_md(v.why or c.status)}): {c.platform} {c.group} {c.model}/{c.prompt}: "
                         f"{c.candidate} vs {c.reference} — {what}")
        lines.append("")
    speed = [(platform, r) for platform, _, rules in speed_rows(run_dir) for r in rules]
    if speed:
        lines += ["### Speed rules", "", "| platform | group | rule | metric | status | candidate / reference tok/s "
                  "(medians) | ratio | Mann-Whitney p |", "|---|---|---|---|---|---:|---:|---:|"]
        for platform, r in speed:
            medians = (f"{r['candidate_spread']['median']:.1f} / {r['reference_spread']['median']:.1f}"
                       if "ratio" in r else "–")
            named = rule_ratio(r)
            ratio = (f"{named.text()}, fails below {r['threshold']:.3g}x" if named
                     else _md(r.get("detail", "")))
            p_value = _p_text(r)
            lines.append(f"| {platform} | {r['group']} | {r['candidate']} vs {r['reference']} | {r['metric']} "
                         f"| {r.get('status')} | {medians} | {ratio} | {p_value} |")
        lines.append("")
    if not names:
        lines += ["No step or comparison fails.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str]) -> int:
    """``report`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("report", argv))


def against_run(spec: str, run_dir: Path, results_dir: Path) -> Path:
    """The run ``--against`` names: a run directory, else a run id beside ``run_dir`` (where the default
    baseline is looked for), else under ``results_dir``.  Raises harness.triage.run_choice.TriageInputError
    naming ``spec`` and the runs beside ``run_dir`` when it names none."""
    from ..triage.run_choice import TriageInputError, resolve_run
    try:
        return resolve_run(spec, run_dir.resolve().parent)
    except TriageInputError as beside:
        try:
            return resolve_run(spec, results_dir)
        except TriageInputError:
            raise beside from None


def run(args: argparse.Namespace) -> int:
    """``python -m harness report [RUN] [--markdown] [--against RUN] [--results-dir DIR] [--out FILE]``.

    Writes the run's report.html (RUN: id, directory or ``latest``, the default), its summary.md and its JUnit
    (``junit/``, harness.record.junit), all rendered again from its summary.json (a committed run too), and prints the report's path; with ``--markdown`` prints the Markdown summary to stdout and the path to
    stderr.  ``--against`` adds changes since an earlier run (``previous``: the newest
    earlier run covering the same platforms).  Returns 0; raises harness.common.errors.InputError
    subclasses (exit code 2 through harness.cli) for a run that does not exist.
    """
    from ..triage.run_choice import resolve_run
    run_dir = resolve_run(args.run, args.results_dir)
    baseline: Path | str | None = None
    if args.against == PREVIOUS:
        baseline = PREVIOUS
    elif args.against and args.against != "none":
        baseline = against_run(args.against, run_dir, args.results_dir)
    out = write_report(run_dir, args.out, baseline)
    if baseline == PREVIOUS:
        baseline = default_baseline(run_dir)
    write_summary_md(run_dir)
    from ..record.junit import write_run_junit
    from ..stages.table import steps_of_role
    data = read_run(run_dir)
    write_run_junit(run_dir, data.steps, data.comparisons, steps_of_role("checks"))
    md = markdown_summary(run_dir, Path(baseline) if baseline else None) if args.markdown else None
    if md is not None:
        print(md)
        print(out, file=sys.stderr)
    else:
        print(out)
    return 0
