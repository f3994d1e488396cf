"""One load checked against its rules: from the runtime probe, with the load's own lines as claims.

A load is one process that loaded a model (the engine, a llama-completion run).  Its
placement, weights, page-locked and memory-mapped bytes are judged from the probe of the
configuration's engine load (harness.record.probe, harness.stages.checks.expectation_probe): the
engine probes its own load; llama-completion has no probe, and its lines are checked as
claims against the engine's.  Its placement record (harness.record.gpu.buffer_placement)
and pin-ladder records (harness.record.gpu.parse_ladder_lines) are claims; its warnings
are facts of its log.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...record.gpu import last_load_model_buffers
from ...record.probe import Probe
from .expectation_probe import (LOGGED_MIB_TOLERANCE_BYTES, claim_findings, coverage, mapped_findings,
                                pin_claims, placement_findings, pinned_findings, weights_findings)
from .expectation_rules import WARNINGS, Expectations, Finding, rule_on
from ...record.expectations import FINDING_FAILED, FINDING_INCOMPLETE, FINDING_PASSED

__all__ = ["LOGGED_MIB_TOLERANCE_BYTES", "Finding", "check_load", "model_buffers", "warnings_found"]

_ROUTING_WARNINGS = (("pin-layers-invalid", "- ignoring it"), ("pin-layers-clamped", "is larger than the number of layers"),
                     ("pin-layers-no-effect", "has no effect"))


def model_buffers(placement: Mapping[str, Any]) -> dict[str, int]:
    """The model (weight) buffers of a placement record (harness.record.gpu.buffer_placement) as logged: bytes
    per buffer type (from the logged MiB) over the ``load_tensors`` lines whose buffer is ``model``, of the
    log's last model load (the one the probe beside it describes: each load rewrites the probe)."""
    out: dict[str, int] = {}
    for b in last_load_model_buffers(dict(placement)):
        out[b["buffer_type"]] = out.get(b["buffer_type"], 0) + round(float(b["mib"]) * 2**20)
    return out


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
               model: Mapping[str, Any], probe: Probe | None, probe_problem: str = "",
               source: str = "the engine") -> tuple[list[Finding], dict[str, Any]]:
    """Check one load against ``exp``: the rules from ``probe`` (the configuration's engine probe; None with
    ``probe_problem`` saying why there is none), the load's logged buffers, pin-ladder records and routing
    lines (``placement``, ``ladder``) as claims against it, and its warnings from its log.  ``model`` is the
    model's summary (``n_layer``, ``expert_tensor_bytes``, ``expert_tensor_bytes_by_layer``); ``source``
    names whose log it is.

    Returns the findings (one or more per checked rule) and the measured facts: ``model_buffers``
    ({type: bytes} as logged), ``probe_buffers`` ({type: bytes}), ``layers`` ({type: [layer, ...]} of
    the experts), ``expert_bytes``, ``pinned_expert_bytes``, ``pinned_fraction`` (None without experts
    or without a driver count), ``page_locked_bytes`` (every weight buffer, the driver's count),
    ``claimed_granted_bytes`` (the grants the load's pin lines claim for those buffers; None without such a line) and ``warnings`` (names found).  Without a probe,
    every rule but ``warnings`` is ``incomplete``: never passed on the fork's word.
    """
    by_layer = [int(x) for x in model.get("expert_tensor_bytes_by_layer") or []]
    expert_total = int(model.get("expert_tensor_bytes") or 0)
    n_layer = int(model.get("n_layer") or len(by_layer))
    logged = model_buffers(placement)
    facts: dict[str, Any] = {"model_buffers": logged, "probe_buffers": None, "layers": None, "expert_bytes": expert_total,
                             "pinned_expert_bytes": None, "pinned_fraction": None, "page_locked_bytes": None,
                             "claimed_granted_bytes": None,
                             "warnings": []}
    findings: list[Finding] = []
    if probe is None:
        for rule in ("placement", "weights", "pinned", "mapped", "claims"):
            if rule_on(exp, rule):
                findings.append(Finding(rule, FINDING_INCOMPLETE, "no probe record", probe_problem or "no probe record"))
    else:
        claimed = pin_claims(probe, ladder)
        facts.update(probe_buffers=probe.buffer_bytes_by_type(), layers=probe.layers_by_buffer_type(),
                     page_locked_bytes=probe.page_locked_bytes(),
                     claimed_granted_bytes=sum(int(r["granted"]) for r, _ in claimed) if claimed else None)
        short = coverage(probe, by_layer) if expert_total else ""
        if exp.experts is not None:
            if not expert_total:
                findings.append(Finding("placement", FINDING_PASSED, "no expert tensors", "the model has no expert tensors"))
            elif sum(by_layer) != expert_total:
                findings.append(Finding("placement", FINDING_INCOMPLETE, "no per-layer expert bytes",
                                        "the model summary has no expert_tensor_bytes_by_layer matching its experts"))
            elif short:
                findings.append(Finding("placement", FINDING_INCOMPLETE, "the probe missed expert tensors", short))
            else:
                findings += placement_findings(exp, probe, n_layer)
        if exp.weights is not None:
            findings += weights_findings(exp.weights, probe)
        if exp.pinned is not None and expert_total:
            if short:
                findings.append(Finding("pinned", FINDING_INCOMPLETE, "the probe missed expert tensors", short))
            else:
                found, pinned = pinned_findings(exp.pinned, probe, expert_total)
                findings += found
                if pinned is not None:
                    facts.update(pinned_expert_bytes=pinned, pinned_fraction=round(pinned / expert_total, 6))
        if exp.mapped is not None:
            findings += mapped_findings(exp.mapped, probe)
        findings += claim_findings(probe, logged, ladder, placement.get("routing", []), source)
    warned = warnings_found(placement, ladder)
    facts["warnings"] = sorted(warned)
    if exp.present or exp.absent:
        bad = False
        for name in exp.present:
            if name not in warned:
                bad = True
                findings.append(Finding("warnings", FINDING_FAILED, f"warning {name} missing",
                                        f"warning {name} missing: {WARNINGS[name]}"))
        for name in exp.absent:
            if name in warned:
                bad = True
                findings.append(Finding("warnings", FINDING_FAILED, f"unexpected warning {name}",
                                        f"unexpected warning {name}: {warned[name][0]}", warned[name][:3]))
        if not bad:
            findings.append(Finding("warnings", FINDING_PASSED, "as expected",
                                    f"present: {', '.join(exp.present) or '-'}; absent: {', '.join(exp.absent) or '-'}"))
    return findings, facts
