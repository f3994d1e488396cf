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
    rule's verdict per run and the triage speed comparison (harness.triage.speed_diff) of each run
    against the one before.  Target: no speed regression in 5 runs.

``noise``
    ``--runs N`` back-to-back speed stages as ``repeat`` runs them (``--warmup``, ``--repeats``: the
    stage's untimed and timed rounds), then per rule its false alarms (every rule that did not pass:
    nothing changed) and the spread of its ratios, per configuration the coefficient of variation of its
    samples and its first round against the rest (harness.triage.speed_noise), as Markdown tables;
    ``--json FILE`` keeps the records; ``--from-runs DIR ...`` reports runs measured before.  Needs no
    nox: ``python3 benchmarks/speed_stage.py noise ...`` on a GPU machine (``nox -s bench-noise`` here).

Usage::

    python benchmarks/speed_stage.py cost -- --platform linux-x86_64-cpu
    python benchmarks/speed_stage.py repeat --runs 5 --platform linux-x86_64-cpu
    python benchmarks/speed_stage.py noise --runs 10 --platform linux-x86_64-cpu --json noise.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.triage.speed_diff import compare_speed  # noqa: E402
from harness.common.statuses import STEP_PASSED  # noqa: E402
from harness.triage.speed_noise import markdown, noise  # noqa: E402
from harness.triage.speed_ratios import rule_factors, same_mode_upstream  # noqa: E402
from harness.matrix.config import MatrixError, load_matrix  # noqa: E402
from harness.kinds.machine import cpu_model, ram_bytes  # noqa: E402
from harness.record.bench import read_bench  # noqa: E402
from harness.record.run import Run  # noqa: E402
from harness.record.run_id import new_run_id  # noqa: E402


def machine() -> str:
    """The machine in words: CPU model, cores, RAM and the load average now."""
    ram = (ram_bytes() or 0) / 2**30
    return (f"{cpu_model()}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, load average "
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
        reused = [q for q in bench.get("pairs", []) if q.get("cached")]
        if reused:
            print(f"{platform}: {len(reused)} of {len(bench['pairs'])} speed pair(s) from the result cache, not "
                  "measured: pass --no-cache after -- for the stage's cost")
        print(f"{platform}: comparisons {compare:.1f} s, speed stage {speed:.1f} s: the speed stage adds "
              f"{100 * speed / compare:.1f} % (target: at most 25 %)")
        for r in bench["rules"]:
            print(f"  {r['status']}: {r['group']} {r['candidate']} {r['metric']}: {r['detail']}")
    return 0


def speed_runs(runs: int, results: Path, platforms: list[str], groups: list[str], work_dir: Path,
               warmup: int | None = None, repeats: int | None = None,
               matrix_path: Path = ROOT / "matrix.yaml") -> Iterator[Path]:
    """``runs`` back-to-back speed stages on the same builds, each a results run of its own; yields each
    run's directory as it ends (``warmup``/``repeats``: the stage's untimed and timed rounds, None: the
    matrix's; ``matrix_path``: the matrix, another one to try other configuration arguments)."""
    from harness.stages.options import Options
    from harness import pipeline
    from harness.stages.speed.speed import stage_speed
    matrix = load_matrix(matrix_path)
    for i in range(runs):
        # a run id of its own each, also under nox (whose HARNESS_RUN_ID would make them one run)
        run = Run.open(results, new_run_id(), argv=["benchmarks/speed_stage.py", *sys.argv[1:]])
        try:
            # no_cache: every run measures; a pair restored from the result cache would repeat the first run
            ctx = pipeline.open_context(matrix, run, Options(platforms=platforms, groups=groups, work_dir=work_dir,
                                                    bench_warmup=warmup, bench_repeats=repeats, no_cache=True),
                               say=lambda _: None)
            t0 = time.monotonic()
            try:
                stage_speed(ctx)
                run.write_summary()
            finally:
                ctx.close()
        finally:
            run.close()
        print(f"run {i + 1}/{runs} {run.id}: {time.monotonic() - t0:.1f} s, load average after "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        yield run.dir


def repeat(runs: int, results: Path, platforms: list[str], groups: list[str], work_dir: Path) -> int:
    """``runs`` back-to-back speed stages on the same builds; prints verdicts and run-to-run triage."""
    matrix = load_matrix(ROOT / "matrix.yaml")
    upstream = same_mode_upstream(matrix)  # the preferred reference of triage's ratios
    factors = rule_factors(matrix)  # and the rules' factors it judges them by
    print(f"machine: {machine()}")
    dirs: list[Path] = []
    failed_rules = 0
    for run_dir in speed_runs(runs, results, platforms, groups, work_dir):
        dirs.append(run_dir)
        for platform in platforms:
            bench = read_bench(run_dir, platform) or {}
            for r in bench.get("rules", []):
                failed_rules += r["status"] != STEP_PASSED  # a speed rule's status is its step's
                ratio = f"{r['ratio']:.3f}x, p {r['p_value']:.3g}" if "ratio" in r else r["detail"]
                print(f"  {platform} {r['group']} {r['candidate']} {r['metric']}: {r['status']} ({ratio}; "
                      f"load {bench.get('load_average')})")
        if len(dirs) > 1:
            changes, not_comparable = compare_speed(dirs[-2], dirs[-1], upstream, factors)
            for line in not_comparable:
                print(f"  triage: not comparable: {line}")
            for c in changes:
                print(f"  triage against run {len(dirs) - 1}: {c.config} {c.model} {c.metric}: {c.before_median:.1f}"
                      f" -> {c.after_median:.1f} tok/s ({c.ratio:.3f}x, p {c.p_value:.3g})"
                      f"{'  REGRESSION' if c.regressed else ''}")
    regressions = sum(c.regressed for a, b in zip(dirs, dirs[1:]) for c in compare_speed(a, b, upstream, factors)[0])
    print(f"{runs} runs: {failed_rules} speed rule(s) not passed, {regressions} triage speed regression(s) "
          f"between consecutive runs (target: none)")
    return 0


def noise_report(run_dirs: list[Path], platforms: list[str], out_json: Path | None) -> int:
    """Each rule's false alarms and the spread of its samples over the runs in ``run_dirs``
    (harness.triage.speed_noise), printed as Markdown tables; the records also to ``out_json`` when given.  Returns 0, or 1
    when a run has no speed record of a platform (nothing was measured)."""
    benches = [(p, read_bench(d, p)) for d in run_dirs for p in platforms]
    missing = [f"{d.name}/{p}" for (p, b), d in zip(benches, [d for d in run_dirs for _ in platforms]) if b is None]
    rules, configs = noise([(p, b) for p, b in benches if b is not None])
    # the machines the runs were measured on, as their records say (a report of --from-runs is often made elsewhere)
    measured_on = sorted({json.dumps(b.get("machine"), sort_keys=True) for _, b in benches if b is not None})
    print(f"\n{len(run_dirs)} runs: {', '.join(d.name for d in run_dirs)}")
    for m in measured_on:
        print(f"measured on: {m}")
    print(markdown(rules, configs))
    loads = [b.get("load_average") for _, b in benches if b]
    print(f"load average (1 min) at each run's start: {', '.join(f'{x[0]:.1f}' for x in loads if x)}")
    if out_json is not None:
        out_json.write_text(json.dumps({"machine": machine(), "measured_on": [json.loads(m) for m in measured_on],
                                        "runs": [str(d) for d in run_dirs],
                                        "rules": [r.to_json() for r in rules],
                                        "configs": [c.to_json() for c in configs]}, indent=1), encoding="utf-8")
        print(f"written: {out_json}")
    for m in missing:
        print(f"error: {m}: no speed/bench.json (the stage measured nothing: builds, model or selection)")
    return 1 if missing else 0


def main() -> int:
    """The command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("cost", "repeat", "noise"),
                    help="cost: the stage's time against its work; repeat: the stage again on the same builds; "
                    "noise: false alarms and spread over repeated stages")
    ap.add_argument("--runs", type=int, default=5, help="stages to run (repeat, noise; default 5)")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "results" / "speed-bench",
                    help="where each stage's run is written (default: results/speed-bench)")
    ap.add_argument("--platform", action="append", default=[],
                    help="a platform of the matrix (repeatable; default: linux-x86_64-cpu)")
    ap.add_argument("--group", action="append", default=[],
                    help="a comparison group with speed rules (repeatable; default: every one)")
    ap.add_argument("--work-dir", type=Path, default=ROOT / ".harness", help="where the builds are (repeat, noise)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed rounds per pair (noise; default: matrix)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per pair (noise; default: matrix)")
    ap.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml",
                    help="the matrix (noise; another one tries other configuration arguments, e.g. -t)")
    ap.add_argument("--json", type=Path, default=None, help="also write the noise records here (noise)")
    ap.add_argument("--from-runs", type=Path, nargs="+", default=None,
                    help="report the noise of these run directories instead of measuring (noise)")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: arguments of compare-outputs (cost)
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.runs < 1 or (args.repeats is not None and args.repeats < 5) or (args.warmup is not None and args.warmup < 0):
        ap.error("--runs must be at least 1, --repeats at least 5, --warmup at least 0")
    platforms = args.platform or ["linux-x86_64-cpu"]
    if args.what == "cost":
        return cost(args.results_dir, extra)
    if args.what == "noise":
        print(f"machine: {machine()}{' (where this report is made)' if args.from_runs else ''}")
        try:
            dirs = args.from_runs or list(speed_runs(args.runs, args.results_dir, platforms, args.group, args.work_dir,
                                                     args.warmup, args.repeats, args.matrix))
        except (MatrixError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return noise_report(dirs, platforms, args.json)
    return repeat(args.runs, args.results_dir, platforms, args.group, args.work_dir)


if __name__ == "__main__":
    sys.exit(main())
