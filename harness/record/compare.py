"""A candidate's comparison file, ``<platform>/<candidate>/compare.json``, typed: written by the greedy
comparisons (harness.stages.outputs.jobs, one entry per group, model and prompt), read by the report's
divergence view (harness.views.report).

Each entry is a comparison of harness.stages.outputs.divergence.StreamComparison as JSON (``prompt_id``,
``reference``, ``candidate``, ``status``, ``detail``, ``first_divergence``, ``kl``, ``text_check``, both sides'
first token ids and texts) plus its ``group`` and ``model``.  summary.json holds the same comparison without the
tokens and texts (harness.record.records.ComparisonRecord); this file is where the texts are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .json_files import read_record_json, write_json
from .records import RecordError
from ..common.json_value import JSON


@dataclass(frozen=True)
class CompareEntry:
    """One entry of compare.json: its identity (``group``, ``model``, ``prompt_id``, ``reference``, ``candidate``;
    ``group`` and ``model`` are "" in files of harnesses that did not write them), its ``status`` and
    ``detail``, and the first repeats' texts (``reference_text``, ``candidate_text``: None when the entry has
    none)."""

    group: str
    model: str
    prompt_id: str
    reference: str
    candidate: str
    status: str
    detail: str = ""
    reference_text: str | None = None
    candidate_text: str | None = None

    def matches(self, group: str, model: str, prompt: str, reference: str) -> bool:
        """True when this entry is the comparison (``group``, ``model``, ``prompt``, ``reference``); an entry
        without a group or model matches any."""
        return (self.prompt_id == prompt and self.reference == reference
                and self.group in ("", group) and self.model in ("", model))


def _text(value: JSON) -> str | None:
    return value if isinstance(value, str) else None


def parse_compare_entries(data: JSON, where: str) -> list[CompareEntry]:
    """The entries of a parsed compare.json; raises :class:`~harness.record.records.RecordError` naming ``where``
    and the entry that is not of the shape above."""
    if not isinstance(data, list):
        raise RecordError(f"{where}: not a list of comparisons")
    out = []
    for i, e in enumerate(data):
        if not isinstance(e, Mapping) or not all(isinstance(e.get(k), str) for k in ("prompt_id", "reference")):
            raise RecordError(f"{where}: entry {i} is not a comparison (no prompt_id and reference)")
        out.append(CompareEntry(str(e.get("group") or ""), str(e.get("model") or ""), e["prompt_id"], e["reference"],
                                str(e.get("candidate") or ""), str(e.get("status") or ""), str(e.get("detail") or ""),
                                _text(e.get("reference_text")), _text(e.get("candidate_text"))))
    return out


def _load(path: Path) -> JSON:
    return read_record_json(path, "no compare.json; the candidate was not compared in this run")


def read_compare_entries(path: Path) -> list[CompareEntry]:
    """The entries of the compare.json at ``path`` (harness.record.layout.RunLayout.compare_json), in the order
    recorded.  Raises FileNotFoundError naming the file when there is none, RecordError naming it when it is
    not JSON or not a list of comparisons."""
    return parse_compare_entries(_load(path), str(path))


def find_compare_entry(path: Path, group: str, model: str, prompt: str, reference: str) -> CompareEntry | None:
    """The entry of the compare.json at ``path`` for (``group``, ``model``, ``prompt``, ``reference``): the last one
    recorded (a continued run appends), None when there is none.  Raises what :func:`read_compare_entries`
    raises."""
    found = [e for e in read_compare_entries(path) if e.matches(group, model, prompt, reference)]
    return found[-1] if found else None


def record_compare_entries(path: Path, group: str, model: str, prompt: str,
                           entries: Sequence[Mapping[str, Any]]) -> None:
    """Write ``entries`` (compare.json entries as JSON objects, each with ``group``, ``model`` and ``prompt_id``) to
    the compare.json at ``path``, in place of the entries it holds for (``group``, ``model``, ``prompt``); the
    other entries are kept.  Raises RecordError naming the file when the one there cannot be read."""
    existing = _load(path) if path.exists() else []
    parse_compare_entries(existing, str(path))
    same = (group, model, prompt)
    write_json(path, [e for e in existing if (e.get("group"), e.get("model"), e.get("prompt_id")) != same]
               + list(entries))
