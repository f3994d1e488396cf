"""Within-run speed ratios: a configuration against the reference it was measured interleaved with.

The speed stage (harness.stages.speed.speed) times the configurations of one unit (model, tokens per
request, rounds) in interleaved rounds: round ``i`` holds one sample of each, taken minutes or
seconds apart, so they share the machine's state at that time (clocks, other work, the GPU's
temperature).  Sample ``i`` of a ``bench.json`` measurement's ``pp_tok_s`` / ``tg_tok_s`` is round
``i`` (the stage records samples in the order taken and stops timing an engine at its first
failure, so the first ``n`` samples of two measurements of one unit are the same ``n`` rounds).

A **per-round ratio** is the candidate's sample over the reference's of the same round; their median is
the within-run ratio, one definition for the stage and every view (harness.common.statistics.within_round_ratio).  Between
two runs the machine moves (issue 29: upstream's unchanged build 0.76x in pp between two runs 5
minutes apart), and a ratio cancels what moved both sides of a round alike.

Which reference: the configuration of upstream's build in the same mode (:func:`same_mode_upstream`),
else one that a speed rule of either run names for the candidate.  The latter is of the fork's own
build (``cuda-nopin`` for ``cuda-pin-all``): the ratio still catches a slowdown of the candidate
alone, but not one that hits both sides, so triage treats it as weaker evidence
(harness.triage.speed_diff).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..matrix.config import Matrix
from ..common.statistics import MIN_SAMPLES, SpeedVerdict, judge, round_ratios  # noqa: F401 (read from here by triage)

#: The kinds of reference: upstream's build in the candidate's mode, or another configuration of the fork.
UPSTREAM, FORK_ONLY = "upstream", "fork-only"


def same_mode_upstream(matrix: Matrix) -> dict[str, str]:
    """Fork configuration -> the configuration of upstream's build that runs its mode, from ``matrix``.

    A configuration's own ``upstream`` key first; else the reference of the first group (in the
    matrix's order) whose reference is a ``base`` build and that has the configuration among its
    candidates (``cuda-base-vs-fork`` gives ``fork`` -> ``base``, ``cuda-base-vs-fork-host-experts``
    gives ``cuda-pin-all`` -> ``cuda-base-host-experts``), the rule harness.stages.outputs.jobs uses to find the
    upstream side of a comparison.  Configurations of upstream's build and fork configurations
    without such a group are left out.
    """
    out: dict[str, str] = {}
    for name, c in matrix.configs.items():
        if c.build == "fork" and c.upstream:
            out[name] = c.upstream
    for g in matrix.groups.values():
        if matrix.configs[g.reference].build != "base":
            continue
        for cand in g.candidates:
            if matrix.configs[cand].build == "fork":
                out.setdefault(cand, g.reference)
    return out


def unit_key(m: Mapping[str, Any]) -> tuple:
    """What makes measurements of one ``bench.json`` interleaved: the same model, tokens per request and
    rounds (harness.stages.speed.speed.Unit), whose configurations the stage times round by round together,
    and the same ``interleaved`` value where the record has one (a stage that times one unit in several
    separate sets of rounds names each set so; absent, as in every record so far, one unit is one set)."""
    return (m.get("model"), m.get("n_prompt"), m.get("n_gen"), m.get("repeats"), m.get("interleaved"))


def interleaved(bench: Mapping[str, Any]) -> dict[tuple, dict[str, Mapping[str, Any]]]:
    """A bench record's measurements by :func:`unit_key`, then by configuration."""
    out: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for m in bench.get("measurements") or []:
        out.setdefault(unit_key(m), {})[str(m.get("config"))] = m
    return out


def rule_factors(matrix: Matrix) -> dict[tuple[str, str, str], float]:
    """(candidate, metric, reference) -> the ``factor`` of ``matrix``'s speed rule for that pair and metric,
    the largest where several groups have one.  Triage judges a candidate's ratio to that reference by at
    least this factor (:func:`harness.triage.speed_diff.compare_bench`): a rule whose pair moves between
    engine processes by more than the default factor (``cuda-base-vs-fork`` on an H200, docs/speed.md)
    says so once, for the run's verdict and for triage."""
    out: dict[tuple[str, str, str], float] = {}
    for g in matrix.groups.values():
        for r in (g.speed.rules if g.speed else ()):
            key = (r.candidate, r.metric, r.reference or g.reference)
            out[key] = max(out.get(key, 0.0), r.factor)
    return out


def recorded_rule_factors(bench: Mapping[str, Any]) -> dict[tuple[str, str, str], float]:
    """(candidate, metric, reference) -> the ``factor`` a bench record's rules were judged with, the largest
    where several rules share the pair (the record's own view of :func:`rule_factors`)."""
    out: dict[tuple[str, str, str], float] = {}
    for r in bench.get("rules") or []:
        if r.get("reference") and r.get("factor") is not None:
            key = (str(r.get("candidate")), str(r.get("metric")), str(r["reference"]))
            out[key] = max(out.get(key, 0.0), float(r["factor"]))
    return out


def rule_references(bench: Mapping[str, Any]) -> dict[tuple[str, str], list[str]]:
    """(candidate, metric) -> the references the speed rules of a bench record name for it, in the rules'
    order: a rule declares that its pair's ratio in that metric means something (``cuda-pin-all`` against
    ``cuda-nopin`` in pp, where pinning matters; not in tg, where the experts are computed in host memory)."""
    out: dict[tuple[str, str], list[str]] = {}
    for r in bench.get("rules") or []:
        refs = out.setdefault((str(r.get("candidate")), str(r.get("metric"))), [])
        if r.get("reference") and r["reference"] not in refs:
            refs.append(str(r["reference"]))
    return out


@dataclass(frozen=True)
class Reference:
    """The reference a configuration's ratio is taken against: its ``name`` and ``kind``
    (:data:`UPSTREAM` or :data:`FORK_ONLY`)."""

    name: str
    kind: str


def choose_reference(config: str, metric: str, before: Mapping[str, Mapping[str, Any]],
                     after: Mapping[str, Mapping[str, Any]], upstream: Mapping[str, str],
                     rule_refs: Sequence[str]) -> Reference | None:
    """The reference of ``config``'s ``metric`` ratio, or None when there is none.

    ``before`` / ``after``: the configurations measured interleaved with ``config`` in run A and run
    B (one :func:`interleaved` set each).  A reference must have at least
    :data:`harness.common.statistics.MIN_SAMPLES` samples of ``metric`` in both.  Preferred:
    ``upstream[config]`` (:func:`same_mode_upstream`); else the first of ``rule_refs`` (the references
    the runs' speed rules name for ``config``), of kind :data:`FORK_ONLY` unless it is upstream's.
    """
    def usable(name: str) -> bool:
        return name != config and all(len((side.get(name) or {}).get(f"{metric}_tok_s") or []) >= MIN_SAMPLES
                                      for side in (before, after))

    up = upstream.get(config)
    if up and usable(up):
        return Reference(up, UPSTREAM)
    for name in rule_refs:
        if usable(name):
            return Reference(name, FORK_ONLY)
    return None


def compare_ratios(before: Sequence[float], after: Sequence[float], factor: float, p_max: float) -> SpeedVerdict:
    """Run B's per-round ratios ``after`` against run A's ``before``, by the slowdown rule of
    harness.common.statistics (``min_ratio`` 1: the ratio must not fall past ``factor`` with the
    one-sided Mann-Whitney U test at ``p_max`` agreeing).  The verdict's medians are ratios, not tok/s.
    Raises ValueError with fewer than MIN_SAMPLES ratios on a side."""
    return judge(before, after, 1.0, factor, p_max)
