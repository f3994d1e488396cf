"""Benchmark of the edit-to-verdict loop: ``python -m harness bench-loop [--keep] [-- HARNESS ARGS]``.

Clones this checkout's committed HEAD into a fresh directory and runs the main job there
(``nox -s build``, ``nox -s test``, ``nox -s compare-outputs``, one results run, as
``nox -s build test compare-outputs`` does) with this machine's warm caches: ccache and
the harness cache directory (base source, models, toolkit, the result cache of
docs/cache.md) are shared with every checkout.  Scenarios, one after another, each
starting from the state the one before left:

1. ``warm-up``: the first run in the clone (its build directories are new; not a target);
2. ``no-op``: the same again;
3. ``comment``: a comment-only edit in patch 3 (``keyed by the loader`` -> ``keyed by its loader (bench …)``);
4. ``code-patch-3``: a code edit in patch 3 changing ``src/llama-model-loader.cpp`` (a log message);
5. ``code-patch-2``: a code edit in patch 2 changing ``ggml/src/ggml-cuda/ggml-cuda.cu`` (a log message).

Each edit carries a mark of this bench run, so no earlier bench run's results can serve it.

For each it prints the seconds of each stage (each nox session's wall time), the verdict,
and what came from the result cache (generation sessions, ctest labels), with the machine
and its load average; ``bench-loop.json`` in the clone keeps the numbers.  Targets (issue 18;
2 cores, main job on the defaults): no-op <= 15 s, comment -> verdict <= 60 s, code edit in
patch 3 -> verdict <= 150 s.  Times on a shared machine are slower than the loop is: the
load average is printed before and after each scenario.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from ..args import strip_dashdash
from ..common.errors import InputError
from ..record.records import RecordError
from ..record.run_id import new_run_id
from ..common.statuses import STEP_SKIPPED
from ..record.summary_md import describe_cache
from ..record.summary import read_run
from ..stages.command_names import STAGE_COMMANDS
from .compile_bench import machine

STAGES = tuple(STAGE_COMMANDS)

PATCH_2 = "patches/ggml-cuda-pin-host-buffers-through-a-chunked-cudahostregister-la.patch"
PATCH_3 = "patches/llama-route-expert-tensors-to-pinned-memory-by-layer-ggml_cuda_m.patch"


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` (each exactly once) in ``path`` of the clone; same line count, so the
    patch's hunk headers stay right.  ``{stamp}`` in ``new`` becomes a mark of this bench-loop run, so an
    edit is new to the result cache every time (a result stored by an earlier bench run cannot serve it)."""

    path: str
    old: str
    new: str


#: Scenario name -> (edit or None, target seconds or None).
SCENARIOS: dict[str, tuple[Edit | None, float | None]] = {
    "warm-up": (None, None),
    "no-op": (None, 15.0),
    "comment": (Edit(PATCH_3, "keyed by the loader", "keyed by its loader ({stamp})"), 60.0),
    "code-patch-3": (Edit(PATCH_3, "(host buffers are not used with mmap)",
                          "(mmap does not use host buffers, {stamp})"), 150.0),
    "code-patch-2": (Edit(PATCH_2, "bytes failed: %s; the range stays registered",
                          "bytes failed: %s; the range is still registered ({stamp})"), None),
}


@dataclass
class Outcome:
    """One scenario: seconds per stage (nox session wall time), total, the run's verdict and cache counts,
    per platform the compile/build seconds, and the load average before and after."""

    scenario: str
    run_id: str
    stages: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    verdict: str = ""
    cache: dict = field(default_factory=dict)
    target_s: float | None = None
    steps: dict[str, float] = field(default_factory=dict)
    load_before: str = ""
    load_after: str = ""


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def apply_edit(clone: Path, edit: Edit, stamp: str) -> None:
    """Apply ``edit`` in ``clone`` (``stamp`` for its ``{stamp}``); raises InputError naming the patch when its
    text is not there once."""
    path = clone / edit.path
    text = path.read_text(encoding="utf-8")
    if text.count(edit.old) != 1:
        raise InputError(f"{edit.path}: expected {edit.old!r} exactly once, found it {text.count(edit.old)} times; "
                         "update SCENARIOS in harness/tools/bench_loop.py for the series")
    path.write_text(text.replace(edit.old, edit.new.format(stamp=stamp)), encoding="utf-8")


def run_main_job(clone: Path, scenario: str, harness_args: Sequence[str], log_dir: Path,
                 python: str = sys.executable, env: Mapping[str, str] | None = None) -> Outcome:
    """Run the three nox sessions of the main job in ``clone`` as one results run, with ``python``
    (``-m nox``) and ``env`` added to this environment; time each (wall seconds).  Each session's
    output goes to ``log_dir/<scenario>.<stage>.log``."""
    run_id = new_run_id()
    out = Outcome(scenario, run_id, load_before=_load())
    full_env = {**os.environ, **(env or {}), "HARNESS_RUN_ID": run_id}
    for stage in STAGES:
        start = time.monotonic()
        with open(log_dir / f"{scenario}.{stage}.log", "wb") as log:
            subprocess.run([python, "-m", "nox", "-s", stage, "--", *harness_args], cwd=clone, env=full_env,
                           stdout=log, stderr=subprocess.STDOUT, check=False)
        out.stages[stage] = round(time.monotonic() - start, 1)
    out.total = round(sum(out.stages.values()), 1)
    out.load_after = _load()
    try:
        summary = read_run(clone / "results" / run_id)
    except (OSError, RecordError):
        out.verdict = "no summary"
        return out
    out.verdict, out.cache = summary.overall or "?", summary.cache
    for s in summary.steps:
        if s.step in ("build", "compile", "test") and s.status != STEP_SKIPPED:
            what = f"{s.platform} {s.config} {s.step}" + (" (reused)" if s.cached else "")
            out.steps[what] = float(s.seconds or 0)
    return out


def _hits(cache: dict, kind: str) -> str:
    events = cache.get(kind) or {}
    hits = events.get("hits", 0)
    return f"{hits}/{hits + events.get('misses', 0)}"


def report(outcomes: Sequence[Outcome], where: str) -> str:
    """The table bench-loop prints."""
    lines = [f"bench-loop on {where}",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; each stage is one nox session's wall time (s)", "",
             f"{'scenario':<14}{'build':>8}{'test':>8}{'compare':>9}{'total':>8}  {'verdict':<10}"
             f"{'gen. sessions cached':>21}{'ctest labels reused':>20}  target / load before -> after"]
    for o in outcomes:
        target = "" if o.target_s is None else (f"<= {o.target_s:.0f} s " + ("met" if o.total <= o.target_s else
                                                                             "MISSED"))
        lines.append(f"{o.scenario:<14}{o.stages.get('build', 0):>8.1f}{o.stages.get('test', 0):>8.1f}"
                     f"{o.stages.get('compare-outputs', 0):>9.1f}{o.total:>8.1f}  {o.verdict:<10}"
                     f"{_hits(o.cache, 'generation'):>21}{_hits(o.cache, 'tests'):>20}  "
                     f"{target}{' / ' if target else ''}{o.load_before} -> {o.load_after}")
    lines.append("")
    for o in outcomes:
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in o.steps.items())
        lines.append(f"{o.scenario}: {describe_cache(o.cache) if o.cache else 'no cache counts'}; {steps}")
    return "\n".join(lines)


def fresh_clone(clone_dir: Path | None, prefix: str) -> tuple[Path, Path, Path]:
    """Clone this checkout's committed HEAD: (the checkout, the directory holding the clone (``clone_dir``,
    else a new one under the system's temporary directory named ``prefix...``), the clone, ``<dir>/clone``).
    Raises InputError when the clone's path exists, CalledProcessError when git fails."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    base = clone_dir or Path(tempfile.mkdtemp(prefix=prefix))
    clone = base / "clone"
    if clone.exists():
        raise InputError(f"{clone} exists; pass another --clone-dir")
    subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
    return root, base, clone


def main(argv: Sequence[str]) -> int:
    """``bench-loop`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bench-loop", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness bench-loop``; returns 0 when every scenario ran (targets are reported, not enforced)."""
    unknown = [s for s in args.scenario if s not in SCENARIOS]
    if unknown:
        raise InputError(f"--scenario {unknown[0]}: no such scenario; the scenarios: {', '.join(SCENARIOS)}")
    root, base, clone = fresh_clone(args.clone_dir, "bench-loop-")
    log_dir = clone / "bench-loop"
    log_dir.mkdir()
    where = machine()
    stamp = f"bench {new_run_id()}"
    print(f"bench-loop: fresh clone of {root} at {clone}; {where}", flush=True)
    outcomes = []
    try:
        for name, (edit, target) in SCENARIOS.items():
            if args.scenario and name not in args.scenario:
                continue
            if edit is not None:
                apply_edit(clone, edit, stamp)
            o = run_main_job(clone, name, strip_dashdash(args.harness_args), log_dir)
            o.target_s = target
            outcomes.append(o)
            print(f"  {name}: {o.total:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in o.stages.items())}), "
                  f"{o.verdict}; {describe_cache(o.cache) if o.cache else 'no cache counts'}", flush=True)
            (clone / "bench-loop.json").write_text(json.dumps({"machine": where, "outcomes": [asdict(x) for x in
                                                                                              outcomes]}, indent=1))
    finally:
        print(report(outcomes, where))
        if not args.keep:
            shutil.rmtree(base if args.clone_dir is None else clone, ignore_errors=True)
    return 0
