"""A configuration's expectations record, ``<platform>/<config>/expectations.json``, typed: written by the
expectations check (harness.stages.checks.expectations), read here by everything that shows or classifies it
(summary.md's table per configuration, the report, the signatures).

A record holds the check's ``status``, the ``rules`` per model (each rule's value and where it came from) and
one entry per model load: the ``model``, the ``load`` (``engine`` or a llama-completion run), its ``log``,
the ``facts`` measured (model buffers, expert layers per buffer type, pinned fraction, page-locked and
claimed bytes, warnings) and the ``findings`` (rule, status, message, a stable ``key``), or why it was
``skipped``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: The step whose record this is: the expectations check's (harness.stages.checks.expectations declares it with
#: this name), which the summary's review and triage read beside the record.
EXPECTATIONS_STEP = "expectations"



#: The outcomes of one rule on one load (a finding's ``status``): not a step's status; the check's step status is
#: decided from its findings (harness.stages.checks.expectations, harness.stages.checks.reloads).
FINDING_PASSED, FINDING_FAILED, FINDING_INCOMPLETE = "passed", "failed", "incomplete"


@dataclass(frozen=True)
class Finding:
    """One rule's outcome on one load: ``rule`` (placement, weights, pinned, mapped, claims, warnings),
    ``status`` (:data:`FINDING_PASSED`, :data:`FINDING_FAILED`, :data:`FINDING_INCOMPLETE`), ``message`` and ``key``
    (stable across runs: no numbers)."""

    rule: str
    status: str
    message: str
    key: str = ""


@dataclass(frozen=True)
class Load:
    """One model load of a configuration: ``model``, ``load`` (``engine`` or a run's stem), ``log`` (its stderr,
    relative to the run), ``facts`` (what was measured, as written), ``findings``, and ``skipped`` (why it was
    not checked; None when it was)."""

    model: str
    load: str
    log: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None


@dataclass(frozen=True)
class ExpectationsRecord:
    """A configuration's expectations record: ``platform``, ``config``, ``status`` of the check, ``rules``
    (model -> its rules as written) and ``loads``."""

    platform: str
    config: str
    status: str
    rules: Mapping[str, Any]
    loads: tuple[Load, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ExpectationsRecord":
        """The record from its JSON object; raises ValueError (TypeError, KeyError, AttributeError
        included) when it is not of this shape."""
        try:
            loads = tuple(Load(model=str(x.get("model", "")), load=str(x.get("load", "")), log=str(x.get("log", "")),
                               facts=dict(x.get("facts") or {}),
                               findings=tuple(Finding(str(f.get("rule", "")), str(f.get("status", "")),
                                                      str(f.get("message", "")), str(f.get("key", "")))
                                              for f in x.get("findings", [])),
                               skipped=x.get("skipped"))
                          for x in data.get("loads", []))
            return cls(str(data.get("platform", "")), str(data.get("config", "")), str(data.get("status", "")),
                       dict(data.get("rules") or {}), loads)
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not an expectations record: {exc}") from exc


def read_expectations(path: Path) -> ExpectationsRecord | None:
    """The expectations record at ``path`` (harness.record.layout.RunLayout.expectations_json), or None where it
    is missing or unreadable (not JSON, not of the record's shape): the step's own record (summary.json) then
    says what is known."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ExpectationsRecord.from_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
