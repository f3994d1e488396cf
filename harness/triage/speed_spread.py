"""How far each within-run speed ratio moves between clean runs: triage's yardstick for a ratio.

A within-run ratio (harness.triage.speed_ratios: a configuration's per-round samples over its reference's)
cancels what moved both sides of a round, but not what belongs to one engine process or one machine: between
clean H200 runs of one series the fork's default-mode pp ratio to upstream moved 0.69-1.42x with the engine of
before (docs/speed.md, "Noise"), and a pinned/pageable ratio moves with the host's memory bandwidth.  A fixed
factor then either calls such movement a slowdown or hides a real one.

So each ratio is judged by the spread it has really shown: for every ordered pair of **clean** runs (a
``summary.json`` that passed, not a planted fault's ``plant-*`` run) measured by the same instrument on the same
machine fingerprint, the change of the ratio's median (run B's median per-round ratio over run A's), and per
(platform, model, configuration, metric, reference) the smallest such change: ``spread`` = 1 / smallest - 1 (0.25: a
clean run has shown the ratio 20 % below another's).  Triage (harness.triage.speed_diff) counts a fall of a
ratio as a regression only past the wider of the rule's factor and this spread, and a fall past the rule's
factor or past the spread alone as **suspect**, which ``triage --confirm`` re-measures.

The runs are the checkout's committed ones, ``results/evidence/`` (every clean H200 run of every day and
machine kept there), read once per process; :func:`measure` takes any directories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
from pathlib import Path
from typing import Iterable, Mapping

from ..record.bench import bench_platforms, instrument, read_bench
from ..record.records import RecordError
from ..common.statuses import VERDICT
from ..record.summary import read_run, run_dirs_under
from .speed_ratios import interleaved
from ..common.statistics import within_round_ratio

#: The committed runs the spreads are measured from.
EVIDENCE = Path(__file__).resolve().parents[2] / "results" / "evidence"

#: (platform, instrument, model, configuration, metric, reference): a ratio moves differently on another model
#: (the F16 experts' prefill synchronises the stream at every expert product, a quantized one's does not).
Key = tuple[str, int, str, str, str, str]


@dataclass(frozen=True)
class Spread:
    """A ratio's cross-run spread: ``smallest`` change between two clean runs (B's median ratio over A's),
    the ``pairs`` of runs it was measured over and the ``runs`` they came from."""

    smallest: float
    pairs: int
    runs: int

    @property
    def factor(self) -> float:
        """The spread as a factor: 1 / smallest - 1 (0 where no clean pair ever fell)."""
        return max(0.0, 1.0 / self.smallest - 1.0)


def clean(run_dir: Path) -> bool:
    """True for a run whose ``summary.json`` says it passed and that is no planted fault's (``plant-*``)."""
    try:
        summary = read_run(run_dir)
    except (OSError, RecordError):
        return False
    return summary.overall in VERDICT.successes and not run_dir.name.startswith("plant-")


def median_ratios(run_dir: Path) -> dict[tuple[str, int, str], dict[tuple[str, str, str, str], float]]:
    """(platform, instrument, machine as JSON) -> (model, configuration, metric, reference) -> the median per-round
    ratio, for every pair of configurations measured interleaved in the run's ``bench.json`` (both directions).
    A pair the stage restored from the result cache (its ``pairs`` entry names the run that measured it) is left
    out: its samples are that run's, and counting them twice would show a change of exactly 1."""
    out: dict[tuple[str, int, str], dict[tuple[str, str, str, str], float]] = {}
    for platform in bench_platforms(run_dir):
        bench = read_bench(run_dir, platform) or {}
        where = (platform, instrument(bench), json.dumps(bench.get("machine"), sort_keys=True))
        mine = out.setdefault(where, {})
        cached = {(p.get("model"), tuple(p.get("configs") or ())) for p in bench.get("pairs") or [] if p.get("cached")}
        for unit, configs in interleaved(bench).items():
            if any((m.get("model"), tuple(m.get("pair") or ())) in cached for m in configs.values()):
                continue
            model = str(unit[0])
            for config, m in configs.items():
                for ref, r in configs.items():
                    if ref == config:
                        continue
                    for metric in ("pp", "tg"):
                        try:  # the one within-run ratio: the median of within-round ratios
                            mine[(model, config, metric, ref)] = within_round_ratio(
                                r.get(f"{metric}_tok_s") or [], m.get(f"{metric}_tok_s") or [])
                        except ValueError:  # no round on both sides, or a reference sample of 0 tok/s
                            continue
    return out


def measure(run_dirs: Iterable[Path]) -> dict[Key, Spread]:
    """Every ratio's :class:`Spread` over the clean runs among ``run_dirs`` (:func:`clean`), pairs of runs of the
    same platform, instrument and machine fingerprint only.  A median ratio of 0 (a configuration that measured
    0 tok/s) gives no change, either way: it would make the spread infinite."""
    by_where: dict[tuple[str, int, str], list[dict[tuple[str, str, str, str], float]]] = {}
    for d in run_dirs:
        if clean(d):
            for where, ratios in median_ratios(d).items():
                by_where.setdefault(where, []).append(ratios)
    out: dict[Key, Spread] = {}
    for (platform, inst, _), runs in by_where.items():
        changes: dict[tuple[str, str, str, str], list[float]] = {}
        for a, b in permutations(runs, 2):
            for k in a.keys() & b.keys():
                if a[k] > 0 and b[k] > 0:  # a ratio of 0 is a configuration that measured nothing: no change
                    changes.setdefault(k, []).append(b[k] / a[k])
        for ratio, values in changes.items():
            key = (platform, inst, *ratio)
            n_runs = sum(1 for r in runs if ratio in r)
            spread = Spread(min(values), len(values), n_runs)
            if key not in out or spread.smallest < out[key].smallest:
                out[key] = spread
    return out


@lru_cache(maxsize=1)
def committed() -> Mapping[Key, Spread]:
    """:func:`measure` over the checkout's committed runs (:data:`EVIDENCE`), once per process."""
    return measure(run_dirs_under(EVIDENCE))


__all__ = ["Spread", "Key", "EVIDENCE", "clean", "median_ratios", "measure", "committed"]
