"""The report's pictures (inline SVG by harness.analysis.svg), each from a run's own records:

* :func:`speed_pair_figures`: per measured pair and metric, both sides' rounds as a strip plot (bench.json);
* :func:`rule_history_figures`: per speed rule, its ratio over the runs beside this one (every run under
  ``results/``, ``results/evidence/`` included), the rule's threshold dashed;
* :func:`probe_figures`: per configuration with a runtime probe, its expert tensors' layers × buffer types,
  coloured by the bytes the driver reports page-locked (``engine.probe.json``, harness.record.probe);
* :func:`kl_figure`: a divergent comparison's KL per position, where its record holds them.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Iterable

from ..record.bench import bench_measurements, bench_platforms, read_bench
from ..record.probe import ProbeError, read_probe
from ..record.results import ComparisonRecord
from ..record.summary import run_dirs_under
from .svg import Cell, cell_strip, line_plot, strip_plot

#: Most runs a rule's history shows (the newest).
HISTORY_RUNS = 60


def _figure(caption: str, svg: str) -> str:
    return f'<figure><figcaption>{escape(caption)}</figcaption>{svg}</figure>'


def speed_pair_figures(bench: dict[str, Any]) -> list[str]:
    """Per pair of a bench.json and per metric, a strip plot of both sides' tok/s per round (the reference
    first, as the pair ran), each dot titled with its round.  Returns HTML ``<figure>`` strings."""
    out = []
    measurements = bench_measurements(bench)
    for pair in bench.get("pairs") or []:
        configs = list(pair.get("configs") or [])
        sides = [next((m for m in measurements if m.config == c and list(m.pair) == configs
                       and m.model == pair.get("model")), None) for c in configs]
        if any(s is None for s in sides):
            continue
        for metric in ("pp", "tg"):
            rows = [(s.config, list(getattr(s, metric))) for s in sides if s is not None]
            if not all(vs for _, vs in rows):
                continue
            tokens = pair["n_prompt"] if metric == "pp" else pair["n_gen"]
            titles = [[f"{c}: round {k + 1}: {v:.1f} tok/s" for k, v in enumerate(vs)] for c, vs in rows]
            title = f"{pair.get('model')} {metric}{tokens}: {' vs '.join(configs)}, {len(rows[0][1])} rounds"
            out.append(_figure(title, strip_plot(rows, x_label=f"{metric} tok/s ({tokens} tokens per request)",
                                                 title=title, point_titles=titles)))
    return out


def _when(run_dir: Path) -> str:
    """The run's start (run.json ``started``), else its directory name: the history's order."""
    from .triage import _started
    return str(_started(run_dir) or run_dir.name)


def rule_history(results_dir: Path, platform: str) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Per speed rule step of ``platform``: (run id, its rule record) over the runs under ``results_dir`` (at any
    depth) that have one, oldest first, at most :data:`HISTORY_RUNS` of them."""
    runs = sorted(run_dirs_under(results_dir), key=lambda d: (_when(d), d.name))
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for run in runs:
        for rule in (read_bench(run, platform) or {}).get("rules") or []:
            if isinstance(rule, dict) and rule.get("step") and rule.get("candidate"):
                out.setdefault(f"{rule['step']} {rule['candidate']}", []).append((run.name, rule))
    return {k: v[-HISTORY_RUNS:] for k, v in out.items()}


def rule_history_figures(results_dir: Path, platform: str, current: str) -> list[str]:
    """Per speed rule of ``platform``, a line plot of its candidate/reference median ratio over the runs of
    :func:`rule_history` with the rule's fail threshold dashed and failed verdicts in red; ``current``: this
    run's id (its point is named on the x axis).  Rules recorded in one run only are left out."""
    out = []
    for key, points in sorted(rule_history(results_dir, platform).items()):
        if len(points) < 2:
            continue
        ys = [r.get("ratio") for _, r in points]
        if all(y is None for y in ys):
            continue
        last = points[-1][1]
        threshold = last.get("threshold")
        ticks = [(0, points[0][0][-16:]), (len(points) - 1, points[-1][0][-16:])]
        ticks += [(i, "this run") for i, (run, _) in enumerate(points) if run == current and i not in (0, len(points) - 1)]
        title = f"{key}: {last.get('model')}, {last.get('candidate')} / {last.get('reference')} over {len(points)} runs"
        out.append(_figure(title, line_plot(
            ys, x_label="runs, oldest to newest", y_label=f"{last.get('metric')} ratio", title=title, x_ticks=ticks,
            limit=float(threshold) if isinstance(threshold, (int, float)) else None,
            limit_label=f"fails below {threshold:.3g}x" if isinstance(threshold, (int, float)) else "",
            bad=[r.get("status") == "failed" for _, r in points],
            point_titles=[f"{run}: {r.get('status')}, {r['ratio']:.3f}x" if r.get("ratio") is not None
                          else f"{run}: {r.get('status')}" for run, r in points])))
    return out


def _probe_cell(weights: list[Any]) -> Cell:
    total = sum(w.bytes for w in weights)
    locked = [w.page_locked for w in weights]
    if not weights:
        return Cell("c-empty", "")
    buffer = weights[0].buffer
    what = f"layer {weights[0].layer} in {buffer.buffer_type}: {total / 2**20:.0f} MiB of expert tensors"
    if not buffer.host:
        return Cell("c-device", f"{what} in device memory")
    if any(x is None for x in locked):
        return Cell("c-unknown", f"{what}, page-locked bytes not asked")
    pinned = sum(x or 0 for x in locked)
    cls = "c-pinned" if pinned >= total else "c-partial" if pinned else "c-pageable"
    return Cell(cls, f"{what}, {pinned / 2**20:.0f} MiB page-locked by the driver")


def probe_figure(path: Path, title: str) -> str:
    """The layer × buffer-type strip of one probe record: a row per buffer type holding expert tensors, a
    column per layer, each cell coloured by the share the driver reports page-locked.  Raises ProbeError
    for a record that cannot be read, ValueError for one without expert tensors."""
    probe = read_probe(path)
    experts = probe.experts
    if not experts:
        raise ValueError(f"{path}: no expert tensors")
    layers = max(w.layer for w in experts) + 1
    rows, notes = [], []
    for buffer_type in sorted({w.buffer.buffer_type for w in experts}):
        these = [w for w in experts if w.buffer.buffer_type == buffer_type]
        cells = [_probe_cell([w for w in these if w.layer == layer]) for layer in range(layers)]
        total = sum(w.bytes for w in these)
        locked = [w.page_locked for w in these]
        pinned = "page-locked not asked" if any(x is None for x in locked) else \
            f"{sum(locked) / 2**20:.0f} MiB page-locked"
        rows.append((buffer_type, cells))
        notes.append(f"{total / 2**20:.0f} MiB, {pinned}" if these[0].buffer.host else f"{total / 2**20:.0f} MiB")
    legend = [("c-pinned", "page-locked"), ("c-partial", "partly page-locked"), ("c-pageable", "pageable"),
              ("c-device", "device memory"), ("c-unknown", "not asked")]
    return cell_strip(rows, column_label="layer (expert tensors)", title=title, legend=legend, notes=notes)


def probe_figures(run_dir: Path) -> list[str]:
    """One :func:`probe_figure` per (platform, configuration, model) of a run that recorded a probe
    (the engine's load: ``gen/<model>/engine.probe.json``), in name order; unreadable records are left out."""
    out = []
    for path in sorted(run_dir.glob("*/*/gen/*/engine.probe.json")):
        platform, config, model = path.parents[3].name, path.parents[2].name, path.parent.name
        title = f"{platform} · {config} · {model}: expert tensors per layer and buffer type"
        try:
            out.append(_figure(title, probe_figure(path, title)))
        except (ProbeError, ValueError):
            continue
    return out


def kl_figure(comparison: ComparisonRecord) -> str:
    """A divergent comparison's KL(reference || candidate) per generated position as a line plot (its
    ``kl.per_position``, nats), the first divergent token's position in the title; "" where the record holds
    no per-position values (runs before they were recorded)."""
    kl = comparison.kl or {}
    values = kl.get("per_position") or []
    if not values:
        return ""
    first = (comparison.first_divergence or {}).get("index")
    where = f", first divergent token at {first}" if first is not None else ""
    title = (f"{comparison.model}/{comparison.prompt}: {comparison.candidate} vs "
             f"{comparison.reference}, KL per position{where}")
    return _figure(title, line_plot([float(v) for v in values], x_label="generated position (teacher-forced on "
                                    "the reference's tokens)", y_label="KL (nats)", title=title,
                                    point_titles=[f"position {i}: {float(v):.4g} nats" for i, v in enumerate(values)]))


def bench_figures(run_dir: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    """(platform, bench.json) of every platform of a run with one."""
    for platform in bench_platforms(run_dir):
        yield platform, read_bench(run_dir, platform) or {}


__all__ = ["speed_pair_figures", "rule_history", "rule_history_figures", "probe_figure", "probe_figures",
           "kl_figure", "bench_figures", "HISTORY_RUNS"]
