"""Noise of the speed stage, measured: what repeated runs of one unchanged series say about each rule.

The input is the ``<platform>/speed/bench.json`` of N runs of the same builds on one machine
(harness.stages.speed.speed; benchmarks/speed_stage.py ``noise`` makes them).  Nothing changed between
the runs, so every rule that did not pass is a false alarm, and the spread of the samples is the
machine's noise, not the code's.  Per rule (:class:`RuleNoise`): the false-alarm rate, the median
ratio of each run and its spread across runs, the per-round ratios (candidate sample i over
reference sample i, the same round) and their spread, the smallest p; and the factor the rule would
have needed so that no run failed.  Per configuration and metric (:class:`ConfigNoise`): the
coefficient of variation (``scipy.stats.variation``, standard deviation with ``ddof=1`` over the
mean) of its samples inside each run, its median's variation across runs, and the first timed
round against the rest (a first request that pays for something the warm-up did not: page faults,
clocks ramping up, caches).
"""

from __future__ import annotations

import statistics as pystats
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence
from ..common.statistics import round_ratios
from ..common.statuses import STEP_PASSED
from ..record.bench import rule_ratio


def cv(samples: Sequence[float]) -> float | None:
    """The coefficient of variation of ``samples`` (sample standard deviation over the mean, a fraction):
    ``scipy.stats.variation`` with ``ddof=1``; None for fewer than 2 samples or a zero mean."""
    xs = [float(x) for x in samples]
    if len(xs) < 2 or not pystats.fmean(xs):
        return None
    from scipy.stats import variation  # imported here: scipy.stats takes a second to import

    return float(variation(xs, ddof=1))


def _range(xs: Sequence[float]) -> tuple[float, float, float] | None:
    """(min, median, max) of ``xs``; None when empty."""
    return (min(xs), pystats.median(xs), max(xs)) if xs else None


@dataclass
class RuleNoise:
    """One speed rule over N runs of the same builds (ratios: candidate tok/s over reference tok/s).

    ``statuses``: its status per run.  ``ratios``: the rule's ratio per run (harness.record.bench.rule_ratio: the median of within-round ratios).  ``round_ratios``:
    every per-round ratio of every run.  ``p_values``: the rank test's p per run.  ``min_ratio``,
    ``factor``, ``p_max``: the rule's settings.
    """

    platform: str
    step: str
    candidate: str
    reference: str
    metric: str
    min_ratio: float
    factor: float
    p_max: float
    statuses: list[str] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    round_ratios: list[float] = field(default_factory=list)
    p_values: list[float] = field(default_factory=list)

    @property
    def false_alarms(self) -> int:
        """Runs in which the rule did not pass (nothing changed, so each is a false alarm)."""
        return sum(s != STEP_PASSED for s in self.statuses)

    @property
    def false_alarm_rate(self) -> float:
        """:attr:`false_alarms` over the runs (0 for none)."""
        return self.false_alarms / len(self.statuses) if self.statuses else 0.0

    @property
    def factor_needed(self) -> float:
        """The smallest factor at which no run would have failed by the rule: over the runs whose rank test
        agreed (p <= p_max), the largest ``min_ratio / ratio - 1``; 0 when none did."""
        worst = [self.min_ratio / r - 1 for r, p in zip(self.ratios, self.p_values) if p <= self.p_max and r > 0]
        return max([0.0, *worst])

    def to_json(self) -> dict[str, Any]:
        """The record the benchmark's JSON output keeps."""
        return {"platform": self.platform, "step": self.step, "candidate": self.candidate, "reference": self.reference,
                "metric": self.metric, "runs": len(self.statuses), "false_alarms": self.false_alarms,
                "false_alarm_rate": self.false_alarm_rate, "ratios": self.ratios, "ratio_cv": cv(self.ratios),
                "round_ratio_range": _range(self.round_ratios), "round_ratio_cv": cv(self.round_ratios),
                "p_values": self.p_values, "factor_needed": self.factor_needed}


@dataclass
class ConfigNoise:
    """One configuration's metric over N runs: ``cvs``, the coefficient of variation of its samples in each
    run; ``medians``, its median tok/s per run; ``first``, per run, its first timed sample over the median of
    the others (below 1: the first round was slower)."""

    platform: str
    config: str
    model: str
    metric: str
    cvs: list[float] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The record the benchmark's JSON output keeps."""
        return {"platform": self.platform, "config": self.config, "model": self.model, "metric": self.metric,
                "cvs": self.cvs, "medians": self.medians, "median_cv": cv(self.medians), "first_over_rest": self.first}


def noise(benches: Iterable[tuple[str, dict[str, Any]]]) -> tuple[list[RuleNoise], list[ConfigNoise]]:
    """The noise of every rule and configuration in ``benches`` ((platform, parsed bench.json) per run and
    platform, in run order).  A configuration measured in several pairs of one run counts once per pair."""
    rules: dict[tuple[str, str, str], RuleNoise] = {}
    configs: dict[tuple[str, str, str, str], ConfigNoise] = {}
    for platform, bench in benches:
        for r in bench.get("rules", []):
            step = r.get("step") or f"speed:{r['group']}:{r['metric']}"
            rn = rules.setdefault((platform, step, r["candidate"]), RuleNoise(
                platform, step, r["candidate"], r["reference"], r["metric"], float(r["min_ratio"]),
                float(r["factor"]), float(r["p_max"])))
            rn.statuses.append(str(r.get("status")))
            judged = rule_ratio(r)
            if judged:
                rn.ratios.append(judged.value)
                rn.p_values.append(float(r["p_value"]))
            ref, cand = r.get("reference_tok_s") or [], r.get("candidate_tok_s") or []
            rounds = [(x, c) for x, c in zip(ref, cand) if x > 0]
            rn.round_ratios += round_ratios([c for _, c in rounds], [x for x, _ in rounds])
        for m in bench.get("measurements", []):
            for metric in ("pp", "tg"):
                xs = [float(x) for x in m.get(f"{metric}_tok_s") or []]
                if len(xs) < 2:
                    continue
                cn = configs.setdefault((platform, m["config"], m["model"], metric),
                                        ConfigNoise(platform, m["config"], m["model"], metric))
                cn.cvs.append(cv(xs) or 0.0)
                cn.medians.append(pystats.median(xs))
                rest = pystats.median(xs[1:])
                cn.first.append(xs[0] / rest if rest else 0.0)
    return list(rules.values()), list(configs.values())


def _fmt_range(xs: Sequence[float], unit: str = "") -> str:
    found = _range(xs)
    return "–" if found is None else f"{found[0]:.3g}–{found[2]:.3g}{unit} (median {found[1]:.3g}{unit})"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def markdown(rules: Sequence[RuleNoise], configs: Sequence[ConfigNoise]) -> str:
    """Two Markdown tables, the rules' and the configurations' noise, for docs/speed.md."""
    lines = ["| platform | rule (step, candidate) | false alarms | ratio per run (median of within-round ratios) | its CV | "
             "per-round ratios | their CV | smallest p | factor needed |",
             "|---|---|---:|---|---:|---|---:|---:|---:|"]
    for r in rules:
        lines.append(f"| {r.platform} | `{r.step}` {r.candidate} vs {r.reference} | {r.false_alarms}/{len(r.statuses)} "
                     f"| {_fmt_range(r.ratios)} | {_pct(cv(r.ratios))} | {_fmt_range(r.round_ratios)} "
                     f"| {_pct(cv(r.round_ratios))} | {min(r.p_values, default=float('nan')):.3g} "
                     f"| {100 * r.factor_needed:.1f} % |")
    lines += ["", "| platform | configuration | metric | CV of samples in a run | median tok/s per run | "
              "CV of the medians | first round / the rest |", "|---|---|---|---|---|---:|---|"]
    for c in configs:
        lines.append(f"| {c.platform} | {c.config} ({c.model}) | {c.metric} | "
                     f"{_fmt_range([100 * x for x in c.cvs], ' %')} | {_fmt_range(c.medians)} | {_pct(cv(c.medians))} "
                     f"| {_fmt_range(c.first)} |")
    return "\n".join(lines)
