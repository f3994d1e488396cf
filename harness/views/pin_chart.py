"""The pin-ladder charts of report.html: a run's pin-ladder files grouped per configuration and model
(:func:`pin_ladders`), each drawn as an SVG bar chart of the bytes requested and granted per allocation
(:func:`pin_chart_svg`), all on one scale (:func:`ladder_scale`).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Sequence

from ..common.words import size_text
from ..record.loads import PinLadder, read_pin_ladder
from ..record.layout import LOAD_FILES, RunLayout
from ..record.records import RecordError
from . import svg


#: Width of a pin-ladder chart, in SVG user units (pixels at 100 % zoom).
CHART_WIDTH = 1000
#: The narrowest bar drawn for bytes above 0 (pixels), and the width below which a bar's size is also printed
#: beside it: on a 6 GiB axis of 544 px, 125 KiB and 5 MiB allocations are under half a pixel wide.
MIN_BAR, SMALL_BAR = 2.0, 12.0


def _pin_ladder(path: Path) -> PinLadder | None:
    """The pin-ladder record at ``path``, None where it is unreadable (left out of the chart)."""
    try:
        return read_pin_ladder(path)
    except (OSError, RecordError):
        return None


def pin_ladders(run_dir: Path) -> list[dict[str, Any]]:
    """The pin-ladder files of a run grouped per (platform, config, model).

    Returns a list of {platform, config, model, file (relative to the run), records (the
    representative generation's records: the first file in name order), files (count),
    granted_totals (sorted distinct totals of granted bytes over the files)}.
    """
    groups: dict[tuple[str, str, str], list[Path]] = {}
    for platform, config, model, _, path in RunLayout(run_dir).all_generation_files(LOAD_FILES["pin_ladder"]):
        groups.setdefault((platform, config, model), []).append(path)
    out = []
    for (platform, config, model), files in sorted(groups.items()):
        loaded = [ladder.lines for ladder in map(_pin_ladder, files) if ladder is not None]
        if not loaded:
            continue
        totals = sorted({sum(int(x["granted"]) for x in recs if x["kind"] in ("ladder", "malloc_host"))
                         for recs in loaded})
        out.append({"platform": platform, "config": config, "model": model,
                    "file": str(files[0].relative_to(run_dir)), "records": [dict(r) for r in loaded[0]],
                    "files": len(loaded), "granted_totals": totals})
    return out


def _ladder_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records a pin-ladder chart draws: the summary lines (kind ladder or malloc_host), else every one."""
    return [r for r in records if r.get("kind") in ("ladder", "malloc_host")] or list(records)


def ladder_scale(ladders: Sequence[Sequence[dict[str, Any]]]) -> float:
    """The bytes at the right end of the axis every pin-ladder chart of a run shares: the round value
    (harness.views.svg.nice_ticks) at or above the largest request or grant of any of ``ladders``."""
    biggest = max([max(int(r.get("requested", 0)), int(r.get("granted", 0)))
                   for recs in ladders for r in _ladder_rows(recs)] + [1])
    return svg.nice_ticks(0, biggest / 2**30, 5)[-1] * 2**30


def pin_chart_svg(records: Sequence[dict[str, Any]], title: str, scale_bytes: float | None = None) -> str:
    """An inline SVG bar chart of pin-ladder records: per allocation, requested and granted bytes.

    ``records`` are harness.record.gpu.parse_ladder_lines dicts; the summary lines (kind ladder or
    malloc_host) are drawn, or every record when there is none.  Bars share one scale from 0 to
    ``scale_bytes`` (bytes; the report passes one for all the run's charts, :func:`ladder_scale`; default:
    this chart's own), drawn as an axis in GiB below them; a granted bar short of its request is drawn in
    the warning colour.  A bar of more than 0 bytes is at least :data:`MIN_BAR` pixels wide, and where a row's
    bars are narrower than :data:`SMALL_BAR` its sizes are printed beside them too, so an allocation too small
    for the shared axis still shows.  Returns the ``<svg>`` element as a string.
    """
    rows = _ladder_rows(records)
    label_w, value_w, bar_h, gap, top = 56, 380, 13, 10, 34
    plot_w = CHART_WIDTH - label_w - value_w - 20
    axis_h = 30
    height = top + len(rows) * (2 * bar_h + gap) + axis_h
    biggest = scale_bytes or ladder_scale([records])
    parts = [f'<svg class="chart" width="{CHART_WIDTH}" height="{height}" '
             f'viewBox="0 0 {CHART_WIDTH} {height}" role="img" aria-label="{escape(title)}">',
             f'<title>{escape(title)}</title>',
             f'<rect x="{label_w}" y="8" width="12" height="10" class="req"/>'
             f'<text x="{label_w + 16}" y="17" class="legend">requested</text>'
             f'<rect x="{label_w + 100}" y="8" width="12" height="10" class="grant"/>'
             f'<text x="{label_w + 116}" y="17" class="legend">granted (pinned)</text>'
             f'<rect x="{label_w + 250}" y="8" width="12" height="10" class="short"/>'
             f'<text x="{label_w + 266}" y="17" class="legend">granted, less than requested</text>']
    for i, r in enumerate(rows):
        y = top + i * (2 * bar_h + gap)
        req, got = int(r.get("requested", 0)), int(r.get("granted", 0))
        w_req = max(MIN_BAR, plot_w * req / biggest)
        w_got = max(MIN_BAR, plot_w * got / biggest) if got > 0 else 0.0
        cls = "grant" if got >= req else "short"
        detail = f"{size_text(got)} of {size_text(req)}"
        if r.get("segments") is not None:
            detail += f", {r['segments']} seg."
        if r.get("seconds") is not None:
            detail += f", {float(r['seconds']):.2f} s"
        if r.get("error"):
            detail += f", {r['error']}"
        tip = escape(str(r.get("line", "")))
        parts.append(
            f'<g><title>{tip}</title>'
            f'<text x="{label_w - 6}" y="{y + bar_h + 4}" class="label" text-anchor="end">#{i + 1}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w_req:.1f}" height="{bar_h}" class="req"/>'
            f'<rect x="{label_w}" y="{y + bar_h}" width="{w_got:.1f}" height="{bar_h}" class="{cls}"/>'
            f'<text x="{label_w + plot_w + 8}" y="{y + bar_h + 4}" class="value">{escape(detail)}</text>'
            + (f'<text x="{label_w + max(w_req, w_got) + 6:.1f}" y="{y + bar_h + 4}" class="value small">'
               f'{escape(size_text(got))} of {escape(size_text(req))}, too small for this axis</text>'
               if max(w_req, w_got) < SMALL_BAR else "") + '</g>')
    axis_y = height - axis_h + 4
    parts.append(f'<line x1="{label_w}" y1="{top - 4}" x2="{label_w}" y2="{axis_y}" class="axis"/>'
                 f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" class="axis"/>')
    for t in svg.nice_ticks(0, biggest / 2**30, 5):
        x = label_w + plot_w * t * 2**30 / biggest
        if x > label_w + plot_w + 0.5:
            continue
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" class="axis"/>'
                     f'<text x="{x:.1f}" y="{axis_y + 15}" class="label" text-anchor="middle">{t:g}</text>')
    parts.append(f'<text x="{label_w + plot_w + 8}" y="{axis_y + 15}" class="label">GiB</text></svg>')
    return "".join(parts)
