"""Charts as inline SVG, drawn on the server: they need no network, no script, no CDN.

Why not matplotlib (a dependency already): one 30-bar chart took 72 ms to render as
SVG here, so a page with four would miss the 100 ms bar the budget service is held
to; these few shapes take well under a millisecond. Colours are Bootstrap's CSS
variables, so the charts follow the Hub's light and dark mode. Every chart has a
<title> and text labels, so it reads without colour too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from markupsafe import Markup

from spawner.readmodel.status import amount, number, percent

PRIMARY = "var(--bs-primary, #0d6efd)"
WARN = "var(--bs-warning, #ffc107)"
MUTED = "var(--bs-secondary-color, #6c757d)"
GRID = "var(--bs-border-color, #dee2e6)"
SERIES = (
    "#1f77b4",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
"""Series colours (matplotlib's tab10): they read on light and dark backgrounds alike."""


def _svg(width: int, height: int, title: str, body: list[str], css: str = "") -> Markup:
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="budget-chart {css}" role="img" '
        f'viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
        f'style="max-width:{width}px" font-size="11" font-family="inherit">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def _f(value: float) -> str:
    return f"{value:.1f}"


def used_against_share(used: float | None, title: str, width: int = 320) -> Markup:
    """A bar of the window budget used (1.0 = the team's whole share), a tick at 100%."""
    height = 26
    if used is None:
        text = f'<text x="0" y="17" fill="{MUTED}">no share in this pool</text>'
        return _svg(width, height, title, [text], "used-bar")
    scale = max(1.0, used) * 1.1
    inner = width - 50
    bar = min(used, scale) / scale * inner
    share_x = inner / scale
    colour = PRIMARY if used <= 1.0 else WARN
    body = [
        f'<rect x="0" y="5" width="{inner}" height="14" rx="3" fill="{GRID}" opacity="0.5"/>',
        f'<rect class="used" x="0" y="5" width="{_f(bar)}" height="14" rx="3" fill="{colour}"/>',
        f'<line x1="{_f(share_x)}" x2="{_f(share_x)}" y1="1" y2="23" stroke="currentColor" '
        f'stroke-width="2"><title>the share (100% of the budget)</title></line>',
        f'<text x="{inner + 6}" y="16" fill="currentColor">{percent(used)}</text>',
    ]
    return _svg(width, height, title, body, "used-bar")


def ratio_bars(items: Sequence[tuple[str, float, float]], title: str, width: int = 520) -> Markup:
    """Per team: occupancy ratio as a bar (1 = at its share), share % as the label."""
    row = 22
    label_w = 130
    height = row * max(1, len(items)) + 18
    finite = [r for _, r, _ in items if r != float("inf")]
    scale = max([1.0, *finite]) * 1.1
    inner = width - label_w - 60
    body = []
    for i, (name, ratio, share) in enumerate(items):
        y = i * row + 4
        shown = min(ratio, scale) if ratio != float("inf") else 0.0
        w = shown / scale * inner
        colour = PRIMARY if ratio <= 1.0 else WARN
        label = number(ratio) if ratio != float("inf") else "no share"
        body.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" fill="currentColor">'
            f"{escape(name)} ({percent(share)})</text>"
            f'<rect class="ratio-bar" x="{label_w}" y="{y + 2}" width="{_f(w)}" height="14" rx="2" '
            f'fill="{colour}"><title>{escape(name)}: ratio {label}</title></rect>'
            f'<text x="{_f(label_w + w + 4)}" y="{y + 13}" fill="currentColor">{label}</text>'
        )
    one = label_w + inner / scale
    body.append(
        f'<line x1="{_f(one)}" x2="{_f(one)}" y1="0" y2="{height - 14}" stroke="currentColor" '
        f'stroke-dasharray="3 3"/>'
        f'<text x="{_f(one)}" y="{height - 3}" text-anchor="middle" fill="{MUTED}">'
        f"1 = at its share</text>"
    )
    return _svg(width, height, title, body, "ratio-bars")


def owed_delivered(
    days: Sequence[tuple[float, float, float]],
    unit: str,
    title: str,
    width: int = 620,
    *,
    empty: str = "no usage yet",
) -> Markup:
    """Per day: delivered (bars) against owed (line), in unit-hours, with a legend;
    ``empty`` (by default "no usage yet") instead of an empty axis."""
    hours = [(t, o / 3600, d / 3600) for t, o, d in days]
    peak = max([0.0, *[max(o, d) for _, o, d in hours]])
    if peak < 0.005:  # nothing a 2-decimal axis could show
        return _empty(width, title, "owed-delivered", empty)
    height, left, bottom = 166, 44, 38
    inner_w, inner_h = width - left - 8, height - bottom - 8
    top = peak * 1.1
    n = max(1, len(hours))
    step = inner_w / n
    legend_y = height - 4
    body = [
        f'<line x1="{left}" x2="{width - 8}" y1="{8 + inner_h}" y2="{8 + inner_h}" '
        f'stroke="{GRID}"/>',
        f'<text x="{left - 4}" y="14" text-anchor="end" fill="{MUTED}">{amount(top)}</text>',
        f'<text x="{left - 4}" y="{8 + inner_h}" text-anchor="end" fill="{MUTED}">0</text>',
        f'<text x="2" y="{8 + inner_h / 2}" fill="{MUTED}" font-size="10">{unit}·h</text>',
    ]
    points = []
    for i, (t, owed, delivered) in enumerate(hours):
        x = left + i * step
        h = delivered / top * inner_h
        day = time.strftime("%b %d", time.gmtime(t))
        body.append(
            f'<rect class="delivered" x="{_f(x + 1)}" y="{_f(8 + inner_h - h)}" '
            f'width="{_f(max(1.0, step - 2))}" height="{_f(h)}" fill="{PRIMARY}">'
            f"<title>{day}: delivered {amount(delivered)} {unit}·h, owed {amount(owed)}"
            "</title></rect>"
        )
        points.append(f"{_f(x + step / 2)},{_f(8 + inner_h - owed / top * inner_h)}")
        if i % 7 == 0 and n - 1 - i >= 4 or i == n - 1:
            body.append(
                f'<text x="{_f(x + step / 2)}" y="{8 + inner_h + 14}" text-anchor="middle" '
                f'fill="{MUTED}">{day}</text>'
            )
    if points:
        body.append(
            f'<polyline class="owed" points="{" ".join(points)}" fill="none" stroke="{WARN}" '
            f'stroke-width="2"><title>owed: the share, or what the team asked for if less'
            f"</title></polyline>"
        )
    body.append(
        f'<g class="legend"><rect x="{left}" y="{legend_y - 9}" width="10" height="10" '
        f'fill="{PRIMARY}"/><text x="{left + 14}" y="{legend_y}" fill="currentColor">'
        f"delivered ({unit}·h per day)</text>"
        f'<line x1="{left + 190}" x2="{left + 204}" y1="{legend_y - 4}" y2="{legend_y - 4}" '
        f'stroke="{WARN}" stroke-width="2"/><text x="{left + 208}" y="{legend_y}" '
        f'fill="currentColor">owed: the share, or what the team asked for if less</text></g>'
    )
    return _svg(width, height, title, body, "owed-delivered")


def _empty(width: int, title: str, css: str, words: str = "no usage yet") -> Markup:
    """A chart with nothing to show: a line saying why, no axis."""
    text = f'<text class="empty" x="0" y="17" fill="{MUTED}">{escape(words)}</text>'
    return _svg(width, 26, title, [text], css)


def usage_lines(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    unit: str,
    title: str,
    width: int = 620,
) -> Markup:
    """Delivered unit-hours per day, one line per team, with a legend."""
    legend_rows = (len(series) + 3) // 4
    height, left, bottom = 150 + 16 * legend_rows, 44, 22 + 16 * legend_rows
    inner_w, inner_h = width - left - 8, 150 - 22 - 8
    values = [v / 3600 for _, points in series for _, v in points]
    peak = max([0.0, *values])
    if peak < 0.005:  # nothing a 2-decimal axis could show
        return _empty(width, title, "usage-lines")
    top = peak * 1.1
    body = [
        f'<line x1="{left}" x2="{width - 8}" y1="{8 + inner_h}" y2="{8 + inner_h}" '
        f'stroke="{GRID}"/>',
        f'<text x="{left - 4}" y="14" text-anchor="end" fill="{MUTED}">{amount(top)}</text>',
        f'<text x="2" y="{8 + inner_h / 2}" fill="{MUTED}" font-size="10">{unit}·h</text>',
    ]
    for k, (name, points) in enumerate(series):
        colour = SERIES[k % len(SERIES)]
        n = max(1, len(points) - 1)
        coords = " ".join(
            f"{_f(left + i / n * inner_w)},{_f(8 + inner_h - v / 3600 / top * inner_h)}"
            for i, (_, v) in enumerate(points)
        )
        body.append(
            f'<polyline class="usage" points="{coords}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5"><title>{escape(name)}</title></polyline>'
        )
        lx = left + (k % 4) * (inner_w / 4)
        ly = 150 - 4 + 16 * (k // 4)
        body.append(
            f'<rect x="{_f(lx)}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{_f(lx + 14)}" y="{ly}" fill="currentColor">{escape(name)}</text>'
        )
    _ = bottom
    return _svg(width, height, title, body, "usage-lines")


def slice_grid(slices: Sequence[tuple[str, str, str]], title: str) -> Markup:
    """One square per slice: filled when held, outlined when free."""
    size, gap = 18, 4
    per_row = 16
    rows = (len(slices) + per_row - 1) // per_row or 1
    width = per_row * (size + gap)
    body = []
    for i, (device, kind, holder) in enumerate(slices):
        x = (i % per_row) * (size + gap)
        y = (i // per_row) * (size + gap)
        fill = PRIMARY if holder else "none"
        state = f"held by {holder}" if holder else "free"
        body.append(
            f'<rect class="slice {"held" if holder else "free"}" x="{x + 1}" y="{y + 1}" '
            f'width="{size}" height="{size}" rx="3" fill="{fill}" stroke="{PRIMARY}">'
            f"<title>{escape(device)} ({escape(kind)}): {escape(state)}</title></rect>"
        )
    return _svg(width, rows * (size + gap) + 2, title, body, "slice-grid")
