"""Benchmark of the pin ladder on a CUDA machine: numbers, not a timed test.

``python -m harness bench --build-dir DIR [--model PATH]`` prints, side by side:

1. prefill and decode tokens/s of an MoE model with experts pageable, fully
   pinned and pinned for half the layers (``llama-bench -ngl 99 -ncmoe 99
   -lm none``, env ``GGML_CUDA_NO_PINNED`` / ``GGML_CUDA_MOE_PIN_LAYERS``);
2. the ladder's seconds per GiB against one plain ``cudaHostRegister`` of the
   same size (the ladder forced by a per-call cap below the buffer size), the
   CUDA context created before either clock starts, several registrations per
   side in two pairs of processes, min and median reported;
3. bytes granted against each simulated cap (``GGML_CUDA_PIN_SIM_*``).

Items 2 and 3 run in child processes that load the fork's ``libggml-cuda``
through ctypes, so every measurement starts from a fresh CUDA context and a
fresh grant-limit simulation.  The issue's targets: the ladder within 10 % of
the plain registration, and at least 99 % of a cap granted.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

GIB = 1 << 30
MIB = 1 << 20


class PinStats(ctypes.Structure):
    """Mirror of ``struct ggml_backend_cuda_pin_stats`` (ggml/include/ggml-cuda.h of the fork)."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "n_allocations", "n_segments", "bytes_pinned", "n_register_calls", "n_unregister_calls",
        "n_leaked_segments", "n_register_failures", "n_host_malloc_calls", "bytes_leaked",
        "bytes_pinned_all", "n_sim_refusals")]


def _libs(build_dir: Path) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    bin_dir = build_dir / "bin"
    base = ctypes.CDLL(str(bin_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cuda = ctypes.CDLL(str(bin_dir / "libggml-cuda.so"), mode=ctypes.RTLD_GLOBAL)
    base.ggml_backend_buft_alloc_buffer.restype = ctypes.c_void_p
    base.ggml_backend_buft_alloc_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base.ggml_backend_buffer_free.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buffer_get_base.restype = ctypes.c_void_p
    base.ggml_backend_buffer_get_base.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buffer_get_type.restype = ctypes.c_void_p
    base.ggml_backend_buffer_get_type.argtypes = [ctypes.c_void_p]
    cuda.ggml_backend_cuda_host_buffer_type.restype = ctypes.c_void_p
    cuda.ggml_backend_cuda_pin_get_stats.argtypes = [ctypes.POINTER(PinStats)]
    return base, cuda


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library that libggml-cuda loaded (the same process-wide instance)."""
    for cand in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(cand)
        except OSError:
            continue
    raise RuntimeError("libcudart not found")


#: cudaHostRegisterPortable, the flag the ladder registers its chunks with (cuda_runtime_api.h)
CUDA_HOST_REGISTER_PORTABLE = 1


def _child_ladder(build_dir: Path, size: int, reps: int = 1) -> dict[str, Any]:
    """In this process: allocate and free one CUDA host buffer of ``size`` bytes ``reps`` times.

    The CUDA context and ggml's backend registry are created before the first
    clock starts, as in :func:`_child_plain`, so both time only the pinning.
    Returns ``seconds`` (list, one per repetition, allocation only), the
    buffer type's name and the pin stats of the last allocation.
    """
    base, cuda = _libs(build_dir)
    _cudart().cudaFree(None)  # the CUDA context, outside every timed region
    buft = cuda.ggml_backend_cuda_host_buffer_type()
    times, out = [], {}
    for _ in range(reps):
        cuda.ggml_backend_cuda_pin_reset_sim()
        start = time.perf_counter()
        buf = base.ggml_backend_buft_alloc_buffer(buft, size)
        times.append(time.perf_counter() - start)
        stats = PinStats()
        cuda.ggml_backend_cuda_pin_get_stats(ctypes.byref(stats))
        name = base.ggml_backend_buft_name(base.ggml_backend_buffer_get_type(buf)).decode()
        out = {"buffer_type": name, **{f[0]: getattr(stats, f[0]) for f in PinStats._fields_}}
        base.ggml_backend_buffer_free(buf)
    return {"seconds": times, **out}


def _child_plain(build_dir: Path, size: int, reps: int = 1) -> dict[str, Any]:
    """In this process: ``reps`` times, mmap ``size`` fresh bytes and register them with one cudaHostRegister.

    Same flag as the ladder's chunks (portable), fresh pages each time as the
    ladder maps its own; the context exists before the clock starts.  Returns
    ``seconds`` (list, registration only) and the last CUDA error code.
    """
    _libs(build_dir)  # same CUDA runtime as the ladder
    rt = _cudart()
    rt.cudaFree(None)
    times, err = [], 0
    for _ in range(reps):
        mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf = ctypes.c_char.from_buffer(mem)
        addr = ctypes.addressof(buf)
        start = time.perf_counter()
        err = rt.cudaHostRegister(ctypes.c_void_p(addr), ctypes.c_size_t(size), ctypes.c_uint(CUDA_HOST_REGISTER_PORTABLE))
        times.append(time.perf_counter() - start)
        rt.cudaHostUnregister(ctypes.c_void_p(addr))
        del buf
        mem.close()
        if err != 0:
            break
    return {"seconds": times, "error": err}


def _spawn(kind: str, build_dir: Path, size: int, env: dict[str, str], reps: int = 1) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "harness.tools.bench", "--child", kind, "--build-dir", str(build_dir),
                           "--size", str(size), "--reps", str(reps)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["ladder_lines"] = [line for line in proc.stderr.splitlines() if "pin ladder:" in line]
    return result


def ladder_cost(build_dir: Path, gib: float = 4.0, chunk_mib: int = 1024, reps: int = 5,
                rounds: int = 2) -> dict[str, Any]:
    """Seconds per GiB of the ladder (forced by a per-call cap of ``chunk_mib``) vs one plain cudaHostRegister.

    ``rounds`` pairs of child processes (plain, then ladder) each time
    ``reps`` registrations of ``gib`` GiB, the CUDA context created before
    either clock.  Returns every time, the min and median per side (seconds
    per GiB) and ``ladder_over_plain`` (median over median; the issue's target
    is at most 1.10) and ``ladder_over_plain_min`` (min over min).
    """
    size = int(gib * GIB)
    plain_t: list[float] = []
    ladder_t: list[float] = []
    out: dict[str, Any] = {"bytes": size, "reps": reps, "rounds": rounds, "chunk_mib": chunk_mib, "errors": []}
    for _ in range(rounds):
        plain = _spawn("plain", build_dir, size, {}, reps)
        ladder = _spawn("ladder", build_dir, size, {"GGML_CUDA_PIN_SIM_CALL_MAX_MB": str(chunk_mib)}, reps)
        for side, r, acc in (("plain", plain, plain_t), ("ladder", ladder, ladder_t)):
            if isinstance(r.get("seconds"), list) and not (side == "plain" and r.get("error")):
                acc += r["seconds"]
            else:
                out["errors"].append(f"{side}: {r.get('error')}")
        out["ladder_segments"] = ladder.get("n_segments")
    out["plain_seconds"], out["ladder_seconds"] = plain_t, ladder_t
    if plain_t and ladder_t:
        for side, t in (("plain", plain_t), ("ladder", ladder_t)):
            out[f"{side}_s_per_gib_min"] = min(t) / gib
            out[f"{side}_s_per_gib_median"] = statistics.median(t) / gib
        out["ladder_over_plain"] = statistics.median(ladder_t) / statistics.median(plain_t)
        out["ladder_over_plain_min"] = min(ladder_t) / min(plain_t)
    return out


def grants(build_dir: Path, gib: float = 4.0) -> list[dict[str, Any]]:
    """Bytes granted for one ``gib`` GiB host buffer under each simulated cap (per call, total, sticky)."""
    size = int(gib * GIB)
    cases = [
        ("per-call 512 MiB", {"GGML_CUDA_PIN_SIM_CALL_MAX_MB": "512"}, size),
        ("total 2048 MiB", {"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "2048"}, 2048 * MIB),
        ("total 3000 MiB", {"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "3000"}, 3000 * MIB),
        ("per-call 2048 + total 2500 MiB", {"GGML_CUDA_PIN_SIM_CALL_MAX_MB": "2048",
                                             "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "2500"}, 2500 * MIB),
        ("sticky after 1024 MiB per call", {"GGML_CUDA_PIN_SIM_CALL_MAX_MB": "1024",
                                            "GGML_CUDA_PIN_SIM_STICKY": "1"}, 0),
    ]
    rows = []
    for name, env, allowed in cases:
        r = _spawn("ladder", build_dir, size, env)
        granted = r.get("bytes_pinned", 0)
        seconds = r.get("seconds")
        rows.append({"case": name, "env": env, "requested": size, "cap_allows": allowed, "granted": granted,
                     "granted_over_cap": (granted / allowed) if allowed else None,
                     "segments": r.get("n_segments"), "seconds": seconds[0] if seconds else None,
                     "error": r.get("error"),
                     "ladder_lines": r.get("ladder_lines", [])})
    return rows


def llama_bench(build_dir: Path, model: Path, n_layer: int, reps: int = 3) -> list[dict[str, Any]]:
    """pp512 and tg128 tokens/s with experts pageable, fully pinned and pinned for half the layers."""
    configs = [("pageable", {"GGML_CUDA_NO_PINNED": "1"}), ("pinned", {}),
               (f"pin layers {n_layer // 2}/{n_layer}", {"GGML_CUDA_MOE_PIN_LAYERS": str(n_layer // 2)})]
    rows = []
    for name, env in configs:
        argv = [str(build_dir / "bin" / "llama-bench"), "-m", str(model), "-ngl", "99", "-ncmoe", "99",
                "-lm", "none", "-p", "512", "-n", "128", "-r", str(reps), "-o", "json"]
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
        row: dict[str, Any] = {"config": name, "env": env, "argv": argv}
        if proc.returncode != 0:
            row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        else:
            for test in json.loads(proc.stdout):
                key = "prefill_tok_s" if test.get("n_prompt", 0) > 0 else "decode_tok_s"
                row[key] = test.get("avg_ts")
        rows.append(row)
    return rows


def render(results: dict[str, Any]) -> str:
    """The benchmark's results as Markdown tables."""
    lines = [f"Machine: {results.get('machine', '?')}", ""]
    if results.get("llama_bench"):
        lines += ["| experts | prefill pp512 (tok/s) | decode tg128 (tok/s) |", "|---|---:|---:|"]
        for r in results["llama_bench"]:
            lines.append(f"| {r['config']} | {r.get('prefill_tok_s', r.get('error', '?'))} "
                         f"| {r.get('decode_tok_s', '')} |")
        lines.append("")
    lc = results.get("ladder_cost")
    if lc and "ladder_over_plain" in lc:
        n = len(lc["plain_seconds"])
        lines += [f"CUDA context created before either clock; {n} registrations per side "
                  f"({lc['rounds']} processes x {lc['reps']}).", "",
                  "| registration | min s/GiB | median s/GiB |", "|---|---:|---:|",
                  f"| one cudaHostRegister of {lc['bytes'] / GIB:.1f} GiB | {lc['plain_s_per_gib_min']:.3f} "
                  f"| {lc['plain_s_per_gib_median']:.3f} |",
                  f"| ladder ({lc['chunk_mib']} MiB chunks) | {lc['ladder_s_per_gib_min']:.3f} "
                  f"| {lc['ladder_s_per_gib_median']:.3f} |",
                  f"| ladder / plain | {lc['ladder_over_plain_min']:.3f} | {lc['ladder_over_plain']:.3f} |", ""]
    if lc and lc.get("errors"):
        lines += ["ladder cost errors: " + "; ".join(lc["errors"]), ""]
    if results.get("grants"):
        lines += ["| simulated limit | requested | cap allows | granted | granted / cap | segments |",
                  "|---|---:|---:|---:|---:|---:|"]
        for g in results["grants"]:
            ratio = f"{g['granted_over_cap']:.4f}" if g["granted_over_cap"] is not None else "-"
            lines.append(f"| {g['case']} | {g['requested']} | {g['cap_allows']} | {g['granted']} | {ratio} "
                         f"| {g['segments']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """``bench`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bench", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness bench --build-dir DIR [--model GGUF --n-layer N] [--out FILE.json]``."""
    if args.child:
        fn = _child_ladder if args.child == "ladder" else _child_plain
        print(json.dumps(fn(args.build_dir, args.size, args.reps if args.child else 1)))
        return 0
    from ..kinds.nvidia import nvidia_gpus
    gpus = nvidia_gpus()
    results: dict[str, Any] = {"machine": f"{gpus[0]['name']} (driver {gpus[0]['driver']}), {os.cpu_count()} CPUs"
                               if gpus else f"no GPU, {os.cpu_count()} CPUs"}
    if args.model:
        results["llama_bench"] = llama_bench(args.build_dir, args.model, args.n_layer)
    results["ladder_cost"] = ladder_cost(args.build_dir, args.gib, reps=args.reps)
    results["grants"] = grants(args.build_dir, args.gib)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
