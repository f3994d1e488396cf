"""The runtime probe's record: what the runtime, the driver and the OS say about one load's weights.

The harness's engine (harness/stages/outputs/engine/engine.cpp, request ``probe``) writes
``<config>/gen/<model>/engine.probe.json`` once per load.  It lists every weight the
model's graphs read, as the scheduler's eval callback sees it (a source of the nodes
that read it), and every buffer holding such a weight:

- per weight: ``name``, ``layer`` (``blk.<n>.``, else -1), ``type`` (ggml type name),
  ``bytes``, ``buffer`` (an index into ``buffers``), ``page_locked``, ``file_backed``,
  ``file_pages`` and ``private_pages``;
- per buffer: ``name`` (the buffer's, from ggml_backend_buffer_name), ``buffer_type``
  (ggml_backend_buft_name of its type), ``bytes``, ``host``, and the same four counts;
- ``driver``: the name of the runtime whose page-locked query the engine was built with, the GPU kind's
  (harness.kinds.shape.EngineProbe.driver: ``"cuda"``), else null;
- ``file_mappings``: per mapping of the model file, its ``bytes`` and what ``/proc/self/smaps``
  reports of it: ``rss``, ``shared_clean``, ``private_clean``, ``private_dirty``, ``anonymous``
  (null on Windows, absent in records of older engines);
- ``probe_ms``: what the probe cost the load, in milliseconds.

``page_locked``: bytes the CUDA driver reports page-locked (``cudaPointerGetAttributes``
gives ``cudaMemoryTypeHost``), sampled at most 1 MiB apart over the range, each sample
standing for the bytes up to the next one; null for device memory and on builds without
CUDA.  ``file_backed``: bytes of the range that the process's memory map names as the
model file's (``/proc/self/smaps``; on Windows ``VirtualQuery`` type ``MEM_MAPPED``); null for
device memory.  A map's name is not its pages: a private writable mapping of the file that
was written to holds anonymous copies under the file's name.  So of the ``file_backed``
bytes, by the OS's page flags:

- ``file_pages``: bytes whose pages are the file's.  Linux (``/proc/self/pagemap``, the
  kernel's Documentation/admin-guide/mm/pagemap.rst): a resident page flagged "file page
  or shared anonymous" (bit 61), or a page not resident and not swapped out (a read fetches
  it from the file).  Windows (``QueryWorkingSetEx``): a page in the working set marked
  ``Shared``.
- ``private_pages``: bytes whose pages are private copies.  Linux: a resident page without
  bit 61, or a swapped-out page (only anonymous pages are swapped).  Windows: a page in the
  working set not marked ``Shared``.

On Windows a page outside the working set is in neither count: ``QueryWorkingSetEx`` does
not say what it would be (Wine answers from the same pagemap bits, marking a page valid
when it is present).  Both are null for device memory and where the OS could not be asked
(pagemap unreadable), and absent in records of older engines (which have no
``file_mappings`` key either: :attr:`Probe.pages_read` is false for them).

The fork's own lines (the pin ladder's grants, the GGML_CUDA_MOE_PIN_LAYERS summary) and
llama's buffer-size lines are claims; this record is what they are checked against
(harness.stages.checks.expectation_probe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
from ..common.json_value import JSON

#: The name of a load's probe record beside its ``engine.stderr``.
PROBE_FILE = "engine.probe.json"
#: The distance between two samples of the page-locked check (engine.cpp's PROBE_STEP): a count is exact
#: to within this many bytes per range.
PROBE_STEP_BYTES = 2**20
#: Weights whose name has this part are expert tensors (as the model summary counts them,
#: harness.matrix.models, and as the fork's routing recognises them).
EXPERT_MARK = "_exps"


def layers_text(layers: Sequence[int]) -> str:
    """``0-7``, ``0-3, 6`` : sorted layers, consecutive ones joined into ranges."""
    parts: list[str] = []
    start = prev = None
    for n in list(layers) + [None]:
        if start is not None and prev is not None and (n is None or n != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(parts)




def group_layers(layers: Mapping[int, set[str]]) -> dict[str, list[int]]:
    """Layer -> buffer types turned into buffer types (``A, B`` where a layer is split) -> sorted layers."""
    out: dict[str, list[int]] = {}
    for n, types in sorted(layers.items()):
        out.setdefault(", ".join(sorted(types)), []).append(n)
    return out


def layers_by_type_text(by_type: Mapping[str, Sequence[int]]) -> str:
    """``CUDA_Host: 0-1; CPU: 2-7``: buffer types with their layers, in the order of their first layer."""
    return "; ".join(f"{t}: {layers_text(v)}" for t, v in sorted(by_type.items(), key=lambda kv: min(kv[1])) if v)


class ProbeError(ValueError):
    """A probe record that cannot be read or does not have the shape above; the message names the path."""


@dataclass(frozen=True)
class ProbeBuffer:
    """One buffer holding weights: its name, buffer type, size in bytes, whether it is host memory, and the
    bytes the driver reports page-locked / the memory map names as the model file's / of those, whose pages
    the OS reports as the file's / as private copies (None: not asked, see the module)."""

    name: str
    buffer_type: str
    bytes: int
    host: bool
    page_locked: int | None
    file_backed: int | None
    file_pages: int | None = None
    private_pages: int | None = None


@dataclass(frozen=True)
class ProbeWeight:
    """One weight the graphs read: name, layer (-1: none), ggml type, bytes, the buffer holding it, and the
    bytes the driver reports page-locked / the memory map names as the model file's / of those, whose pages
    the OS reports as the file's / as private copies (None: not asked)."""

    name: str
    layer: int
    type: str
    bytes: int
    buffer: ProbeBuffer
    page_locked: int | None
    file_backed: int | None
    file_pages: int | None = None
    private_pages: int | None = None

    @property
    def expert(self) -> bool:
        """True for an expert tensor (its name has :data:`EXPERT_MARK`)."""
        return EXPERT_MARK in self.name


@dataclass(frozen=True)
class FileMapping:
    """One mapping of the model file as ``/proc/self/smaps`` reports it, in bytes: its size, resident, shared
    clean, private clean (file pages this process alone maps), private dirty and anonymous (private copies)."""

    bytes: int
    rss: int
    shared_clean: int
    private_clean: int
    private_dirty: int
    anonymous: int


@dataclass(frozen=True)
class Probe:
    """One load's probe record (see the module)."""

    weights: tuple[ProbeWeight, ...]
    buffers: tuple[ProbeBuffer, ...]
    driver: str | None
    probe_ms: float
    file_mappings: tuple[FileMapping, ...] | None = None
    #: False for a record of an engine older than the page counts (no ``file_mappings`` key): its null page
    #: counts mean "not asked", not "the OS could not be asked".
    pages_read: bool = True

    @property
    def experts(self) -> tuple[ProbeWeight, ...]:
        """The expert tensors among the weights."""
        return tuple(w for w in self.weights if w.expert)

    def expert_layers(self) -> dict[int, set[str]]:
        """Layer -> the buffer types holding that layer's expert tensors."""
        out: dict[int, set[str]] = {}
        for w in self.experts:
            out.setdefault(w.layer, set()).add(w.buffer.buffer_type)
        return out

    def expert_bytes_by_layer(self) -> dict[int, int]:
        """Layer -> bytes of that layer's expert tensors the probe saw."""
        out: dict[int, int] = {}
        for w in self.experts:
            out[w.layer] = out.get(w.layer, 0) + w.bytes
        return out

    def layers_by_buffer_type(self) -> dict[str, list[int]]:
        """Buffer type -> the sorted layers with expert tensors in it (a layer split over two types is in both)."""
        out: dict[str, set[int]] = {}
        for layer, types in self.expert_layers().items():
            for t in types:
                out.setdefault(t, set()).add(layer)
        return {t: sorted(v) for t, v in sorted(out.items())}

    def buffer_bytes_by_type(self) -> dict[str, int]:
        """Buffer type -> bytes of the weight buffers of that type."""
        out: dict[str, int] = {}
        for b in self.buffers:
            out[b.buffer_type] = out.get(b.buffer_type, 0) + b.bytes
        return out

    def page_locked_bytes(self) -> int | None:
        """Bytes of the weight buffers the driver reports page-locked (None on a build without its GPU kind's probe)."""
        if self.driver is None:
            return None
        return sum(b.page_locked or 0 for b in self.buffers)


def _int(value: JSON, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProbeError(f"{where}: expected a byte count, got {value!r}")
    return value


def _opt_int(value: JSON, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _part(value: JSON, whole: int, where: str) -> int | None:
    """A count of bytes within a range of ``whole`` bytes (page-locked, file-backed), or None."""
    n = _opt_int(value, where)
    if n is not None and n > whole:
        raise ProbeError(f"{where}: {n} bytes of a {whole}-byte range")
    return n


#: The byte counts of a range, in the order of :class:`ProbeWeight`'s and :class:`ProbeBuffer`'s fields.
_COUNT_KEYS = ("page_locked", "file_backed", "file_pages", "private_pages")
#: The keys of a ``file_mappings`` entry, in the order of :class:`FileMapping`'s fields.
_MAPPING_KEYS = ("bytes", "rss", "shared_clean", "private_clean", "private_dirty", "anonymous")


def _counts(entry: Mapping[str, Any], size: int, at: str) -> list[int | None]:
    """The counts of :data:`_COUNT_KEYS` of a weight or buffer of ``size`` bytes; the page counts within the
    file-backed bytes."""
    counts = [_part(entry.get(k), size, f"{at}.{k}") for k in _COUNT_KEYS]
    backed, file_pages, private = counts[1:]
    if backed is not None and (file_pages or 0) + (private or 0) > backed:
        raise ProbeError(f"{at}: {file_pages} file and {private} private page bytes of {backed} file-backed bytes")
    return counts


def _typed(value: JSON, kind: type | tuple[type, ...], what: str, where: str) -> JSON:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise ProbeError(f"{where}: expected {what}, got {value!r}")
    return value


def parse_probe(data: Mapping[str, Any], where: str = "probe") -> Probe:
    """The :class:`Probe` of a parsed record; raises :class:`ProbeError` naming ``where`` and the key that is
    missing or of the wrong kind (a page-locked or file-backed count larger than its range included)."""
    try:
        buffers = []
        for i, b in enumerate(data["buffers"]):
            at = f"{where}: buffers[{i}]"
            size = _int(b["bytes"], f"{at}.bytes")
            buffers.append(ProbeBuffer(_typed(b["name"], str, "a name", f"{at}.name"),
                                       _typed(b["buffer_type"], str, "a name", f"{at}.buffer_type"), size,
                                       _typed(b["host"], bool, "true or false", f"{at}.host"),
                                       *_counts(b, size, at)))
        weights = []
        for i, w in enumerate(data["weights"]):
            at = f"{where}: weights[{i}]"
            index = w["buffer"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(buffers):
                raise ProbeError(f"{at}.buffer {index!r} names no buffer")
            size = _int(w["bytes"], f"{at}.bytes")
            weights.append(ProbeWeight(_typed(w["name"], str, "a name", f"{at}.name"),
                                       _typed(w["layer"], int, "a layer number", f"{at}.layer"),
                                       _typed(w["type"], str, "a type name", f"{at}.type"), size, buffers[index],
                                       *_counts(w, size, at)))
        driver = data.get("driver")
        probe_ms = _typed(data.get("probe_ms", 0.0), (int, float), "milliseconds", f"{where}: probe_ms")
        maps = data.get("file_mappings")
        mappings = None if maps is None else tuple(
            FileMapping(*(_int(m[k], f"{where}: file_mappings[{i}].{k}") for k in _MAPPING_KEYS))
            for i, m in enumerate(_typed(maps, list, "a list", f"{where}: file_mappings")))
        return Probe(tuple(weights), tuple(buffers), None if driver is None else str(driver), float(probe_ms),
                     mappings, "file_mappings" in data)
    except (KeyError, TypeError) as exc:
        raise ProbeError(f"{where}: not a probe record ({type(exc).__name__}: {exc})") from None


def engine_record(path: Path, error: Callable[[str], Exception], missing: str, what: str) -> JSON:
    """The parsed JSON an engine request wrote at ``path`` (the probe's, harness.record.reloads'); raises
    ``error(message)`` naming the file where it is ``missing`` (that text follows the name) or cannot be read, and
    where it is neither an object nor an ``{"error": ...}`` (``what`` names the kind of record)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path.name} missing: {missing}") from None
    except (OSError, ValueError) as exc:
        raise error(f"{path.name} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{path.name}: not a {what}")
    return data


def read_probe(path: Path) -> Probe:
    """The probe record at ``path``; raises :class:`ProbeError` (missing, unreadable, or an ``error`` record the
    harness wrote when the engine refused the probe, whose message it carries)."""
    data = engine_record(path, ProbeError, "the load has no probe record", "probe record")
    if "error" in data:
        raise ProbeError(f"{path.name}: the engine could not probe the load: {data['error']}")
    return parse_probe(data, path.name)
