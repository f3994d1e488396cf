"""Regression triage: what changed between two result runs.

``python -m harness triage [A [B]] [--json] [--results-dir results]`` compares run A
(the older) with run B (the newer).  Without arguments B is ``results/latest`` and A
the newest earlier run that ran at least B's platforms; with one argument that run is
B.  It reports, from the two ``summary.json`` files and the run directories:

* status transitions per platform/config/step and per comparison, regressions first
  (passed -> failed/error, identical -> diverged/crashed/timeout, or a failure where
  there was none before), then fixes, then every other change;
* divergences that are new or moved (the first divergent token index changed);
* failure signatures (harness.triage.signatures) that are new, still present, or gone,
  matched by (kind, key);
* pin-ladder changes: granted bytes per platform/config summed over the
  ``*.pin-ladder.json`` files of the generations both runs have; fewer granted bytes is a
  regression, and so is any change of where a configuration's model buffers are
  (harness.triage.memory_changes), each with a signature;
* build and test times that changed by more than :data:`TIME_NOISE_FRACTION` of the
  earlier time and at least :data:`TIME_NOISE_FLOOR_S` seconds;
* speed: each configuration's within-run ratio to the reference it was measured interleaved
  with, run B's per-round ratios against run A's by the speed rule (harness.triage.speed_diff):
  a slowdown is a regression with a ``speed_regression`` signature; absolute tok/s are
  information, and a tok/s slowdown that no ratio settles is "suspect", never a regression;
  runs of different machines are "not comparable", never a regression.

A run B that is incomplete (stopped by a signal, an exception or a full disk, or with
something asked for not run) is named so and compared only on what it recorded: what A
has and B did not get to is listed as not compared, not as a regression.  When the
newest run has no summary.json at all, triage says so instead of comparing older runs.

A record of A that B has not is "not run in B", apart from the regressions: B may be
narrower on purpose (``--model``, fewer stages or platforms).  ``--strict`` counts such
records (and those B was interrupted in) as regressions, for a gate that wants B to cover A.

Exit status: 1 when there is any regression (something that ran in both runs got worse;
with ``--strict`` also something of A that B did not run), 0 when there is none, 2 for
bad input.

Bisecting the patch series or upstream commits is harness.bisect.

Longer than 400 lines: one comparison of two runs whose parts (statuses, divergences, signatures, pin
ladders, times, speed) all feed one report and one exit status; the parts with rules of their own are
modules already (memory_changes.py, speed_diff.py, speed_ratios.py, speed_confirm.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from ..common.errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASSED
from ..common.locks import RunLock
from ..common.statistics import OF_MEDIANS, WITHIN_ROUND
from ..common.words import size_text
from ..record.layout import RunLayout
from ..record.records import ComparisonRecord, RecordError, StepRecord
from ..common.statuses import (COMPARISON, DIVERGED, GENERATION_FAILURES, KILLED, STEP, STEP_ERROR, STEP_INTERRUPTED,
                               STEP_PASSED)
from ..record.summary_md import cache_text, describe_cached, shown_as_reused
from ..record.expectations import EXPECTATIONS_STEP
from ..record.loads import PinLadder, read_pin_ladder
from ..record.summary import RunSummary, read_run
from ..record.verdict import RowVerdict, comparison_verdict, step_verdict
from . import memory_changes
from .signatures import load_signatures
from ..matrix.config import load_matrix
from ..stages.table import step_spec
from .upstream_diff import upstream_test_transitions
from .speed_diff import SpeedChange, compare_speed
from .speed_ratios import rule_factors, same_mode_upstream
from .run_choice import SAME_RUN_WARNING, TriageInputError, incomplete_reasons, previous_run, resolve_run

#: Statuses that count as a failure or a success (declared in harness.common.statuses).
BAD_STEP = STEP.failures
GOOD = STEP.successes | COMPARISON.successes

#: A build or test time change is reported when it exceeds both this fraction of the
#: earlier time and TIME_NOISE_FLOOR_S.  The numbers are the project's rule for this
#: report (issue 5): repeated builds and ctest runs of an unchanged tree on the shared
#: 2-core machines and CI runners vary by up to about a fifth (ccache hits, other jobs on
#: the host), and steps of a few seconds are dominated by process start-up, so changes
#: below 5 s say nothing.
TIME_NOISE_FRACTION = 0.20
TIME_NOISE_FLOOR_S = 5.0

# --------------------------------------------------------------------------- report records


@dataclass
class Transition:
    """A status change of one step or comparison between run A and run B.

    ``category`` is regression, fix or other; ``kind`` is step, comparison, kl (a mean KL
    divergence past its threshold), placement, pinning, speed (a slowdown between the runs) or upstream-test (a test
    of upstream's suite whose pair of outcomes changed class, harness.triage.upstream_diff); ``where``
    holds the identifying fields (platform, config, step / group, model, prompt,
    reference, candidate / platform, config, model, metric); ``before``/``after`` are statuses or ``absent``; ``detail``
    is B's detail (A's when the record is gone); ``signature`` the failure signature
    ({kind, key, summary}) of the failing side, with ``signature_known`` telling whether
    run A already had that key; ``blocked_by`` names a failed build the step waited on;
    ``cached`` says where B's record came from when the result cache supplied it
    (``cached: <run-id>``, docs/cache.md; "" when B ran it).
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
    cached: str = ""


@dataclass
class DivergenceChange:
    """A divergence that is ``new`` in B or ``moved`` (first divergent token index changed).

    Indices count generated tokens from 0; ``before_index`` is None for a new one and
    ``moved_by`` is ``after_index - before_index`` in generated tokens for a moved one.
    ``reference_piece``/``candidate_piece`` are B's tokens at the divergence and
    ``reference_margin``/``candidate_margin`` their rows' top-1 minus top-2 logits
    (nats).  ``near_tie`` is B's flag (None for records without one).  ``cached``: where B's
    generations came from when the result cache supplied them ("" when B generated them).
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
    cached: str = ""


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
    ladder summary lines (see harness.record.gpu.ladder_totals); ``generations`` counts them.
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


#: The verdicts of a triage report (:meth:`TriageReport.to_json`): a regression, no regression but run B was killed
#: mid-way, or neither.
TRIAGE_REGRESSED, TRIAGE_INCOMPLETE, TRIAGE_CLEAN = "regressed", "incomplete", "clean"


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
    #: why run B is incomplete ([] when it is complete); B is compared only on what it recorded, and
    #: ``not_compared`` lists what A has that B did not run or was stopped in (a regression only when ``strict``)
    b_incomplete: list[str] = field(default_factory=list)
    #: B's harness process died before its command ended (harness.common.statuses.KILLED): what it recorded stops
    #: where it died, not where it was stopped, so B is never called clean
    b_killed: bool = False
    #: A and B are one run (named twice, or B's previous run resolved to itself): nothing can have changed
    same_run: bool = False
    not_compared: list[str] = field(default_factory=list)
    strict: bool = False
    #: speed of the configurations both runs measured (same machine only), and why other pairs were not compared
    speed_changes: list[SpeedChange] = field(default_factory=list)
    speed_not_comparable: list[str] = field(default_factory=list)
    #: B's result cache counts in words (harness.record.summary_md.describe_cache), "" without any
    b_cache: str = ""
    #: B's own verdict as its summary.json records it (passed, failed, incomplete, ...): a run can fail on what
    #: failed in A too, with no regression between them
    b_overall: str = ""

    @property
    def regressions(self) -> list[Transition]:
        """Transitions whose category is regression."""
        return [t for t in self.transitions if t.category == "regression"]

    @property
    def speed_suspects(self) -> list[SpeedChange]:
        """Speed changes whose tok/s fell past the factor with no within-run ratio to settle them: never
        regressions; ``triage --confirm`` re-measures them (harness.triage.speed_diff)."""
        return [c for c in self.speed_changes if c.suspect]

    @property
    def fixes(self) -> list[Transition]:
        """Transitions whose category is fix."""
        return [t for t in self.transitions if t.category == "fix"]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data, plus ``verdict`` (regressed|incomplete|clean; incomplete: no regression,
        and B was killed mid-way) and counts."""
        data = asdict(self)
        data["verdict"] = TRIAGE_REGRESSED if self.regressions else (TRIAGE_INCOMPLETE if self.b_killed else TRIAGE_CLEAN)
        data["counts"] = {"regressions": len(self.regressions), "fixes": len(self.fixes),
                          "other_changes": len(self.transitions) - len(self.regressions) - len(self.fixes),
                          "speed_suspects": len(self.speed_suspects)}
        return data


# --------------------------------------------------------------------------- diffing


def _category(fails_before: bool, fails_after: bool, passes_after: bool) -> str:
    """A record that fails in B and did not in A is a regression; one that failed in A and passes in B a fix;
    any other change of status or verdict is neither."""
    if fails_after and not fails_before:
        return "regression"
    if fails_before and passes_after:
        return "fix"
    return "other"


def _blocked_by(platform: str, step: StepRecord | None) -> str:
    builds = step.blocked_by() if step else []
    return f"{platform} {', '.join(builds)} build" if builds else ""


def _sig_index(entries: list[dict]) -> dict[tuple, dict]:
    index: dict[tuple, dict] = {}
    for e in entries:
        key: tuple
        if e.get("step") == "compare":
            key = (e.get("platform"), "compare", e.get("group"), e.get("model"), e.get("prompt"), e.get("config"))
        else:
            key = (e.get("platform"), e.get("config"), e.get("step"))
        index[key] = e["signature"]
    return index


def _short(sig: dict | None) -> dict[str, str] | None:
    return None if sig is None else {"kind": sig["kind"], "key": sig["key"], "summary": sig["summary"]}


def _unfinished(after: str) -> bool:
    """True when B's side of a record says nothing: B did not run it (absent) or was stopped during it."""
    return after in ("absent", STEP_INTERRUPTED)


def _not_run(before: str, after: str) -> str:
    """The parenthesis of a not-compared record: ``(identical in A; not run in B)``."""
    return f"({before} in A; {'not run' if after == 'absent' else after} in B)"


#: The records :func:`_changes` compares: steps or comparisons, both sides of one kind.
Record = TypeVar("Record", StepRecord, ComparisonRecord)


def _changes(records_a: Mapping[tuple, Record], records_b: Mapping[tuple, Record], verdict: Callable[[Record], RowVerdict],
             what: Callable[[tuple], str], not_compared: list[str] | None,
             strict: bool) -> Iterator[tuple[tuple, Record | None, Record | None, str, str, str | None]]:
    """``(key, a, b, before, after, category)`` for each key of either run's records (steps or comparisons, by key),
    in key order: the record of each side (None where absent), its status (``absent`` where absent) and the
    category of the change (:func:`_category` over each side's row ``verdict``, harness.record.verdict; None for
    the same status and verdict on both sides).  The same status judged otherwise (a comparison whose group's
    ``expect`` changed) is a change whose statuses carry their verdicts.  A record that B did not finish
    (:func:`_unfinished`) is no change but a line of ``not_compared`` (``what`` names the record) unless
    ``strict``, where it is a regression."""
    for key in sorted(set(records_a) | set(records_b)):
        a, b = records_a.get(key), records_b.get(key)
        before = a.status if a else "absent"
        after = b.status if b else "absent"
        va, vb = (verdict(a) if a else None), (verdict(b) if b else None)
        fails_before, fails_after = bool(va and va.fails), bool(vb and vb.fails)
        if before == after and fails_before == fails_after:
            yield key, a, b, before, after, None
            continue
        if _unfinished(after) and not strict:
            if not_compared is not None and a is not None:
                not_compared.append(f"{what(key)} {_not_run(before, after)}")
            continue
        category = "regression" if _unfinished(after) else \
            _category(fails_before, fails_after, bool(vb and vb.passes))
        if before == after and va and vb:
            before, after = f"{before} ({va.text()})", f"{after} ({vb.text()})"
        yield key, a, b, before, after, category


def _step_transitions(sa: RunSummary, sb: RunSummary, sig_a: dict, sig_b: dict, known: set,
                      not_compared: list[str] | None = None, strict: bool = False) -> list[Transition]:
    out = []
    for key, a, b, before, after, category in _changes(sa.steps_by_key(), sb.steps_by_key(), step_verdict,
                                                       lambda k: f"{k[0]} {k[1]} {k[2]}", not_compared, strict):
        if category is None:
            sa_sig, sb_sig = sig_a.get(key), sig_b.get(key)
            if before in BAD_STEP and sa_sig and sb_sig and (sa_sig["kind"], sa_sig["key"]) != (sb_sig["kind"], sb_sig["key"]):
                out.append(Transition("other", "step", key[0], f"{key[1]} {key[2]}", before, after,
                                      {"platform": key[0], "config": key[1], "step": key[2]},
                                      f"signature changed from {sa_sig['summary']}", _short(sb_sig),
                                      (sb_sig["kind"], sb_sig["key"]) in known))
            continue
        if category == "regression" and _model_unmade(b):
            category = "other"  # the harness could not make its input: nothing of the fork was run, nor got worse
        failing_side = sig_a.get(key) if category == "fix" else sig_b.get(key)
        either = b or a
        detail = either.detail if either else ""
        sig_known = None
        if failing_side and category != "fix":
            sig_known = (failing_side["kind"], failing_side["key"]) in known
        out.append(Transition(category, "step", key[0], f"{key[1]} {key[2]}", before, after,
                              {"platform": key[0], "config": key[1], "step": key[2]}, detail,
                              _short(failing_side), sig_known, _blocked_by(key[0], b), _step_cached(b)))
    return out


def _model_unmade(step: StepRecord | None) -> bool:
    """True for a step that errored only because a model could not be made (every failure fact of kind
    ``model``, harness.record.records.FAILURE_KINDS): a problem of the harness's inputs, never a regression."""
    facts = step.failures if step else []
    return step is not None and step.status == STEP_ERROR and bool(facts) and all(f.kind == "model" for f in facts)


def _step_cached(step: StepRecord | None) -> str:
    """``cached: <run-id>`` (``reused`` for a test step) when the result cache supplied ``step``, else ""."""
    if not step or not step.cached:
        return ""
    return f"{'reused' if shown_as_reused(step.step) else 'cached'}: {step.cached}"


def _cmp_what(key: tuple) -> str:
    return f"{key[1]} {key[2]}/{key[3]}: {key[5]} vs {key[4]}"


def _comparison_transitions(sa: RunSummary, sb: RunSummary, sig_a: dict, sig_b: dict, known: set,
                            not_compared: list[str] | None = None, strict: bool = False) -> list[Transition]:
    out = []
    for key, a, b, before, after, category in _changes(sa.comparisons_by_key(), sb.comparisons_by_key(), comparison_verdict,
                                                       lambda k: f"{k[0]} {_cmp_what(k)}", not_compared, strict):
        if category is None:
            continue
        sigs, side = (sig_a, a) if category == "fix" else (sig_b, b)
        status = side.status if side else None
        platform, _, model, prompt, reference, candidate = key
        sig = None
        if status == DIVERGED:
            sig = sigs.get((platform, "compare", key[1], model, prompt, candidate))
        elif status in GENERATION_FAILURES:  # the generate step of the side that failed holds the signature
            sig = sigs.get((platform, candidate, "generate")) or sigs.get((platform, reference, "generate"))
        sig_known = None
        if sig and category != "fix":
            sig_known = (sig["kind"], sig["key"]) in known
        where = {"platform": platform, "group": key[1], "model": model, "prompt": prompt,
                 "reference": reference, "candidate": candidate}
        shown = b or a
        out.append(Transition(category, "comparison", platform, _cmp_what(key), before, after, where,
                              shown.detail if shown else "", _short(sig), sig_known,
                              cached=describe_cached(b.cached) if b and b.cached else ""))
    return out


def _divergence_changes(sa: RunSummary, sb: RunSummary) -> list[DivergenceChange]:
    ca = sa.comparisons_by_key()
    out = []
    for c in sb.comparisons:
        div = c.first_divergence
        if c.status != DIVERGED:
            continue
        key = c.key()
        old = ca.get(key)
        old_div = old.first_divergence if old and old.status == DIVERGED else None
        index = div.get("index") if div else None
        ref = (div or {}).get("reference") or {}
        cand = (div or {}).get("candidate") or {}
        if old is None or old.status != DIVERGED:
            change = "new"
        elif (old_div or {}).get("index") != index:
            change = "moved"
        else:
            continue
        before = (old_div or {}).get("index") if change == "moved" else None
        out.append(DivergenceChange(change, key[0], key[1], key[2], key[3], key[4], key[5], before, index,
                                    ref.get("piece") if div else None, cand.get("piece") if div else None,
                                    (div or {}).get("near_tie"), ref.get("margin"), cand.get("margin"),
                                    index - before if isinstance(index, int) and isinstance(before, int) else None,
                                    describe_cached(c.cached) if c.cached else ""))
    return out


def _kl_mean(c: ComparisonRecord | None) -> float | None:
    """The comparison's mean KL divergence (nats), None when it has none."""
    return (c.kl or {}).get("mean") if c else None


def _kl_transitions(sa: RunSummary, sb: RunSummary) -> list[Transition]:
    """A comparison whose mean KL divergence rose above its group's ``kl_mean_max`` is a regression, even
    when its greedy tokens stayed identical; one that fell back below it is a fix."""
    ca = sa.comparisons_by_key()
    out = []
    for c in sb.comparisons:
        limit = c.kl_mean_max
        after = _kl_mean(c)
        key = c.key()
        before = _kl_mean(ca.get(key))
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
                              f"{limit:g} nats (status {c.status})"))
    return out


def _one_per_comparison(comparisons: list[Transition], kl: list[Transition]) -> list[Transition]:
    """``comparisons`` and ``kl`` transitions with each comparison counted once: a KL transition of a comparison
    that also changed status the same way (its tokens diverged and its mean KL rose past the limit) is folded
    into that comparison's transition, its detail appended, instead of being a second regression (8 comparisons
    gave "12 regression(s)" before, issue 60)."""
    by_key = {(t.platform, t.what, t.category): t for t in comparisons}
    out = list(comparisons)
    for t in kl:
        same = by_key.get((t.platform, t.what, t.category))
        if same is None:
            out.append(t)
        else:
            same.detail = f"{same.detail}; {t.detail}" if same.detail else t.detail
    return out


def _memory_transitions(a: Path, b: Path, pin_changes: list[PinChange], sa: RunSummary,
                        sb: RunSummary) -> list[Transition]:
    """Regressions that no status shows: model buffers that moved (any load both runs have), expert layers the
    runtime probe finds in another buffer type, fewer page-locked bytes by the driver's count, and fewer
    page-locked bytes granted by the pin lines (harness.triage.memory_changes); more is not a transition.
    A move is a fix instead where it made the configuration's ``expectations`` step go from failed to
    passed (the buffers went back where they belong)."""
    def expectations(summary: RunSummary, platform: str, config: str) -> str:
        return summary.step_status(platform, config, EXPECTATIONS_STEP) or "absent"

    out = []
    for c in memory_changes.placement_changes(a, b):
        where = {"platform": c["platform"], "config": c["config"], "model": c["model"], "load": c["load"]}
        back = expectations(sa, c["platform"], c["config"]) in BAD_STEP and \
            expectations(sb, c["platform"], c["config"]) == STEP_PASSED
        out.append(Transition("fix" if back else "regression", "placement", c["platform"],
                              f"{c['config']} {c['model']}: placement",
                              memory_changes.describe_buffers(c["before"]), memory_changes.describe_buffers(c["after"]),
                              where, f"model buffers of load {c['load']} changed", None if back else c["signature"]))
    for c in memory_changes.probe_changes(a, b):
        out.append(Transition("regression", "placement" if c["what"] == "layers" else "pinning", c["platform"],
                              f"{c['config']} {c['model']}: probed {c['what']}", c["before"], c["after"],
                              {"platform": c["platform"], "config": c["config"], "model": c["model"]},
                              "the runtime probe of the engine load", c["signature"]))
    for p in pin_changes:
        if p.after_granted >= p.before_granted:
            continue
        sig = memory_changes.pinned_drop_signature(p.platform, p.config, p.before_granted, p.after_granted,
                                                   p.after_requested)
        out.append(Transition("regression", "pinning", p.platform, f"{p.config}: pinned bytes",
                              f"{size_text(p.before_granted)} granted", f"{size_text(p.after_granted)} granted",
                              {"platform": p.platform, "config": p.config},
                              f"over {p.generations} generation(s), {size_text(p.after_requested)} requested", sig))
    return out


def _b_recorded(sb: RunSummary) -> Callable[[dict], bool]:
    """Whether run B holds a finished record where a signature entry (harness.triage.signatures) of run A was
    found: the same step, ended with a status that proves something (not ``interrupted``), or the same
    comparison.  A signature of A is gone only from a record B has: what B never ran is not compared."""
    steps = {(s.platform, s.config, s.step) for s in sb.steps if s.status not in STEP.unproven}
    comparisons = {(c.platform, c.candidate, c.group, c.model, c.prompt) for c in sb.comparisons}

    def has(e: dict) -> bool:
        if e.get("step") == "compare":
            return (e.get("platform"), e.get("config"), e.get("group"), e.get("model"), e.get("prompt")) in comparisons
        return (e.get("platform"), e.get("config"), e.get("step")) in steps
    return has


def _signature_sets(entries_a: list[dict], entries_b: list[dict],
                    b_has: Callable[[dict], bool] = lambda _e: True) -> tuple[list, list, list]:
    """(new, known, gone) signatures of run B against run A; ``gone`` counts only A's entries at a record
    ``b_has`` (:func:`_b_recorded`)."""
    def group(entries: list[dict]) -> dict[tuple, SignatureSeen]:
        seen: dict[tuple, SignatureSeen] = {}
        for e in entries:
            for sig in (e["signature"], *e.get("other_signatures", [])):
                item = seen.setdefault((sig["kind"], sig["key"]),
                                       SignatureSeen(sig["kind"], sig["key"], sig["summary"]))
                where = f"{e.get('platform')} {e.get('config')} {e.get('step')}"
                if e.get("step") == "compare":
                    where += f" {e.get('group')}/{e.get('model')}/{e.get('prompt')}"
                item.where.append(where)
        return seen

    ga, gb = group(entries_a), group(entries_b)
    ga_had = group([e for e in entries_a if b_has(e)])
    new = [gb[k] for k in sorted(set(gb) - set(ga))]
    known = [gb[k] for k in sorted(set(gb) & set(ga))]
    gone = [ga_had[k] for k in sorted(set(ga_had) - set(gb))]
    return new, known, gone


def pin_totals(run_dir: Path) -> dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]]:
    """Per (platform, config), per generation (model, "<prompt>.r<k>"), the pin-ladder totals.

    Every generation with a ``.stderr`` file is listed; one without a pin-ladder.json
    had no ladder lines and gets zero totals.  Totals come from harness.record.gpu.ladder_totals
    (bytes requested/granted, allocations, segments).
    """
    out: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    layout = RunLayout(run_dir)
    for platform, config, model, stem, _ in layout.all_generation_files(".stderr"):
        try:
            ladder = read_pin_ladder(layout.load_file(platform, config, model, stem, "pin_ladder"))
        except FileNotFoundError:
            ladder = PinLadder()
        out.setdefault((platform, config), {})[(model, stem)] = ladder.totals()
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


def _timing_changes(sa: RunSummary, sb: RunSummary) -> list[TimingChange]:
    steps_a = sa.steps_by_key()
    out = []
    for s in sb.steps:
        key = (s.platform, s.config, s.step)
        a = steps_a.get(key)
        spec = step_spec(key[2])
        if not a or spec is None or not spec.timed:
            continue  # only the steps whose stage times their work (a build, a test run) have meaningful times
        if a.status != STEP_PASSED or s.status != STEP_PASSED:
            continue  # a failed step stops early; its time says nothing
        if any(x.up_to_date or x.cached for x in (a, s)):
            continue  # an up-to-date build did not build; a reused test step ran nothing
        before, after = float(a.seconds or 0), float(s.seconds or 0)
        threshold = time_threshold(before)
        if abs(after - before) > threshold:
            out.append(TimingChange(key[0], key[1], key[2], before, after, round(threshold, 1)))
    return out


def _speed_transitions(changes: list[SpeedChange]) -> list[Transition]:
    """A regression, with its ``speed_regression`` signature, per speed change whose within-run ratio fell by
    the rule (harness.triage.speed_diff); suspects and tok/s changes are no transitions."""
    out = []
    for c in changes:
        if not c.regressed:
            continue
        key = f"{c.config} {c.model} {c.metric}"
        summary = (f"speed {key}: {c.after_vs_reference:.3g}x {c.reference} in the run against "
                   f"{c.before_vs_reference:.3g}x in the earlier run (each the {WITHIN_ROUND}; "
                   f"{c.vs_reference_ratio:.2f}x, fails below "
                   f"{c.threshold:.3g}x; Mann-Whitney p {c.vs_reference_p:.2g} <= {c.p_max:g}); "
                   f"{c.after_median:.1f} against {c.before_median:.1f} tok/s")
        out.append(Transition("regression", "speed", c.platform, f"{key} tok/s", f"{c.before_median:.1f} tok/s",
                              f"{c.after_median:.1f} tok/s",
                              {"platform": c.platform, "config": c.config, "model": c.model, "metric": c.metric},
                              summary, {"kind": "speed_regression", "key": f"speed {key}", "summary": summary}))
    return out


def _order(t: Transition) -> tuple:
    return ({"regression": 0, "fix": 1}.get(t.category, 2), t.platform, t.kind != "step", t.what)


def diff_runs(a: Path, b: Path, strict: bool = False, upstream: Mapping[str, str] | None = None,
              factors: Mapping[tuple[str, str, str], float] | None = None) -> TriageReport:
    """Compare run directory ``a`` (earlier) with ``b`` (later) and return what changed.

    ``upstream``: fork configuration -> upstream's configuration in its mode, the preferred reference of
    its speed ratios (harness.triage.speed_ratios.same_mode_upstream; None: every reference counts as
    fork-only, harness.triage.speed_diff).  ``factors``: the speed rules' factors by (candidate, metric,
    reference) (speed_ratios.rule_factors; None: those the runs' records were judged with).

    Reads both summary.json files, their signatures (signatures.json, else computed from
    the logs without writing), and pin-ladder files.  A record of A that B has not
    (B was narrower: fewer models, stages or platforms; or stopped before it) or that B
    was interrupted in goes to ``not_compared``, never to the regressions, unless
    ``strict``: then it is a regression.  Raises TriageInputError when either
    directory has no readable summary.json.
    """
    try:
        sa, sb = read_run(a), read_run(b)
    except (FileNotFoundError, RecordError) as exc:
        raise TriageInputError(str(exc)) from None
    entries_a, entries_b = load_signatures(a), load_signatures(b)
    sig_a, sig_b = _sig_index(entries_a), _sig_index(entries_b)
    known = {(sig["kind"], sig["key"]) for e in entries_a for sig in (e["signature"], *e.get("other_signatures", []))}
    report = TriageReport(a=sa.run_id, b=sb.run_id, a_dir=str(a), b_dir=str(b),
                          platforms=sorted(sa.covered_platforms() | sb.covered_platforms()))
    report.b_incomplete = incomplete_reasons(sb)
    report.b_killed = sb.killed
    report.same_run = a.resolve() == b.resolve()
    report.b_cache = cache_text(sb.cache, sb.steps, RunLayout(b))
    report.b_overall = sb.overall
    owner = RunLock.live_owner(b)
    if owner is not None:
        report.b_incomplete.insert(0, f"still running (pid {owner})")
    report.strict = strict
    report.pin_changes = _pin_changes(a, b)
    report.speed_changes, report.speed_not_comparable = compare_speed(a, b, upstream, factors)
    report.transitions = sorted(_step_transitions(sa, sb, sig_a, sig_b, known, report.not_compared, strict)
                                + _one_per_comparison(
                                    _comparison_transitions(sa, sb, sig_a, sig_b, known, report.not_compared, strict),
                                    _kl_transitions(sa, sb))
                                + _memory_transitions(a, b, report.pin_changes, sa, sb)
                                + _speed_transitions(report.speed_changes)
                                + upstream_test_transitions(a, b, report.platforms, Transition), key=_order)
    report.divergences = _divergence_changes(sa, sb)
    report.signatures_new, report.signatures_known, report.signatures_gone = _signature_sets(entries_a, entries_b, _b_recorded(sb))
    report.timing_changes = _timing_changes(sa, sb)
    return report


def diff_by_matrix(a: Path, b: Path, matrix_path: Path | None, strict: bool = False) -> TriageReport:
    """:func:`diff_runs` with the speed references and rule factors of the matrix at ``matrix_path``
    (harness.triage.speed_ratios), as ``triage`` judges; without a matrix file, those the runs recorded.
    Raises TriageInputError as diff_runs, and harness.matrix.config's errors for a matrix that cannot be read."""
    matrix = load_matrix(matrix_path) if matrix_path is not None and matrix_path.is_file() else None
    upstream = same_mode_upstream(matrix) if matrix else None
    return diff_runs(a, b, strict, upstream, rule_factors(matrix) if matrix else None)


# --------------------------------------------------------------------------- text output


def _transition_line(t: Transition) -> str:
    line = f"  {t.platform}  {t.what}: {t.before} -> {t.after}"
    if t.signature:
        state = "" if t.signature_known is None else (" (known)" if t.signature_known else " (new signature)")
        line += f"\n      [{t.signature['kind']}] {t.signature['summary']}{state}"
    elif t.detail and t.after not in GOOD:
        line += f"\n      {t.detail[:200]}"
    if t.blocked_by:
        line += f"\n      blocked by: {t.blocked_by}"
    if t.cached:
        line += f"\n      {t.cached}"
    return line


def format_report(report: TriageReport) -> str:
    """The report as plain text for a terminal: sections in order of importance, then the verdict."""
    out = [f"triage {report.a} -> {report.b}  (platforms: {', '.join(report.platforms) or 'none'})"]
    if report.b_overall:
        out.append(f"run {report.b} itself: {report.b_overall}")
    out.append("")
    if report.same_run:
        out += [f"{SAME_RUN_WARNING.format(run=report.b)}", ""]
    if report.b_cache:
        out += [f"result cache in {report.b}: {report.b_cache}", ""]
    if report.b_incomplete:
        out.append(f"RUN {report.b} IS INCOMPLETE: compared only on what it recorded; "
                   f"{len(report.not_compared)} record(s) of {report.a} it did not get to are not compared "
                   "(and are not regressions)")
        out += [f"  {r}" for r in report.b_incomplete]
        out += [f"  not compared: {r}" for r in report.not_compared]
        out.append("")
    sections = [("REGRESSIONS", report.regressions), ("FIXES", report.fixes),
                ("OTHER CHANGES", [t for t in report.transitions if t.category == "other"])]
    for title, items in sections:
        out.append(f"{title} ({len(items)})")
        out += [_transition_line(t) for t in items]
        out.append("")
    if report.not_compared and not report.b_incomplete:  # after the changes: a narrower run B lists many
        out.append(f"NOT RUN IN {report.b} ({len(report.not_compared)}): records of {report.a} that {report.b} "
                   "did not ask for, not compared (and not regressions; --strict counts them)")
        out += [f"  not compared: {r}" for r in report.not_compared]
        out.append("")
    hard = [d for d in report.divergences if not d.near_tie]
    near = [d for d in report.divergences if d.near_tie]
    divergence_lists: tuple[tuple[str, list[DivergenceChange]], ...] = (("HARD DIVERGENCES, NEW OR MOVED", hard),
                         ("NEAR-TIE DIVERGENCES, NEW OR MOVED (the reference's top two logits almost equal)", near))
    for title, changes in divergence_lists:
        if not changes:
            continue
        out.append(f"{title} ({len(changes)})")
        for d in changes:
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
            if d.cached:
                out.append(f"      {d.cached}")
        out.append("")
    out.append(f"SIGNATURES: {len(report.signatures_new)} new, {len(report.signatures_known)} known, "
               f"{len(report.signatures_gone)} gone")
    signature_lists: tuple[tuple[str, list[SignatureSeen]], ...] = (
        ("new", report.signatures_new), ("known", report.signatures_known), ("gone", report.signatures_gone))
    for label, signatures in signature_lists:
        for s in signatures:
            out.append(f"  {label:5}  [{s.kind}] {s.summary}  ({'; '.join(s.where)})")
    out.append("")
    if report.pin_changes:
        out.append(f"PIN LADDER, GRANTED BYTES CHANGED ({len(report.pin_changes)})")
        for p in report.pin_changes:
            out.append(f"  {p.platform}  {p.config}: granted {size_text(p.before_granted)} -> {size_text(p.after_granted)} "
                       f"of {size_text(p.after_requested)} requested, {p.before_allocations} -> {p.after_allocations} "
                       f"allocations over {p.generations} generation(s)")
        out.append("")
    if report.speed_changes or report.speed_not_comparable:
        out.append(f"SPEED ({len(report.speed_changes)} measurement(s) in both runs; a regression is a within-run "
                   "ratio that fell past the factor and at the Mann-Whitney p; tok/s are information)")
        out += [f"  not comparable: {line}" for line in report.speed_not_comparable]
        out += [_speed_line(c) for c in report.speed_changes]
        out.append("")
    if report.timing_changes:
        out.append(f"TIMES BEYOND NOISE ({len(report.timing_changes)}; threshold max(20 %, 5 s))")
        for c in report.timing_changes:
            out.append(f"  {c.platform}  {c.config} {c.step}: {c.before_s:.1f} s -> {c.after_s:.1f} s "
                       f"(threshold {c.threshold_s:.1f} s)")
        out.append("")
    n, suspects = len(report.regressions), len(report.speed_suspects)
    if n:
        out.append(f"verdict: {n} regression(s)")
    elif report.b_killed:
        out.append(f"verdict: incomplete, not clean: no regression in what {report.b} recorded, but its harness "
                   f"process was killed mid-way ({KILLED}); run it again")
    else:
        out.append("verdict: no regressions")
    if suspects:
        out[-1] += (f"; {suspects} suspect speed change(s), not regressions: `python -m harness triage "
                    f"{report.a} {report.b} --confirm` re-measures both builds interleaved")
    return "\n".join(out)


def _speed_line(c: SpeedChange) -> str:
    """One speed change: tok/s in A and B, the within-run ratio to its reference in A and B, the verdict."""
    line = (f"  {c.platform}  {c.config} {c.model} {c.metric}: {c.before_median:.1f} -> {c.after_median:.1f} tok/s "
            f"({OF_MEDIANS} {c.ratio:.2f}x, p {c.p_value:.2g})")
    if c.reference:
        line += (f"; vs {c.reference} ({c.reference_kind}), {WITHIN_ROUND}: {c.before_vs_reference:.3g}x -> "
                 f"{c.after_vs_reference:.3g}x ({c.vs_reference_ratio:.2f}x, p {c.vs_reference_p:.2g})")
    else:
        line += "; no interleaved reference in both runs"
    if c.verdict != "unchanged":
        line += f"  {c.verdict.upper()}\n      {c.why}"
    return line


def main(argv: Sequence[str]) -> int:
    """``triage`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("triage", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness triage [A [B]] [--json] [--results-dir DIR]``; returns the exit status.

    0: nothing that ran in both runs got worse; 1: at least one regression (with ``--strict``, also a
    record of A that B did not run).  Raises TriageInputError (exit code 2
    through harness.cli) for an unknown run, nothing to compare with or an unreadable summary.
    """
    if len(args.runs) > 2:
        raise TriageInputError(f"expected at most two runs, got {len(args.runs)}: {' '.join(args.runs)}")
    if len(args.runs) == 2:
        a, b = (resolve_run(r, args.results_dir) for r in args.runs)
    else:
        b = resolve_run(args.runs[0] if args.runs else "latest", args.results_dir)
        a = previous_run(b, args.results_dir)
    report = diff_by_matrix(a, b, args.matrix, args.strict)
    if report.same_run:
        print(SAME_RUN_WARNING.format(run=report.b), file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_report(report))
    confirmed = _confirm(args, a, b, report) if args.confirm and report.speed_suspects else []
    if report.regressions or any(c.confirmed for c in confirmed):
        return EXIT_FAILED
    return EXIT_INCOMPLETE if report.b_killed else EXIT_PASSED


def _confirm(args: argparse.Namespace, a: Path, b: Path, report: TriageReport) -> list:
    """``--confirm``: re-measure the report's suspects (harness.triage.speed_confirm) and print each verdict;
    returns the Confirmations.  Raises ConfirmError (exit 2) where a build or the matrix is missing."""
    # imported here: it starts engines, which no other triage needs
    from ..stages.building.source import cache_dir, obtain_base
    from ..matrix.model_sources.registry import ModelStore
    from . import speed_confirm

    if not args.matrix.is_file():
        raise speed_confirm.ConfirmError(f"{args.matrix}: no such matrix file; --confirm needs it for the "
                                         "configurations' arguments and models")
    matrix = load_matrix(args.matrix)
    work = args.work_dir.resolve()
    cache = cache_dir()
    # a model is made as the pipeline makes it: a generated one needs the pinned base tree (its vocabulary)
    models = ModelStore(matrix.models, cache, lambda: obtain_base(matrix, cache).path, matrix.path)
    engine = speed_confirm.engines_from_builds(matrix, a, b, [w.resolve() for w in args.a_work_dir] or [work],
                                               [work], models.path)
    out = work / "confirm" / f"{report.a}--{report.b}"
    print(f"\nCONFIRM ({len(report.speed_suspects)} suspect(s); both builds interleaved here, logs in {out})")
    found = speed_confirm.confirm(report.speed_suspects, engine, out, matrix.speed.repeats, matrix.speed.factor)
    for c in found:
        print(speed_confirm.describe(c))
    return found
