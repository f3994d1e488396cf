"""Triage of where the weights live and what is page-locked: changes between two runs that count as regressions.

A silent fallback to pageable memory leaves every greedy token unchanged, so triage
does not wait for a status to change: it compares the records themselves.

* **Placement**: per platform, configuration and model, the model buffers of every load
  both runs have (``*.placement.json``, harness.record.gpu.buffer_placement), as
  ``{buffer type: MiB}``.  Any difference is a regression: the weights moved (``CUDA_Host
  4733 MiB -> CPU 4733 MiB``), unless triage sees that it brought the configuration's
  failed ``expectations`` step back to passed (a fix).
* **Pinned bytes**: per platform and configuration, the bytes granted by the pin ladder
  over the generations both runs have (harness.triage.triage.pin_totals).  Fewer
  granted bytes in the later run is a regression; more is another change, reported
  by triage's pin-ladder section only.

* **What the runtime probe found** (harness.record.probe), per configuration and model both
  runs probed: an expert layer in another buffer type, or fewer bytes the driver reports
  page-locked, is a regression whatever the logs say (:func:`probe_changes`).

Each regression carries a signature (kind ``placement`` or ``pinning``, the same kinds as
harness.triage.signatures gives a failed ``expectations`` step) whose key holds no byte
counts, so the same fault gives the same key in every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..record.loads import read_placement
from ..record.probe import (PROBE_FILE, PROBE_STEP_BYTES, Probe, ProbeError, group_layers, layers_by_type_text,
                            layers_text, read_probe)
from ..record.layout import RunLayout
from ..record.records import RecordError


def load_placements(run_dir: Path) -> dict[tuple[str, str, str], dict[str, dict[str, float]]]:
    """Per (platform, configuration, model), per load (``engine``, ``<prompt>.r<k>``): the model buffers
    of its placement record (harness.record.loads.Placement.model_buffers_mib).  Loads without a readable
    record are left out."""
    out: dict[tuple[str, str, str], dict[str, dict[str, float]]] = {}
    for platform, config, model, stem, path in RunLayout(run_dir).all_load_files("placement"):
        try:
            buffers = read_placement(path).model_buffers_mib()
        except (OSError, RecordError):
            continue
        if buffers:
            out.setdefault((platform, config, model), {})[stem] = buffers
    return out


def describe_buffers(buffers: dict[str, float]) -> str:
    """``CUDA0 319 MiB, CUDA_Host 4733 MiB``: model buffers in words, by type name."""
    return ", ".join(f"{t} {mib:.0f} MiB" for t, mib in sorted(buffers.items())) or "no model buffer"


def placement_changes(a_dir: Path, b_dir: Path) -> list[dict[str, Any]]:
    """Every (platform, configuration, model) whose model buffers differ between run ``a_dir`` and
    ``b_dir`` in a load both have.  Each item: ``platform``, ``config``, ``model``, ``load`` (the first
    differing load), ``before`` and ``after`` (``{type: MiB}``) and ``signature`` ({kind: placement,
    key, summary}); the key names the buffer types that gained or lost weights, not their sizes."""
    pa, pb = load_placements(a_dir), load_placements(b_dir)
    out = []
    for key in sorted(set(pa) & set(pb)):
        for load in sorted(set(pa[key]) & set(pb[key])):
            before, after = pa[key][load], pb[key][load]
            if before == after:
                continue
            platform, config, model = key
            lost = sorted(t for t in before if t not in after or after[t] < before[t])
            gained = sorted(t for t in after if t not in before or before[t] < after[t])
            where = f"{config}/{model}"
            stable = f"model weights moved from {', '.join(lost) or 'nowhere'} to {', '.join(gained) or 'nowhere'}"
            out.append({"platform": platform, "config": config, "model": model, "load": load,
                        "before": before, "after": after,
                        "signature": {"kind": "placement", "key": f"placement change: {where}: {stable}",
                                      "summary": f"placement changed: {where}: {describe_buffers(before)} -> "
                                                 f"{describe_buffers(after)}"}})
            break
    return out


def pinned_drop_signature(platform: str, config: str, before_granted: int, after_granted: int,
                          requested: int) -> dict[str, str]:
    """The ``pinning`` signature of a drop in page-locked bytes of ``config`` on ``platform`` (bytes)."""
    return {"kind": "pinning", "key": f"pinned bytes dropped: {config}",
            "summary": f"pinned bytes dropped: {config}: {before_granted / 2**20:.0f} MiB -> "
                       f"{after_granted / 2**20:.0f} MiB granted of {requested / 2**20:.0f} MiB requested "
                       f"({platform})"}


def load_probes(run_dir: Path) -> dict[tuple[str, str, str], Probe]:
    """Per (platform, configuration, model): the engine load's probe record (harness.record.probe); loads
    without a readable record are left out."""
    out: dict[tuple[str, str, str], Probe] = {}
    for path in sorted(run_dir.glob(f"*/*/gen/*/{PROBE_FILE}")):
        try:
            out[(path.parents[3].name, path.parents[2].name, path.parent.name)] = read_probe(path)
        except ProbeError:
            continue
    return out


def probe_changes(a_dir: Path, b_dir: Path) -> list[dict[str, Any]]:
    """What the runtime probe found differently between run ``a_dir`` and ``b_dir``, per (platform,
    configuration, model) both probed: expert layers that moved to another buffer type (a ``placement``
    signature naming the layers and types), and fewer bytes the driver reports page-locked (a ``pinning``
    signature; more is not a change of concern).  Each item: ``platform``, ``config``, ``model``, ``what``
    (``layers`` or ``page-locked``), ``before``, ``after`` (text) and ``signature``; keys hold no byte counts."""
    pa, pb = load_probes(a_dir), load_probes(b_dir)
    out = []
    for key in sorted(set(pa) & set(pb)):
        platform, config, model = key
        where = f"{config}/{model}"
        before, after = pa[key].expert_layers(), pb[key].expert_layers()
        moved = sorted(n for n in set(before) & set(after) if before[n] != after[n])
        if moved:
            was = layers_by_type_text(group_layers({n: before[n] for n in moved}))
            now = layers_by_type_text(group_layers({n: after[n] for n in moved}))
            out.append({"platform": platform, "config": config, "model": model, "what": "layers", "before": was,
                        "after": now, "signature": {
                            "kind": "placement", "key": f"probed layers moved: {where}: layers {layers_text(moved)}",
                            "summary": f"probed layers moved: {where}: {was} -> {now}"}})
        locked_a, locked_b = pa[key].page_locked_bytes(), pb[key].page_locked_bytes()
        if locked_a is not None and locked_b is not None and locked_b + PROBE_STEP_BYTES < locked_a:
            out.append({"platform": platform, "config": config, "model": model, "what": "page-locked",
                        "before": f"{locked_a / 2**20:.0f} MiB", "after": f"{locked_b / 2**20:.0f} MiB",
                        "signature": {"kind": "pinning", "key": f"page-locked bytes dropped: {where}",
                                      "summary": f"page-locked bytes dropped (the driver): {where}: "
                                                 f"{locked_a / 2**20:.0f} MiB -> {locked_b / 2**20:.0f} MiB"}})
    return out
