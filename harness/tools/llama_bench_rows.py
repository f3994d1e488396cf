"""``python -m harness llama-bench-rows RUN... [--platform P] [--out FILE]``: runs' speed measurements as
llama-bench JSONL rows (harness.record.llama_bench), for upstream's ``scripts/compare-llama-bench.py``.

The speed stage writes ``<platform>/speed/llama-bench.jsonl`` itself; this command writes it for runs
recorded before it did (the committed ones under ``results/evidence/``), or all runs' rows into one file
(``--out``).  It prints, per row set, which configuration each build_commit stands for, which is what
``compare-llama-bench.py -b`` and ``-c`` take.  A platform's kind (``backends``, ``gpu_info``) is its
``hardware.gpu`` in ``--matrix``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..common.errors import InputError
from ..kinds.registry import UnknownKind, gpu_of
from ..kinds.shape import GpuKind
from ..record.bench import bench_measurements, bench_platforms, read_bench
from ..record.llama_bench import FILE_NAME, rows_of_run
from ..record.layout import RunLayout


def main(argv: Sequence[str]) -> int:
    """``llama-bench-rows`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s
    code."""
    from ..cli import parse_command
    return run(parse_command("llama-bench-rows", argv))


def _kind(args: argparse.Namespace, platform: str) -> GpuKind:
    """The kind of ``platform`` in ``args.matrix``; raises InputError naming the matrix where it has no such
    platform or the platform an undeclared kind."""
    from ..matrix.config import load_matrix
    matrix = load_matrix(args.matrix)
    if platform not in matrix.platforms:
        raise InputError(f"{args.matrix}: no platform {platform}: its kind (backend, GPUs) is not known")
    try:
        return gpu_of(matrix.platforms[platform])
    except UnknownKind as exc:
        raise InputError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    """Write the rows of ``args.runs`` (see the module docstring); returns 0, or 2 (InputError through
    harness.cli) for a run that does not exist or has no bench.json on the platforms asked for."""
    from ..triage.run_choice import resolve_run
    collected: list[str] = []
    for spec in args.runs:
        run_dir = resolve_run(spec, args.results_dir)
        platforms = args.platform or bench_platforms(run_dir)
        for platform in platforms:
            try:
                rows = rows_of_run(run_dir, platform, _kind(args, platform))
            except ValueError as exc:
                raise InputError(f"{run_dir.name} {platform}: {exc}") from exc
            measured = sorted({m.config for m in bench_measurements(read_bench(run_dir, platform) or {})})
            left_out = [c for c in measured if c not in {r["config"] for r in rows}]
            if not rows:
                why = (f"no record of the commit the builds of {', '.join(left_out)} were made from (environment.json's "
                       "build_commits, a base_commit or a configure log)") if left_out else "no speed measurements"
                raise InputError(f"{RunLayout(run_dir).bench_json(platform)}: {why}")
            if left_out:
                print(f"{run_dir.name} {platform}: left out {', '.join(left_out)}: no config.json, or no record of the "
                      "commit its build was made from", file=sys.stderr)
            lines = [json.dumps(r) + "\n" for r in rows]
            legend: dict[str, list[str]] = {}
            for r in rows:
                names = legend.setdefault(r["build_commit"], [])
                if r["config"] not in names:
                    names.append(r["config"])
            if args.out is None:
                out = run_dir / platform / "speed" / FILE_NAME
                out.write_text("".join(lines), encoding="utf-8")
                print(f"{out}: {len(rows)} rows", file=sys.stderr)
            collected += lines
            for commit, names in legend.items():
                print(f"{run_dir.name} {platform}: build_commit {commit} = {', '.join(names)}", file=sys.stderr)
    if args.out is not None:
        args.out.write_text("".join(collected), encoding="utf-8")
        print(f"{args.out}: {len(collected)} rows", file=sys.stderr)
    return 0
