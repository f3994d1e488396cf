"""Benchmark of the first run on a fresh machine: ``python -m harness bench-cold [--keep] [-- HARNESS ARGS]``.

Clones this checkout's committed HEAD into a fresh directory and runs the README's first command
there (:data:`README_COMMAND`) as a newcomer would, every cache of the harness empty:

1. ``venv``: ``python3 -m venv .venv``;
2. ``pip``: ``pip install --require-hashes -r requirements.txt`` with the new environment's pip; pip's own cache is
   left as it is (what a download costs is not the harness's time); then the console script,
   ``pip install --no-deps --no-build-isolation --no-index -e .`` (its own part, ``pip-editable``);
3. ``nox -s build test compare-outputs``: each session on its own, one results run (as
   harness/tools/bench_loop.py runs them), with the environment's ``bin/`` first on ``PATH`` as
   ``activate`` puts it, ``CCACHE_DIR`` and ``HARNESS_CACHE_DIR`` new empty directories beside the
   clone: ccache, the base source, the models, the CUDA toolkit layout and the result cache all
   start empty, and the clone's build directories are new.

It prints the seconds of each part, of each build and compile step, the verdict, and the machine
with its load average before and after; ``bench-cold.json`` in the clone keeps them.  Target
(issue 31; 2 cores, 24 GiB, the main job on the defaults): the whole command in at most 15 min.
``--reuse-python``: leave out steps 1 and 2 and run nox with this Python (the harness's time alone).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..args import strip_dashdash
from .bench_loop import Outcome, fresh_clone, run_main_job
from .compile_bench import machine

#: The README's first command, part by part ("the two commands"); tests/test_bench_cold.py keeps them equal.
README_COMMAND = ("python3 -m venv .venv", ". .venv/bin/activate", "pip install --require-hashes -r requirements.txt",
                  "pip install --no-deps --no-build-isolation --no-index -e .", "nox -s build test compare-outputs")
#: Seconds the whole command may take on the 2-core development machine (issue 31).
TARGET_S = 900.0


@dataclass
class ColdRun:
    """One cold run: the machine before and after, seconds of ``venv`` and ``pip`` (absent with
    --reuse-python), the main job's :class:`~harness.tools.bench_loop.Outcome`, the total, and the
    caches it started from."""

    machine_before: str
    setup: dict[str, float] = field(default_factory=dict)
    main_job: Outcome | None = None
    total: float = 0.0
    caches: dict[str, str] = field(default_factory=dict)
    machine_after: str = ""
    failed: str = ""


def _timed(argv: Sequence[str], cwd: Path, log: Path) -> tuple[int, float]:
    """Run ``argv`` in ``cwd`` with its output into ``log``: (exit code, wall seconds)."""
    start = time.monotonic()
    with open(log, "wb") as fh:
        rc = subprocess.run(list(argv), cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    return rc, round(time.monotonic() - start, 1)


def report(cold: ColdRun) -> str:
    """The lines bench-cold prints: each part's seconds, the total against :data:`TARGET_S`, the steps."""
    lines = [f"bench-cold on {cold.machine_before}",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; empty caches: "
             + ", ".join(f"{k} {v}" for k, v in cold.caches.items())]
    parts = dict(cold.setup)
    if cold.main_job is not None:
        parts.update(cold.main_job.stages)
    lines += [f"  {name:<16}{seconds:>8.1f} s" for name, seconds in parts.items()]
    if not cold.setup:
        lines.append("  (venv and pip install not run: --reuse-python)")
    met = "met" if cold.total <= TARGET_S else "MISSED"
    lines.append(f"  {'total':<16}{cold.total:>8.1f} s   target <= {TARGET_S:.0f} s {met}")
    if cold.main_job is not None:
        lines.append(f"verdict: {cold.main_job.verdict}; steps: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in cold.main_job.steps.items()))
    if cold.failed:
        lines.append(f"stopped: {cold.failed}")
    lines.append(f"machine after: {cold.machine_after}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """``bench-cold`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bench-cold", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness bench-cold``; returns 0 when every part ran (the target is reported, not
    enforced), 1 when creating the environment or installing the requirements failed (its log is named)."""
    _, base, clone = fresh_clone(args.clone_dir, "bench-cold-")
    log_dir = clone / "bench-cold"
    log_dir.mkdir()
    caches = {"CCACHE_DIR": base / "ccache", "HARNESS_CACHE_DIR": base / "harness-cache"}
    for path in caches.values():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    cold = ColdRun(machine(), caches={k: str(v) for k, v in caches.items()})
    env = {k: str(v) for k, v in caches.items()}
    python = sys.executable
    print(f"bench-cold: fresh clone at {clone}; {cold.machine_before}", flush=True)
    try:
        if not args.reuse_python:
            venv = clone / ".venv"
            bindir = venv / ("Scripts" if os.name == "nt" else "bin")
            python = str(bindir / ("python.exe" if os.name == "nt" else "python"))
            pip = [python, "-m", "pip", "install"]
            for name, argv_ in (("venv", [shutil.which("python3") or sys.executable, "-m", "venv", str(venv)]),
                                ("pip", [*pip, "--require-hashes", "-r", "requirements.txt"]),
                                ("pip-editable", [*pip, "--no-deps", "--no-build-isolation", "--no-index", "-e", "."])):
                rc, cold.setup[name] = _timed(argv_, clone, log_dir / f"{name}.log")
                print(f"  {name}: {cold.setup[name]:.1f} s (exit {rc})", flush=True)
                if rc != 0:
                    cold.failed = f"{name} exited {rc}; see {log_dir / (name + '.log')}"
                    return 1
            env.update({"VIRTUAL_ENV": str(venv), "PATH": str(bindir) + os.pathsep + os.environ.get("PATH", "")})
        cold.main_job = run_main_job(clone, "cold", strip_dashdash(args.harness_args), log_dir, python, env)
        return 0
    finally:
        cold.total = round(sum(cold.setup.values()) + (cold.main_job.total if cold.main_job else 0.0), 1)
        cold.machine_after = machine()
        (clone / "bench-cold.json").write_text(json.dumps(asdict(cold), indent=1))
        print(report(cold))
        if not args.keep:
            for path in (base,) if args.clone_dir is None else (clone, *caches.values()):
                shutil.rmtree(path, ignore_errors=True)
