"""Small inline SVG figures for the HTML report: a strip plot, a line plot and a strip of cells.

Each function returns one ``<svg>`` element as a string, drawn with ``html.escape``d text and the
CSS classes of :data:`CSS` (which the page that embeds them includes once), so a report stays one
self-contained file that a browser renders without scripts, fonts or network.  Sizes are SVG user
units (pixels at 100 % zoom).  The figures carry their axis labels; every mark has a ``<title>`` that
a browser shows on hover.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from html import escape
from typing import Sequence

#: Width of every figure.
WIDTH = 640
#: Room left of a plot for its row labels or y tick labels.
LEFT = 170
#: Room right of a plot (for a row's value text in a strip of cells).
RIGHT = 20
#: Pixels a digit of 11 px text takes, and the least room between two tick labels beside their digits.
DIGIT_W, TICK_GAP = 7, 8

#: The classes the figures use; the page embeds this once in its ``<style>``.  Colours mean verdicts only: red
#: (``bad``, ``limit``, ``verdict-frame``, ``failed``) is a failure some check decided; the memory classes of a
#: strip of cells (``c-*``) are blues and greys, whatever the configuration expects of them.
CSS = """
svg.fig { display: block; margin: 4px 0 12px; }
svg.fig text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill: #1f2328; }
svg.fig text.axis-label { font-weight: 600; }
svg.fig .frame { stroke: #8c959f; stroke-width: 1; fill: none; }
svg.fig .grid { stroke: #e4e8ec; stroke-width: 1; }
svg.fig .s0 { fill: #2f6fb0; stroke: #2f6fb0; } svg.fig .s1 { fill: #e0823d; stroke: #e0823d; }
svg.fig .s2 { fill: #6e7781; stroke: #6e7781; }
svg.fig .median { stroke: #1f2328; stroke-width: 2; }
svg.fig .line { fill: none; stroke-width: 1.5; }
svg.fig .limit { stroke: #cf222e; stroke-dasharray: 4 3; stroke-width: 1; }
svg.fig text.limit { fill: #cf222e; stroke: none; }
svg.fig .bad { fill: #cf222e; stroke: #cf222e; }
svg.fig .apart { fill: #ffffff; stroke: #6e7781; stroke-width: 1.5; }
svg.fig .mark { stroke: #8250df; stroke-dasharray: 2 2; stroke-width: 1.5; }
svg.fig text.mark { fill: #8250df; stroke: none; }
svg.fig .c-pinned { fill: #2f6fb0; } svg.fig .c-partial { fill: #9cc3e6; } svg.fig .c-pageable { fill: #d0d7de; }
svg.fig .c-device { fill: #0a3069; } svg.fig .c-host { fill: #8c959f; } svg.fig .c-empty { fill: #f6f8fa; }
svg.fig .c-unknown { fill: #ffffff; stroke: #8c959f; stroke-dasharray: 2 2; }
svg.fig .verdict-frame { fill: none; stroke: #cf222e; stroke-width: 2; }
svg.fig text.verdict-bad { fill: #cf222e; font-weight: 600; } svg.fig text.verdict-note { fill: #57606a; }
"""


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].

    Returns at least two ticks; a zero-width range is widened by one unit (or 1 % of its value) each way.
    """
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(hi) * 0.01 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    k = 0
    while True:
        t = first + k * step
        ticks.append(round(t, 12))
        if t >= hi - 1e-12 * abs(step):
            break
        k += 1
    return ticks


def tick_text(value: float) -> str:
    """A tick label: ``35k`` for 35000, ``1.5`` for 1.5, ``0.002`` for 0.002."""
    if value != 0 and abs(value) >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:.6g}"


@dataclass(frozen=True)
class Scale:
    """A linear map from data values [lo, hi] onto pixels [a, b] (b < a for a y axis)."""

    lo: float
    hi: float
    a: float
    b: float

    def __call__(self, value: float) -> float:
        """The pixel of ``value``."""
        return self.a + (value - self.lo) * (self.b - self.a) / (self.hi - self.lo)


def _open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg class="fig" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>']


def _x_axis(scale: Scale, ticks: Sequence[float], top: float, bottom: float, label: str, width: int) -> list[str]:
    parts = []
    for t in ticks:
        x = scale(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="grid"/>'
                     f'<text x="{x:.1f}" y="{bottom + 13}" text-anchor="middle">{escape(tick_text(t))}</text>')
    parts.append(f'<text x="{(scale.a + scale.b) / 2:.1f}" y="{bottom + 28}" text-anchor="middle" '
                 f'class="axis-label">{escape(label)}</text>')
    return parts


def strip_plot(rows: Sequence[tuple[str, Sequence[float]]], *, x_label: str, title: str,
               point_titles: Sequence[Sequence[str]] | None = None) -> str:
    """A horizontal strip plot: one row per (label, values), each value a dot, the median a bar.

    Rows take the classes ``s0``, ``s1``, ... (the report's two sides of a pair get two colours).
    ``point_titles``: per row, per value, the hover text (default: the value).  All rows share one x
    axis labelled ``x_label`` (the field's unit, e.g. "pp tok/s").  Raises ValueError without values.
    """
    values = [v for _, vs in rows for v in vs]
    if not values:
        raise ValueError(f"strip plot {title!r}: no values")
    row_h, top = 26, 8
    height = top + len(rows) * row_h + 36
    ticks = nice_ticks(min(values), max(values))
    scale = Scale(ticks[0], ticks[-1], LEFT, WIDTH - RIGHT)
    bottom = top + len(rows) * row_h
    parts = _open(WIDTH, height, title) + _x_axis(scale, ticks, top, bottom, x_label, WIDTH)
    for i, (label, vs) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        cls = f"s{min(i, 2)}"
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
        for k, v in enumerate(vs):
            tip = point_titles[i][k] if point_titles else tick_text(v)
            # rounds are spread a little up and down so that equal values stay visible
            dy = ((k % 3) - 1) * 4
            parts.append(f'<circle cx="{scale(v):.1f}" cy="{y + dy:.1f}" r="4" class="{cls}" fill-opacity="0.75">'
                         f'<title>{escape(tip)}</title></circle>')
        if vs:
            med = statistics.median(vs)
            parts.append(f'<line x1="{scale(med):.1f}" y1="{y - 10:.1f}" x2="{scale(med):.1f}" y2="{y + 10:.1f}" '
                         f'class="median"><title>median {escape(tick_text(med))}</title></line>')
    parts.append(f'<rect x="{LEFT}" y="{top}" width="{WIDTH - RIGHT - LEFT}" height="{bottom - top}" class="frame"/>'
                 "</svg>")
    return "".join(parts)


def line_plot(ys: Sequence[float | None], *, x_label: str, y_label: str, title: str,
              x_ticks: Sequence[tuple[int, str]] = (), limit: float | None = None, limit_label: str = "",
              bad: Sequence[bool] = (), point_titles: Sequence[str] = (), height: int = 180,
              apart: Sequence[bool] = (), marks: Sequence[tuple[int, str]] = ()) -> str:
    """A line plot of ``ys`` over their indexes 0..n-1 (None: a gap), dots on every point.

    ``x_ticks``: (index, label) pairs to label below the plot (default: about six evenly spaced indexes).
    ``limit``: a dashed horizontal line (a rule's threshold); ``limit_label`` names it in a line of its own
    above the plot, off the data, from its left edge (a whole rule fits: about 60 characters).  ``bad``: per
    point, drawn in the failure colour.  ``apart``: per point, drawn hollow and grey and left out of the line
    (a point of another series).  ``marks``: (index, label) pairs marked by a dotted vertical line and a ring
    round the point, labelled above the plot in a line below the limit's, at the first or last point too
    (the label then runs inwards from its line: e.g. the first divergent token, "this run").
    ``point_titles``: hover text per point.  Raises ValueError when no y is known.
    """
    known = [y for y in ys if y is not None]
    if not known:
        raise ValueError(f"line plot {title!r}: no values")
    # one line of text above the plot for the limit's label, one for the marks' labels: never on each other
    limit_row, mark_row = 14 if limit_label else 0, 14 if marks else 0
    top, bottom = 10 + limit_row + mark_row, height - 40
    span = known + ([limit] if limit is not None else [])
    ticks = nice_ticks(min(span), max(span), 4)
    y_scale = Scale(ticks[0], ticks[-1], bottom, top)
    n = len(ys)
    x_scale = Scale(0, max(n - 1, 1), LEFT, WIDTH - RIGHT)
    parts = _open(WIDTH, height, title)
    for t in ticks:
        y = y_scale(t)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(tick_text(t))}</text>')
    parts.append(f'<text x="14" y="{(top + bottom) / 2:.1f}" text-anchor="middle" class="axis-label" '
                 f'transform="rotate(-90 14 {(top + bottom) / 2:.1f})">{escape(y_label)}</text>')
    if not x_ticks:
        stride = max(1, math.ceil(n / 6))
        x_ticks = [(i, str(i)) for i in range(0, n, stride)]
    for i, text in x_ticks:
        x = x_scale(i)
        anchor = "start" if i == 0 else "end" if i == n - 1 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="{anchor}">{escape(text)}</text>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{bottom + 30}" text-anchor="middle" '
                 f'class="axis-label">{escape(x_label)}</text>')
    if limit is not None:
        y = y_scale(limit)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="limit"/>')
        if limit_label:
            row = top - mark_row - 6
            parts.append(f'<line x1="{LEFT}" y1="{row - 4}" x2="{LEFT + 18}" y2="{row - 4}" '
                         f'class="limit"/><text x="{LEFT + 22}" y="{row}" class="limit">'
                         f'{escape(limit_label)}</text>')
    for i, text in marks:
        x = x_scale(i)
        # a label that would run past the plot's right edge runs leftwards from its line
        leftwards = x + 4 + DIGIT_W * len(text) > WIDTH - RIGHT
        anchor = ' text-anchor="end"' if leftwards else ""
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{bottom}" class="mark"/>'
                     f'<text x="{x - 4 if leftwards else x + 4:.1f}" y="{top - 6}" class="mark"{anchor}>'
                     f'{escape(text)}</text>')
        mark_y = ys[i] if 0 <= i < len(ys) else None
        if mark_y is not None:
            parts.append(f'<circle cx="{x:.1f}" cy="{y_scale(mark_y):.1f}" r="7" class="mark" fill="none">'
                         f'<title>{escape(text)}</title></circle>')
    run: list[str] = []
    for i, point in enumerate([*ys, None]):
        if i < len(apart) and apart[i]:
            continue
        if point is None:
            if len(run) > 1:
                parts.append(f'<polyline points="{" ".join(run)}" class="line s0" fill="none"/>')
            run = []
            continue
        run.append(f"{x_scale(i):.1f},{y_scale(point):.1f}")
    for i, point in enumerate(ys):
        if point is None:
            continue
        cls = "apart" if i < len(apart) and apart[i] else "bad" if i < len(bad) and bad[i] else "s0"
        tip = point_titles[i] if i < len(point_titles) else tick_text(point)
        parts.append(f'<circle cx="{x_scale(i):.1f}" cy="{y_scale(point):.1f}" r="{3 if n > 60 else 4}" class="{cls}">'
                     f'<title>{escape(tip)}</title></circle>')
    parts.append(f'<rect x="{LEFT}" y="{top}" width="{WIDTH - RIGHT - LEFT}" height="{bottom - top}" class="frame"/>'
                 "</svg>")
    return "".join(parts)


def tick_stride(columns: int, cell_w: float) -> int:
    """Every how many columns of ``cell_w`` pixels a strip of cells labels one: the least of 1, 2, 5, 10, 20,
    50, ... whose labels (numbers up to ``columns - 1``, :data:`DIGIT_W` a digit) keep :data:`TICK_GAP` pixels
    between them (48 layers of 5 px: every 5th; 8 layers of 22 px: every one)."""
    gap = DIGIT_W * len(str(max(columns - 1, 0))) + TICK_GAP
    for power in range(0, 7):
        for m in (1, 2, 5):
            stride = m * 10 ** power
            if stride * cell_w >= gap or stride >= columns:
                return stride
    return max(1, columns)


@dataclass(frozen=True)
class Cell:
    """One cell of :func:`cell_strip`: its class (``c-pinned``, ``c-pageable``, ...) and hover text."""

    cls: str
    title: str


def cell_strip(rows: Sequence[tuple[str, Sequence[Cell]]], *, column_label: str, title: str,
               legend: Sequence[tuple[str, str]], notes: Sequence[str] = (),
               verdicts: Sequence[tuple[str, bool]] = ()) -> str:
    """A grid of cells: one row per (label, cells), the columns numbered from 0 (e.g. layers).

    ``legend``: (class, text) pairs drawn above the grid; ``notes``: one text per row drawn right of it
    (e.g. its bytes).  ``verdicts``: (text, failed) lines a check decided of what the grid shows, drawn below
    it, a failed one in red with the grid framed red.  Raises ValueError without rows or columns.
    """
    columns = max((len(cells) for _, cells in rows), default=0)
    if not rows or not columns:
        raise ValueError(f"cell strip {title!r}: nothing to draw")
    note_w = 200 if notes else 0
    cell_w = min(22.0, (WIDTH - LEFT - RIGHT - note_w) / columns)
    cell_h, top = 16, 26
    height = top + len(rows) * (cell_h + 4) + 34 + 15 * len(verdicts)
    parts = _open(WIDTH, height, title)
    x = 8
    for cls, text in legend:
        parts.append(f'<rect x="{x}" y="6" width="11" height="11" class="{cls}"/>'
                     f'<text x="{x + 15}" y="15">{escape(text)}</text>')
        x += 26 + DIGIT_W * len(text)
    for r, (label, cells) in enumerate(rows):
        y = top + r * (cell_h + 4)
        parts.append(f'<text x="{LEFT - 8}" y="{y + 12}" text-anchor="end">{escape(label)}</text>')
        for c, cell in enumerate(cells):
            parts.append(f'<rect x="{LEFT + c * cell_w:.1f}" y="{y}" width="{cell_w - 2:.1f}" height="{cell_h}" '
                         f'class="{cell.cls}"><title>{escape(cell.title)}</title></rect>')
        if r < len(notes):
            parts.append(f'<text x="{LEFT + columns * cell_w + 8:.1f}" y="{y + 12}">{escape(notes[r])}</text>')
    bottom = top + len(rows) * (cell_h + 4)
    stride = tick_stride(columns, cell_w)
    for c in range(0, columns, stride):
        parts.append(f'<text x="{LEFT + c * cell_w + (cell_w - 2) / 2:.1f}" y="{bottom + 10}" '
                     f'text-anchor="middle">{c}</text>')
    parts.append(f'<text x="{LEFT + columns * cell_w / 2:.1f}" y="{bottom + 26}" text-anchor="middle" '
                 f'class="axis-label">{escape(column_label)}</text>')
    if any(failed for _, failed in verdicts):
        parts.append(f'<rect x="{LEFT - 3}" y="{top - 3}" width="{columns * cell_w + 4:.1f}" '
                     f'height="{bottom - top + 2}" class="verdict-frame"/>')
    room = (WIDTH - 16) // DIGIT_W  # characters of 11 px bold text a line holds; a longer one is cut, whole on hover
    for k, (text, failed) in enumerate(verdicts):
        shown = text if len(text) <= room else text[:room - 1] + "…"
        parts.append(f'<text x="8" y="{bottom + 44 + 15 * k}" class="{"verdict-bad" if failed else "verdict-note"}">'
                     f'<title>{escape(text)}</title>{escape(shown)}</text>')
    parts.append("</svg>")
    return "".join(parts)
