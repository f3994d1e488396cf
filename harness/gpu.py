"""GPU facts read from logs: pin-ladder lines, compute-sanitizer summaries, device attributes.

The pin ladder (patch 0002) logs one line per host-buffer allocation, e.g.::

    ggml_cuda_host_malloc: pin ladder: requested=6442450944 granted=2147483648 segments=4 seconds=0.731
    ggml_cuda_host_malloc: pin ladder: partial pin: requested=6442450944 granted=2147483648 segments=4 error=cudaErrorMemoryAllocation

Those lines are parsed into numbers (bytes, segments, seconds) for results and triage.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_LADDER = re.compile(r"pin ladder:\s*(?P<kind>partial pin:|no pin:|cudaMallocHost)?\s*(?P<kv>(?:\w+=\S+\s*)+)")
_KV = re.compile(r"(\w+)=(\S+)")


def parse_ladder_lines(text: str) -> list[dict[str, Any]]:
    """Every pin-ladder line of ``text`` as a dict.

    Keys: ``kind`` (``ladder``, ``partial``, ``none`` or ``malloc_host``),
    ``requested`` and ``granted`` (bytes, int), ``segments`` (int),
    ``seconds`` (float, when logged), ``error`` (CUDA error name, when
    logged), and ``line`` (the raw line).  Lines that do not parse are skipped.
    """
    out = []
    for line in text.splitlines():
        m = _LADDER.search(line)
        if not m:
            continue
        kind = {"partial pin:": "partial", "no pin:": "none", "cudaMallocHost": "malloc_host"}.get(
            m.group("kind") or "", "ladder")
        rec: dict[str, Any] = {"kind": kind, "line": line.strip()}
        for k, v in _KV.findall(m.group("kv")):
            if k in ("requested", "granted", "segments"):
                rec[k] = int(v)
            elif k == "seconds":
                rec[k] = float(v)
            else:
                rec[k] = v
        if "requested" in rec and "granted" in rec:
            out.append(rec)
    return out


def ladder_totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum of requested/granted bytes and segments over the summary lines of one run (WARN lines skipped)."""
    summary = [r for r in records if r["kind"] in ("ladder", "malloc_host")]
    return {"allocations": len(summary),
            "requested": sum(r["requested"] for r in summary),
            "granted": sum(r["granted"] for r in summary),
            "segments": sum(r.get("segments", 0) for r in summary),
            "seconds": round(sum(r.get("seconds", 0.0) for r in summary), 3),
            "warnings": sum(1 for r in records if r["kind"] in ("partial", "none"))}


#: compute-sanitizer's closing line per run; group 1 is the error count.
SANITIZER_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")


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
