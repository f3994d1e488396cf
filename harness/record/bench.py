"""The speed stage's records: step names of speed rules and ``<platform>/speed/bench.json``.

harness.stages.speed.speed writes them; the summary's readers (JUnit, signatures, report, triage) read
them through this module, so none of them needs the stage itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..common.statistics import MIN_SAMPLES, OF_MEDIANS, WITHIN_ROUND, within_round_ratio
from .layout import RunLayout

#: Step names of the speed rules start with this: ``speed:<group>:<metric>``, config = the candidate;
#: a rule against another reference than its group's adds ``:vs-<reference>``.
STEP_PREFIX = "speed:"
#: What a step name puts before a rule's own reference (harness.matrix.config.SpeedRule.reference).
VS = "vs-"
#: The metrics a rule can judge: prompt processing and generation, both in tok/s.
METRICS = ("pp", "tg")


@dataclass(frozen=True)
class RuleStep:
    """What a speed rule's step name says: its ``group``, ``metric`` and ``reference`` ("" for the
    group's reference; the rule's own otherwise)."""

    group: str
    metric: str
    reference: str = ""


#: The key of ``bench.json`` that names how its samples were taken, and the instrument of this harness:
#: 1 (absent): the engine's ``bench`` request of before, whose pp ended when the decodes returned and whose tg
#: sampled each token on the CPU; 2: decodes through llama_process, each part ended by llama_synchronize, tg
#: without sampling, as llama-bench (harness/stages/outputs/engine/engine.cpp).  Samples of two instruments are
#: never compared (harness.triage.speed_diff).
INSTRUMENT_KEY = "instrument"
INSTRUMENT = 2


def instrument(bench: dict[str, Any]) -> int:
    """The instrument a bench record was measured with: :data:`INSTRUMENT_KEY`, else 2 where a measurement
    carries ``pp_queued_tok_s`` (only that engine reports it; the first records of instrument 2 were written
    before the key), else 1."""
    value = bench.get(INSTRUMENT_KEY)
    if isinstance(value, int):
        return value
    measurements = bench.get("measurements") or []
    return 2 if any(isinstance(m, dict) and "pp_queued_tok_s" in m for m in measurements) else 1


def step_name(group: str, metric: str, reference: str = "") -> str:
    """The step of a speed rule: ``speed:<group>:<metric>``, with ``:vs-<reference>`` when the rule names
    a reference other than its group's (``reference``; "" for the group's).  The candidate is the step's
    configuration, so the name is unique per candidate, metric and reference."""
    return f"{STEP_PREFIX}{group}:{metric}" + (f":{VS}{reference}" if reference else "")


def parse_rule_step(step: str) -> RuleStep | None:
    """The :class:`RuleStep` of a speed rule's step name (:func:`step_name`), None for any other step."""
    if not step.startswith(STEP_PREFIX):
        return None
    parts = step[len(STEP_PREFIX):].split(":")
    reference = ""
    if len(parts) == 3 and parts[2].startswith(VS):
        reference = parts.pop()[len(VS):]
    if len(parts) != 2 or not parts[0] or parts[1] not in METRICS:
        return None
    return RuleStep(parts[0], parts[1], reference)


def parse_step(step: str) -> tuple[str, str] | None:
    """(group, metric) of a speed rule's step name, None for any other step (:func:`parse_rule_step` also
    gives the rule's own reference)."""
    parsed = parse_rule_step(step)
    return (parsed.group, parsed.metric) if parsed else None


def bench_json(run_dir: Path, platform: str) -> Path:
    """``<platform>/speed/bench.json`` of the run in ``run_dir``."""
    return RunLayout(run_dir).bench_json(platform)


def read_bench(run_dir: Path, platform: str) -> dict[str, Any] | None:
    """The parsed bench.json of ``platform`` in a run, or None when it has none or it cannot be read."""
    try:
        data = json.loads(bench_json(run_dir, platform).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def bench_platforms(run_dir: Path) -> list[str]:
    """The platforms of a run that have a bench.json, sorted."""
    return sorted(d.parent.parent.name for d in run_dir.glob("*/speed/bench.json"))


@dataclass(frozen=True)
class BenchMeasurement:
    """One configuration's samples in one pair of a bench.json (``measurements``): its model and tokens per
    request (``n_prompt`` prompt tokens, then ``n_gen`` generated), the threads it asked for (None: the
    engine's default), the pair it was interleaved in, and the pp and tg tok/s of each timed round; what its
    engine said of itself when it loaded (``engine``: ``model_desc``, the model's description as
    ``llama_model_desc`` gives it, and ``n_threads``, the CPU threads its context used), "" and None in records
    of before."""

    config: str
    model: str
    n_prompt: int
    n_gen: int
    threads: int | None
    pair: tuple[str, ...]
    pp: tuple[float, ...]
    tg: tuple[float, ...]
    model_desc: str = ""
    n_threads_used: int | None = None


def bench_measurements(data: dict[str, Any], where: str = "bench.json") -> list[BenchMeasurement]:
    """The typed measurements of a parsed bench.json (:func:`read_bench`).  Raises ValueError naming
    ``where``, the measurement's index and the key that is missing or of the wrong type."""
    out = []
    for i, m in enumerate(data.get("measurements") or []):
        try:
            threads = m.get("threads")
            engine = m.get("engine") or {}
            used = engine.get("n_threads")
            out.append(BenchMeasurement(
                str(m["config"]), str(m["model"]), int(m["n_prompt"]), int(m["n_gen"]),
                None if threads is None else int(threads), tuple(str(c) for c in m.get("pair") or ()),
                tuple(float(x) for x in m.get("pp_tok_s") or ()), tuple(float(x) for x in m.get("tg_tok_s") or ()),
                str(engine.get("model_desc") or ""), None if used is None else int(used)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: measurements[{i}]: {type(exc).__name__}: {exc}") from exc
    return out


@dataclass(frozen=True)
class RuleRatio:
    """A speed rule's ratio as every view shows it: its ``value`` (candidate over reference, 1.0: as fast) and
    ``name``, the definition it is (harness.common.statistics.WITHIN_ROUND or OF_MEDIANS)."""

    value: float
    name: str

    def text(self, digits: int = 2) -> str:
        """``0.99x (median of within-round ratios)``: the value and its name."""
        return f"{self.value:.{digits}f}x ({self.name})"


def rule_ratio(rule: Mapping[str, Any]) -> RuleRatio | None:
    """The ratio of a judged speed rule of a bench.json (``rules``), None for one not judged (no ``ratio``).

    Rules record the rounds of both sides (``reference_tok_s``, ``candidate_tok_s``; sample i is round i), so
    the ratio is harness.common.statistics.within_round_ratio of them: the number the speed stage judged,
    for records of before too.  The first records (2026-12-01/02) kept no rounds in a rule: their recorded
    ``ratio``, a ratio of medians, named so."""
    if rule.get("ratio") is None:
        return None
    ref, cand = rule.get("reference_tok_s") or [], rule.get("candidate_tok_s") or []
    if min(len(ref), len(cand)) >= MIN_SAMPLES:
        try:
            return RuleRatio(within_round_ratio(ref, cand), WITHIN_ROUND)
        except ValueError:
            pass
    return RuleRatio(float(rule["ratio"]), OF_MEDIANS)
