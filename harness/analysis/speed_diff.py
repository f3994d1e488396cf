"""Speed between two runs: the slowdown rule (harness.analysis.statistics) applied to their samples.

For every platform that has a ``<platform>/speed/bench.json`` (harness.stages.speed) in both
runs, every configuration measured in both with the same model and tokens per request is
judged: run B's tok/s samples against run A's, pp and tg, with ``min_ratio`` 1 (no slowdown)
and run B's ``defaults.speed`` factor and p.  Speeds are compared only when both bench records
carry the same machine fingerprint (harness.record.environment.machine_fingerprint: CPU model
and core count, GPUs and driver, visible GPUs, CUDA driver and toolkit); any other pair is
"not comparable", never a regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..matrix.config import DEFAULT_SPEED
from ..record.bench import METRICS, bench_platforms, read_bench
from .statistics import judge


@dataclass
class SpeedChange:
    """One configuration's speed in runs A and B: medians in tok/s, ``ratio`` (B over A), the threshold
    below which it counts, the rank test's ``p_value`` and whether it is a ``regressed`` slowdown."""

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
    regressed: bool


def _key(m: dict) -> tuple:
    return (m.get("config"), m.get("model"), m.get("n_prompt"), m.get("n_gen"))


def compare_speed(a: Path, b: Path) -> tuple[list[SpeedChange], list[str]]:
    """The speed changes from run directory ``a`` to ``b`` and the platforms whose speeds are not comparable
    (one line each, saying why).  Measurements with fewer than two samples on a side are left out."""
    changes: list[SpeedChange] = []
    not_comparable: list[str] = []
    for platform in sorted(set(bench_platforms(a)) & set(bench_platforms(b))):
        ba, bb = read_bench(a, platform) or {}, read_bench(b, platform) or {}
        if ba.get("machine") != bb.get("machine") or not bb.get("machine"):
            differ = sorted(k for k in set(ba.get("machine") or {}) | set(bb.get("machine") or {})
                            if (ba.get("machine") or {}).get(k) != (bb.get("machine") or {}).get(k))
            not_comparable.append(f"{platform}: another machine ({', '.join(differ) or 'no fingerprint'} differ); "
                                  "speed not compared")
            continue
        settings = {**DEFAULT_SPEED, **(bb.get("defaults") or {})}
        before = {_key(m): m for m in ba.get("measurements", [])}
        for m in bb.get("measurements", []):
            old = before.get(_key(m))
            if old is None:
                continue
            for metric in METRICS:
                xa, xb = old.get(f"{metric}_tok_s") or [], m.get(f"{metric}_tok_s") or []
                if len(xa) < 2 or len(xb) < 2:
                    continue
                v = judge(xa, xb, 1.0, float(settings["factor"]), float(settings["p_max"]))
                changes.append(SpeedChange(platform, str(m["config"]), str(m["model"]), metric, v.reference.median,
                                           v.candidate.median, v.ratio, v.threshold, v.p_value, v.p_max, v.regressed))
    return changes, not_comparable
