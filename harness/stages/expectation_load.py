"""One load checked against its rules: placement, weights, pinned fraction and warnings, from its records.

A load is one process that loaded a model (the engine, a llama-completion run): its
placement record (harness.record.gpu.buffer_placement), its pin-ladder records
(harness.record.gpu.parse_ladder_lines) and the model's summary
(harness.matrix.models.model_summary) are all :func:`check_load` reads.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..record.gpu import SUMMARY_KINDS
from .expectation_rules import WARNINGS, Expectations, LayerRange, Pinned, rule_on

#: llama prints buffer sizes in MiB with two decimals: a logged size is within half of 0.01 MiB of the bytes.
LOGGED_MIB_TOLERANCE_BYTES = int(0.005 * 2**20) + 1
#: The pin ladder's smallest chunk (GGML_CUDA_PIN_CHUNK_MIN_MB, default 16 MiB, ggml-cuda/pin-ladder.cuh): under a
#: simulated total cap the ladder stops within one smallest chunk of the cap.
PIN_CHUNK_MIN_BYTES = 16 * 2**20
#: Two fractions closer than this are equal (bytes over gigabytes: far below one byte in a million).
FRACTION_EPSILON = 1e-9
_ROUTING_WARNINGS = (("pin-layers-invalid", "- ignoring it"), ("pin-layers-clamped", "is larger than the number of layers"),
                     ("pin-layers-no-effect", "has no effect"))

# --------------------------------------------------------------------------- facts of one load


@dataclass(frozen=True)
class Buffer:
    """One model buffer of a load: its type name as logged and its size in bytes (from the logged MiB)."""

    buffer_type: str
    bytes: int


@dataclass
class Finding:
    """The outcome of one rule on one load: ``status`` passed, failed or incomplete; ``key`` stable across
    runs (no byte counts); ``message`` for people (with sizes); ``evidence`` the record lines it rests on."""

    rule: str
    status: str
    key: str
    message: str
    evidence: list[str] = field(default_factory=list)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _layers_text(layers: Sequence[int]) -> str:
    """``0-7``, ``0-3, 6`` : consecutive layers joined into ranges."""
    parts: list[str] = []
    start = prev = None
    for n in list(layers) + [None]:
        if start is not None and (n is None or n != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(parts)


def model_buffers(placement: Mapping[str, Any]) -> list[Buffer]:
    """The model (weight) buffers of a placement record (harness.record.gpu.buffer_placement): the
    ``load_tensors`` lines whose buffer is ``model``, in log order."""
    return [Buffer(b["buffer_type"], round(float(b["mib"]) * 2**20)) for b in placement.get("buffers", [])
            if b.get("stage") == "load_tensors" and b.get("what") == "model"]


def _matches(buffer_type: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(buffer_type, pattern)


@dataclass
class ExpertPlacement:
    """Where a load's expert bytes are, as far as buffer sizes prove it.

    ``expected``: per layer range, (range text, pattern, expected expert bytes, bytes of the buffers of
    that pattern); ``per_buffer``: expert bytes attributed to each model buffer (index in
    :func:`model_buffers` order): the expected bytes where the buffer's type holds them, else the least a
    buffer of that size must hold (its size minus every non-expert byte of the model).
    """

    expected: list[tuple[str, str, int, int]]
    per_buffer: list[int]


def place_experts(buffers: Sequence[Buffer], by_layer: Sequence[int], other_bytes: int,
                  ranges: Sequence[LayerRange]) -> tuple[ExpertPlacement, list[Finding]]:
    """Check that the expert tensors of each layer range are in its buffer type, from buffer sizes.

    ``buffers``: the load's model buffers; ``by_layer``: expert bytes per layer (the model file);
    ``other_bytes``: the model's non-expert tensor bytes; ``ranges``: the expected placement.  A range
    fails when the buffers of its type hold fewer bytes than its experts (``expert tensors of layers 0-7
    in CPU (4733 MiB), expected CUDA_Host``, naming the buffer types that hold more than they should), or
    when a buffer type holds more than its expected experts plus every non-expert byte (experts of other
    layers are there).  Returns the attribution (for the pinned rule) and one finding per failure, or one
    passed finding.
    """
    n_layer = len(by_layer)
    have: dict[str, int] = {}
    for b in buffers:
        have[b.buffer_type] = have.get(b.buffer_type, 0) + b.bytes
    tol = LOGGED_MIB_TOLERANCE_BYTES * max(1, len(buffers))
    by_pattern: dict[str, list[int]] = {}  # ranges of one buffer type are checked together
    for r in ranges:
        by_pattern.setdefault(r.buffer_type, []).extend(r.layers(n_layer))
    groups = [(pattern, sorted(set(layers)), sum(by_layer[i] for i in set(layers)))
              for pattern, layers in by_pattern.items() if layers]

    def expected_in(buffer_type: str) -> int:
        return sum(need for pattern, _, need in groups if _matches(buffer_type, pattern))

    excess = {t: n - expected_in(t) for t, n in have.items() if n > expected_in(t) + other_bytes + tol}
    findings: list[Finding] = []
    expected = []
    named: set[str] = set()  # buffer types named as where a short range's experts went
    for pattern, layers, need in groups:
        got = sum(n for t, n in have.items() if _matches(t, pattern))
        expected.append((_layers_text(layers), pattern, need, got))
        if got + tol >= need:
            continue
        where = sorted(excess, key=lambda t: -excess[t]) or sorted(t for t in have if not _matches(t, pattern))
        named.update(where)
        found = ", ".join(f"{t} ({_mib(have[t])})" for t in where) or "no model buffer"
        what = f"expert tensors of layers {_layers_text(layers)}"
        if got == 0:
            findings.append(Finding("placement", "failed", f"{what} in {', '.join(where) or 'none'}, expected {pattern}",
                                    f"{what} in {found}, expected {pattern}"))
        else:
            findings.append(Finding("placement", "failed",
                                    f"{what} not all in {pattern} (also in {', '.join(where) or 'none'})",
                                    f"{what}: {pattern} holds {_mib(got)} of their {_mib(need)}; "
                                    f"more than expected in {found}"))
    for t, extra in sorted(excess.items()):
        if t in named:
            continue
        findings.append(Finding("placement", "failed", f"expert tensors of other layers in {t}",
                                f"{t} holds {_mib(have[t])}: {_mib(extra)} more than its expected experts "
                                f"({_mib(expected_in(t))}) plus every non-expert tensor ({_mib(other_bytes)})"))
    per_buffer = []
    for b in buffers:
        share = expected_in(b.buffer_type)
        if share and b.buffer_type not in excess:
            per_buffer.append(min(b.bytes, round(share * b.bytes / have[b.buffer_type])))
        else:
            per_buffer.append(max(0, b.bytes - other_bytes))
    if not findings:
        text = "; ".join(f"layers {lay} in {pat} ({_mib(got)} holding {_mib(need)} of experts)"
                         for lay, pat, need, got in expected)
        findings.append(Finding("placement", "passed", "as expected", f"expert tensors: {text}"))
    return ExpertPlacement(expected, per_buffer), findings


def ladder_grants(buffers: Sequence[Buffer], ladder: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Page-locked bytes granted to each model buffer: the pin-ladder summary record (cudaMallocHost,
    ladder or disabled) whose requested bytes match the buffer's logged size, each record used once;
    None for a buffer with no such record (it never asked to be pinned)."""
    free = [r for r in ladder if r.get("kind") in SUMMARY_KINDS]
    out: list[int | None] = []
    for b in buffers:
        hit = next((r for r in free if abs(int(r["requested"]) - b.bytes) <= LOGGED_MIB_TOLERANCE_BYTES), None)
        if hit is None:
            out.append(None)
            continue
        free.remove(hit)
        out.append(int(hit["granted"]))
    return out


def pinned_expert_bytes(buffers: Sequence[Buffer], experts_in: Sequence[int], grants: Sequence[int | None]) -> int:
    """Expert bytes certainly page-locked: per buffer ``max(0, G - (S - X))`` (S its bytes, X its expert
    bytes, G granted; 0 without a grant), summed."""
    return sum(max(0, (g or 0) - (b.bytes - x)) for b, x, g in zip(buffers, experts_in, grants))


def cap_floor_bytes(rule: Pinned, buffers: Sequence[Buffer], experts_in: Sequence[int]) -> int:
    """Expert bytes a simulated total cap of ``rule.cap_bytes`` must still let be page-locked: the model
    buffers of ``rule.capped_type`` (S bytes, X of them experts) are granted at least ``min(cap, S)`` less
    one smallest ladder chunk (:data:`PIN_CHUNK_MIN_BYTES`), of which at least that minus ``S - X`` are
    expert bytes."""
    if rule.cap_bytes is None:
        return 0
    s = sum(b.bytes for b in buffers if _matches(b.buffer_type, rule.capped_type))
    x = sum(e for b, e in zip(buffers, experts_in) if _matches(b.buffer_type, rule.capped_type))
    return max(0, min(rule.cap_bytes, s) - PIN_CHUNK_MIN_BYTES - (s - x))


def warnings_found(placement: Mapping[str, Any], ladder: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The :data:`WARNINGS` a load logged, each with the log lines that show it."""
    found: dict[str, list[str]] = {}
    for r in ladder:
        kind = r.get("warning") if r.get("kind") == "repeated" else r.get("kind")
        name = {"partial": "partial-pin", "none": "no-pin"}.get(str(kind))
        if name:
            found.setdefault(name, []).append(str(r.get("line", "")))
    for line in placement.get("routing", []):
        for name, marker in _ROUTING_WARNINGS:
            if marker in line:
                found.setdefault(name, []).append(line)
    return found


def check_load(exp: Expectations, placement: Mapping[str, Any], ladder: Sequence[Mapping[str, Any]],
               model: Mapping[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Check one load (its placement record, its pin-ladder records, the model's summary) against ``exp``.

    Returns the findings (one or more per checked rule) and the measured facts: ``model_buffers``
    ({type: bytes}), ``expert_bytes``, ``pinned_expert_bytes``, ``pinned_fraction`` (None without
    experts) and ``warnings`` (names found).  A rule that needs what the records do not hold (no model
    buffer line; no per-layer expert bytes) gives an ``incomplete`` finding.
    """
    buffers = model_buffers(placement)
    by_layer = [int(x) for x in model.get("expert_tensor_bytes_by_layer") or []]
    expert_total = int(model.get("expert_tensor_bytes") or 0)
    other = max(0, int(model.get("tensor_bytes") or 0) - expert_total)
    findings: list[Finding] = []
    facts: dict[str, Any] = {"model_buffers": {}, "expert_bytes": expert_total, "pinned_expert_bytes": None,
                             "pinned_fraction": None, "warnings": []}
    for b in buffers:
        facts["model_buffers"][b.buffer_type] = facts["model_buffers"].get(b.buffer_type, 0) + b.bytes
    if not buffers:
        for rule in ("placement", "weights", "pinned"):
            if rule_on(exp, rule):
                findings.append(Finding(rule, "incomplete", "no model buffer in the record",
                                        "the placement record has no load_tensors model buffer line"))
    else:
        placed = None
        if exp.experts is not None:
            if expert_total == 0:
                findings.append(Finding("placement", "passed", "no expert tensors", "the model has no expert tensors"))
            elif sum(by_layer) != expert_total:
                findings.append(Finding("placement", "incomplete", "no per-layer expert bytes",
                                        "the model summary has no expert_tensor_bytes_by_layer matching its experts"))
            else:
                placed, found = place_experts(buffers, by_layer, other, exp.experts)
                findings += found
        if exp.weights is not None:
            wrong = [b for b in buffers if not any(_matches(b.buffer_type, p) for p in exp.weights)]
            if wrong:
                types = sorted({b.buffer_type for b in wrong})
                findings.append(Finding("weights", "failed",
                                        f"model weights in {', '.join(types)}, expected {' or '.join(exp.weights)}",
                                        "model weights in " + ", ".join(f"{b.buffer_type} ({_mib(b.bytes)})" for b in wrong)
                                        + f", expected {' or '.join(exp.weights)}"))
            else:
                findings.append(Finding("weights", "passed", "as expected",
                                        "model buffers: " + ", ".join(f"{b.buffer_type} ({_mib(b.bytes)})" for b in buffers)))
        if exp.pinned is not None and expert_total:
            experts_in = placed.per_buffer if placed else [max(0, b.bytes - other) for b in buffers]
            grants = ladder_grants(buffers, ladder)
            pinned = pinned_expert_bytes(buffers, experts_in, grants)
            fraction = pinned / expert_total
            facts.update(pinned_expert_bytes=pinned, pinned_fraction=round(fraction, 6))
            rule = exp.pinned
            low = rule.min
            floor = cap_floor_bytes(rule, buffers, experts_in)
            if rule.cap_bytes is not None:
                low = max(low or 0.0, floor / expert_total)
            ok = (low is None or fraction + FRACTION_EPSILON >= low) and \
                 (rule.max is None or fraction <= rule.max + FRACTION_EPSILON)
            # the buffers that matter: those holding expert bytes and those with a pin record
            grant_text = ", ".join(f"{b.buffer_type} {_mib(b.bytes)}: " + ("no pin record" if g is None else f"granted {_mib(g)}")
                                   for b, x, g in zip(buffers, experts_in, grants) if x or g is not None)
            message = (f"{fraction:.3f} of the expert tensors pinned ({_mib(pinned)} of {_mib(expert_total)}), "
                       f"expected {rule.describe()}" + (f" ({floor / expert_total:.3f})" if rule.cap_bytes else "")
                       + f"; {grant_text}")
            key = f"pinned fraction {'below' if low is not None and fraction + FRACTION_EPSILON < low else 'above'} " \
                  f"{rule.describe()}"
            findings.append(Finding("pinned", "passed" if ok else "failed", "as expected" if ok else key, message,
                                    [str(r.get("line", "")) for r in ladder if r.get("kind") in SUMMARY_KINDS][:6]))
    found = warnings_found(placement, ladder)
    facts["warnings"] = sorted(found)
    if exp.present or exp.absent:
        bad = False
        for name in exp.present:
            if name not in found:
                bad = True
                findings.append(Finding("warnings", "failed", f"warning {name} missing",
                                        f"warning {name} missing: {WARNINGS[name]}"))
        for name in exp.absent:
            if name in found:
                bad = True
                findings.append(Finding("warnings", "failed", f"unexpected warning {name}",
                                        f"unexpected warning {name}: {found[name][0]}", found[name][:3]))
        if not bad:
            findings.append(Finding("warnings", "passed", "as expected",
                                    f"present: {', '.join(exp.present) or '-'}; absent: {', '.join(exp.absent) or '-'}"))
    return findings, facts
