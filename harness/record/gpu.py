"""GPU facts read from logs: pin-ladder lines, buffer placement, compute-sanitizer summaries, device attributes.

The pin ladder (patch 0002) logs one INFO line per CUDA host buffer allocation
and a WARN line when less than requested was pinned, e.g.::

    ggml_cuda_host_malloc: pin ladder: cudaMallocHost requested=4962910208 granted=4962910208 segments=1 calls=1 seconds=0.912
    ggml_cuda_host_malloc: pin ladder: requested=6442450944 granted=2147483648 segments=4 calls=9 seconds=0.731
    ggml_cuda_host_malloc: pin ladder: disabled: requested=4962910208 granted=0 segments=0 calls=0 seconds=0.000
    ggml_cuda_host_malloc: pin ladder: partial pin: requested=6442450944 granted=2147483648 segments=4 error=cudaErrorMemoryAllocation
    ggml_cuda_host_malloc: pin ladder: no pin: size_class=1048576 allocations=8 requested=8388608 granted=0 (7 of them not logged above)

Those lines are parsed into numbers (bytes, segments, calls, seconds) for
results and triage.  llama's own load log names, per device and buffer type,
the size of every buffer it allocates (``load_tensors:        CUDA1 model
buffer size =   160.06 MiB``); those lines give where the weights, KV cache and
compute buffers landed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kinds.registry import recorded_env

_LADDER = re.compile(r"pin ladder:\s*(?P<kind>partial pin:|no pin:|disabled:|cudaMallocHost)?\s*(?P<kv>(?:\w+=\S+\s*)+)")
_KV = re.compile(r"(\w+)=(\S+)")
_INT_KEYS = ("requested", "granted", "segments", "calls", "size_class", "allocations")

#: kinds of the one summary line every host buffer allocation prints
SUMMARY_KINDS = ("ladder", "malloc_host", "disabled")


def parse_ladder_lines(text: str) -> list[dict[str, Any]]:
    """Every pin-ladder line of ``text`` as a dict.

    Keys: ``kind`` (``malloc_host``: one cudaMallocHost block; ``ladder``:
    pageable memory pinned in chunks; ``disabled``: GGML_CUDA_NO_PINNED;
    ``partial`` / ``none``: a WARN line; ``repeated``: the count of WARN lines
    of one size class that were not logged one by one), ``requested`` and
    ``granted`` (bytes, int), ``segments`` and ``calls`` (int), ``seconds``
    (float, when logged), ``error`` (CUDA error name, when logged),
    ``size_class`` and ``allocations`` (repeated lines), and ``line`` (the raw
    line).  Lines that do not parse are skipped.
    """
    out = []
    for line in text.splitlines():
        m = _LADDER.search(line)
        if not m:
            continue
        kv = dict(_KV.findall(m.group("kv")))
        kind = {"partial pin:": "partial", "no pin:": "none", "cudaMallocHost": "malloc_host",
                "disabled:": "disabled"}.get(m.group("kind") or "", "ladder")
        if kind in ("partial", "none") and "allocations" in kv:
            kind = "repeated"
        rec: dict[str, Any] = {"kind": kind, "line": line.strip()}
        if kind == "repeated":
            rec["warning"] = "none" if m.group("kind") == "no pin:" else "partial"
        for k, v in kv.items():
            if k in _INT_KEYS:
                rec[k] = int(v)
            elif k == "seconds":
                rec[k] = float(v)
            else:
                rec[k] = v
        if "requested" in rec and "granted" in rec:
            out.append(rec)
    return out


def ladder_totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over the summary lines of one run: allocations, bytes requested and granted, segments, calls, seconds.

    ``warnings`` counts the partial/no pin warnings, those reported only as a
    count (``repeated`` lines, whose first one was logged in full) included.
    """
    summary = [r for r in records if r["kind"] in SUMMARY_KINDS]
    warnings = sum(1 for r in records if r["kind"] in ("partial", "none"))
    warnings += sum(r.get("allocations", 1) - 1 for r in records if r["kind"] == "repeated")
    return {"allocations": len(summary),
            "requested": sum(r["requested"] for r in summary),
            "granted": sum(r["granted"] for r in summary),
            "segments": sum(r.get("segments", 0) for r in summary),
            "calls": sum(r.get("calls", 0) for r in summary),
            "seconds": round(sum(r.get("seconds", 0.0) for r in summary), 3),
            "warnings": warnings}


def pin_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of a GPU kind's backend (harness.kinds: placement, pinning, visible devices) set in
    ``environ`` (default: this process's environment), sorted by name.

    Any value counts, an empty one included: the fork tests GGML_CUDA_NO_PINNED
    for presence only, so ``GGML_CUDA_NO_PINNED=0`` still turns pinning off.
    CUDA_VISIBLE_DEVICES is listed because it decides which GPUs a run sees.
    """
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if recorded_env(k)}


# llama.cpp prints "%s: %12s %s buffer size = %8.2f MiB" per buffer (load_tensors, llama_kv_cache, llama_context,
# sched_reserve); the buffer type name carries the device (CUDA0, CUDA1, CUDA_Host, CPU, CPU_Mapped, CUDA0_Split)
_BUFFER = re.compile(r"\b(?P<stage>\w+):\s+(?P<buft>[\w.-]+)\s+(?P<what>\w+) buffer size =\s*(?P<mib>[0-9.]+) MiB")
_ROUTING = re.compile(r"llama_model_loader: (GGML_CUDA_MOE_PIN_LAYERS(?!=\d+: tensor ).*)$")
#: The line llama's model loader prints once per model load (src/llama-model-loader.cpp).
_LOAD_START = "llama_model_loader: loaded meta data"
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")


def buffer_placement(text: str) -> dict[str, Any]:
    """Where llama put its buffers, from one run's stderr (``-lv 4``).

    Returns ``buffers``: [{stage, buffer_type, what, mib, load}] in log order
    (``what``: model, KV, output, compute, ...; ``mib``: MiB as logged; ``load``: which model load of
    the log, from 1: an engine's stderr holds every process started for it, one after the other);
    ``by_buffer_type``: MiB summed per buffer type (the device is part of the
    name: CUDA0, CUDA1, CUDA_Host, CPU, CUDA0_Split); ``offloaded_layers``:
    [offloaded, total] or None; ``routing``: the GGML_CUDA_MOE_PIN_LAYERS lines
    of the loader (summary and warnings).
    """
    buffers = []
    routing = []
    offloaded = None
    load = 0
    for line in text.splitlines():
        if _LOAD_START in line:
            load += 1
            continue
        m = _BUFFER.search(line)
        if m:
            buffers.append({"stage": m.group("stage"), "buffer_type": m.group("buft"), "what": m.group("what"),
                            "mib": float(m.group("mib")), "load": max(load, 1)})
            continue
        m = _ROUTING.search(line)
        if m:
            routing.append(m.group(1).strip())
            continue
        m = _OFFLOADED.search(line)
        if m:
            offloaded = [int(m.group(1)), int(m.group(2))]
    by_type: dict[str, float] = {}
    for b in buffers:
        buffer_type, mib = str(b["buffer_type"]), float(b["mib"])
        by_type[buffer_type] = round(by_type.get(buffer_type, 0.0) + mib, 2)
    return {"buffers": buffers, "by_buffer_type": by_type, "offloaded_layers": offloaded, "routing": routing}



def last_load_model_buffers(placement: dict[str, Any]) -> list[dict[str, Any]]:
    """The model (weight) buffers of a placement record (:func:`buffer_placement`): its ``load_tensors`` lines
    of buffer ``model``, of the log's last model load only (an engine's stderr holds every process started for
    it, and the probe beside it describes the last one)."""
    model = [b for b in placement.get("buffers", []) if b.get("stage") == "load_tensors" and b.get("what") == "model"]
    last = max((int(b.get("load", 1)) for b in model), default=1)
    return [b for b in model if int(b.get("load", 1)) == last]

#: compute-sanitizer's closing line per run; group 1 is the error count.
#: compute-sanitizer's closing count of errors: ``ERROR SUMMARY: 2 errors`` (memcheck, synccheck, initcheck) or
#: racecheck's ``RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)``, whose errors it captures (a
#: racecheck warning is a hazard the tool itself does not call an error, and is left in the log).
SANITIZER_SUMMARY = re.compile(r"=+ (?:ERROR|RACECHECK) SUMMARY: (?:\d+ hazards? displayed \()?(\d+) errors?")


def sanitizer_summary(log: Path) -> str:
    """compute-sanitizer's ``ERROR SUMMARY`` lines of ``log`` as one string, e.g. "ERROR SUMMARY: 0 errors" per binary."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    counts = [int(n) for n in SANITIZER_SUMMARY.findall(text)]
    if not counts:
        return ""
    return f"compute-sanitizer: {len(counts)} run(s), {sum(counts)} error(s)"


_FACT = re.compile(r"^\s*gpu fact:\s*(\w+)\s*=\s*(.+?)\s*$", re.M)


def test_log_facts(log: Path) -> dict[str, str]:
    """``gpu fact: key = value`` lines the CUDA test binary prints (device name, pinned-memory attributes)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return dict(_FACT.findall(text))


#: A compute-sanitizer report header (``========= Invalid __global__ write of size 1 bytes``): one ``=`` run, one
#: space, the message; detail lines are indented further.
SANITIZER_REPORT = re.compile(r"^=+ (?P<msg>\S.*?)\s*$")
SANITIZER_DETAIL = re.compile(r"^=+ {2,}(?P<msg>\S.*?)\s*$")
#: Lines of the ``=`` prefix that are not a report: the banner, summaries, and the backtrace headers.
SANITIZER_NOT_A_REPORT = re.compile(r"^(?:COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|This tool|"
                             r"Saved host backtrace|Host Frame|Error: process didn't)")
#: The device frame of a report: ``at k_name(char *)+0x30 in /src/file.cu:12`` or ``at 0x30 in file.cu:12:k_name``.
SANITIZER_AT = re.compile(r"^at (?:(?P<fn1>.+?)\+0x[0-9a-fA-F]+(?: in .*)?|0x[0-9a-fA-F]+ in (?:\S+?:\d+:)?(?P<fn2>.+))$")
#: A saved host frame: ``Host Frame:ggml_backend_sched_graph_compute_async [0x1c2d3] in libggml-base.so`` (older
#: versions: ``Host Frame:/path/libggml-base.so (ggml_backend_sched_graph_compute_async + 0x1c2d3) [0x1c2d3]``).
_SAN_HOST = re.compile(r"^Host Frame:\s*(?P<text>.+?)\s*$")
#: Host frames of the CUDA driver and runtime, which every launch passes through: not where a launch came from.
_SAN_RUNTIME = re.compile(r"libcuda\.so|libcudart|cudart|cuLaunch|cudaLaunch|__cudart|__device_stub|"
                          r"\[0x[0-9a-fA-F]+\] in \S*libc\.so")


@dataclass(frozen=True)
class SanitizerError:
    """compute-sanitizer's first report of a log: its message (``Invalid __global__ write of size 1 bytes``), the
    kernel or API call it names (``""`` when none), and the function of the first host frame of the saved backtrace
    outside the CUDA driver and runtime that has a symbol (``""`` when none), without its address and library."""

    message: str
    kernel: str
    host_frame: str

    def text(self) -> str:
        """``Invalid __global__ write of size 1 bytes in k_x(char *) (host: ggml_backend_cuda_set_tensor_async)``."""
        return self.message + (f" in {self.kernel}" if self.kernel else "") + \
            (f" (host: {self.host_frame})" if self.host_frame else "")


def first_sanitizer_error(text: str) -> SanitizerError | None:
    """The first report in compute-sanitizer output ``text`` (its log file or a combined stdout), or None where it
    reported nothing.  The device frame's function is the kernel; the host frame is the first of the report's
    saved host backtrace outside the CUDA driver and runtime, its address dropped."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = SANITIZER_REPORT.match(line)
        if not m or SANITIZER_DETAIL.match(line) or SANITIZER_NOT_A_REPORT.match(m.group("msg")):
            continue
        kernel = host = ""
        for follow in lines[i + 1:]:
            d = SANITIZER_DETAIL.match(follow)
            if not d:
                break
            detail = d.group("msg")
            at = SANITIZER_AT.match(detail)
            if at and not kernel:
                kernel = (at.group("fn1") or at.group("fn2") or "").strip()
            frame = _SAN_HOST.match(detail)
            if frame and not host and not _SAN_RUNTIME.search(frame.group("text")):
                # the function alone: no address, no library path; a frame without a symbol is skipped
                name = re.sub(r"\s*\[0x[0-9a-fA-F]+\]", "", frame.group("text"))
                host = re.sub(r"\s+in\s+\S+$", "", name).strip() if not name.strip().startswith("in ") else ""
        return SanitizerError(m.group("msg"), kernel, host)
    return None
