"""A tiny SVG chart writer (lines, markers, reference lines) for the run report.

Written by hand so that core stays light (no matplotlib). One function, ``chart``, returns the
text of a standalone SVG document with axes, "nice" ticks, a legend and one polyline and/or
marker set per series. Non-finite points are dropped; an empty chart says "no data".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_MARKERS = 4000  # beyond this a series is drawn as a line only, to keep files small


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]] = field(default_factory=list)
    mode: str = "line"  # "line", "markers" or "line+markers"
    color: str | None = None
    step: bool = False  # draw as a staircase (a running best only changes at new records)


@dataclass(frozen=True)
class HLine:
    y: float
    label: str
    color: str = "#555555"


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values covering [low, high] (steps of 1, 2, 2.5 or 5 times a power of ten)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def fmt(value: float) -> str:
    """A short label: 1200 -> '1200', 0.25 -> '0.25', 1.5e-05 -> '1.5e-05'."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.3g}"
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text


def _expand(low: float, high: float) -> tuple[float, float]:
    if high > low:
        pad = (high - low) * 0.05
        return low - pad, high + pad
    pad = abs(low) * 0.1 or 1.0
    return low - pad, high + pad


def _legend_layout(items: list[tuple[str, str, str]], x0: int, width: int) -> list[tuple[int, int]]:
    """(x, row) of each legend item, wrapping rows at width."""
    placed, x, row = [], x0, 0
    for name, _, _ in items:
        item_w = 52 + 7 * len(name)
        if x + item_w > x0 + width and x > x0:
            x, row = x0, row + 1
        placed.append((x, row))
        x += item_w
    return placed


def chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, hlines: Sequence[HLine] = (),
          width: int = 760, height: int = 400, y_min: float | None = None, y_max: float | None = None,
          x_integer: bool = False) -> str:
    """A standalone SVG document plotting every series; y_min / y_max pin the axis ends."""
    data = [(s, _finite(s.points)) for s in series]
    all_points = [p for _, pts in data for p in pts]
    colors = [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(series)]
    legend = [(h.label, h.color, "dashed") for h in hlines]
    legend += [(s.name, c, "markers" if s.mode == "markers" else "line") for s, c in zip(series, colors)]
    left, right, bottom = 72, 20, 52
    pw = width - left - right
    placed = _legend_layout(legend, left, pw)
    rows = 1 + max((row for _, row in placed), default=0)
    top = 44 + 16 * rows
    ph = height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<title>{escape(title)}</title>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    if not all_points:
        out.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#777777">no data</text>')
        out.append("</svg>")
        return "\n".join(out) + "\n"

    # legend: rows between the title and the plot
    for (name, color, style), (x, row) in zip(legend, placed):
        y = 44 + 16 * row
        if style == "markers":
            out.append(f'<circle cx="{x + 12}" cy="{y - 4}" r="3.5" fill={quoteattr(color)}/>')
        else:
            dash = ' stroke-dasharray="6 4"' if style == "dashed" else ""
            out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 24}" y2="{y - 4}" stroke={quoteattr(color)} '
                       f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 30}" y="{y}">{escape(name)}</text>')

    xs = [x for x, _ in all_points]
    ys = [y for _, y in all_points] + [h.y for h in hlines if math.isfinite(h.y)]
    x0, x1 = _expand(min(xs), max(xs))
    y0, y1 = _expand(min(ys), max(ys))
    if y_min is not None:
        y0 = y_min
    if y_max is not None:
        y1 = y_max
    if y1 <= y0:
        y1 = y0 + 1.0

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (min(max(y, y0), y1) - y0) / (y1 - y0) * ph

    # axes, grid and ticks
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333333"/>')
    for t in nice_ticks(y0, y1):
        y = sy(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(t))}</text>')
    for t in nice_ticks(x0, x1):
        if x_integer and not float(t).is_integer():
            continue
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 5}" stroke="#333333"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle">{escape(fmt(t))}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 10}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2:.1f})">{escape(y_label)}</text>')

    # reference lines
    for h in hlines:
        if math.isfinite(h.y) and y0 <= h.y <= y1:
            y = sy(h.y)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke={quoteattr(h.color)} '
                       'stroke-dasharray="6 4"/>')

    # series
    for (s, pts), color in zip(data, colors):
        if not pts:
            continue
        if "line" in s.mode and len(pts) > 1:
            path = []
            for k, (x, y) in enumerate(pts):
                if s.step and k:
                    path.append(f"{sx(x):.1f},{sy(pts[k - 1][1]):.1f}")
                path.append(f"{sx(x):.1f},{sy(y):.1f}")
            out.append(f'<polyline fill="none" stroke={quoteattr(color)} stroke-width="1.6" points="{" ".join(path)}"/>')
        if "markers" in s.mode or len(pts) == 1:
            if len(pts) <= MAX_MARKERS or s.mode == "markers":
                for x, y in pts:
                    out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill={quoteattr(color)}/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
