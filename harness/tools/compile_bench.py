"""Benchmark of the compile step: ``python -m harness bench-compile [--cold] [-j N]``.

Runs the ``compile`` step (harness.stages.building.cuda_compile) of a CUDA platform for the
fork and the base (``--fork-only``: the fork) in a fresh work directory, so neither ninja nor an earlier
build directory helps, and prints the seconds of each with the machine it ran
on.  Warm (default): ccache's usual directory, filled by an earlier run, serves
the compiles.  ``--cold``: an empty ccache directory, so every unit is
compiled.  The targets (docs/platforms.md, docs/benchmarks.md): cold at most 10 minutes, warm at most 1 minute,
on 2 cores.  The load average is printed before and after, because a shared
machine makes the numbers slower than the step is.
"""

from __future__ import annotations

import argparse
import os
import platform as pyplatform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence
from ..common.statuses import STEP_PASSED


def machine() -> str:
    """One line about this machine: CPU model, cores, RAM and the load average now."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = pyplatform.processor()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    return f"{model}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, load average {load}"


def main(argv: Sequence[str]) -> int:
    """``bench-compile`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bench-compile", argv))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; prints one line per variant (status, seconds, units) and returns 0 when
    every compile passed, 1 otherwise."""
    from ..matrix.config import load_matrix
    from ..stages.building.compile_stage import compile_variant
    from ..stages.options import Options
    from ..pipeline import open_context
    from ..record.run import Run
    from ..args import parse_defines, split_names
    platforms = split_names(args.platform) or ["linux-x86_64-cuda"]
    if len(platforms) != 1:
        print(f"error: bench-compile times one platform, got {', '.join(platforms)}", file=sys.stderr)
        return 2
    jobs = args.jobs or 2  # the target's machine
    matrix = load_matrix(args.matrix)
    p = matrix.platform(platforms[0])
    if not p.compile_only_cmake:
        print(f"error: {p.name} has no compile_only options in {args.matrix}", file=sys.stderr)
        return 2
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-compile-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.cold:
        os.environ["CCACHE_DIR"] = str(root / "ccache")
    print(f"machine: {machine()}")
    print(f"mode: {'cold (empty ccache)' if args.cold else 'warm (ccache ' + os.environ.get('CCACHE_DIR', 'default') + ')'}"
          f", -j {jobs}, work {root / 'work'}")
    run = Run(root / "results", "bench")
    ctx = open_context(matrix, run, Options(platforms=[p.name], jobs=jobs, work_dir=root / "work",
                                            patches_dir=args.patches_dir, cuda_arch=args.cuda_arch,
                                            cmake_defines=parse_defines(args.defines)), say=lambda _: None)
    ctx.builds.base()  # obtaining the source is not the step's time
    ctx.builds.patches()
    ok = True
    total = 0.0
    fork_plan = None
    for variant in ("fork",) if args.fork_only else ("fork", "base"):
        start = time.monotonic()
        result = compile_variant(ctx, p, variant, like=fork_plan)
        seconds = time.monotonic() - start
        total += seconds
        if result is None:
            step = run.step(p.name, variant, "compile")
            print(f"{variant}: skipped: {step.detail if step else 'no compile step recorded'}")
            return 1
        fork_plan = fork_plan or result.plan
        ok = ok and result.status == STEP_PASSED
        units = len(result.plan.units) if result.plan else 0
        print(f"{variant}: {result.status} in {seconds:.1f} s ({units} units, linked {len(result.linked)} targets)"
              + ("" if result.status == STEP_PASSED else f": {result.detail}"))
    ctx.close()
    print(f"total: {total:.1f} s; machine after: {machine()}")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
