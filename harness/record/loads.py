"""The records of one model load, typed: the files beside a load's stderr under ``<config>/gen/<model>/``
(harness.record.layout.LOAD_FILES, named by RunLayout.load_file), written by the comparisons
(harness.stages.outputs) and read by triage, the report, the signatures and the expectations check.

* ``<stem>.cmd``: the command line of the process (:class:`LoadCommand`): argv, the environment added on top of
  the harness's, and the time limit;
* ``<stem>.placement.json``: the buffers llama logged (harness.record.gpu.buffer_placement; :class:`Placement`);
* ``<stem>.pin-ladder.json``: the pin-ladder lines (harness.record.gpu.parse_ladder_lines; :class:`PinLadder`),
  only for a load that logged one.

Each reader raises FileNotFoundError naming the file where there is none, and
harness.record.records.RecordError naming it (its ``reason`` without the name) where it is not JSON or not of
its record's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .gpu import ladder_totals, last_load_model_buffers
from .json_files import read_record_json
from .records import RecordError


@dataclass(frozen=True)
class LoadCommand:
    """A load's ``.cmd``: ``argv`` (the full command, launcher first), ``env`` (added on top of the harness's
    environment), ``launcher_env`` (the launcher's own, llama-completion runs only) and ``timeout_s`` (seconds;
    None where not recorded)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None

    @property
    def program(self) -> Path:
        """The command's first word as a path (a launcher's where there is one)."""
        return Path(self.argv[0])


def read_load_command(path: Path) -> LoadCommand:
    """The command record at ``path`` (a ``.cmd`` file).  Raises FileNotFoundError naming the file when there is
    none, RecordError naming it when it is not JSON or has no ``argv`` of at least one string."""
    data = read_record_json(path, "no command record")
    argv = data.get("argv") if isinstance(data, dict) else None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RecordError.at(path, "not a command record (no argv of strings)")
    timeout = data.get("timeout_s")
    try:
        return LoadCommand(tuple(argv), {str(k): str(v) for k, v in (data.get("env") or {}).items()},
                           {str(k): str(v) for k, v in (data.get("launcher_env") or {}).items()},
                           None if timeout is None else float(timeout))
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a command record ({exc})") from None


@dataclass(frozen=True)
class Placement:
    """A load's placement record: ``buffers`` ({stage, buffer_type, what, mib, load} each, in log order),
    ``by_buffer_type`` (MiB per buffer type), ``offloaded_layers`` ((offloaded, total) or None) and ``routing``
    (the GGML_CUDA_MOE_PIN_LAYERS lines), as harness.record.gpu.buffer_placement gives them."""

    buffers: tuple[Mapping[str, Any], ...]
    by_buffer_type: Mapping[str, float]
    offloaded_layers: tuple[int, int] | None
    routing: tuple[str, ...]

    def as_record(self) -> dict[str, Any]:
        """The record in the form harness.record.gpu.buffer_placement returns it (what the claim checks of
        harness.stages.checks.expectation_load read)."""
        return {"buffers": [dict(b) for b in self.buffers], "by_buffer_type": dict(self.by_buffer_type),
                "offloaded_layers": None if self.offloaded_layers is None else list(self.offloaded_layers),
                "routing": list(self.routing)}

    def model_buffers_mib(self) -> dict[str, float]:
        """``{buffer type: MiB}`` of the model (weight) buffers of the log's last model load
        (harness.record.gpu.last_load_model_buffers), summed per type and rounded to 0.01 MiB."""
        out: dict[str, float] = {}
        for b in last_load_model_buffers(self.as_record()):
            out[b["buffer_type"]] = round(out.get(b["buffer_type"], 0.0) + float(b["mib"]), 2)
        return out


def read_placement(path: Path) -> Placement:
    """The placement record at ``path`` (``<stem>.placement.json``).  Raises FileNotFoundError naming the file
    when there is none (the load logged no buffer lines), RecordError naming it when it is not JSON or not of
    the shape of :class:`Placement` (a buffer without its buffer type and MiB included)."""
    data = read_record_json(path, "no placement record")
    if not isinstance(data, dict):
        raise RecordError.at(path, "not a placement record (not an object)")
    try:
        buffers = tuple(dict(b) for b in data.get("buffers") or [])
        for i, b in enumerate(buffers):
            if not isinstance(b.get("buffer_type"), str) or isinstance(b.get("mib"), bool) \
                    or not isinstance(b.get("mib"), (int, float)):
                raise ValueError(f"buffers[{i}] has no buffer_type and mib")
        offloaded = data.get("offloaded_layers")
        return Placement(buffers, {str(k): float(v) for k, v in (data.get("by_buffer_type") or {}).items()},
                         None if offloaded is None else (int(offloaded[0]), int(offloaded[1])),
                         tuple(str(line) for line in data.get("routing") or []))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise RecordError.at(path, f"not a placement record ({exc})") from None


@dataclass(frozen=True)
class PinLadder:
    """A load's pin-ladder record: its ``lines`` as harness.record.gpu.parse_ladder_lines gives them (each with
    ``kind``, ``requested`` and ``granted`` bytes, and what else the line logged)."""

    lines: tuple[Mapping[str, Any], ...] = ()

    def totals(self) -> dict[str, Any]:
        """harness.record.gpu.ladder_totals of the lines: allocations, bytes requested and granted, segments,
        calls, seconds, warnings."""
        return ladder_totals([dict(r) for r in self.lines])



def read_pin_ladder(path: Path) -> PinLadder:
    """The pin-ladder record at ``path`` (``<stem>.pin-ladder.json``).  Raises FileNotFoundError naming the file
    when there is none (the load logged no pin-ladder line), RecordError naming it when it is not JSON or not a
    list of lines each with a ``kind`` and byte counts ``requested`` and ``granted``."""
    data = read_record_json(path, "no pin-ladder record; the load logged no pin-ladder line")
    if not isinstance(data, list):
        raise RecordError.at(path, "not a pin-ladder record (not a list)")
    for i, line in enumerate(data):
        if not isinstance(line, dict) or not isinstance(line.get("kind"), str) \
                or not all(isinstance(line.get(k), int) and not isinstance(line.get(k), bool)
                           for k in ("requested", "granted")):
            raise RecordError.at(path, f"not a pin-ladder record (line {i} has no kind, requested and granted bytes)")
    return PinLadder(tuple(data))
