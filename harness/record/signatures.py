"""A run's ``signatures.json`` (harness.record.layout.RunLayout.signatures_json), typed: written by
harness.triage.signatures.classify_run, read back by it (harness.triage.signatures.load_signatures) for triage,
the report and the forecast.

One :class:`SignatureEntry` per failed step and per failed comparison, each with the failure's signature
({kind, key, summary, evidence}, harness.triage.text_rules.Signature as JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .json_files import read_record_json
from .records import RecordError
from ..common.json_value import JSON

#: The keys of a signature.
SIGNATURE_KEYS = ("kind", "key", "summary", "evidence")
#: The keys naming a comparison, in entries of step ``compare`` only.
COMPARISON_KEYS = ("group", "model", "prompt", "reference")


@dataclass(frozen=True)
class SignatureEntry:
    """One failure of a run: the ``platform``, ``config`` (the candidate of a comparison) and ``step`` (``compare``
    for a comparison) it belongs to, its ``signature``, the ``other_signatures`` of a step with several distinct
    failures, and for a comparison its ``comparison`` (group, model, prompt, reference; empty for a step)."""

    platform: str
    config: str
    step: str
    signature: Mapping[str, str]
    other_signatures: tuple[Mapping[str, str], ...] = ()
    comparison: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as classify_run writes it: platform, config, step, the comparison's keys, signature and
        other_signatures where there are some."""
        out: dict[str, Any] = {"platform": self.platform, "config": self.config, "step": self.step,
                               **(dict(self.comparison) if self.comparison is not None else {}),
                               "signature": dict(self.signature)}
        if self.other_signatures:
            out["other_signatures"] = [dict(s) for s in self.other_signatures]
        return out


def _signature(data: JSON, where: str) -> dict[str, str]:
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in SIGNATURE_KEYS):
        raise ValueError(f"{where} is not a signature ({', '.join(SIGNATURE_KEYS)})")
    return {k: data[k] for k in SIGNATURE_KEYS}


def read_signatures(path: Path) -> tuple[SignatureEntry, ...]:
    """The entries of the signatures record at ``path``, in order.  Raises FileNotFoundError naming the file when
    there is none (the run was not classified), RecordError naming it when it is not JSON or not a list of
    entries each with its platform, config, step and signature."""
    data = read_record_json(path, "no signatures.json; the run's signatures were not written")
    out = []
    try:
        if not isinstance(data, list):
            raise ValueError("not a list")
        for i, e in enumerate(data):
            if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in ("platform", "config", "step")):
                raise ValueError(f"entry {i} has no platform, config and step")
            compare = e["step"] == "compare"
            out.append(SignatureEntry(
                e["platform"], e["config"], e["step"], _signature(e.get("signature"), f"entry {i}'s signature"),
                tuple(_signature(s, f"entry {i}'s other signature {j}")
                      for j, s in enumerate(e.get("other_signatures") or [])),
                {k: str(e.get(k, "")) for k in COMPARISON_KEYS} if compare else None))
    except ValueError as exc:
        raise RecordError.at(path, f"not a signatures record ({exc})") from None
    return tuple(out)
