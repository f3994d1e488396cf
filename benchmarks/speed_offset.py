"""Where a speed pair's per-process offset comes from: upstream's llama-bench against the harness's engine, on the
same builds, model and token counts, one machine, back to back (docs/speed.md, "Where the offset came from").

Per side (two build variants, e.g. ``base`` and ``fork``), ``--processes`` processes of each instrument,
alternating between the sides (A B, B A, A B, ...), so that a drift of the machine falls on both alike:

``llama-bench``
    ``llama-bench -m MODEL -p N_PROMPT -n N_GEN -r REPS -ngl 99 -o json``: upstream's own figures of one process
    (``avg_ts`` of its pp and tg tests; it synchronises after each part and generates without sampling).
``engine``
    one ``llama-harness-engine`` process alone: a warm-up request, then ``REPS`` ``bench`` requests; a process's
    figure is the median of its requests: pp (ended by ``llama_synchronize``), ``pp queued`` (the time its
    decodes took to return, which is what the engine timed as pp before it waited for the GPU) and tg.
``engine beside an idle one``
    the same with the other side's engine loaded and idle, as the speed stage holds a pair; the idle engine's
    CPU seconds over the rounds (``utime + stime`` of ``/proc/<pid>/stat``) say whether its threads spin.

Throughout, ``nvidia-smi --query-gpu=clocks.sm,clocks.mem`` every 250 ms (where there is one): each part's
lowest and median SM clock.  Prints per instrument and side the process figures, their spread across processes
(highest over lowest) and the ratio of the sides' medians; ``--json`` keeps every number.  No clock is locked.

Usage (the builds first: ``python -m harness build --platform linux-x86_64-cuda``)::

    python3 benchmarks/speed_offset.py --platform linux-x86_64-cuda --model moe-large --processes 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.matrix.config import Generation  # noqa: E402
from harness.stages.building.engine_target import ENGINE_TARGET  # noqa: E402
from harness.stages.outputs.engine import EngineSession, engine_argv  # noqa: E402


@dataclass
class Figures:
    """One process's figures, tok/s: ``pp``, ``tg`` and (engine only) ``pp_queued``; ``idle_cpu_s``: the CPU
    seconds the other side's idle engine used meanwhile (beside an idle one only)."""

    side: str
    instrument: str
    pp: float
    tg: float
    pp_queued: float | None = None
    idle_cpu_s: float | None = None
    samples_pp: list[float] = field(default_factory=list)
    samples_tg: list[float] = field(default_factory=list)
    process: int = 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (``/proc/<pid>/stat`` fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bound(argv: list[str], cpus: str) -> list[str]:
    """``argv`` started bound to the CPU list ``cpus`` (e.g. ``4-7``) by util-linux's taskset, which binds the
    process and every thread it starts; ``argv`` itself for ``""``."""
    return ["taskset", "--cpu-list", cpus, *argv] if cpus else argv


def llama_bench(binary: Path, model: Path, n_prompt: int, n_gen: int, reps: int, side: str,
                contexts: int = 1, threads: int | None = None, cpus: str = "", process: int = 0) -> list[Figures]:
    """One llama-bench process with every layer on the GPU: ``contexts`` pp tests of ``n_prompt`` tokens (each in a
    context of its own, on the model loaded once) and one tg test; a Figures per pp test, each with the tg
    figure.  ``threads``: its ``-t``; ``cpus``: the CPU list it is bound to (:func:`bound`).  Raises
    CalledProcessError or ValueError."""
    argv = [str(binary), "-m", str(model), "-p", ",".join([str(n_prompt)] * contexts), "-n", str(n_gen),
            "-r", str(reps), "-ngl", "99", "-o", "json"]
    if threads:
        argv += ["-t", str(threads)]
    out = subprocess.run(bound(argv, cpus), check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)
    pps = [t for t in tests if t["n_prompt"] == n_prompt and t["n_gen"] == 0]
    tg = next(t for t in tests if t["n_gen"] == n_gen and t["n_prompt"] == 0)
    if len(pps) != contexts:
        raise ValueError(f"llama-bench reported {len(pps)} pp tests of {n_prompt} tokens, not {contexts}")
    return [Figures(side, "llama-bench", float(pp["avg_ts"]), float(tg["avg_ts"]),
                    samples_pp=[float(x) for x in pp["samples_ts"]], samples_tg=[float(x) for x in tg["samples_ts"]],
                    process=process) for pp in pps]


#: The parts ``--instruments`` may name.
INSTRUMENTS = {"llama-bench", "engine", "beside"}


def cpu_list(text: str) -> set[int]:
    """The CPUs of a list such as ``4``, ``4-7`` or ``0,2,4-5``; an empty set for ``""``.  Raises ValueError."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def engine_figures(session: EngineSession, n_prompt: int, n_gen: int, reps: int, side: str, instrument: str,
                   idle: EngineSession | None = None) -> Figures:
    """A warm-up request, then ``reps`` timed ones on ``session``; with ``idle``, that engine's CPU seconds
    over the timed requests.  Raises EngineError."""
    session.bench(n_prompt, 2)
    before = cpu_seconds(idle.proc.pid) if idle is not None else 0.0
    results = [session.bench(n_prompt, n_gen) for _ in range(reps)]
    used = cpu_seconds(idle.proc.pid) - before if idle is not None else None
    queued = [r.pp_queued_tok_s for r in results if r.pp_queued_tok_s is not None]
    return Figures(side, instrument, statistics.median(r.pp_tok_s for r in results),
                   statistics.median(r.tg_tok_s for r in results),
                   statistics.median(queued) if queued else None, used,
                   [r.pp_tok_s for r in results], [r.tg_tok_s for r in results])


class Clocks:
    """nvidia-smi's SM and memory clocks every 250 ms in a thread, with a label per part."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int]] = []
        self.part = ""
        try:
            self._proc: subprocess.Popen[str] | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader,nounits", "-lms", "250"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                sm, mem = (int(x) for x in line.split(","))
            except ValueError:
                continue
            self.rows.append((self.part, sm, mem))

    def summary(self, part: str) -> str:
        """The part's lowest and median SM clock, MHz."""
        sm = [r[1] for r in self.rows if r[0] == part]
        return f"SM clock {min(sm)}-{statistics.median(sm):.0f} MHz (lowest, median)" if sm else "no clock read"

    def stop(self) -> None:
        """End nvidia-smi."""
        if self._proc is not None:
            self._proc.terminate()


def contexts_line(figures: list[Figures]) -> str:
    """One side's llama-bench pp figures with several contexts a process: each process's figures bracketed, the
    widest spread within a process and the spread across process medians."""
    per_process: dict[int, list[float]] = {}
    for f in figures:
        per_process.setdefault(f.process, []).append(f.pp)
    within = max(max(v) / min(v) for v in per_process.values())
    centres = [statistics.median(v) for v in per_process.values()]
    shown = " ".join("[" + ", ".join(f"{v:.0f}" for v in vs) + "]" for vs in per_process.values())
    return (f"pp by process [contexts]: {shown} tok/s; widest spread within a process {within:.3f}x, across process "
            f"medians {max(centres) / min(centres):.3f}x")


def report(figures: list[Figures], sides: list[str], clocks: Clocks) -> None:
    """Per instrument: each side's process figures, their spread, and the ratio of the sides' medians."""
    for instrument in dict.fromkeys(f.instrument for f in figures):
        print(f"\n{instrument} ({clocks.summary(instrument)})")
        medians: dict[str, dict[str, float]] = {}
        for side in sides:
            mine = [f for f in figures if f.instrument == instrument and f.side == side]
            for metric in ("pp", "pp_queued", "tg"):
                values = [getattr(f, metric) for f in mine if getattr(f, metric) is not None]
                if not values:
                    continue
                medians.setdefault(metric, {})[side] = statistics.median(values)
                if metric == "pp" and instrument == "llama-bench" and len(mine) > len({f.process for f in mine}):
                    print(f"  {side} {contexts_line(mine)}")
                    continue
                print(f"  {side} {metric}: {', '.join(f'{v:.0f}' for v in values)} tok/s; spread across processes "
                      f"{max(values) / min(values):.3f}x")
            idle = [f.idle_cpu_s for f in mine if f.idle_cpu_s is not None]
            if idle:
                print(f"  {side}: the other side's idle engine used {', '.join(f'{s:.3f}' for s in idle)} CPU s "
                      f"during the timed requests")
        for metric, by_side in medians.items():
            if len(by_side) == 2:
                a, b = (by_side[s] for s in sides)
                print(f"  {metric}: {sides[1]} / {sides[0]} = {b / a:.3f}x (medians of process figures)")


def main() -> int:
    """The command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="linux-x86_64-cuda", help="the platform whose builds are measured")
    ap.add_argument("--work-dir", type=Path, default=ROOT / ".harness", help="where the builds are")
    ap.add_argument("--sides", nargs=2, default=["base", "fork"], metavar=("A", "B"), help="the two build variants")
    ap.add_argument("--model", default="moe-large", help="a model of matrix.yaml (obtained by `harness models`)")
    ap.add_argument("--n-prompt", type=int, default=512, help="prompt tokens per request (pp)")
    ap.add_argument("--n-gen", type=int, default=32, help="generated tokens per request (tg)")
    ap.add_argument("--reps", type=int, default=5, help="timed requests per process")
    ap.add_argument("--processes", type=int, default=4, help="processes per side and instrument")
    ap.add_argument("--instruments", default="llama-bench,engine,beside",
                    help="comma-separated parts to run: llama-bench, engine (alone), beside (beside an idle engine)")
    ap.add_argument("--contexts", type=int, default=1,
                    help="llama-bench: pp tests per process, each in a context of its own on the one loaded model")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of each measured process (llama.cpp's "
                    "default when left out)")
    ap.add_argument("--cpus", default="", help="bind each measured process to these CPUs, e.g. 4 or 4-7 (none when "
                    "left out)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = ap.parse_args()
    parts = set(args.instruments.split(","))
    if parts - INSTRUMENTS:
        ap.error(f"--instruments: unknown {', '.join(sorted(parts - INSTRUMENTS))} (known: {', '.join(sorted(INSTRUMENTS))})")
    try:
        cpus = cpu_list(args.cpus)
    except ValueError:
        ap.error(f"--cpus: not a CPU list such as 4 or 4-7: {args.cpus!r}")
    found = subprocess.run([sys.executable, "-m", "harness", "models", args.model], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout
    model = Path(found.strip().split(": ", 1)[1])
    bins = {s: args.work_dir / s / f"build-{args.platform}" / "bin" for s in args.sides}
    gen = Generation(n_predict=args.n_gen, repeats=1, ctx_size=max(1024, args.n_prompt + args.n_gen + 8))
    logs = ROOT / "results" / "speed-offset"
    logs.mkdir(parents=True, exist_ok=True)

    def start(side: str) -> EngineSession:
        extra = ["-ngl", "99"] + (["-t", str(args.threads)] if args.threads else [])
        argv = bound(engine_argv(bins[side] / ENGINE_TARGET, model, gen, extra), args.cpus)
        return EngineSession(argv, {}, logs / f"{side}.stderr", logs / f"{side}.cmd", load_timeout_s=300.0,
                             request_timeout_s=300.0)

    clocks = Clocks()
    figures: list[Figures] = []
    order = [args.sides if k % 2 == 0 else args.sides[::-1] for k in range(args.processes)]
    print(f"model {model.name}, {args.n_prompt} prompt and {args.n_gen} generated tokens, {args.reps} timed "
          f"requests per process, {args.processes} processes per side; {os.cpu_count()} cores")
    if cpus or args.threads:
        print(f"measured processes bound to CPUs {sorted(cpus) if cpus else 'any'}, threads {args.threads or 'default'}")
    clocks.part = "llama-bench"
    for k, sides in enumerate(order if "llama-bench" in parts else []):
        for side in sides:
            figures += llama_bench(bins[side] / "llama-bench", model, args.n_prompt, args.n_gen, args.reps, side,
                                   args.contexts, args.threads, args.cpus, k)
    clocks.part = "engine alone"
    for sides in order if "engine" in parts else []:
        for side in sides:
            session = start(side)
            try:
                figures.append(engine_figures(session, args.n_prompt, args.n_gen, args.reps, side, clocks.part))
            finally:
                session.close()
    clocks.part = "engine beside an idle one"
    for sides in order if "beside" in parts else []:
        sessions = {s: start(s) for s in sides}
        try:
            for side in sides:
                other = next(s for s in sides if s != side)
                figures.append(engine_figures(sessions[side], args.n_prompt, args.n_gen, args.reps, side,
                                              clocks.part, idle=sessions[other]))
        finally:
            for s in sessions.values():
                s.close()
    clocks.stop()
    report(figures, list(args.sides), clocks)
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": [asdict(f) for f in figures], "clocks": clocks.rows}, indent=1),
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
