"""Benchmark: does ccache hit across build trees?  Prints seconds and ccache hit counts.

    python benchmarks/ccache_across_trees.py [--platform linux-x86_64-cpu] [-j 2] [--work DIR]
                                             [--check group:base-vs-fork]

With an empty ccache directory of its own (``<work>/ccache``, so the numbers are not
skewed by other caches), it builds in fresh trees under ``<work>``:

1. the fork (cold: fills the cache);
2. the base after the fork — the unity sources of libllama and every file the series
   does not touch should come from the cache (issue 9's goal: ≤ 15 s on 2 cores);
3. bisect step k = n (the whole series, in its own tree ``bisect/k<n>``), then
   k = n − 1, n − 2, … 0: each step drops one patch (goal: ≤ 30 s on 2 cores).  A bisect
   step builds the targets its check needs (``--check``, as ``python -m harness bisect
   --check`` takes it).

For each build it prints the wall time of the build step and ccache's hits and misses
(``ccache --print-stats`` after ``ccache --zero-stats``).  Nothing is asserted: the
numbers go into docs/benchmarks.md with the machine they came from.
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

from harness.bisect import SeriesBisector, check_targets  # noqa: E402
from harness.stages.building import find_tool  # noqa: E402
from harness.matrix.config import load_matrix  # noqa: E402
from harness.stages.patches import read_series  # noqa: E402
from harness.pipeline import Options, Pipeline  # noqa: E402
from harness.record.run import Run  # noqa: E402
from harness.common.statuses import STEP_PASSED  # noqa: E402


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
    if result.status != STEP_PASSED:
        raise SystemExit(f"{label}: {result.detail}")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def main() -> int:
    """Run the measurements; exit 0 when every build passed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="linux-x86_64-cpu")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=ROOT / ".harness" / "ccache-bench")
    ap.add_argument("--check", default="group:base-vs-fork",
                    help="the bisect check whose targets each bisect step builds (default: group:base-vs-fork)")
    args = ap.parse_args()
    targets = check_targets(args.check)
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["CCACHE_DIR"] = str(work / "ccache")
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), load average {os.getloadavg()[0]:.1f}; "
          f"ccache dir {work / 'ccache'}")
    matrix = load_matrix(ROOT / "matrix.yaml")
    p = matrix.platform(args.platform)
    run = Run.open(work / "results", "bench")
    pipe = Pipeline(matrix, run, Options(platforms=[p.name], jobs=args.jobs, work_dir=work / "trees",
                                         patches_dir=ROOT / "patches"))
    measured("fork (cold cache)", lambda: pipe.build_variant(p, "fork"))
    measured("base after the fork", lambda: pipe.build_variant(p, "base"))
    patches = read_series(ROOT / "patches")
    n = len(patches)
    print(f"bisect steps build {', '.join(targets)} (--check {args.check})")
    bisector = SeriesBisector(patches, p.name, pipe.cmake_options(p, "base"), targets,
                              lambda b, k: (True, ""), work / "bisect", args.jobs, base=pipe.base())
    measured(f"bisect k={n} (whole series, new tree)", lambda: bisector.build(n))
    for k in range(n - 1, -1, -1):
        measured(f"bisect k={k} (without {patches[k].name})", lambda k=k: bisector.build(k))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
