"""Regression triage: what changed between two result runs, and which patch broke a check.

``python -m harness triage [A [B]] [--json] [--results-dir results]`` compares run A
(the older) with run B (the newer).  Without arguments B is ``results/latest`` and A
the newest earlier run that ran at least B's platforms; with one argument that run is
B.  It reports, from the two ``summary.json`` files and the run directories:

* status transitions per platform/config/step and per comparison, regressions first
  (passed -> failed/error, identical -> diverged/crashed/timeout, or a failure where
  there was none before), then fixes, then every other change;
* divergences that are new or moved (the first divergent token index changed);
* failure signatures (harness.signatures) that are new, still present, or gone,
  matched by (kind, key);
* pin-ladder changes: granted bytes per platform/config summed over the
  ``*.pin-ladder.json`` files of the generations both runs have;
* build and test times that changed by more than :data:`TIME_NOISE_FRACTION` of the
  earlier time and at least :data:`TIME_NOISE_FLOOR_S` seconds.

Exit status: 1 when there is any regression, 0 when there is none, 2 for bad input.

``python -m harness bisect -- --platform P --check test:NAME|group:G[:MODEL[:PROMPT]]``
finds the first patch of the series that makes the check fail (see
:func:`bisect_first_bad` and :class:`SeriesBisector`); with ``--upstream GOOD..BAD
[--repo PATH]`` it finds the first upstream commit on BAD's first-parent line that makes
the check fail with the whole series applied on top (:class:`UpstreamBisector`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import gpu
from .results import COMPARISON, STEP, RecordError, RunLayout, StepRecord, read_summary
from .signatures import load_signatures

#: Statuses that count as a failure or a success (declared in harness.results).
BAD_STEP = STEP.failures
BAD_COMPARISON = COMPARISON.failures
GOOD = STEP.successes | COMPARISON.successes

#: A build or test time change is reported when it exceeds both this fraction of the
#: earlier time and TIME_NOISE_FLOOR_S.  The numbers are the project's rule for this
#: report (issue 5): repeated builds and ctest runs of an unchanged tree on the shared
#: 2-core machines and CI runners vary by up to about a fifth (ccache hits, other jobs on
#: the host), and steps of a few seconds are dominated by process start-up, so changes
#: below 5 s say nothing.
TIME_NOISE_FRACTION = 0.20
TIME_NOISE_FLOOR_S = 5.0

#: How many known run ids an "unknown run" error lists.
KNOWN_RUNS_SHOWN = 5


class TriageInputError(Exception):
    """A run id or directory that does not name a results run, or no run to compare with."""


# --------------------------------------------------------------------------- runs


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TriageInputError(f"{path}: not valid JSON ({exc})") from exc


def _started(run_dir: Path) -> str:
    meta = _read_json(run_dir / "run.json") or {}
    if isinstance(meta, dict) and meta.get("started"):
        return str(meta["started"])
    summary = _read_json(run_dir / "summary.json") or {}
    return str(summary.get("updated", "")) if isinstance(summary, dict) else ""


def known_runs(results_dir: Path) -> list[Path]:
    """Run directories under ``results_dir`` (those holding summary.json), oldest first.

    Ordered by the start time in run.json (then summary.json's ``updated``), then by id;
    run ids are UTC timestamps, so both orders agree for runs the harness created.
    """
    if not results_dir.is_dir():
        return []
    runs = [d for d in results_dir.iterdir()
            if d.is_dir() and not d.is_symlink() and (d / "summary.json").is_file()]
    return sorted(runs, key=lambda d: (_started(d), d.name))


def _latest(results_dir: Path) -> Path | None:
    link = results_dir / "latest"
    if link.exists() and (link / "summary.json").is_file():
        return link.resolve()
    marker = results_dir / "LATEST"
    if marker.is_file():
        candidate = results_dir / marker.read_text().strip()
        if (candidate / "summary.json").is_file():
            return candidate
    runs = known_runs(results_dir)
    return runs[-1] if runs else None


def _unknown(spec: str, results_dir: Path) -> TriageInputError:
    runs = [d.name for d in known_runs(results_dir)]
    if runs:
        shown = ", ".join(reversed(runs[-KNOWN_RUNS_SHOWN:]))
        more = f" (and {len(runs) - KNOWN_RUNS_SHOWN} older)" if len(runs) > KNOWN_RUNS_SHOWN else ""
        return TriageInputError(f"unknown run {spec!r}: no {results_dir / spec} with a summary.json; "
                                f"known runs, newest first: {shown}{more}")
    return TriageInputError(f"unknown run {spec!r}: {results_dir} holds no runs")


def resolve_run(spec: str, results_dir: Path) -> Path:
    """The run directory ``spec`` names: a directory with summary.json, a run id under
    ``results_dir``, or ``latest``.  Raises TriageInputError naming ``spec`` and listing
    a few known run ids when it names none.
    """
    direct = Path(spec)
    if (direct / "summary.json").is_file():
        return direct.resolve()
    if spec == "latest":
        latest = _latest(results_dir)
        if latest:
            return latest
    candidate = results_dir / spec
    if (candidate / "summary.json").is_file():
        return candidate.resolve()
    raise _unknown(spec, results_dir)


def covered_platforms(summary: Mapping[str, Any]) -> set[str]:
    """Platforms of a summary that ran at least one step (a skipped platform does not count)."""
    return {s["platform"] for s in summary.get("configurations", []) if s.get("status") != "skipped"}


def previous_run(b: Path, results_dir: Path) -> Path:
    """The newest run before ``b`` (in :func:`known_runs` order) that covers b's platforms.

    "Covers" means it ran a superset of the platforms b ran.  Raises TriageInputError when
    there is none.
    """
    summary_b = _read_json(b / "summary.json") or {}
    wanted = covered_platforms(summary_b)
    runs = known_runs(results_dir)
    names = [r.resolve() for r in runs]
    earlier = runs[:names.index(b.resolve())] if b.resolve() in names else runs
    for run in reversed(earlier):
        if run.resolve() == b.resolve():
            continue
        if wanted <= covered_platforms(_read_json(run / "summary.json") or {}):
            return run.resolve()
    raise TriageInputError(f"no run before {b.name} in {results_dir} covers its platforms "
                           f"({', '.join(sorted(wanted)) or 'none'}); name two runs to compare")


# --------------------------------------------------------------------------- report records


@dataclass
class Transition:
    """A status change of one step or comparison between run A and run B.

    ``category`` is regression, fix or other; ``kind`` is step or comparison; ``where``
    holds the identifying fields (platform, config, step / group, model, prompt,
    reference, candidate); ``before``/``after`` are statuses or ``absent``; ``detail``
    is B's detail (A's when the record is gone); ``signature`` the failure signature
    ({kind, key, summary}) of the failing side, with ``signature_known`` telling whether
    run A already had that key; ``blocked_by`` names a failed build the step waited on.
    """

    category: str
    kind: str
    platform: str
    what: str
    before: str
    after: str
    where: dict[str, str]
    detail: str = ""
    signature: dict[str, str] | None = None
    signature_known: bool | None = None
    blocked_by: str = ""


@dataclass
class DivergenceChange:
    """A divergence that is ``new`` in B or ``moved`` (first divergent token index changed).

    Indices count generated tokens from 0; ``before_index`` is None for a new one and
    ``moved_by`` is ``after_index - before_index`` in generated tokens for a moved one.
    ``reference_piece``/``candidate_piece`` are B's tokens at the divergence and
    ``reference_margin``/``candidate_margin`` their rows' top-1 minus top-2 logits
    (nats).  ``near_tie`` is B's flag (None for records without one).
    """

    change: str
    platform: str
    group: str
    model: str
    prompt: str
    reference: str
    candidate: str
    before_index: int | None
    after_index: int | None
    reference_piece: str | None = None
    candidate_piece: str | None = None
    near_tie: bool | None = None
    reference_margin: float | None = None
    candidate_margin: float | None = None
    moved_by: int | None = None


@dataclass
class SignatureSeen:
    """One failure signature and where it occurs (``platform config step`` strings)."""

    kind: str
    key: str
    summary: str
    where: list[str] = field(default_factory=list)


@dataclass
class PinChange:
    """Pin-ladder totals of one platform/config in A and B, in bytes.

    Sums over the generations (model, prompt, repeat) present in both runs, of the
    ladder summary lines (see harness.gpu.ladder_totals); ``generations`` counts them.
    """

    platform: str
    config: str
    generations: int
    before_requested: int
    after_requested: int
    before_granted: int
    after_granted: int
    before_allocations: int
    after_allocations: int


@dataclass
class TimingChange:
    """A step whose time changed beyond noise: seconds before and after, and the threshold used."""

    platform: str
    config: str
    step: str
    before_s: float
    after_s: float
    threshold_s: float


@dataclass
class TriageReport:
    """Everything that changed from run ``a`` to run ``b`` (ids and directories)."""

    a: str
    b: str
    a_dir: str
    b_dir: str
    platforms: list[str]
    transitions: list[Transition] = field(default_factory=list)
    divergences: list[DivergenceChange] = field(default_factory=list)
    signatures_new: list[SignatureSeen] = field(default_factory=list)
    signatures_known: list[SignatureSeen] = field(default_factory=list)
    signatures_gone: list[SignatureSeen] = field(default_factory=list)
    pin_changes: list[PinChange] = field(default_factory=list)
    timing_changes: list[TimingChange] = field(default_factory=list)

    @property
    def regressions(self) -> list[Transition]:
        """Transitions whose category is regression."""
        return [t for t in self.transitions if t.category == "regression"]

    @property
    def fixes(self) -> list[Transition]:
        """Transitions whose category is fix."""
        return [t for t in self.transitions if t.category == "fix"]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data, plus ``verdict`` (regressed|clean) and counts."""
        data = asdict(self)
        data["verdict"] = "regressed" if self.regressions else "clean"
        data["counts"] = {"regressions": len(self.regressions), "fixes": len(self.fixes),
                          "other_changes": len(self.transitions) - len(self.regressions) - len(self.fixes)}
        return data


# --------------------------------------------------------------------------- diffing


def _category(before: str, after: str, bad: frozenset[str]) -> str:
    if after in bad and before not in bad:
        return "regression"
    if before in bad and after in GOOD:
        return "fix"
    return "other"


def _blocked_by(platform: str, step: dict | None) -> str:
    builds = StepRecord.from_json(step).blocked_by() if step else []
    return f"{platform} {', '.join(builds)} build" if builds else ""


def _sig_index(entries: list[dict]) -> dict[tuple, dict]:
    index: dict[tuple, dict] = {}
    for e in entries:
        if e.get("step") == "compare":
            key = (e.get("platform"), "compare", e.get("group"), e.get("model"), e.get("prompt"), e.get("config"))
        else:
            key = (e.get("platform"), e.get("config"), e.get("step"))
        index[key] = e["signature"]
    return index


def _short(sig: dict | None) -> dict[str, str] | None:
    return None if sig is None else {"kind": sig["kind"], "key": sig["key"], "summary": sig["summary"]}


def _step_transitions(sa: dict, sb: dict, sig_a: dict, sig_b: dict, known: set) -> list[Transition]:
    steps_a = {(s["platform"], s["config"], s["step"]): s for s in sa.get("configurations", [])}
    steps_b = {(s["platform"], s["config"], s["step"]): s for s in sb.get("configurations", [])}
    out = []
    for key in sorted(set(steps_a) | set(steps_b)):
        a, b = steps_a.get(key), steps_b.get(key)
        before = a["status"] if a else "absent"
        after = b["status"] if b else "absent"
        if before == after:
            sa_sig, sb_sig = sig_a.get(key), sig_b.get(key)
            if before in BAD_STEP and sa_sig and sb_sig and (sa_sig["kind"], sa_sig["key"]) != (sb_sig["kind"], sb_sig["key"]):
                out.append(Transition("other", "step", key[0], f"{key[1]} {key[2]}", before, after,
                                      {"platform": key[0], "config": key[1], "step": key[2]},
                                      f"signature changed from {sa_sig['summary']}", _short(sb_sig),
                                      (sb_sig["kind"], sb_sig["key"]) in known))
            continue
        category = _category(before, after, BAD_STEP)
        if after == "absent" and before in GOOD and any(k[0] == key[0] and k[2] == key[2] for k in steps_b):
            # B ran this step on this platform but no longer for this configuration: something was lost
            category = "regression"
        failing_side = sig_a.get(key) if category == "fix" else sig_b.get(key)
        detail = (b or a or {}).get("detail", "")
        sig_known = None
        if failing_side and category != "fix":
            sig_known = (failing_side["kind"], failing_side["key"]) in known
        out.append(Transition(category, "step", key[0], f"{key[1]} {key[2]}", before, after,
                              {"platform": key[0], "config": key[1], "step": key[2]}, detail,
                              _short(failing_side), sig_known, _blocked_by(key[0], b)))
    return out


def _cmp_key(c: dict) -> tuple:
    return (c["platform"], c["group"], c["model"], c["prompt"], c["reference"], c["candidate"])


def _cmp_what(key: tuple) -> str:
    return f"{key[1]} {key[2]}/{key[3]}: {key[5]} vs {key[4]}"


def _comparison_transitions(sa: dict, sb: dict, sig_a: dict, sig_b: dict, known: set) -> list[Transition]:
    ca = {_cmp_key(c): c for c in sa.get("comparisons", [])}
    cb = {_cmp_key(c): c for c in sb.get("comparisons", [])}
    out = []
    for key in sorted(set(ca) | set(cb)):
        a, b = ca.get(key), cb.get(key)
        before = a["status"] if a else "absent"
        after = b["status"] if b else "absent"
        if before == after:
            continue
        category = _category(before, after, BAD_COMPARISON)
        if after == "absent" and any(k[0] == key[0] and k[1] == key[1] for k in cb):
            # B ran this group on this platform but lost this comparison
            category = "regression"
        sigs, side = (sig_a, a) if category == "fix" else (sig_b, b)
        status = (side or {}).get("status")
        platform, _, model, prompt, reference, candidate = key
        sig = None
        if status == "diverged":
            sig = sigs.get((platform, "compare", key[1], model, prompt, candidate))
        elif status in ("crashed", "timeout"):  # the generate step of the side that failed holds the signature
            sig = sigs.get((platform, candidate, "generate")) or sigs.get((platform, reference, "generate"))
        sig_known = None
        if sig and category != "fix":
            sig_known = (sig["kind"], sig["key"]) in known
        where = {"platform": platform, "group": key[1], "model": model, "prompt": prompt,
                 "reference": reference, "candidate": candidate}
        out.append(Transition(category, "comparison", platform, _cmp_what(key), before, after, where,
                              (b or a or {}).get("detail", ""), _short(sig), sig_known))
    return out


def _divergence_changes(sa: dict, sb: dict) -> list[DivergenceChange]:
    ca = {_cmp_key(c): c for c in sa.get("comparisons", [])}
    out = []
    for c in sb.get("comparisons", []):
        div = c.get("first_divergence")
        if c.get("status") != "diverged":
            continue
        key = _cmp_key(c)
        old = ca.get(key)
        old_div = (old or {}).get("first_divergence") if old and old.get("status") == "diverged" else None
        index = div.get("index") if div else None
        ref = (div or {}).get("reference") or {}
        cand = (div or {}).get("candidate") or {}
        if old is None or old.get("status") != "diverged":
            change = "new"
        elif (old_div or {}).get("index") != index:
            change = "moved"
        else:
            continue
        before = (old_div or {}).get("index") if change == "moved" else None
        out.append(DivergenceChange(change, key[0], key[1], key[2], key[3], key[4], key[5], before, index,
                                    ref.get("piece") if div else None, cand.get("piece") if div else None,
                                    (div or {}).get("near_tie"), ref.get("margin"), cand.get("margin"),
                                    index - before if isinstance(index, int) and isinstance(before, int) else None))
    return out


def _kl_transitions(sa: dict, sb: dict) -> list[Transition]:
    """A comparison whose mean KL divergence rose above its group's ``kl_mean_max`` is a regression, even
    when its greedy tokens stayed identical; one that fell back below it is a fix."""
    ca = {_cmp_key(c): c for c in sa.get("comparisons", [])}
    out = []
    for c in sb.get("comparisons", []):
        limit = c.get("kl_mean_max")
        after = (c.get("kl") or {}).get("mean")
        key = _cmp_key(c)
        before = ((ca.get(key) or {}).get("kl") or {}).get("mean")
        if limit is None or after is None:
            continue
        over_a = before is not None and before > limit
        over_b = after > limit
        if over_a == over_b:
            continue
        where = {"group": key[1], "model": key[2], "prompt": key[3], "reference": key[4], "candidate": key[5]}
        text_a = "absent" if before is None else f"KL mean {before:.3g}"
        out.append(Transition("regression" if over_b else "fix", "kl", key[0], _cmp_what(key), text_a,
                              f"KL mean {after:.3g}", where,
                              f"mean KL divergence {'above' if over_b else 'back below'} the group's kl_mean_max "
                              f"{limit:g} nats (status {c.get('status')})"))
    return out


def _signature_sets(entries_a: list[dict], entries_b: list[dict]) -> tuple[list, list, list]:
    def group(entries: list[dict]) -> dict[tuple, SignatureSeen]:
        seen: dict[tuple, SignatureSeen] = {}
        for e in entries:
            sig = e["signature"]
            item = seen.setdefault((sig["kind"], sig["key"]), SignatureSeen(sig["kind"], sig["key"], sig["summary"]))
            where = f"{e.get('platform')} {e.get('config')} {e.get('step')}"
            if e.get("step") == "compare":
                where += f" {e.get('group')}/{e.get('model')}/{e.get('prompt')}"
            item.where.append(where)
        return seen

    ga, gb = group(entries_a), group(entries_b)
    new = [gb[k] for k in sorted(set(gb) - set(ga))]
    known = [gb[k] for k in sorted(set(gb) & set(ga))]
    gone = [ga[k] for k in sorted(set(ga) - set(gb))]
    return new, known, gone


def pin_totals(run_dir: Path) -> dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]]:
    """Per (platform, config), per generation (model, "<prompt>.r<k>"), the pin-ladder totals.

    Every generation with a ``.stderr`` file is listed; one without a pin-ladder.json
    had no ladder lines and gets zero totals.  Totals come from harness.gpu.ladder_totals
    (bytes requested/granted, allocations, segments).
    """
    out: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for platform, config, model, stem, stderr in RunLayout(run_dir).all_generation_files(".stderr"):
        ladder_file = stderr.with_name(stem + ".pin-ladder.json")
        records = _read_json(ladder_file) if ladder_file.is_file() else []
        out.setdefault((platform, config), {})[(model, stem)] = gpu.ladder_totals(records or [])
    return out


def _pin_changes(a_dir: Path, b_dir: Path) -> list[PinChange]:
    ta, tb = pin_totals(a_dir), pin_totals(b_dir)
    out = []
    for key in sorted(set(ta) & set(tb)):
        common = sorted(set(ta[key]) & set(tb[key]))
        if not common:
            continue
        before = [ta[key][g] for g in common]
        after = [tb[key][g] for g in common]
        if not any(t["allocations"] for t in before + after):
            continue
        change = PinChange(key[0], key[1], len(common),
                           sum(t["requested"] for t in before), sum(t["requested"] for t in after),
                           sum(t["granted"] for t in before), sum(t["granted"] for t in after),
                           sum(t["allocations"] for t in before), sum(t["allocations"] for t in after))
        if change.before_granted != change.after_granted or change.before_allocations != change.after_allocations:
            out.append(change)
    return out


def time_threshold(before_s: float) -> float:
    """Seconds a step's time must change by to be reported: max(20 % of ``before_s``, 5 s).

    See TIME_NOISE_FRACTION and TIME_NOISE_FLOOR_S for where the numbers come from.
    """
    return max(TIME_NOISE_FRACTION * before_s, TIME_NOISE_FLOOR_S)


def _timing_changes(sa: dict, sb: dict) -> list[TimingChange]:
    steps_a = {(s["platform"], s["config"], s["step"]): s for s in sa.get("configurations", [])}
    out = []
    for s in sb.get("configurations", []):
        key = (s["platform"], s["config"], s["step"])
        a = steps_a.get(key)
        if not a or not (key[2] == "build" or key[2].startswith("test")):
            continue  # only build and test steps have meaningful times
        if a["status"] != "passed" or s["status"] != "passed":
            continue  # a failed step stops early; its time says nothing
        if any(str(x.get("detail", "")).startswith("up to date") for x in (a, s)):
            continue  # an up-to-date build did not build
        before, after = float(a.get("seconds") or 0), float(s.get("seconds") or 0)
        threshold = time_threshold(before)
        if abs(after - before) > threshold:
            out.append(TimingChange(key[0], key[1], key[2], before, after, round(threshold, 1)))
    return out


def _order(t: Transition) -> tuple:
    return ({"regression": 0, "fix": 1}.get(t.category, 2), t.platform, t.kind != "step", t.what)


def diff_runs(a: Path, b: Path) -> TriageReport:
    """Compare run directory ``a`` (earlier) with ``b`` (later) and return what changed.

    Reads both summary.json files, their signatures (signatures.json, else computed from
    the logs without writing), and pin-ladder files.  Raises TriageInputError when either
    directory has no readable summary.json.
    """
    try:
        sa, sb = read_summary(a), read_summary(b)
    except (FileNotFoundError, RecordError) as exc:
        raise TriageInputError(str(exc)) from None
    entries_a, entries_b = load_signatures(a), load_signatures(b)
    sig_a, sig_b = _sig_index(entries_a), _sig_index(entries_b)
    known = {(e["signature"]["kind"], e["signature"]["key"]) for e in entries_a}
    report = TriageReport(a=str(sa.get("run_id") or a.name), b=str(sb.get("run_id") or b.name),
                          a_dir=str(a), b_dir=str(b),
                          platforms=sorted(covered_platforms(sa) | covered_platforms(sb)))
    report.transitions = sorted(_step_transitions(sa, sb, sig_a, sig_b, known)
                                + _comparison_transitions(sa, sb, sig_a, sig_b, known)
                                + _kl_transitions(sa, sb), key=_order)
    report.divergences = _divergence_changes(sa, sb)
    report.signatures_new, report.signatures_known, report.signatures_gone = _signature_sets(entries_a, entries_b)
    report.pin_changes = _pin_changes(a, b)
    report.timing_changes = _timing_changes(sa, sb)
    return report


# --------------------------------------------------------------------------- text output


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _transition_line(t: Transition) -> str:
    line = f"  {t.platform}  {t.what}: {t.before} -> {t.after}"
    if t.signature:
        state = "" if t.signature_known is None else (" (known)" if t.signature_known else " (new signature)")
        line += f"\n      [{t.signature['kind']}] {t.signature['summary']}{state}"
    elif t.detail and t.after not in GOOD:
        line += f"\n      {t.detail[:200]}"
    if t.blocked_by:
        line += f"\n      blocked by: {t.blocked_by}"
    return line


def format_report(report: TriageReport) -> str:
    """The report as plain text for a terminal: sections in order of importance, then the verdict."""
    out = [f"triage {report.a} -> {report.b}  (platforms: {', '.join(report.platforms) or 'none'})", ""]
    sections = [("REGRESSIONS", report.regressions), ("FIXES", report.fixes),
                ("OTHER CHANGES", [t for t in report.transitions if t.category == "other"])]
    for title, items in sections:
        out.append(f"{title} ({len(items)})")
        out += [_transition_line(t) for t in items]
        out.append("")
    hard = [d for d in report.divergences if not d.near_tie]
    near = [d for d in report.divergences if d.near_tie]
    for title, items in (("HARD DIVERGENCES, NEW OR MOVED", hard),
                         ("NEAR-TIE DIVERGENCES, NEW OR MOVED (the reference's top two logits almost equal)", near)):
        if not items:
            continue
        out.append(f"{title} ({len(items)})")
        for d in items:
            where = f"  {d.platform}  {d.group} {d.model}/{d.prompt}: {d.candidate} vs {d.reference}"
            margins = "" if d.reference_margin is None else \
                f", margins {d.reference_margin:.3g} vs {d.candidate_margin if d.candidate_margin is not None else float('nan'):.3g}"
            if d.change == "moved":
                out.append(f"{where}: moved from generated token {d.before_index} to {d.after_index} "
                           f"({d.moved_by:+d} tokens{margins})" if d.moved_by is not None else
                           f"{where}: moved from generated token {d.before_index} to {d.after_index}{margins}")
            else:
                out.append(f"{where}: new, at generated token {d.after_index} "
                           f"({d.reference_piece!r} vs {d.candidate_piece!r}{margins})")
        out.append("")
    out.append(f"SIGNATURES: {len(report.signatures_new)} new, {len(report.signatures_known)} known, "
               f"{len(report.signatures_gone)} gone")
    for label, items in (("new", report.signatures_new), ("known", report.signatures_known),
                         ("gone", report.signatures_gone)):
        for s in items:
            out.append(f"  {label:5}  [{s.kind}] {s.summary}  ({'; '.join(s.where)})")
    out.append("")
    if report.pin_changes:
        out.append(f"PIN LADDER, GRANTED BYTES CHANGED ({len(report.pin_changes)})")
        for p in report.pin_changes:
            out.append(f"  {p.platform}  {p.config}: granted {_bytes(p.before_granted)} -> {_bytes(p.after_granted)} "
                       f"of {_bytes(p.after_requested)} requested, {p.before_allocations} -> {p.after_allocations} "
                       f"allocations over {p.generations} generation(s)")
        out.append("")
    if report.timing_changes:
        out.append(f"TIMES BEYOND NOISE ({len(report.timing_changes)}; threshold max(20 %, 5 s))")
        for c in report.timing_changes:
            out.append(f"  {c.platform}  {c.config} {c.step}: {c.before_s:.1f} s -> {c.after_s:.1f} s "
                       f"(threshold {c.threshold_s:.1f} s)")
        out.append("")
    n = len(report.regressions)
    out.append(f"verdict: {n} regression(s)" if n else "verdict: no regressions")
    return "\n".join(out)


def _strip_dashdash(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    return argv[1:] if argv[:1] == ["--"] else argv


def main(argv: Sequence[str]) -> int:
    """``python -m harness triage [A [B]] [--json] [--results-dir DIR]``; returns the exit status.

    0: no regression; 1: at least one regression; 2: bad input (unknown run, nothing to
    compare with, unreadable summary) with the reason on stderr.
    """
    ap = argparse.ArgumentParser(prog="python -m harness triage",
                                 description="Report what changed between two result runs.")
    ap.add_argument("runs", nargs="*", metavar="RUN",
                    help="run ids or directories: A B, or only B (A: the previous run covering its platforms); "
                         "default: latest against its previous run")
    ap.add_argument("--json", action="store_true", help="print a machine-readable JSON object")
    ap.add_argument("--results-dir", type=Path, default=Path("results"))
    args = ap.parse_args(_strip_dashdash(argv))
    try:
        if len(args.runs) > 2:
            raise TriageInputError(f"expected at most two runs, got {len(args.runs)}: {' '.join(args.runs)}")
        if len(args.runs) == 2:
            a, b = (resolve_run(r, args.results_dir) for r in args.runs)
        else:
            b = resolve_run(args.runs[0] if args.runs else "latest", args.results_dir)
            a = previous_run(b, args.results_dir)
        report = diff_runs(a, b)
    except (TriageInputError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_report(report))
    return 1 if report.regressions else 0


# --------------------------------------------------------------------------- bisect


class BisectError(Exception):
    """The range cannot be bisected: the check fails at the good end or passes at the bad end."""


def bisect_first_bad(n: int, check: Callable[[int], bool], *, good: int = 0, bad: int | None = None,
                     cache: dict[int, bool] | None = None, name: Callable[[int], str] | None = None) -> int:
    """The first k in (good, bad] with check(k) False, by binary search; k counts applied patches.

    ``n`` is the number of patches; ``check(k)`` builds base + patches 1..k and returns
    True when the check passes.  ``good`` (default 0, the unpatched base) must pass and
    ``bad`` (default n, the whole series) must fail; otherwise BisectError, naming the
    end that is wrong.  Outcomes are memoised in ``cache`` (k -> passed), which callers
    may share between calls; each k is checked at most once.  Assumes one transition from
    pass to fail in the range (as git bisect does); with several, one of them is found.
    ``name(k)`` words position k in those errors when k is not a patch count (the upstream
    bisection passes commit positions).  Returns k: patch number k (1-based) is the first
    bad patch.  Raises ValueError for bounds outside 0 <= good < bad <= n.
    """
    bad = n if bad is None else bad
    if not 0 <= good < bad <= n:
        raise ValueError(f"need 0 <= good < bad <= n; got good={good}, bad={bad}, n={n}")
    memo = cache if cache is not None else {}

    def passes(k: int) -> bool:
        if k not in memo:
            memo[k] = bool(check(k))
        return memo[k]

    def where(k: int) -> str:
        if name is not None:
            return name(k)
        return "the unpatched base (k=0)" if k == 0 else f"k={k} (patches 1..{k})"

    if not passes(good):
        raise BisectError(f"the check fails at {where(good)}; it must pass at the good end"
                          + ("" if name else " (choose another --good)"))
    if passes(bad):
        raise BisectError(f"the check passes at {where(bad)}; it must fail at the bad end, "
                          "so there is nothing to bisect")
    lo, hi = good, bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return hi


@dataclass
class BisectResult:
    """The first bad patch (1-based ``first_bad`` with its file name and subject) and each k's outcome."""

    first_bad: int
    patch: str
    subject: str
    outcomes: dict[int, dict[str, Any]]


@dataclass
class SeriesBisector:
    """Applies patches 1..k of ``patches`` onto ``base``, builds, and runs ``check`` for each k asked.

    Every k has its own directory ``work_dir/k<k>/``: ``llama.cpp/`` the source tree
    (harness.source.prepare_tree; re-made only when the prefix changes), ``build/`` the
    build directory (harness.build.build, whose key makes a rebuild of an unchanged prefix
    a no-op), ``logs/`` configure/build/patch logs, and whatever the check writes.  All
    k directories sit at the same depth and ccache's base_dir is ``work_dir``, so objects
    a patch does not touch come from the cache when another k is built.
    ``check(bisector, k)`` returns (passed, detail).  ``cmake_options`` and ``targets`` are
    passed to every build; for k > 0 LLAMA_FORK_SERIES names the prefix.
    """

    base: Any  # harness.source.BaseTree
    patches: Sequence[Any]  # harness.patches.Patch
    platform: str
    cmake_options: Mapping[str, str]
    targets: tuple[str, ...]
    check: Callable[[Any, int], tuple[bool, str]]
    work_dir: Path
    jobs: int | None = None
    say: Callable[[str], None] = print
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    _builds: dict[int, Any] = field(default_factory=dict, repr=False)

    def k_dir(self, k: int) -> Path:
        """``work_dir/k<k>``: everything of the build with patches 1..k."""
        return self.work_dir / f"k{k}"

    def dir_at(self, k: int, variant: str = "fork") -> Path:
        """The directory of the ``base`` (k=0) or ``fork`` (patches 1..k) build a check at k uses."""
        return self.k_dir(0 if variant == "base" else k)

    def build_at(self, k: int, variant: str = "fork") -> Any:
        """The ``base`` (k=0) or ``fork`` (patches 1..k) build for a check at k; see :meth:`build`."""
        return self.build(0 if variant == "base" else k)

    def point(self, k: int) -> str:
        """Position k in words for check details: ``k=<k>``."""
        return f"k={k}"

    def tree(self, k: int) -> Path:
        """The source tree holding base + patches 1..k (created or reused); raises PatchApplyError."""
        from .patches import apply_series, series_digest
        from .source import prepare_tree
        logs = self.k_dir(k) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if k == 0:
            return prepare_tree(self.base, self.work_dir, "k0")
        return prepare_tree(self.base, self.work_dir, f"k{k}", series_digest(list(self.patches[:k])),
                            lambda repo, rev: apply_series(repo, rev, self.patches, upto=k,
                                                           log=logs / "patches.log"))

    def build(self, k: int) -> Any:
        """Build base + patches 1..k once per process; returns harness.build.BuildResult."""
        if k in self._builds:
            return self._builds[k]
        from .build import BuildRequest, build, ccache_env
        from .patches import series_digest, series_label
        prefix = list(self.patches[:k])
        options = dict(self.cmake_options)
        if k:
            options["LLAMA_FORK_SERIES"] = series_label(prefix, total=len(self.patches))
        source = self.tree(k)
        req = BuildRequest(self.platform, f"bisect-k{k}", source, (self.k_dir(k) / "build").resolve(), options,
                           tuple(self.targets), {"base": self.base.commit, "series": series_digest(prefix)},
                           self.jobs, env=ccache_env(self.work_dir.resolve()))
        result = build(req, self.k_dir(k) / "logs")
        self._builds[k] = result
        return result

    def passes(self, k: int) -> bool:
        """Run the check at k, record (passed, detail) in ``outcomes`` and say it; True when it passed."""
        passed, detail = self.check(self, k)
        self.outcomes[k] = {"passed": passed, "detail": detail}
        label = "the unpatched base" if k == 0 else f"patches 1..{k} (last: {self.patches[k - 1].name})"
        self.say(f"k={k} {label}: {'pass' if passed else 'FAIL'} — {detail}")
        return passed

    def run(self, good: int = 0, bad: int | None = None) -> BisectResult:
        """Bisect over k in [good, bad] (default [0, n]) and return the first bad patch.

        Raises BisectError (with the failing end's detail) when the range cannot be bisected,
        and harness.patches.PatchApplyError when a patch does not apply.
        """
        cache: dict[int, bool] = {}
        try:
            k = bisect_first_bad(len(self.patches), self.passes, good=good, bad=bad, cache=cache)
        except BisectError as exc:
            ends = [f"k={k}: {o['detail']}" for k, o in sorted(self.outcomes.items())]
            raise BisectError(f"{exc}\n  " + "\n  ".join(ends)) from None
        patch = self.patches[k - 1]
        return BisectResult(k, patch.name, patch.subject, dict(sorted(self.outcomes.items())))


# --------------------------------------------------------------------------- upstream bisect


@dataclass(frozen=True)
class UpstreamCommit:
    """One upstream commit: its full id (``sha``) and subject line."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        """The first 12 hex digits of the id (names its build directory)."""
        return self.sha[:12]


def _resolve_commit(repo: Path, rev: str) -> str | None:
    """The full id of commit ``rev`` in ``repo``, or None when it names no commit there."""
    from .source import git
    if rev.startswith("-"):
        return None
    proc = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _is_git_repo(path: Path) -> bool:
    """Whether ``path`` itself is a git repository (work tree or bare), not a directory inside one."""
    from .source import git
    return git(["rev-parse", "--git-dir"], path, check=False,
               env={"GIT_CEILING_DIRECTORIES": str(path.resolve().parent)}).returncode == 0


def fetched_clone(url: str, dest: Path, revs: Sequence[str], say: Callable[[str], None] = print) -> Path:
    """A bare repository at ``dest`` holding ``revs``, fetched from ``url`` when they are missing.

    Created empty on first use; when a rev does not resolve there, every branch and tag of
    ``url`` is fetched, and a rev that still does not resolve (a commit id no branch holds)
    is fetched on its own and kept under ``refs/bisect-upstream/``.  Revs that the remote
    does not have are left missing (the caller reports them).  Returns ``dest``; raises
    harness.source.SourceError when git cannot create or fetch into it.
    """
    from .source import git
    if not (dest / "HEAD").is_file():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        git(["init", "--quiet", "--bare", str(tmp)])
        tmp.rename(dest)
    if all(_resolve_commit(dest, r) for r in revs):
        return dest
    say(f"fetching the branches and tags of {url} into {dest}")
    git(["fetch", "--quiet", "--tags", "--force", url, "+refs/heads/*:refs/heads/*"], dest)
    for rev in revs:
        if _resolve_commit(dest, rev) is None and \
                git(["fetch", "--quiet", url, rev], dest, check=False).returncode == 0:
            sha = _resolve_commit(dest, "FETCH_HEAD")
            if sha:
                git(["update-ref", f"refs/bisect-upstream/{sha}", sha], dest)
    return dest


def upstream_repo(matrix: Any, repo: Path | None, revs: Sequence[str], cache: Path,
                  say: Callable[[str], None] = print) -> Path:
    """The git repository the upstream commits ``revs`` (GOOD and BAD) are taken from.

    ``repo`` (``--repo``) wins and must be a git repository.  Otherwise the first ``local``
    source of ``matrix`` (harness.config.Matrix) whose path exists, is a git repository and
    holds every rev; else a bare clone under ``cache/upstream/`` fetched from the first
    ``git`` source's URL (see :func:`fetched_clone`).  Raises TriageInputError naming what
    was tried when none qualifies, and harness.source.SourceError when fetching fails.
    """
    if repo is not None:
        if not repo.is_dir() or not _is_git_repo(repo):
            raise TriageInputError(f"--repo {repo}: not a git repository")
        return repo.resolve()
    tried: list[str] = []
    for src in matrix.sources:
        if src.kind != "local" or src.path is None or not src.path.exists():
            continue
        if not _is_git_repo(src.path):
            tried.append(f"local source {src.path} is not a git repository")
            continue
        missing = [r for r in revs if _resolve_commit(src.path, r) is None]
        if not missing:
            return src.path.resolve()
        tried.append(f"local source {src.path} has no commit {', '.join(missing)}")
    for src in matrix.sources:
        if src.kind == "git" and src.url:
            dest = cache / "upstream" / hashlib.sha256(src.url.encode()).hexdigest()[:16]
            for line in tried:
                say(f"note: {line}")
            return fetched_clone(src.url, dest, revs, say)
    tried.append("the matrix lists no git source to fetch from")
    raise TriageInputError(f"{matrix.path}: no repository holds {' and '.join(revs)} ({'; '.join(tried)}); "
                           "name one with --repo")


def upstream_commits(repo: Path, good: str, bad: str) -> list[UpstreamCommit]:
    """GOOD followed by ``git rev-list --first-parent --reverse GOOD..BAD``, with subjects.

    Index 0 is GOOD (must pass), the last is BAD (must fail).  Raises TriageInputError when
    either rev names no commit of ``repo``, when GOOD is not an ancestor of BAD, or when
    the range holds no commit.
    """
    from .source import git
    ids = {}
    for label, rev in (("GOOD", good), ("BAD", bad)):
        sha = _resolve_commit(repo, rev)
        if sha is None:
            raise TriageInputError(f"--upstream: {label} {rev!r} is not a commit in {repo}")
        ids[label] = sha
    if ids["GOOD"] == ids["BAD"]:
        raise TriageInputError(f"--upstream {good}..{bad}: GOOD and BAD are the same commit {ids['GOOD'][:12]}")
    if git(["merge-base", "--is-ancestor", ids["GOOD"], ids["BAD"]], repo, check=False).returncode != 0:
        raise TriageInputError(f"--upstream {good}..{bad}: GOOD {ids['GOOD'][:12]} is not an ancestor of "
                               f"BAD {ids['BAD'][:12]} in {repo}")
    listed = git(["rev-list", "--first-parent", "--reverse", "--format=%H%x00%s", f"{ids['GOOD']}..{ids['BAD']}"],
                 repo).stdout
    commits = [UpstreamCommit(*line.split("\0", 1)) for line in listed.splitlines() if "\0" in line]
    if not commits:
        raise TriageInputError(f"--upstream {good}..{bad}: no commit between GOOD and BAD on BAD's first-parent line")
    subject = git(["log", "-1", "--format=%s", ids["GOOD"]], repo).stdout.strip()
    return [UpstreamCommit(ids["GOOD"], subject), *commits]


def first_parent(repo: Path, sha: str) -> str | None:
    """The first parent of commit ``sha`` in ``repo`` (full id), or None for a root commit."""
    return _resolve_commit(repo, f"{sha}^1")


@dataclass
class UpstreamBisectResult:
    """The first bad upstream commit and every commit checked.

    ``first_bad``/``subject``: the commit; ``index``: its position on the first-parent line
    (0 is GOOD, ``candidates`` is BAD); ``series_applies``: False when the patch series did
    not apply there (the commit then counts as failing); ``not_applied``: commit id -> the
    patch file that did not apply, for every commit checked; ``outcomes``: commit id ->
    {index, subject, passed, detail, builds}.
    """

    first_bad: str
    subject: str
    index: int
    candidates: int
    series_applies: bool
    not_applied: dict[str, str]
    outcomes: dict[str, dict[str, Any]]


@dataclass
class UpstreamBisector:
    """Builds upstream ``commits[k]`` with the whole patch series applied and runs ``check`` at k.

    ``commits`` comes from :func:`upstream_commits` (0 = GOOD, last = BAD) in ``repo``.
    Every commit has ``work_dir/<commit12>/fork/`` (the tree with the series applied by
    harness.patches.apply_series with the commit as base, ``build/``, ``logs/``) and, when
    a check compares against upstream itself, ``work_dir/<commit12>/base/`` (the commit
    unpatched).  All sit at the same depth and ccache's base_dir is ``work_dir``; the
    build key holds the commit and series digest, so a commit built before is not built
    again.  When the series does not apply at a commit, its fork build is an ``error``
    whose detail says so, the check fails there, and ``not_applied`` names the patch.
    """

    repo: Path
    commits: Sequence[UpstreamCommit]
    patches: Sequence[Any]  # harness.patches.Patch
    platform: str
    cmake_options: Mapping[str, str]
    targets: tuple[str, ...]
    check: Callable[[Any, int], tuple[bool, str]]
    work_dir: Path
    jobs: int | None = None
    say: Callable[[str], None] = print
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    not_applied: dict[int, str] = field(default_factory=dict)
    _builds: dict[tuple[int, str], Any] = field(default_factory=dict, repr=False)

    def dir_at(self, k: int, variant: str = "fork") -> Path:
        """``work_dir/<commit12>/<variant>``: tree, build and logs of commit k, patched (fork) or not (base)."""
        return self.work_dir / self.commits[k].short / variant

    def k_dir(self, k: int) -> Path:
        """The patched build's directory of commit k (``dir_at(k, "fork")``)."""
        return self.dir_at(k, "fork")

    def point(self, k: int) -> str:
        """Position k in words for check details: the commit's short id."""
        return f"upstream {self.commits[k].short}"

    def tree(self, k: int, variant: str = "fork") -> Path:
        """The source tree of commit k, with the series applied for ``fork``; raises PatchApplyError."""
        from .patches import prepare_series_tree
        from .source import BaseTree, prepare_tree
        commit = self.commits[k]
        logs = self.dir_at(k, variant) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        base = BaseTree(self.repo, commit.sha, commit.sha, f"upstream {self.repo}")
        if variant == "base":
            return prepare_tree(base, self.work_dir, f"{commit.short}/base")
        return prepare_series_tree(base, self.work_dir, f"{commit.short}/fork", list(self.patches),
                                   log=logs / "patches.log")

    def build_at(self, k: int, variant: str = "fork") -> Any:
        """Build commit k (``fork``: with the series; ``base``: without) once per process.

        Returns harness.build.BuildResult; status ``error`` with a detail naming the patch
        when the series does not apply at the commit.
        """
        if (k, variant) in self._builds:
            return self._builds[(k, variant)]
        from .build import BuildRequest, BuildResult, build, ccache_env
        from .patches import PatchApplyError, series_digest, series_label
        commit, here = self.commits[k], self.dir_at(k, variant)
        try:
            source = self.tree(k, variant)
        except PatchApplyError as exc:
            position = [p.name for p in self.patches].index(exc.patch) + 1
            self.not_applied[k] = exc.patch
            result = BuildResult(self.platform, f"bisect-upstream-{variant}", "error", "", (here / "build").resolve(),
                                 0.0, False, detail=(f"the patch series does not apply at {commit.short}: patch "
                                                     f"{position} of {len(self.patches)}, {exc.patch}, does not "
                                                     f"apply (log {here / 'logs' / 'patches.log'})"))
            self._builds[(k, variant)] = result
            return result
        options = dict(self.cmake_options)
        key_parts = {"base": commit.sha}
        if variant == "fork":
            options["LLAMA_FORK_SERIES"] = series_label(list(self.patches))
            key_parts["series"] = series_digest(list(self.patches))
        req = BuildRequest(self.platform, f"bisect-upstream-{variant}", source, (here / "build").resolve(), options,
                           tuple(self.targets), key_parts, self.jobs, env=ccache_env(self.work_dir.resolve()))
        result = build(req, here / "logs")
        self._builds[(k, variant)] = result
        return result

    def build(self, k: int) -> Any:
        """The patched build of commit k (``build_at(k, "fork")``)."""
        return self.build_at(k, "fork")

    def _builds_at(self, k: int) -> dict[str, str]:
        """Per variant built for commit k: ``reused`` (up to date), ``built``, ``series did not apply``
        or the failed build's status."""
        out = {}
        for (at, variant), b in sorted(self._builds.items()):
            if at != k:
                continue
            if variant == "fork" and k in self.not_applied:
                out[variant] = "series did not apply"
            else:
                out[variant] = "reused" if b.up_to_date else ("built" if b.status == "passed" else b.status)
        return out

    def passes(self, k: int) -> bool:
        """Run the check at commit k, record it in ``outcomes`` and say it; True when it passed."""
        passed, detail = self.check(self, k)
        commit = self.commits[k]
        builds = self._builds_at(k)
        self.outcomes[k] = {"index": k, "subject": commit.subject, "passed": passed, "detail": detail,
                            "builds": builds}
        end = " (GOOD)" if k == 0 else " (BAD)" if k == len(self.commits) - 1 else ""
        shown = ", ".join(f"{v} {s}" for v, s in builds.items())
        self.say(f"[{k}/{len(self.commits) - 1}] {commit.short} {commit.subject}{end}: "
                 f"{'pass' if passed else 'FAIL'} — {detail}" + (f" [build: {shown}]" if shown else ""))
        return passed

    def _name(self, k: int) -> str:
        commit = self.commits[k]
        end = "GOOD" if k == 0 else "BAD" if k == len(self.commits) - 1 else "commit"
        extra = f"; the patch series does not apply there ({self.not_applied[k]})" if k in self.not_applied else ""
        return f"{end} {commit.short} ({commit.subject}{extra})"

    def run(self) -> UpstreamBisectResult:
        """Bisect over the commits and return the first bad one.

        Raises BisectError (with each checked end's detail) when GOOD fails or BAD passes.
        """
        try:
            k = bisect_first_bad(len(self.commits) - 1, self.passes, name=self._name)
        except BisectError as exc:
            ends = [f"{self.commits[i].short}: {o['detail']}" for i, o in sorted(self.outcomes.items())]
            raise BisectError(f"{exc}\n  " + "\n  ".join(ends)) from None
        commit = self.commits[k]
        return UpstreamBisectResult(commit.sha, commit.subject, k, len(self.commits) - 1, k not in self.not_applied,
                                    {self.commits[i].sha: p for i, p in sorted(self.not_applied.items())},
                                    {self.commits[i].sha: o for i, o in sorted(self.outcomes.items())})


# --------------------------------------------------------------------------- checks


@dataclass
class TestCheck:
    """Check ``test:<name>``: the ctest test ``name`` (with any of ``labels``) passes at k."""

    name: str
    labels: Sequence[str]
    timeout_s: float = 900

    __test__ = False  # not a pytest class

    def __call__(self, bisector: Any, k: int) -> tuple[bool, str]:
        """Build k's fork and run the test; (passed, detail).  A build failure or a missing test is a failure.

        ``bisector`` is a SeriesBisector or UpstreamBisector.
        """
        from .native_tests import run_ctest
        built = bisector.build_at(k, "fork")
        if built.status != "passed":
            return False, f"build {built.status}: {built.detail}"
        run = run_ctest(built.build_dir, self.labels, [self.name], bisector.dir_at(k, "fork") / f"tests-{self.name}",
                        timeout_s=self.timeout_s)
        case = next((c for c in run.cases if c.name == self.name), None)
        if case is None or case.status == "skipped":
            return False, (f"test {self.name} is not registered with ctest at {bisector.point(k)} "
                           f"(labels {', '.join(self.labels)})")
        if case.status != "passed":
            return False, f"{self.name} failed{': ' + case.message if case.message else ''} (log {run.log})"
        return True, f"{self.name} passed"


@dataclass
class GroupCheck:
    """Check ``group:<group>[:model[:prompt]]``: every candidate's greedy output equals the reference's.

    Configurations built from ``base`` use the bisector's base build at k (the unpatched
    base for a patch bisection, the unpatched commit for an upstream one), those built from
    ``fork`` its fork build at k.  ``configs``: name -> harness.config.RunConfig;
    ``model_paths``: model name -> GGUF path; ``prompts``: prompt id -> text;
    ``generation``: harness.config.Generation.  Generations are cached per (build
    directory, config, model, prompt), so a reference shared by every k is run once.
    """

    group: Any  # harness.config.Group
    configs: Mapping[str, Any]
    model_paths: Mapping[str, Path]
    prompts: Mapping[str, str]
    generation: Any
    _cache: dict[tuple, list] = field(default_factory=dict, repr=False)

    def _runs(self, bisector: Any, k: int, config: str, model: str, prompt: str) -> list:
        from .compare import GenerationSpec, run_generation
        cfg = self.configs[config]
        where = bisector.dir_at(k, cfg.build)
        key = (where, config, model, prompt)
        if key not in self._cache:
            built = bisector.build_at(k, cfg.build)
            if built.status != "passed":
                raise RuntimeError(f"{cfg.build} build for {bisector.point(k)} {built.status}: {built.detail}")
            runs = []
            for r in range(1, self.generation.repeats + 1):
                spec = GenerationSpec(binary=built.bin_dir / "llama-completion", model=self.model_paths[model],
                                      prompt=self.prompts[prompt], n_predict=self.generation.n_predict,
                                      seed=self.generation.seed, ctx_size=self.generation.ctx_size,
                                      args=tuple(cfg.args), env=dict(cfg.env), timeout_s=self.generation.timeout_s)
                runs.append(run_generation(spec, where / "gen" / config / model / f"{prompt}.r{r}"))
            self._cache[key] = runs
        return self._cache[key]

    def __call__(self, bisector: Any, k: int) -> tuple[bool, str]:
        """Run the group's comparisons at k; (passed, detail naming the first non-identical prompt)."""
        from .compare import compare_runs, tokenize
        g = self.group
        for model in self.model_paths:
            for prompt in self.prompts:
                try:
                    ref_runs = self._runs(bisector, k, g.reference, model, prompt)
                    tok_bin = bisector.build_at(k, self.configs[g.reference].build).bin_dir / "llama-tokenize"
                    for cand in g.candidates:
                        cand_runs = self._runs(bisector, k, cand, model, prompt)
                        pc = compare_runs(prompt, g.reference, ref_runs, cand, cand_runs,
                                          lambda text, _m=self.model_paths[model]: tokenize(
                                              tok_bin, _m, text, bisector.dir_at(k, "fork") / "tokenize"))
                        if pc.status != "identical":
                            return False, f"{model}/{prompt}: {cand} vs {g.reference}: {pc.detail}"
                except RuntimeError as exc:
                    return False, str(exc)
        return True, f"{g.name}: every prompt identical"


def _parse_check(spec: str) -> tuple[str, list[str]]:
    kind, _, rest = spec.partition(":")
    parts = [p for p in rest.split(":")] if rest else []
    if kind not in ("test", "group") or not parts or not parts[0] or (kind == "test" and len(parts) != 1) \
            or len(parts) > 3:
        raise TriageInputError(f"--check {spec!r}: expected test:<ctest-name> or group:<group>[:model[:prompt]]")
    return kind, parts


def _parse_range(spec: str) -> tuple[str, str]:
    good, sep, bad = spec.partition("..")
    if not sep or not good or not bad or bad.startswith(".") or ".." in bad or "-" in (good[0], bad[0]):
        raise TriageInputError(f"--upstream {spec!r}: expected GOOD..BAD (two commits, e.g. b6000..b6100)")
    return good, bad


def _make_check(spec: str, matrix: Any, platform: Any, pipe: Any) -> tuple[Callable[[Any, int], tuple[bool, str]],
                                                                          tuple[str, ...]]:
    """The check ``spec`` names and the build targets it needs; TriageInputError for an unknown group/model/prompt."""
    kind, parts = _parse_check(spec)
    if kind == "test":
        return TestCheck(parts[0], platform.test_labels), (parts[0],)
    if parts[0] not in matrix.groups:
        raise TriageInputError(f"--check {spec}: unknown group {parts[0]!r} "
                               f"(known: {', '.join(sorted(matrix.groups))})")
    group = matrix.groups[parts[0]]
    models = [parts[1]] if len(parts) > 1 else list(group.models)
    prompts = [parts[2]] if len(parts) > 2 else list(group.prompts)
    for m in models:
        if m not in group.models:
            raise TriageInputError(f"--check {spec}: group {group.name} has no model {m!r} "
                                   f"(it has: {', '.join(group.models)})")
    for p in prompts:
        if p not in group.prompts:
            raise TriageInputError(f"--check {spec}: group {group.name} has no prompt {p!r} "
                                   f"(it has: {', '.join(group.prompts)})")
    model_paths = {}
    for m in models:
        try:
            model_paths[m] = pipe.model_path(m)
        except Exception as exc:  # a model that cannot be assembled is bad input here
            raise TriageInputError(f"model {m}: {type(exc).__name__}: {exc}") from exc
    check = GroupCheck(group, matrix.configs, model_paths, {p: matrix.prompts[p].text for p in prompts},
                       group.generation)
    return check, ("llama-completion", "llama-tokenize")


def _print_upstream(result: UpstreamBisectResult) -> None:
    print(f"first bad upstream commit: {result.first_bad} {result.subject}")
    if not result.series_applies:
        print(f"  the patch series did not apply at this commit ({result.not_applied[result.first_bad]} does not "
              "apply); it counts as failing, so the check itself was not run there")
    others = [f"{sha[:12]} ({patch})" for sha, patch in result.not_applied.items() if sha != result.first_bad]
    if others:
        print(f"  the patch series did not apply at {', '.join(others)} either (counted as failing)")


def bisect_main(argv: Sequence[str]) -> int:
    """``python -m harness bisect -- --platform P --check test:NAME|group:G[:M[:P]] [--good K] [--bad K]``
    or ``... --upstream GOOD..BAD [--repo PATH]``.

    Without --upstream: bisects the patch series (apply 1..k, build, check) and prints the
    first bad patch.  With it: bisects the upstream commits of ``git rev-list
    --first-parent --reverse GOOD..BAD`` (GOOD must pass, BAD must fail), each built with
    the whole series applied on top, and prints ``first bad upstream commit: <sha>
    <subject>``; a commit where the series does not apply counts as failing and the output
    says so.  Builds are kept under ``<work-dir>/bisect/<platform>/k<k>`` and
    ``<work-dir>/bisect-upstream/<platform>/<commit12>/`` and reused by later runs.
    Prints each position checked; returns 0 when a first bad patch or commit is found, 2
    for bad input or a range that cannot be bisected (the check fails at the good end or
    passes at the bad end).
    """
    from .cli import _add_common, parse_defines
    from .config import load_matrix
    from .patches import PatchError, read_series
    from .pipeline import Options, Pipeline
    from .results import Run
    from .source import SourceError
    ap = argparse.ArgumentParser(prog="python -m harness bisect",
                                 description="Find the first patch of the series, or the first upstream commit, "
                                             "that makes a check fail.")
    _add_common(ap)
    ap.add_argument("--platform", required=True, help="platform from matrix.yaml")
    ap.add_argument("--check", required=True, help="test:<ctest-name> or group:<group>[:model[:prompt]]")
    ap.add_argument("--good", type=int, default=None, help="a k known to pass (default 0: the unpatched base)")
    ap.add_argument("--bad", type=int, default=None, help="a k known to fail (default: the whole series)")
    ap.add_argument("--upstream", metavar="GOOD..BAD", default=None,
                    help="bisect the upstream commits on BAD's first-parent line after GOOD, each with the "
                         "patch series applied, instead of the patches")
    ap.add_argument("--repo", type=Path, default=None,
                    help="with --upstream: git repository holding the commits (default: the matrix's first local "
                         "source that has them, else a clone fetched from its git source)")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES (default: from nvidia-smi)")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="VAR=VALUE")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(_strip_dashdash(argv))
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    try:
        _parse_check(args.check)
        if args.upstream is None and args.repo is not None:
            raise TriageInputError("--repo needs --upstream GOOD..BAD")
        if args.upstream is not None and (args.good is not None or args.bad is not None):
            raise TriageInputError("--good/--bad pick positions in the patch series; with --upstream the range "
                                   "is GOOD..BAD")
        revs = _parse_range(args.upstream) if args.upstream is not None else None
        matrix = load_matrix(args.matrix)
        platform = matrix.platform(args.platform)
        patches = read_series(args.patches_dir)
        defines = parse_defines(args.defines)
        pipe = Pipeline(matrix, Run(Path(os.devnull), "none", create=False),
                        Options(platforms=[platform.name], cmake_defines=defines, cuda_arch=args.cuda_arch,
                                jobs=args.jobs, work_dir=args.work_dir, patches_dir=args.patches_dir), say)
        check, targets = _make_check(args.check, matrix, platform, pipe)
        if revs is not None:
            repo = upstream_repo(matrix, args.repo, revs, pipe.cache, say)
            commits = upstream_commits(repo, *revs)
            if first_parent(repo, commits[1].sha) != commits[0].sha:
                say(f"note: GOOD {commits[0].short} is not on BAD's first-parent line; the candidates are the "
                    f"commits of that line GOOD does not reach, from {commits[1].short} on")
            say(f"bisecting {len(commits) - 1} upstream commit(s) after {commits[0].short} on the first-parent line "
                f"of {commits[-1].short} in {repo}, each with the {len(patches)} patch(es) of {args.patches_dir}")
            upstream = UpstreamBisector(repo, commits, patches, platform.name, pipe.cmake_options(platform, "base"),
                                        targets, check, args.work_dir.resolve() / "bisect-upstream" / platform.name,
                                        args.jobs, say)
            found = upstream.run()
        else:
            bisector = SeriesBisector(pipe.base(), patches, platform.name, pipe.cmake_options(platform, "base"),
                                      targets, check, args.work_dir.resolve() / "bisect" / platform.name,
                                      args.jobs, say)
            result = bisector.run(args.good or 0, args.bad)
    except (TriageInputError, BisectError, PatchError, SourceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if revs is not None:
        if args.json:
            print(json.dumps(asdict(found), indent=2))
        else:
            _print_upstream(found)
        return 0
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(f"first bad patch: {result.first_bad} of {len(patches)}: {result.patch} ({result.subject})")
    return 0
