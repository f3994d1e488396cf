"""Benchmark: does ccache hit across build trees?  Prints seconds and ccache hit counts.

    python benchmarks/ccache_across_trees.py [--platform linux-x86_64-cpu] [-j 2] [--work DIR]

With an empty ccache directory of its own (``<work>/ccache``, so the numbers are not
skewed by other caches), it builds in fresh trees under ``<work>``:

1. the fork (cold: fills the cache);
2. the base after the fork: every file the series does not touch should come from the cache;
3. the bisect points of the build stage for k = n (the whole series), n - 1, ... 0, as
   ``python -m harness bisect`` runs them (harness.bisect.points.run_point: one work directory
   for every point, the base built once, the fork rebuilt from one prefix to the next).

For each it prints the wall time and ccache's hits and misses (``ccache --print-stats`` after
``ccache --zero-stats``).  Nothing is asserted: the numbers go into docs/benchmarks.md with the
machine they came from.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import cli  # noqa: E402
from harness.bisect.points import RunCommandLine, matrix_at, run_point, write_prefix  # noqa: E402
from harness.common.statuses import STEP_FAILED, STEP_PASSED, VERDICT_PASSED  # noqa: E402
from harness.matrix.config import load_matrix  # noqa: E402
from harness.pipeline import Options, open_context  # noqa: E402
from harness.record.run import Run  # noqa: E402
from harness.stages.building.build import find_tool  # noqa: E402
from harness.stages.building.patches import read_series  # noqa: E402


def ccache(*args: str) -> str:
    """Run ccache with ``args`` (CCACHE_DIR from the environment); its stdout."""
    return subprocess.run([find_tool("ccache") or "ccache", *args], check=True, capture_output=True,
                          text=True).stdout


def stats() -> dict[str, int]:
    """ccache's direct+preprocessed hits, misses and uncacheable calls since the last zeroing."""
    values = dict(line.split("\t", 1) for line in ccache("--print-stats").splitlines() if "\t" in line)
    hits = int(values.get("direct_cache_hit", 0)) + int(values.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(values.get("cache_miss", 0))}


def measured(label: str, build: Callable[[], tuple[bool, str]]) -> None:
    """Run ``build`` (-> passed, detail) between ccache's zeroing and its stats; print the wall time and the
    hits and misses.  Raises SystemExit naming ``label`` where the build did not pass."""
    ccache("--zero-stats")
    start = time.monotonic()
    passed, detail = build()
    wall = time.monotonic() - start
    s = stats()
    print(f"{label}: {STEP_PASSED if passed else STEP_FAILED}, {wall:.1f} s, ccache {s['hits']} hits / {s['misses']} misses",
          flush=True)
    if not passed:
        raise SystemExit(f"{label}: {detail}")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def main() -> int:
    """Run the measurements; exit 0 when every build passed."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--platform", default="linux-x86_64-cpu")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=ROOT / ".harness" / "ccache-bench")
    args = ap.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["CCACHE_DIR"] = str(work / "ccache")
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), load average {os.getloadavg()[0]:.1f}; "
          f"ccache dir {work / 'ccache'}")
    matrix = load_matrix(ROOT / "matrix.yaml")
    p = matrix.platform(args.platform)
    run = Run.open(work / "results", "bench")
    ctx = open_context(matrix, run, Options(platforms=[p.name], jobs=args.jobs, work_dir=work / "trees",
                                            patches_dir=ROOT / "patches"), say=lambda line: None)

    def variant(name: str) -> Callable[[], tuple[bool, str]]:
        def build() -> tuple[bool, str]:
            result = ctx.build_variant(p, name)
            return result.status == STEP_PASSED, result.detail
        return build

    try:
        measured("fork (cold cache)", variant("fork"))
        measured("base after the fork", variant("base"))
    finally:
        ctx.close()  # its build locks: a bisect point takes its own
        run.close()
    patches = read_series(ROOT / "patches")
    n = len(patches)
    command = RunCommandLine(("build",), cli.parse(["build", "--platform", p.name, "-j", str(args.jobs)]))

    def point(k: int) -> Callable[[], tuple[bool, str]]:
        def build() -> tuple[bool, str]:
            series = write_prefix(patches, k, work / "bisect" / "series" / f"k{k}")
            at_k, _ = matrix_at(matrix, [p.name], patches, k)  # the test targets a later patch brings left out
            done = run_point(k, f"bench-k{k}", command, at_k, [p.name], series, work / "bisect" / "work",
                             work / "bisect" / "runs", [f"k={k}"])
            return done.summary.overall == VERDICT_PASSED, f"{done.run_dir}: {done.summary.overall}"
        return build

    for k in range(n, -1, -1):
        measured(f"bisect point k={k} (patches 1..{k} of {n})", point(k))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
