"""What a reviewer asks of each configuration, in one table: the ``Per configuration`` part of summary.md.

One row per platform, configuration and model that an ``expectations`` step judged, from
the records the run already wrote (nothing is measured here):

- **layers per buffer type**: where the runtime probe found each layer's expert tensors
  (``<config>/expectations.json``, the engine load's facts; harness.record.probe);
- **page-locked MiB**: the driver's count over the weight buffers, against what the fork's
  pin lines claimed for the same load;
- **warnings** the load logged;
- **tokens**: the configuration's greedy comparisons against its reference, by status;
- **pp / tg**: the median tok/s the speed stage measured (``<platform>/speed/bench.json``).

The table reads as a pull-request comment; a dash is a fact the run does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from .expectations import EXPECTATIONS_STEP, read_expectations
from .probe import layers_by_type_text
from .tolerant import read_json_or_none

if TYPE_CHECKING:  # their types only
    from .layout import RunLayout
    from .verdict import ComparisonLike, StepLike


def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:.0f}"


def _layers(layers: dict[str, list[int]] | None) -> str:
    if not layers:
        return "–"
    return layers_by_type_text(layers)


def _speed(bench_json: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(config, model) -> (pp, tg) median tok/s, the first measurement of each, from a platform's bench.json."""
    bench = read_json_or_none(bench_json)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for m in (bench or {}).get("measurements", []) if isinstance(bench, dict) else []:
        try:
            out.setdefault((m["config"], m["model"]), (float(m["pp"]["median"]), float(m["tg"]["median"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def review_lines(layout: RunLayout, steps: Iterable[StepLike], comparisons: Sequence[ComparisonLike]) -> list[str]:
    """The ``Per configuration`` table of summary.md for a run's ``steps`` and ``comparisons`` (records of
    harness.record.records, or any of their shape: harness.record.verdict.StepLike and ComparisonLike;
    harness.record.summary_md renders summary.md with it) and ``layout`` (its RunLayout), or [] when no configuration has an expectations record."""
    rows = []
    speeds: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}
    for step in steps:
        if step.step != EXPECTATIONS_STEP:
            continue
        record = read_expectations(layout.expectations_json(step.platform, step.config))
        if record is None:
            continue
        speed = speeds.setdefault(step.platform, _speed(layout.bench_json(step.platform)))
        for load in record.loads:
            if load.load != "engine":
                continue
            facts, model = load.facts, load.model
            counts: dict[str, int] = {}
            refs = set()
            for c in comparisons:
                if (c.platform, c.candidate, c.model) == (step.platform, step.config, model):
                    counts[c.status] = counts.get(c.status, 0) + 1
                    refs.add(c.reference)
            tokens = (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" vs {', '.join(sorted(refs))}"
                      if counts else "–")
            pp_tg = speed.get((step.config, model))
            rows.append(f"| {step.platform} | {step.config} | {model} | {_layers(facts.get('layers'))} "
                        f"| {_mib(facts.get('page_locked_bytes'))} / {_mib(facts.get('claimed_granted_bytes'))} "
                        f"| {', '.join(facts.get('warnings') or []) or '–'} | {tokens} "
                        f"| {'–' if pp_tg is None else f'{pp_tg[0]:.0f} / {pp_tg[1]:.0f}'} | {step.status} |")
    if not rows:
        return []
    return ["## Per configuration", "",
            "Expert layers per buffer type and page-locked MiB as the runtime probe found them (the driver's count "
            "against the fork's pin lines), warnings logged, tokens against the reference, pp / tg tok/s.", "",
            "| platform | config | model | expert layers per buffer type | page-locked MiB: driver / claimed "
            "| warnings | tokens | pp / tg tok/s | expectations |",
            "|---|---|---|---|---:|---|---|---:|---|", *rows, ""]
