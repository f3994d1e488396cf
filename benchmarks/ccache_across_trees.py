"""Benchmark: does ccache hit across build trees?  Prints seconds and ccache hit counts.

    python benchmarks/ccache_across_trees.py [--platform linux-x86_64-cpu] [-j 2] [--work DIR]

With an empty ccache directory of its own (``<work>/ccache``, so the numbers are not
skewed by other caches), it builds in fresh trees under ``<work>``:

1. the fork (cold: fills the cache);
2. the base after the fork — the unity sources of libllama and every file the series
   does not touch should come from the cache (issue 9's goal: ≤ 15 s on 2 cores);
3. bisect step k = n (the whole series, in its own tree ``bisect/k<n>``), then
   k = n − 1: the step that drops one patch (goal: ≤ 30 s on 2 cores).

For each build it prints the wall time of the build step and ccache's hits and misses
(``ccache --print-stats`` after ``ccache --zero-stats``).  Nothing is asserted: the
numbers go into the README with the machine they came from.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.analysis.bisect import SeriesBisector  # noqa: E402
from harness.stages.build import find_tool  # noqa: E402
from harness.matrix.config import load_matrix  # noqa: E402
from harness.stages.patches import read_series  # noqa: E402
from harness.pipeline import Options, Pipeline  # noqa: E402
from harness.record.results import Run  # noqa: E402


def ccache(*args: str) -> str:
    """Run ccache with ``args`` (CCACHE_DIR from the environment); its stdout."""
    return subprocess.run([find_tool("ccache") or "ccache", *args], check=True, capture_output=True,
                          text=True).stdout


def stats() -> dict[str, int]:
    """ccache's direct+preprocessed hits, misses and uncacheable calls since the last zeroing."""
    values = dict(line.split("\t", 1) for line in ccache("--print-stats").splitlines() if "\t" in line)
    hits = int(values.get("direct_cache_hit", 0)) + int(values.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(values.get("cache_miss", 0))}


def measured(label: str, build) -> None:
    ccache("--zero-stats")
    start = time.monotonic()
    result = build()
    wall = time.monotonic() - start
    s = stats()
    print(f"{label}: {result.status}, build step {result.seconds:.1f} s (wall {wall:.1f} s), "
          f"ccache {s['hits']} hits / {s['misses']} misses", flush=True)
    if result.status != "passed":
        raise SystemExit(f"{label}: {result.detail}")


def main() -> int:
    """Run the three measurements; exit 0 when every build passed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="linux-x86_64-cpu")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=ROOT / ".harness" / "ccache-bench")
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["CCACHE_DIR"] = str(work / "ccache")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; ccache dir {work / 'ccache'}")
    matrix = load_matrix(ROOT / "matrix.yaml")
    p = matrix.platform(args.platform)
    run = Run.open(work / "results", "bench")
    pipe = Pipeline(matrix, run, Options(platforms=[p.name], jobs=args.jobs, work_dir=work / "trees",
                                         patches_dir=ROOT / "patches"))
    measured("fork (cold cache)", lambda: pipe.build_variant(p, "fork"))
    measured("base after the fork", lambda: pipe.build_variant(p, "base"))
    patches = read_series(ROOT / "patches")
    n = len(patches)
    bisector = SeriesBisector(patches, p.name, pipe.cmake_options(p, "base"), tuple(p.targets + p.test_targets),
                              lambda b, k: (True, ""), work / "bisect", args.jobs, base=pipe.base())
    measured(f"bisect k={n} (whole series, new tree)", lambda: bisector.build(n))
    measured(f"bisect k={n - 1} (one patch fewer)", lambda: bisector.build(n - 1))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
