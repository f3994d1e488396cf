"""What a run recorded of its inputs, typed: ``run.json`` (its id and the command lines that ran it; written by
harness.record.run.Run), each configuration's ``config.json`` (the configuration as the matrix declared it,
harness.matrix.config.RunConfig, written by harness.stages.outputs.sessions) and ``models/<model>.json`` (each model's path and summary,
harness.stages.outputs.jobs).  Read by triage, the report and the expectations check.

Each reader raises FileNotFoundError naming the file where there is none, and
harness.record.records.RecordError naming it (its ``reason`` without the name) where it is not JSON or not of
its record's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..common.statuses import check_run_kind
from .json_files import read_record_json
from .records import RecordError


def _object(path: Path, missing: str, what: str) -> dict[str, Any]:
    data = read_record_json(path, missing)
    if not isinstance(data, dict):
        raise RecordError.at(path, f"not {what} (not an object)")
    return data


@dataclass(frozen=True)
class RunCommand:
    """One command that ran the run: its ``argv`` and when it ``started`` (ISO 8601 UTC)."""

    argv: tuple[str, ...]
    started: str


@dataclass(frozen=True)
class RunInfo:
    """A run's ``run.json``: ``run_id``, when it ``started`` (ISO 8601 UTC; "" where not recorded), the
    ``commands`` that ran it, in order (a later stage continuing the run adds one), and its ``kind``
    (harness.common.statuses.RUN_KINDS; None for a run recorded before runs had kinds:
    harness.triage.run_choice.run_kind decides those)."""

    run_id: str
    started: str
    commands: tuple[RunCommand, ...] = ()
    kind: str | None = None


def read_run_info(path: Path) -> RunInfo:
    """The run record at ``path`` (harness.record.layout.RunLayout.run_json).  Raises FileNotFoundError naming the
    file when there is none, RecordError naming it when it is not JSON or not of the shape of :class:`RunInfo`
    (a ``kind`` not among harness.common.statuses.RUN_KINDS included)."""
    data = _object(path, "no run.json; is this a run directory?", "a run record")
    try:
        kind = data.get("kind")
        return RunInfo(str(data.get("run_id") or ""), str(data.get("started") or ""),
                       tuple(RunCommand(tuple(str(a) for a in c.get("argv") or []), str(c.get("started") or ""))
                             for c in data.get("commands") or []),
                       None if kind is None else check_run_kind(kind))
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a run record ({exc})") from None


@dataclass(frozen=True)
class ConfigRecord:
    """A configuration's ``config.json`` (the harness.matrix.config.RunConfig the run generated with, as written),
    what a reader of the run shows of it: ``name``, ``build`` (the variant), the ``args`` and ``env`` added to
    every process and the ``description``.  The rest (upstream, expectations, reloads, sanitize) is the matrix's
    and read from it."""

    name: str
    build: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""


def read_run_config(path: Path) -> ConfigRecord:
    """The configuration record at ``path`` (harness.record.layout.RunLayout.config_json).  Raises
    FileNotFoundError naming the file when there is none, RecordError naming it when it is not JSON or not a
    configuration (no name and build, or args and env of the wrong kind)."""
    data = _object(path, "no config.json; the configuration did not generate here", "a configuration record")
    try:
        if not isinstance(data.get("name"), str) or not isinstance(data.get("build"), str):
            raise ValueError("no name and build")
        return ConfigRecord(data["name"], data["build"], tuple(str(a) for a in data.get("args") or []),
                            {str(k): str(v) for k, v in (data.get("env") or {}).items()},
                            str(data.get("description") or ""))
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a configuration record ({exc})") from None


@dataclass(frozen=True)
class ModelRecord:
    """A model's ``models/<model>.json``: the ``path`` of the GGUF file the run used and its ``summary``
    (harness.matrix.models.model_summary: architecture, layers, experts and their bytes per layer, ...), the
    whole record as written, which the expectation rules read."""

    path: str
    summary: Mapping[str, Any]


def read_model_record(path: Path) -> ModelRecord:
    """The model record at ``path`` (harness.record.layout.RunLayout.model_json).  Raises FileNotFoundError naming
    the file when there is none, RecordError naming it when it is not JSON or not an object."""
    data = _object(path, "no model record; the model was not assembled", "a model record")
    return ModelRecord(str(data.get("path") or ""), data)
