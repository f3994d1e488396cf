"""Triage across runs, judged by each ratio's measured cross-run spread (harness.triage.speed_spread): what it
says of every ordered pair of the committed clean runs, and what it says when a 12 % loss is planted in them.

Prints each ratio's spread (its smallest change between two clean runs), then over every ordered pair of clean runs
of one platform, instrument and machine fingerprint: the regressions and suspects; and per speed rule, with run B's
candidate samples of that rule scaled by ``--scale`` (0.88: 12 % slower), in how many pairs triage reports a
regression or a suspect.  docs/speed.md keeps the numbers.

Usage::

    python benchmarks/triage_spread.py [--platform linux-x86_64-cuda] [--scale 0.88]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter, defaultdict
from itertools import permutations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.triage.speed_diff import compare_bench  # noqa: E402
from harness.triage.speed_ratios import rule_factors, same_mode_upstream  # noqa: E402
from harness.triage.speed_spread import EVIDENCE, clean, committed  # noqa: E402
from harness.record.summary import run_dirs_under  # noqa: E402
from harness.matrix.config import load_matrix  # noqa: E402
from harness.record.bench import instrument, read_bench  # noqa: E402


def scaled(bench: dict, config: str, reference: str, metric: str, factor: float) -> dict:
    """``bench`` with ``config``'s ``metric`` samples times ``factor`` in the sets measured beside ``reference``."""
    out = copy.deepcopy(bench)
    for m in out["measurements"]:
        if m["config"] == config and reference in (m.get("pair") or [reference]):
            m[f"{metric}_tok_s"] = [x * factor for x in m[f"{metric}_tok_s"]]
    return out


def main() -> int:
    """The command line (see the module docstring); returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="linux-x86_64-cuda", help="the platform whose records are compared")
    ap.add_argument("--scale", type=float, default=0.88, help="the planted loss: candidate samples times this")
    args = ap.parse_args()
    matrix = load_matrix(ROOT / "matrix.yaml")
    upstream, factors, spreads = same_mode_upstream(matrix), rule_factors(matrix), committed()
    runs = [d for d in run_dirs_under(EVIDENCE) if clean(d) and read_bench(d, args.platform)]
    benches = {d: read_bench(d, args.platform) or {} for d in runs}
    groups: dict[tuple[int, str], list[Path]] = defaultdict(list)
    for d, b in benches.items():
        groups[(instrument(b), json.dumps(b.get("machine"), sort_keys=True))].append(d)
    print(f"{len(runs)} clean runs with {args.platform} speed records under {EVIDENCE}")
    print("\nspread of each ratio (smallest change of its median between two clean runs):")
    for (platform, inst, model, config, metric, ref), s in sorted(spreads.items()):
        if platform == args.platform:
            print(f"  instrument {inst}, {model}: {config} {metric} vs {ref}: {s.smallest:.3f}x ({s.factor:.0%}), "
                  f"{s.pairs} pairs of {s.runs} runs")
    pairs = [(a, b) for ds in groups.values() for a, b in permutations(ds, 2)]
    changes = [c for a, b in pairs for c in compare_bench(args.platform, benches[a], benches[b], upstream, factors,
                                                          spreads)]
    print(f"\n{len(pairs)} ordered pairs: {sum(c.regressed for c in changes)} regressions, "
          f"{sum(c.suspect for c in changes)} suspects")
    rules = sorted({(r["candidate"], r["reference"], r["metric"], str(r.get("model")))
                    for b in benches.values() for r in b.get("rules", [])})
    flagged, total = Counter(), Counter()
    for a, b in pairs:
        inst = instrument(benches[b])
        for config, ref, metric, model in rules:
            if not any(m["config"] == config and str(m.get("model")) == model
                       for m in benches[b].get("measurements", [])):
                continue
            found = [c for c in compare_bench(args.platform, benches[a], scaled(benches[b], config, ref, metric,
                                                                                args.scale), upstream, factors, spreads)
                     if (c.config, c.metric, c.model) == (config, metric, model)]
            if found:
                total[(inst, model, config, ref, metric)] += 1
                flagged[(inst, model, config, ref, metric)] += any(c.regressed or c.suspect for c in found)
    print(f"\nrun B's candidate samples of one rule times {args.scale}: pairs that report a regression or a suspect")
    for key in sorted(total):
        inst, model, config, ref, metric = key
        print(f"  instrument {inst}, {model}: {config} {metric} vs {ref}: {flagged[key]}/{total[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
