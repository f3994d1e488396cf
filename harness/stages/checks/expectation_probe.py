"""The rules of one load judged from the runtime probe, and the load's own lines checked as claims against it.

The probe (harness.record.probe) says, per weight, which buffer and buffer type hold it,
how many of its bytes the CUDA driver reports page-locked and how many the model file
backs.  From it, exactly:

``placement``
    every expert tensor of each layer range is in a buffer type of that range (per
    layer and per tensor: a layer's experts in the wrong buffer type fail even where
    every layer's experts have the same size).
``weights``
    every weight the graphs read is in a buffer type of the list.
``pinned``
    the fraction of the experts' bytes the driver reports page-locked.
``mapped``
    memory-mapped loads: every host weight outside ``CPU_REPACK`` (weights upstream
    repacks for its CPU kernels live in anonymous memory by design) is backed by the
    model file, by the memory map's name and by the OS's page flags (no page a private
    copy); loads with mmap off: none is.

``claims``: what the load logged, checked against the probe: llama's model buffer sizes per
buffer type, each pin-ladder grant against the page-locked bytes the driver reports for
the buffer of that size, and the fork's GGML_CUDA_MOE_PIN_LAYERS summary against the
layers the probe finds in each buffer type.  A claim that disagrees is a failure of its own.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Mapping, Sequence

from ...record.gpu import SUMMARY_KINDS
from ...record.probe import PROBE_STEP_BYTES, Probe, ProbeBuffer, ProbeWeight, group_layers, layers_text
from .expectation_rules import Expectations, Finding, Pinned
from ...record.expectations import FINDING_FAILED, FINDING_INCOMPLETE, FINDING_PASSED

#: The buffer type of weights upstream repacks for its CPU kernels (ggml-cpu's extra buffer type): anonymous
#: memory by design, whatever the load mode.
REPACK_BUFFER_TYPE = "CPU_REPACK"
#: llama prints buffer sizes in MiB with two decimals: a logged size is within half of 0.01 MiB of the bytes.
LOGGED_MIB_TOLERANCE_BYTES = int(0.005 * 2**20) + 1
#: The pin ladder's smallest chunk (GGML_CUDA_PIN_CHUNK_MIN_MB, default 16 MiB, ggml-cuda/pin-ladder.cuh): under a
#: simulated total cap the ladder stops within one smallest chunk of the cap.
PIN_CHUNK_MIN_BYTES = 16 * 2**20
#: A grant and the driver's count agree within two samples of the probe: the count is exact to one sample per
#: end of a registered segment.
CLAIM_TOLERANCE_BYTES = 2 * PROBE_STEP_BYTES
#: Two fractions closer than this are equal (bytes over gigabytes: far below one byte in a million).
FRACTION_EPSILON = 1e-9
#: The fork's routing summary (patch 0003, src/llama-moe-pin.h llama_moe_pin_summary):
#: ``GGML_CUDA_MOE_PIN_LAYERS=2: expert tensors of layers 0-1 in CUDA_Host, layers 2-7 in CPU (pageable)``.
_SUMMARY = re.compile(r"GGML_CUDA_MOE_PIN_LAYERS=\d+: expert tensors of (?P<parts>.*?)(?:;|$)")
_PART = re.compile(r"(?:layers? (?P<first>\d+)(?:-(?P<last>\d+))?|none) in (?P<buft>[\w.-]+)")


def mib(n: float) -> str:
    """``n`` bytes as whole MiB, e.g. ``4733 MiB``."""
    return f"{n / 2**20:.0f} MiB"


def matches(buffer_type: str, pattern: str) -> bool:
    """True when ``buffer_type`` is ``pattern`` or matches it as an fnmatch pattern (``CUDA[0-9]*``), or one of
    the alternatives of a pattern written ``A|B`` (``CPU_Mapped|CPU_REPACK``)."""
    return any(fnmatch.fnmatchcase(buffer_type, alt) for alt in pattern.split("|"))


def in_words(pattern: str) -> str:
    """A buffer type pattern for people: ``CPU_Mapped or CPU_REPACK`` for ``CPU_Mapped|CPU_REPACK``."""
    return " or ".join(pattern.split("|"))


def coverage(probe: Probe, by_layer: Sequence[int]) -> str:
    """Why the probe cannot judge the experts ("" when it can): a layer whose expert bytes in the model
    file (``by_layer``) exceed what the probe saw of that layer."""
    seen = probe.expert_bytes_by_layer()
    short = [i for i, need in enumerate(by_layer) if need and seen.get(i, 0) < need]
    if not short:
        return ""
    return (f"the probe saw {mib(sum(seen.get(i, 0) for i in short))} of the {mib(sum(by_layer[i] for i in short))} "
            f"of expert tensors of layers {layers_text(short)}")


def placement_findings(exp: Expectations, probe: Probe, n_layer: int) -> list[Finding]:
    """``placement``: per layer range of ``exp.experts``, the layers whose expert tensors the probe finds in a
    buffer type not matching the range's, named with where they are; one passed finding otherwise."""
    assert exp.experts is not None
    where = probe.expert_layers()
    out = []
    for r in exp.experts:
        wrong: dict[str, list[int]] = {}
        for layer in r.layers(n_layer):
            for t in sorted(where.get(layer, ())):
                if not matches(t, r.buffer_type):
                    wrong.setdefault(t, []).append(layer)
        for t, layers in sorted(wrong.items()):
            text = f"expert tensors of layers {layers_text(layers)} in {t}, expected {in_words(r.buffer_type)}"
            out.append(Finding("placement", FINDING_FAILED, text, text + " (the probe)"))
    if not out:
        text = "; ".join(f"layers {layers_text(v)} in {t}" for t, v in probe.layers_by_buffer_type().items())
        out.append(Finding("placement", FINDING_PASSED, "as expected", f"expert tensors: {text or 'none'} (the probe)"))
    return out


def weights_findings(weights: Sequence[str], probe: Probe) -> list[Finding]:
    """``weights``: every weight the probe saw is in a buffer type matching one of ``weights``."""
    wrong: dict[str, int] = {}
    for w in probe.weights:
        if not any(matches(w.buffer.buffer_type, p) for p in weights):
            wrong[w.buffer.buffer_type] = wrong.get(w.buffer.buffer_type, 0) + w.bytes
    want = " or ".join(weights)
    if wrong:
        return [Finding("weights", FINDING_FAILED, f"model weights in {', '.join(sorted(wrong))}, expected {want}",
                         "model weights in " + ", ".join(f"{t} ({mib(n)})" for t, n in sorted(wrong.items()))
                         + f", expected {want} (the probe)")]
    return [Finding("weights", FINDING_PASSED, "as expected",
                     "model weights in " + ", ".join(f"{t} ({mib(n)})" for t, n in probe.buffer_bytes_by_type().items()))]


def cap_floor_bytes(rule: Pinned, probe: Probe) -> int:
    """Expert bytes a simulated total cap of ``rule.cap_bytes`` must still let be page-locked: the weight
    buffers of ``rule.capped_type`` (S bytes, X of them experts, from the probe) are granted at least
    ``min(cap, S)`` less one smallest ladder chunk (:data:`PIN_CHUNK_MIN_BYTES`), of which at least that
    minus ``S - X`` are expert bytes."""
    if rule.cap_bytes is None:
        return 0
    s = sum(b.bytes for b in probe.buffers if matches(b.buffer_type, rule.capped_type))
    x = sum(w.bytes for w in probe.experts if matches(w.buffer.buffer_type, rule.capped_type))
    return max(0, min(rule.cap_bytes, s) - PIN_CHUNK_MIN_BYTES - (s - x))


def pinned_findings(rule: Pinned, probe: Probe, expert_total: int) -> tuple[list[Finding], int | None]:
    """``pinned``: the page-locked fraction of the experts' bytes (``expert_total``, the model file's), from the
    driver's count in the probe.  Returns the findings and the page-locked expert bytes (None: the probe has
    no driver's count, which is incomplete)."""
    if probe.driver is None:
        return [Finding("pinned", FINDING_INCOMPLETE, "no driver count in the probe",
                         "the probe has no page-locked counts (the engine was built without its GPU kind's "
                         "probe)")], None
    pinned = sum(w.page_locked or 0 for w in probe.experts)
    fraction = pinned / expert_total
    low = rule.min
    floor = cap_floor_bytes(rule, probe)
    if rule.cap_bytes is not None:
        low = max(low or 0.0, floor / expert_total)
    ok = (low is None or fraction + FRACTION_EPSILON >= low) and (rule.max is None or fraction <= rule.max + FRACTION_EPSILON)
    per_type: dict[str, list[int]] = {}
    for w in probe.experts:
        got = per_type.setdefault(w.buffer.buffer_type, [0, 0])
        got[0] += w.page_locked or 0
        got[1] += w.bytes
    detail = ", ".join(f"{t}: {mib(a)} of {mib(b)}" for t, (a, b) in sorted(per_type.items()))
    message = (f"{fraction:.3f} of the expert tensors page-locked according to the driver ({mib(pinned)} of "
               f"{mib(expert_total)}), expected {rule.describe()}" + (f" ({floor / expert_total:.3f})" if rule.cap_bytes else "")
               + f"; {detail}")
    key = f"pinned fraction {'below' if low is not None and fraction + FRACTION_EPSILON < low else 'above'} {rule.describe()}"
    return [Finding("pinned", FINDING_PASSED if ok else FINDING_FAILED, "as expected" if ok else key, message)], pinned


def mapped_findings(mapped: bool, probe: Probe) -> list[Finding]:
    """``mapped``: with ``mapped`` every host weight outside :data:`REPACK_BUFFER_TYPE` is wholly backed by the
    model file, by the memory map's name and by its pages (none a private copy, by the OS's page flags:
    harness.record.probe); without, none of its bytes are.  Incomplete where the probe has no map count, or,
    with ``mapped`` and no failure of the map's name, no page counts."""
    host = [w for w in probe.weights if w.buffer.host and w.buffer.buffer_type != REPACK_BUFFER_TYPE]
    if any(w.file_backed is None for w in host):
        return [Finding("mapped", FINDING_INCOMPLETE, "no map count in the probe", "the probe has no file-backed counts")]
    if mapped:
        bad = [w for w in host if (w.file_backed or 0) < w.bytes]  # None: returned above
        what, want = "not backed by the model file (anonymous memory)", "memory-mapped"
    else:
        bad = [w for w in host if (w.file_backed or 0) > 0]
        what, want = "backed by the model file", "read into memory (mmap off)"
    if bad:
        types = sorted({w.buffer.buffer_type for w in bad})
        return [Finding("mapped", FINDING_FAILED, f"host weights in {', '.join(types)} {what}, expected {want}",
                         f"{len(bad)} host weight(s) in {', '.join(types)} ({mib(sum(w.bytes for w in bad))}) {what}, "
                         f"expected {want}; first: {bad[0].name} (the process's memory map)")]
    total = sum(w.bytes for w in host)
    if not mapped:
        return [Finding("mapped", FINDING_PASSED, "as expected", f"{len(host)} host weight(s) ({mib(total)}) in anonymous memory")]
    return pages_findings(probe, host, total)


def _anonymous_text(probe: Probe) -> str:
    """``; smaps: the model's mappings hold 59 MiB anonymous`` (empty without a smaps reading)."""
    if not probe.file_mappings:
        return ""
    return f"; smaps: the model's mappings hold {mib(sum(m.anonymous for m in probe.file_mappings))} anonymous"


def pages_findings(probe: Probe, host: Sequence[ProbeWeight], total: int) -> list[Finding]:
    """The page half of ``mapped`` for ``host`` weights (``total`` bytes) the memory map names as the model
    file's: failed where a page of one is a private copy, incomplete where the probe has no page counts.  A
    record of an engine older than the page counts (:attr:`Probe.pages_read`) is judged by the map's name alone,
    and the message says so."""
    if not probe.pages_read:
        return [Finding("mapped", FINDING_PASSED, "as expected",
                         f"{len(host)} host weight(s) ({mib(total)}) backed by the model file (pages not read: a "
                         "record of an engine older than the page counts)")]
    if any(w.private_pages is None for w in host):
        return [Finding("mapped", FINDING_INCOMPLETE, "no page counts in the probe",
                         "the probe has no page counts (the OS's page flags could not be read, or an older engine)")]
    bad = [w for w in host if w.private_pages]
    if bad:
        types = sorted({w.buffer.buffer_type for w in bad})
        layers = sorted({w.layer for w in bad if w.layer >= 0})
        return [Finding("mapped", FINDING_FAILED,
                         f"host weights in {', '.join(types)}: pages privately copied under the model file's name, "
                         "expected the file's pages",
                         f"{len(bad)} host weight(s) in {', '.join(types)} ({mib(sum(w.bytes for w in bad))}"
                         + (f"; layers {layers_text(layers)}" if layers else "")
                         + f") hold {mib(sum(w.private_pages or 0 for w in bad))} of private page copies under the "
                         f"model file's name, expected the file's pages; first: {bad[0].name} (the OS's page flags)"
                         + _anonymous_text(probe))]
    untold = sum(w.file_backed - (w.file_pages or 0) for w in host if w.file_backed is not None)
    return [Finding("mapped", FINDING_PASSED, "as expected",
                     f"{len(host)} host weight(s) ({mib(total)}) backed by the model file, no page a private copy"
                     + (f" ({mib(untold)} outside the working set: the OS does not say)" if untold else "")
                     + _anonymous_text(probe))]


def _buffer_of_size(buffers: Sequence[ProbeBuffer], size: int, used: set[int]) -> int | None:
    """The index of the unused host buffer whose size is closest to ``size`` within one probe sample."""
    best = None
    for i, b in enumerate(buffers):
        if i in used or not b.host:
            continue
        gap = abs(b.bytes - size)
        if gap <= PROBE_STEP_BYTES and (best is None or gap < abs(buffers[best].bytes - size)):
            best = i
    return best


#: The summary's note that the host buffer type hands out plain memory (GGML_CUDA_NO_PINNED, a device without
#: pinned host buffers): its layers then sit in a buffer of type CPU of their own.
_NOT_PAGE_LOCKED = "is not page-locked on this device"


def pin_claims(probe: Probe, ladder: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], ProbeBuffer]]:
    """The pin-ladder summary records of a load that claim a grant for one of the probe's weight buffers, each
    with that buffer (matched by size, each buffer once); records of other buffers (a context's compute or
    output buffer) are left out: the probe does not cover them."""
    used: set[int] = set()
    out = []
    for r in ladder:
        if r.get("kind") not in SUMMARY_KINDS:
            continue
        i = _buffer_of_size(probe.buffers, int(r["requested"]), used)
        if i is not None:
            used.add(i)
            out.append((r, probe.buffers[i]))
    return out


def routing_claims(lines: Sequence[str]) -> tuple[dict[int, str], bool] | None:
    """(layer -> buffer type as the fork's GGML_CUDA_MOE_PIN_LAYERS summary line names them, whether the line
    says the host buffer type is not page-locked), or None where no summary was logged."""
    for line in lines:
        m = _SUMMARY.search(line)
        if not m:
            continue
        out: dict[int, str] = {}
        for part in _PART.finditer(m.group("parts")):
            if part.group("first") is None:
                continue
            first = int(part.group("first"))
            last = int(part.group("last") or first)
            out.update({n: part.group("buft") for n in range(first, last + 1)})
        return out, _NOT_PAGE_LOCKED in line
    return None


def routing_disagreements(probe: Probe, named: Mapping[int, str], host_unpinned: bool) -> list[int]:
    """The layers whose experts the probe does not find where the summary puts them.  The summary splits the
    layers into groups by buffer type; a group's experts must sit in buffers of that type (or, where the
    summary says the host type is not page-locked, of type CPU) and in no buffer of another group."""
    groups: dict[str, list[int]] = {}
    for layer, t in named.items():
        groups.setdefault(t, []).append(layer)
    holders: dict[int, set[int]] = {}  # layer -> indices of the buffers holding its experts
    kinds: dict[int, set[str]] = {}
    index = {id(b): i for i, b in enumerate(probe.buffers)}
    for w in probe.experts:
        holders.setdefault(w.layer, set()).add(index[id(w.buffer)])
        kinds.setdefault(w.layer, set()).add(w.buffer.buffer_type)
    used = {t: set().union(*(holders.get(n, set()) for n in layers)) for t, layers in groups.items()}
    wrong = []
    for t, layers in groups.items():
        allowed = {t, "CPU"} if host_unpinned else {t}
        others = set().union(*(b for u, b in used.items() if u != t))
        for n in layers:
            if n in kinds and (not kinds[n] <= allowed or holders[n] & others):
                wrong.append(n)
    return sorted(wrong)


def _by_type(layers: Mapping[int, set[str]]) -> str:
    """``0-1 in CUDA_Host, 2-7 in CPU``: layers grouped by the buffer types holding their experts."""
    return ", ".join(f"{layers_text(v)} in {t}" for t, v in group_layers(layers).items())


def claim_findings(probe: Probe, buffers: Mapping[str, int], ladder: Sequence[Mapping[str, Any]],
                   routing: Sequence[str], source: str) -> list[Finding]:
    """``claims``: the load's logged model buffers per type (``buffers``, bytes), its pin-ladder records and its
    routing lines, each checked against ``probe``; ``source`` names whose log it is (``the engine``, ``a
    llama-completion run``).  One finding per disagreement (keys without byte counts), else one passed."""
    out = []
    probed = probe.buffer_bytes_by_type()
    tol = LOGGED_MIB_TOLERANCE_BYTES * max(1, len(buffers))
    for t in sorted(probed):  # a logged type the probe lacks holds only weights no graph reads
        if abs(probed[t] - buffers.get(t, 0)) > tol:
            out.append(Finding("claims", FINDING_FAILED, f"buffer sizes: {source} logs {t} unlike the probe",
                                f"buffer sizes: {source} logs {t} {mib(buffers.get(t, 0))}; "
                                f"the probe finds {mib(probed[t])} of weight buffers of that type"))
    if probe.driver is not None:
        for r, b in pin_claims(probe, ladder):
            granted, locked = int(r["granted"]), b.page_locked or 0
            if abs(granted - locked) > CLAIM_TOLERANCE_BYTES:
                rel = "more" if granted > locked else "less"
                out.append(Finding("claims", FINDING_FAILED, f"pinning: the pin line reports {rel} than the driver holds",
                                    f"pinning: {source}'s pin line reports {mib(granted)} granted for the {mib(b.bytes)} "
                                    f"{b.buffer_type} buffer; the driver reports {mib(locked)} page-locked",
                                    [str(r.get("line", ""))]))
    claimed = routing_claims(routing)
    if claimed and claimed[0]:
        named, host_unpinned = claimed
        wrong = routing_disagreements(probe, named, host_unpinned)
        if wrong:
            said = _by_type({n: {t} for n, t in named.items()})
            got = _by_type({n: t for n, t in probe.expert_layers().items() if n in named})
            out.append(Finding("claims", FINDING_FAILED, "routing: the summary names other layers than the probe finds",
                                f"routing: {source}'s summary puts layers {said}; the probe finds {got} "
                                f"(layers {layers_text(wrong)} disagree)",
                                [line for line in routing if "expert tensors of" in line][:1]))
    if not out:
        out.append(Finding("claims", FINDING_PASSED, "as probed", f"{source}'s buffer, pin and routing lines agree with the probe"))
    return out
