"""Benchmark of the speed stage (harness/stages/speed.py): what it costs and whether it stays quiet.

Two measurements, printed as numbers with the machine they ran on (docs/speed.md keeps them):

``cost``
    one ``python -m harness compare-outputs`` run at the matrix's defaults (extra arguments pass
    through, e.g. ``--platform linux-x86_64-cpu``): the comparisons' wall time
    (``compare-timing.json``) against the speed stage's (``speed/bench.json``), both of the same
    run on the same machine.  Target: the speed stage adds at most 25 %.

``repeat``
    ``--runs N`` back-to-back runs of the speed stage alone on the same builds (already built:
    ``python -m harness build --platform ...`` first), each a results run of its own; prints every
    rule's verdict per run and the triage speed comparison (harness.analysis.speed_diff) of each run
    against the one before.  Target: no speed regression in 5 runs.

Usage::

    python benchmarks/speed_stage.py cost -- --platform linux-x86_64-cpu
    python benchmarks/speed_stage.py repeat --runs 5 --platform linux-x86_64-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.analysis.speed_diff import compare_speed  # noqa: E402
from harness.analysis.speed_ratios import same_mode_upstream  # noqa: E402
from harness.matrix.config import load_matrix  # noqa: E402
from harness.record import environment  # noqa: E402
from harness.record.bench import read_bench  # noqa: E402
from harness.record.results import Run  # noqa: E402


def machine() -> str:
    """The machine in words: CPU model, cores, RAM and the load average now."""
    ram = (environment.ram_bytes() or 0) / 2**30
    return (f"{environment.cpu_model()}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, load average "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def cost(results: Path, extra: list[str]) -> int:
    """One compare-outputs run; prints the comparisons' and the speed stage's wall time per platform."""
    print(f"machine: {machine()}")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "compare-outputs", "--results-dir", str(results), *extra],
                          cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"})
    total = time.monotonic() - start
    run = (results / "latest").resolve()
    print(f"run {run.name}: exit {proc.returncode}, {total:.1f} s in all; load average after "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for timing in sorted(run.glob("*/compare-timing.json")):
        platform = timing.parent.name
        compare = json.loads(timing.read_text())["wall"]
        bench = read_bench(run, platform)
        if bench is None:
            print(f"{platform}: comparisons {compare:.1f} s, no speed stage")
            continue
        speed = float(bench["wall_s"])
        print(f"{platform}: comparisons {compare:.1f} s, speed stage {speed:.1f} s: the speed stage adds "
              f"{100 * speed / compare:.1f} % (target: at most 25 %)")
        for r in bench["rules"]:
            print(f"  {r['status']}: {r['group']} {r['candidate']} {r['metric']}: {r['detail']}")
    return 0


def repeat(runs: int, results: Path, platforms: list[str], groups: list[str], work_dir: Path) -> int:
    """``runs`` back-to-back speed stages on the same builds; prints verdicts and run-to-run triage."""
    from harness.pipeline import Options, Pipeline
    from harness.stages.speed import stage_speed
    matrix = load_matrix(ROOT / "matrix.yaml")
    upstream = same_mode_upstream(matrix)  # the preferred reference of triage's ratios
    print(f"machine: {machine()}")
    dirs: list[Path] = []
    failed_rules = 0
    for i in range(runs):
        run = Run.open(results, None, argv=["benchmarks/speed_stage.py", "repeat"])
        try:
            pipe = Pipeline(matrix, run, Options(platforms=platforms, groups=groups, work_dir=work_dir),
                            say=lambda _: None)
            t0 = time.monotonic()
            stage_speed(pipe)
            run.write_summary()
            pipe.release_builds()
        finally:
            run.close()
        dirs.append(run.dir)
        print(f"run {i + 1}/{runs} {run.id}: {time.monotonic() - t0:.1f} s")
        for platform in platforms:
            bench = read_bench(run.dir, platform) or {}
            for r in bench.get("rules", []):
                failed_rules += r["status"] != "passed"
                ratio = f"{r['ratio']:.3f}x, p {r['p_value']:.3g}" if "ratio" in r else r["detail"]
                print(f"  {platform} {r['group']} {r['candidate']} {r['metric']}: {r['status']} ({ratio}; "
                      f"load {bench.get('load_average')})")
        if len(dirs) > 1:
            changes, not_comparable = compare_speed(dirs[-2], dirs[-1], upstream)
            for line in not_comparable:
                print(f"  triage: not comparable: {line}")
            for c in changes:
                print(f"  triage against run {len(dirs) - 1}: {c.config} {c.model} {c.metric}: {c.before_median:.1f}"
                      f" -> {c.after_median:.1f} tok/s ({c.ratio:.3f}x, p {c.p_value:.3g})"
                      f"{'  REGRESSION' if c.regressed else ''}")
    regressions = sum(c.regressed for a, b in zip(dirs, dirs[1:]) for c in compare_speed(a, b, upstream)[0])
    print(f"{runs} runs: {failed_rules} speed rule(s) not passed, {regressions} triage speed regression(s) "
          f"between consecutive runs (target: none)")
    return 0


def main() -> int:
    """The command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("cost", "repeat"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--results-dir", type=Path, default=ROOT / "results" / "speed-bench")
    ap.add_argument("--platform", action="append", default=[])
    ap.add_argument("--group", action="append", default=[])
    ap.add_argument("--work-dir", type=Path, default=ROOT / ".harness", help="where the builds are (repeat)")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: arguments of compare-outputs (cost)
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.what == "cost":
        return cost(args.results_dir, extra)
    return repeat(args.runs, args.results_dir, args.platform or ["linux-x86_64-cpu"], args.group, args.work_dir)


if __name__ == "__main__":
    sys.exit(main())
