"""The reload record: a model loaded, probed and freed several times in one engine process.

The harness's engine (harness/stages/outputs/engine/engine.cpp, request ``reload <count> <path>``)
writes ``<config>/gen/<model>/engine.reloads.json`` from an engine process of its own (its log:
``engine.reloads.log``), for the pin configurations (harness.stages.checks.reloads).  Beside
the engine's own load, the model is loaded with the same parameters, its weights found as the
probe finds them (harness.record.probe), and freed, ``count`` times:

- ``baseline``: the process's memory before the first of those loads;
- ``cycles``: per load, ``load_ms``, the process's memory while ``loaded`` and after the free
  (``freed``), and per weight buffer ``buffer_type``, ``bytes``, ``host``, ``page_locked`` (the
  bytes the CUDA driver reports page-locked while loaded, as the probe counts them) and
  ``page_locked_after_free`` (the same range asked again after the free: a registration kept past
  the free still answers ``cudaMemoryTypeHost``);
- ``driver``: ``"cuda"`` when the engine was built with the CUDA runtime, else null (the
  page-locked counts are null then);
- ``reload_ms``: what the loads cost, in milliseconds.

A process's memory is ``rss`` (VmRSS), ``locked`` (VmLck: mlock'ed) and ``pinned`` (VmPin: pages
a driver pinned and accounted to the process), in bytes from ``/proc/self/status``; on Windows
``rss`` is the working set and the others are null.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .expectations import FINDING_FAILED, Finding
from .probe import engine_record
from .json_files import read_record_json
from .records import RecordError
from ..common.json_value import JSON

#: The name of the reload record beside a load's ``engine.stderr``.
RELOADS_FILE = "engine.reloads.json"
#: The log of the engine process that made it (its loads' lines; not a ``.stderr``: not a load the
#: expectations judge).
RELOADS_LOG = "engine.reloads.log"
#: The command line of that engine process.
RELOADS_CMD = "engine.reloads.cmd"


class ReloadError(ValueError):
    """A reload record that cannot be read, does not have the shape above, or is the harness's record of an
    engine that failed the request (``{"error": ...}``; :attr:`engine_failed` is then true)."""

    def __init__(self, message: str, engine_failed: bool = False):
        super().__init__(message)
        self.engine_failed = engine_failed


@dataclass(frozen=True)
class Memory:
    """The process's memory in bytes (None: the OS did not say): resident, locked (VmLck), pinned (VmPin)."""

    rss: int | None
    locked: int | None
    pinned: int | None


@dataclass(frozen=True)
class ReloadBuffer:
    """One weight buffer of a reload: its type, bytes, whether host memory, and the bytes the driver reports
    page-locked while loaded and after the free (None: not asked)."""

    buffer_type: str
    bytes: int
    host: bool
    page_locked: int | None
    page_locked_after_free: int | None


@dataclass(frozen=True)
class ReloadCycle:
    """One load and free: its time, the process's memory while loaded and after the free, its weight buffers."""

    load_ms: float
    loaded: Memory
    freed: Memory
    buffers: tuple[ReloadBuffer, ...]

    @property
    def granted(self) -> int:
        """Bytes of the host weight buffers the driver reported page-locked while loaded."""
        return sum(b.page_locked or 0 for b in self.buffers if b.host)

    @property
    def left(self) -> int:
        """Bytes of the freed host weight buffers the driver still reports page-locked."""
        return sum(b.page_locked_after_free or 0 for b in self.buffers if b.host)


@dataclass(frozen=True)
class Reloads:
    """One reload record (see the module)."""

    baseline: Memory
    cycles: tuple[ReloadCycle, ...]
    driver: str | None
    reload_ms: float


def _count(value: JSON, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReloadError(f"{where}: expected a byte count, got {value!r}")
    return value


def _memory(data: JSON, where: str) -> Memory:
    if not isinstance(data, Mapping):
        raise ReloadError(f"{where}: expected the process's memory, got {data!r}")
    return Memory(*(_count(data.get(k), f"{where}.{k}") for k in ("rss", "locked", "pinned")))


def _ms(value: JSON, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReloadError(f"{where}: expected milliseconds, got {value!r}")
    return float(value)


def parse_reloads(data: Mapping[str, Any], where: str = "reloads") -> Reloads:
    """The :class:`Reloads` of a parsed record; raises :class:`ReloadError` naming ``where`` and the key that is
    missing or of the wrong kind."""
    try:
        cycles = []
        for i, c in enumerate(data["cycles"]):
            at = f"{where}: cycles[{i}]"
            buffers = []
            for j, b in enumerate(c["buffers"]):
                bt = f"{at}.buffers[{j}]"
                size = _count(b["bytes"], f"{bt}.bytes")
                if not isinstance(b["buffer_type"], str) or not isinstance(b["host"], bool) or size is None:
                    raise ReloadError(f"{bt}: expected a buffer type, bytes and host, got {b!r}")
                locked = [_count(b.get(k), f"{bt}.{k}") for k in ("page_locked", "page_locked_after_free")]
                if any(n is not None and n > size for n in locked):
                    raise ReloadError(f"{bt}: page-locked bytes beyond the buffer's {size}")
                buffers.append(ReloadBuffer(b["buffer_type"], size, b["host"], *locked))
            cycles.append(ReloadCycle(_ms(c["load_ms"], f"{at}.load_ms"), _memory(c["loaded"], f"{at}.loaded"),
                                      _memory(c["freed"], f"{at}.freed"), tuple(buffers)))
        driver = data.get("driver")
        return Reloads(_memory(data["baseline"], f"{where}: baseline"), tuple(cycles),
                       None if driver is None else str(driver), _ms(data.get("reload_ms", 0.0), f"{where}: reload_ms"))
    except (KeyError, TypeError) as exc:
        raise ReloadError(f"{where}: not a reload record ({type(exc).__name__}: {exc})") from None


def read_reloads(path: Path) -> Reloads:
    """The reload record at ``path``; raises :class:`ReloadError` (missing, unreadable, malformed, or the
    ``{"error": ...}`` the harness writes when the engine failed the request or died in it)."""
    data = engine_record(path, ReloadError, "no reload record", "reload record")
    if "error" in data:
        raise ReloadError(f"the engine failed the reloads: {data['error']}", engine_failed=True)
    return parse_reloads(data, path.name)


def recorded_count(path: Path) -> int | None:
    """The ``count`` of loads the reload record at ``path`` was asked for (the engine writes it beside the cycles),
    None when the file is missing, unreadable, not an object or holds no count (the loads are owed again)."""
    try:
        count = engine_record(path, ReloadError, "no reload record", "reload record").get("count")
    except ReloadError:
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


# --------------------------------------------------------------------------- the check's record


@dataclass(frozen=True)
class ReloadCheck:
    """A configuration's reloads check record, ``<platform>/<config>/reloads.json`` (harness.record.layout.RunLayout
    .reloads_json), written by harness.stages.checks.reloads: ``platform``, ``config``, the check's ``status`` and
    the ``findings`` per model (rule, status, message and a stable ``key``, as the expectations record's)."""

    platform: str
    config: str
    status: str
    models: Mapping[str, tuple[Finding, ...]]

    def failed_keys(self) -> dict[tuple[str, str, str], str]:
        """(model, rule, message) -> the stable key of every failed finding (the first where one repeats)."""
        keys: dict[tuple[str, str, str], str] = {}
        for model, findings in self.models.items():
            for f in findings:
                if f.status == FINDING_FAILED:
                    keys.setdefault((model, f.rule, f.message), f.key)
        return keys


def read_reload_check(path: Path) -> ReloadCheck:
    """The reloads check record at ``path``.  Raises FileNotFoundError naming the file when there is none (the
    check did not run), harness.record.records.RecordError naming it when it is not JSON or not of the shape of
    :class:`ReloadCheck`."""
    data = read_record_json(path, "no reloads record; the reloads check did not run here")
    try:
        models = {str(model): tuple(Finding(str(f["rule"]), str(f["status"]), str(f["message"]), str(f.get("key", "")))
                                    for f in findings)
                  for model, findings in data.get("models", {}).items()}
        return ReloadCheck(str(data.get("platform", "")), str(data.get("config", "")), str(data.get("status", "")),
                           models)
    except (AttributeError, KeyError, TypeError) as exc:
        raise RecordError(f"{path}: not a reloads record ({type(exc).__name__}: {exc})") from None
