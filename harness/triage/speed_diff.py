"""Speed between two runs: within-run ratios compared across runs, absolute tok/s as information.

For every platform that has a ``<platform>/speed/bench.json`` (harness.stages.speed.speed) in both
runs, every configuration measured in both with the same model, tokens per request and rounds is
judged per metric (pp, tg), with run B's ``defaults.speed`` factor and p; where a speed rule pairs the
configuration with the reference of its ratio, by that rule's factor when it is wider (the matrix's rules
when triage has the matrix, else the ones either record was judged with; speed_ratios.rule_factors):

* its **ratio** to the reference it was measured interleaved with (per-round ratios,
  harness.triage.speed_ratios), run B's against run A's, by the slowdown rule of
  harness.common.statistics.  Samples inside one run share the machine's state at that time,
  and a rank test across two runs takes a drift of the machine for a slowdown (issue 29: the
  same series 0.85x in pp between two runs, upstream's unchanged build 0.76x); a ratio cancels
  what moved both sides of a round.
* its **tok/s** (the medians and a rank test of run B's samples against run A's): information,
  and the evidence for a suspect.

The verdict (:data:`REGRESSION`, :data:`SUSPECT` or :data:`UNCHANGED`) by the reference's kind:

* upstream's build in the same mode (``fork`` against ``base``, ``cuda-pin-all`` against
  ``cuda-base-host-experts``): a regression when the ratio counts by the rule; the tok/s is
  information, since a change that upstream's build shares is the machine's;
* a fork-only reference that a speed rule names for that metric (``cuda-nopin`` for
  ``cuda-pin-all`` pp): a regression when the ratio counts by the rule **and** the
  configuration's own tok/s median fell past the factor.  Between clean H200 runs the
  pinned/pageable ratio fell 0.75x (p 0.004) with the pinned tok/s unchanged (1.00x) because the
  pageable reference ran 1.33x faster: a ratio that falls only because its reference got faster
  is no slowdown of the configuration.  A tok/s that fell past the factor without the ratio
  counting is **suspect**: a slowdown of both sides does not show in the ratio;
* no reference measured interleaved in both runs: never a regression; a tok/s median past the
  factor is **suspect**.

``python -m harness triage --confirm`` settles suspects by measuring both builds interleaved
(harness.triage.speed_confirm).  Speeds are compared only when both bench records carry the
same machine fingerprint (harness.kinds.machine.machine_fingerprint: CPU model and core
count, GPUs and driver, visible GPUs, CUDA driver and toolkit); any other pair is "not
comparable", never a regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..matrix.config import DEFAULT_SPEED
from ..record.bench import METRICS, bench_platforms, instrument, read_bench
from .speed_spread import Key, Spread, committed
from .speed_ratios import FORK_ONLY, UPSTREAM, Reference, choose_reference, compare_ratios, interleaved, \
    recorded_rule_factors, round_ratios, rule_references
from ..common.statistics import MIN_SAMPLES, SpeedVerdict, judge, within_round_ratio

#: The verdicts of a speed change: a slowdown by the ratio rule, a tok/s slowdown no ratio settles, neither.
REGRESSION, SUSPECT, UNCHANGED = "regression", "suspect", "unchanged"


@dataclass
class SpeedChange:
    """One configuration's ``metric`` in runs A and B.

    tok/s (information): ``before_median`` / ``after_median``, ``ratio`` (B over A), the ``threshold``
    below which a ratio is past the factor, the rank test's ``p_value`` against ``p_max``.
    Within-run ratio: ``reference`` and its ``reference_kind`` (speed_ratios.UPSTREAM or FORK_ONLY;
    "" when there is none), each run's within-run ratio, the median of its within-round ratios
    (harness.common.statistics.within_round_ratio, the speed stage's and the report's number) in A and B
    (``before_vs_reference``, ``after_vs_reference``), their change ``vs_reference_ratio`` (B's median over A's) and its
    rank test's ``vs_reference_p``.  ``verdict``: REGRESSION, SUSPECT or UNCHANGED (module
    docstring), ``why`` says which evidence decided it.  ``factor``: the factor it was judged with (the
    matrix's, or the wider one of a speed rule that pairs the configuration with its reference; None in
    records made before it was kept), which ``triage --confirm`` judges the re-measurement with too, and
    ``processes``: the engine processes a side it was measured with, which ``--confirm`` measures with too.
    """

    platform: str
    config: str
    model: str
    metric: str
    before_median: float
    after_median: float
    ratio: float
    threshold: float
    p_value: float
    p_max: float
    verdict: str = UNCHANGED
    why: str = ""
    reference: str = ""
    reference_kind: str = ""
    before_vs_reference: float | None = None
    after_vs_reference: float | None = None
    vs_reference_ratio: float | None = None
    vs_reference_p: float | None = None
    n_prompt: int | None = None
    n_gen: int | None = None
    factor: float | None = None
    processes: int = 1

    @property
    def regressed(self) -> bool:
        """The change is a regression (a slowdown of its ratio by the rule)."""
        return self.verdict == REGRESSION

    @property
    def suspect(self) -> bool:
        """The tok/s fell past the factor and no ratio settles whether the build or the machine did it."""
        return self.verdict == SUSPECT


def _verdict(tok_s: SpeedVerdict, rel: SpeedVerdict | None, kind: str) -> tuple[str, str]:
    """(verdict, why) from the tok/s verdict, the ratio's verdict (None without a reference) and its kind."""
    if rel is None:
        if tok_s.slower:
            return SUSPECT, "tok/s median past the factor and no reference measured interleaved in both runs"
        return UNCHANGED, "no reference measured interleaved in both runs; tok/s within the factor"
    if kind == UPSTREAM:
        if rel.regressed:
            return REGRESSION, "ratio to upstream's build in the same mode fell by the rule"
        return UNCHANGED, "ratio to upstream's build in the same mode within the rule"
    if rel.regressed and tok_s.slower:
        return REGRESSION, "ratio to a fork-only reference fell by the rule and the tok/s median past the factor"
    if tok_s.slower:
        return SUSPECT, ("tok/s median past the factor; the ratio to a fork-only reference does not count, and it "
                         "hides a slowdown of both sides")
    return UNCHANGED, "tok/s median within the factor" + (" (the ratio fell because the reference got faster)"
                                                         if rel.regressed else "")


def _within_spread(ratio: float, factor: float, spread: Spread | None, verdict: str, why: str) -> tuple[str, str]:
    """A ratio that did not fall by the rule (its factor widened to its cross-run spread) is still **suspect**
    when it fell past the narrower of ``factor`` and the ``spread`` clean runs have shown: past the factor but
    within what clean runs moved (the rule cannot tell the build from the machine), or past anything clean runs
    moved though within the factor.  ``triage --confirm`` re-measures a suspect."""
    if spread is None:
        return verdict, why
    bound = min(factor, spread.factor)
    if ratio >= 1.0 / (1.0 + bound):
        return verdict, why
    return SUSPECT, (f"ratio fell to {ratio:.3f}x of run A's: past {'the factor' if bound == factor else 'the spread'} "
                     f"({bound:.0%}), within what it is judged by ({max(factor, spread.factor):.0%}: its smallest "
                     f"change between two clean runs, {spread.smallest:.3f}x over {spread.pairs} pairs of "
                     f"{spread.runs} committed runs, harness.triage.speed_spread)")


def _set_in_a(key: tuple, config: str, metric: str, set_b: Mapping[str, Mapping[str, Any]],
              sets_a: Mapping[tuple, Mapping[str, Mapping[str, Any]]], upstream: Mapping[str, str],
              named: list[str]) -> tuple[Mapping[str, Mapping[str, Any]], Reference | None] | None:
    """Run A's set of rounds to judge ``config``'s ``metric`` of run B's set ``set_b`` (unit ``key``) against,
    with the reference chosen for the pair of sets; None when run A measured ``config`` in no set of the
    same model, tokens and rounds.

    The set of the same name comes first.  A record that names its sets per pair (the pair-by-pair stage)
    and one that does not (one set per unit, the records before it) measured the same unit in sets of
    different names: then every set of A with the same model, tokens and rounds that holds ``config`` is a
    candidate, and the one where upstream's build in the same mode is measured in both wins, then one with
    any reference, then the first."""
    same = sets_a.get(key)
    if same is not None and config in same:
        return same, choose_reference(config, metric, same, set_b, upstream, named)
    options = [s for k, s in sets_a.items() if k[:4] == key[:4] and config in s]
    if not options:
        return None
    chosen = [(s, choose_reference(config, metric, s, set_b, upstream, named)) for s in options]
    for want in (UPSTREAM, FORK_ONLY):
        for s, ref in chosen:
            if ref is not None and ref.kind == want:
                return s, ref
    return chosen[0]


def compare_bench(platform: str, ba: Mapping[str, Any], bb: Mapping[str, Any],
                  upstream: Mapping[str, str] | None = None,
                  factors: Mapping[tuple[str, str, str], float] | None = None,
                  spreads: Mapping[Key, Spread] | None = None) -> list[SpeedChange]:
    """The speed changes of one platform from bench record ``ba`` (run A) to ``bb`` (run B).

    ``upstream``: fork configuration -> upstream's configuration in its mode
    (speed_ratios.same_mode_upstream; empty: every reference is fork-only).  Uses run B's
    ``defaults.speed`` factor and p_max (DEFAULT_SPEED where absent), widened for a configuration
    whose ratio is taken against a reference that a speed rule pairs it with to that rule's factor:
    ``factors`` ((candidate, metric, reference) -> factor, speed_ratios.rule_factors of the matrix), or
    where it is None the factors the two records' rules were judged with.  Measurements with fewer
    than MIN_SAMPLES samples on a side are left out; a reference with a sample of 0 tok/s gives no ratio.
    ``spreads``: each ratio's cross-run spread (harness.triage.speed_spread; None: none known): a ratio falls
    by the rule only past the wider of its factor and its spread, and a fall past either alone is **suspect**.
    The machine is not checked here (:func:`compare_speed` does).
    """
    spreads = spreads or {}
    inst = instrument(dict(bb))
    settings = {**DEFAULT_SPEED, **(bb.get("defaults") or {})}
    factor, p_max = float(settings["factor"]), float(settings["p_max"])
    sets_a, sets_b = interleaved(ba), interleaved(bb)
    refs_a, refs_b = rule_references(ba), rule_references(bb)
    if factors is None:
        fa, fb = recorded_rule_factors(ba), recorded_rule_factors(bb)
        factors = {k: max(fa.get(k, 0.0), fb.get(k, 0.0)) for k in {*fa, *fb}}
    out: list[SpeedChange] = []
    for key, set_b in sets_b.items():
        for config, mb in set_b.items():
            for metric in METRICS:
                xb = mb.get(f"{metric}_tok_s") or []
                named = list(dict.fromkeys([*refs_b.get((config, metric), []), *refs_a.get((config, metric), [])]))
                found = _set_in_a(key, config, metric, set_b, sets_a, upstream or {}, named)
                if found is None:
                    continue
                set_a, ref = found
                xa = set_a[config].get(f"{metric}_tok_s") or []
                if len(xa) < MIN_SAMPLES or len(xb) < MIN_SAMPLES:
                    continue
                wide = max(factor, factors.get((config, metric, ref.name), 0.0)) if ref is not None else factor
                tok_s = judge(xa, xb, 1.0, wide, p_max)
                change = SpeedChange(platform, config, str(mb.get("model")), metric, tok_s.reference.median,
                                     tok_s.candidate.median, tok_s.ratio, tok_s.threshold, tok_s.p_value, p_max,
                                     n_prompt=mb.get("n_prompt"), n_gen=mb.get("n_gen"), factor=wide,
                                     processes=int(mb.get("processes") or 1))
                rel = None
                spread = (spreads.get((platform, inst, str(mb.get("model")), config, metric, ref.name))
                          if ref is not None else None)
                if ref is not None:
                    try:
                        ra = round_ratios(xa, set_a[ref.name][f"{metric}_tok_s"])
                        rb = round_ratios(xb, set_b[ref.name][f"{metric}_tok_s"])
                    except ValueError:  # a reference sample of 0 tok/s: no ratio, as without a reference
                        ra = rb = []
                    if min(len(ra), len(rb)) >= MIN_SAMPLES:
                        judged = max(wide, spread.factor) if spread is not None else wide
                        rel = compare_ratios(ra, rb, judged, p_max)
                        change.reference, change.reference_kind = ref.name, ref.kind
                        # each run's own ratio by the one definition the speed stage judges and the report shows
                        change.before_vs_reference = within_round_ratio(set_a[ref.name][f"{metric}_tok_s"], xa)
                        change.after_vs_reference = within_round_ratio(set_b[ref.name][f"{metric}_tok_s"], xb)
                        change.vs_reference_ratio, change.vs_reference_p = rel.ratio, rel.p_value
                        change.factor = judged
                change.verdict, change.why = _verdict(tok_s, rel, ref.kind if rel is not None and ref else "")
                if rel is not None and change.verdict == UNCHANGED:
                    change.verdict, change.why = _within_spread(rel.ratio, wide, spread, change.verdict, change.why)
                out.append(change)
    return out


def compare_speed(a: Path, b: Path, upstream: Mapping[str, str] | None = None,
                  factors: Mapping[tuple[str, str, str], float] | None = None,
                  spreads: Mapping[Key, Spread] | None = None) -> tuple[list[SpeedChange], list[str]]:
    """The speed changes from run directory ``a`` to ``b`` (:func:`compare_bench` per platform, with
    ``upstream``, ``factors`` and ``spreads``, None: the committed runs', harness.triage.speed_spread.committed)
    and the platforms whose speeds are not comparable (one line each, saying why: another instrument or
    machine)."""
    spreads = committed() if spreads is None else spreads
    changes: list[SpeedChange] = []
    not_comparable: list[str] = []
    for platform in sorted(set(bench_platforms(a)) & set(bench_platforms(b))):
        ba, bb = read_bench(a, platform) or {}, read_bench(b, platform) or {}
        if instrument(ba) != instrument(bb):
            not_comparable.append(f"{platform}: measured by different instruments ({instrument(ba)} and "
                                  f"{instrument(bb)}, harness.record.bench.INSTRUMENT); speed not compared")
            continue
        if ba.get("machine") != bb.get("machine") or not bb.get("machine"):
            differ = sorted(k for k in set(ba.get("machine") or {}) | set(bb.get("machine") or {})
                            if (ba.get("machine") or {}).get(k) != (bb.get("machine") or {}).get(k))
            not_comparable.append(f"{platform}: another machine ({', '.join(differ) or 'no fingerprint'} differ); "
                                  "speed not compared")
            continue
        changes += compare_bench(platform, ba, bb, upstream, factors, spreads)
    return changes, not_comparable

