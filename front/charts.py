"""Server-rendered SVG line charts: a time series (or a few) against a cap, as one inline ``<svg>``,
with no outside asset (``chart-*`` classes of ``static/css/kici.css``, presentation attributes so
it reads unstyled), an image to assistive technology whose ``<title>`` and ``aria-label`` carry the
summary, and ``data-hover`` for ``static/js/charts.js``. :func:`line_chart` is pure;
:func:`scaler_charts` turns one scaler's capacity samples into its page's four charts. Design:
docs/capacity-charts.md ("Drawing").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NotRequired, TypedDict

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from lib.units import format_bytes_iec, format_duration

from .templatetags.kici_ui import cpus as format_cpus

#: A point of a series: its time and value; a ``None`` value breaks the line there.
Point = tuple[datetime, float | None]

#: The drawing, in viewBox units (the SVG scales to its box).
WIDTH, HEIGHT = 600, 170
LEFT, RIGHT, TOP, BOTTOM = 70, 10, 22, 22
#: At most this many points per series: samples are taken in buckets along the time axis and each
#: bucket keeps its peak, so a short burst stays visible however long the window.
MAX_POINTS = 240


@dataclass(frozen=True)
class Series:
    """One line: its legend ``label``, its ``points`` (oldest first) and its colour ``tone``
    (``a`` or ``b``: ``chart-line-a`` / ``chart-line-b``)."""

    label: str
    points: Sequence[Point]
    tone: str = "a"


@dataclass(frozen=True)
class Chart:
    """A rendered chart: the ``svg`` markup and the ``summary`` it carries as its accessible name."""

    title: str
    summary: str
    svg: SafeString


def nice_ceiling(value: float, *, binary: bool = False) -> float:
    """The smallest round number at least ``value``, the top of an axis: 1, 2, 2.5 or 5 x 10^k;
    with ``binary``, a power of two times 1024^k (``12 GiB`` -> ``16 GiB``). 0 or less -> 1.
    Raises ``ValueError`` for a value that is not finite."""
    if not math.isfinite(value):
        raise ValueError(f"nice_ceiling: value must be finite, got {value!r}")
    if value <= 0:
        return 1.0
    if binary:
        base = 1024 ** max(0, math.floor(math.log(value, 1024)))
        for step in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            if step * base >= value:
                return float(step * base)
    exp = 10 ** math.floor(math.log10(value))
    for mantissa in (1, 2, 2.5, 5, 10):
        if mantissa * exp >= value * (1 - 1e-12):
            return float(mantissa * exp)
    return float(10 * exp)  # pragma: no cover


def _bucketed(points: Sequence[Point], start: datetime, end: datetime, buckets: int) -> list[Point]:
    """At most ``buckets`` points: per bucket of the window, its peak value at the time of its
    last point (``None`` when it held no value); points outside the window are left out."""
    if len(points) <= buckets:
        return [(t, v) for t, v in points if start <= t <= end]
    span = (end - start).total_seconds() or 1.0
    out: dict[int, Point] = {}
    for t, v in points:
        if not start <= t <= end:
            continue
        key = min(buckets - 1, int((t - start).total_seconds() / span * buckets))
        held = out.get(key)
        peak = v if held is None or held[1] is None else (held[1] if v is None else max(held[1], v))
        out[key] = (t, peak)
    return [out[k] for k in sorted(out)]


def _segments(points: Sequence[Point], max_gap: timedelta | None) -> list[list[tuple[datetime, float]]]:
    """Runs of points to join with a line: a ``None`` value, or two points further apart than
    ``max_gap``, ends a run."""
    runs: list[list[tuple[datetime, float]]] = []
    run: list[tuple[datetime, float]] = []
    for t, v in points:
        if v is None or (run and max_gap is not None and t - run[-1][0] > max_gap):
            if run:
                runs.append(run)
            run = []
        if v is not None:
            run.append((t, v))
    if run:
        runs.append(run)
    return runs


def _steps(points: Sequence[Point], max_gap: timedelta | None) -> list[list[tuple[datetime, float]]]:
    """The cap as steps: each value holds until a point with another value, where the line moves
    to it; only the changes and the ends of each run are kept."""
    out = []
    for run in _segments(points, max_gap):
        stepped = [run[0]]
        for t, v in run[1:]:
            if v != stepped[-1][1]:
                stepped += [(t, stepped[-1][1]), (t, v)]
        if run[-1][0] != stepped[-1][0]:
            stepped.append((run[-1][0], stepped[-1][1]))
        out.append(stepped)
    return out


def _summary(title: str, series: Sequence[Series], cap: Sequence[Point] | None, cap_label: str, fmt) -> str:
    """``"<title>: <label> latest X, peak Y; ...; <cap_label> Z."``: a series with no value says
    "no data", a cap that is unset at the end "none now" (or "no <cap_label>" when never set)."""
    parts = []
    for s in series:
        values = [v for _, v in s.points if v is not None]
        if not values:
            parts.append(f"{s.label} no data")
            continue
        latest = next(v for _, v in reversed(s.points) if v is not None)
        parts.append(f"{s.label} latest {fmt(latest)}, peak {fmt(max(values))}")
    if cap is not None:
        caps = [v for _, v in cap if v is not None]
        latest_cap = cap[-1][1] if cap else None
        if latest_cap is not None:
            parts.append(f"{cap_label} {fmt(latest_cap)}")
        elif caps:
            parts.append(f"{cap_label} none now (was {fmt(max(caps))})")
        else:
            parts.append(f"no {cap_label}")
    return f"{title}: " + "; ".join(parts) + "."


def _count(value: float) -> str:
    """A plain number without noise: ``5.0`` -> ``5``, ``2.5`` -> ``2.5``."""
    return f"{value:g}"


def _local_hhmm(t: datetime) -> str:
    return timezone.localtime(t).strftime("%H:%M")


def _local_minute(t: datetime) -> str:
    return timezone.localtime(t).strftime("%Y-%m-%d %H:%M")


def _hover_data(
    series: Sequence[Series],
    drawn: Sequence[Sequence[Point]],
    cap_label: str,
    cap_drawn: Sequence[Point] | None,
    x: Callable[[datetime], float],
    y: Callable[[float], float],
    fmt: Callable[[float], str],
    point_time: Callable[[datetime], str],
) -> dict:
    """What ``charts.js`` shows under the pointer: ``box`` (the plot, in viewBox units), ``t`` the
    drawn times as ``[x, label]`` (ascending), and per line (the series, then the cap) its ``label``,
    ``tone`` and ``v``: for each time ``[y, formatted value]``, or None where it has no value."""
    lines = [(s.label, s.tone, pts) for s, pts in zip(series, drawn, strict=True)]
    if cap_drawn is not None:
        lines.append((cap_label, "cap", cap_drawn))
    times = sorted({t for _, _, pts in lines for t, _ in pts})
    index = {t: i for i, t in enumerate(times)}
    out_lines = []
    for label, tone, pts in lines:
        values: list[list | None] = [None] * len(times)
        for t, v in pts:
            if v is not None:
                values[index[t]] = [round(y(v), 1), fmt(v)]
        out_lines.append({"label": label, "tone": tone, "v": values})
    return {
        "box": [LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM],
        "t": [[round(x(t), 1), point_time(t)] for t in times],
        "s": out_lines,
    }


def _legend(series: Sequence[Series], cap_label: str | None) -> list[str]:
    """The legend along the top: a swatch and the label of each series, then the cap's (if any)."""
    out = []
    legend_x = LEFT
    for s in series:
        out.append(
            f'<line class="chart-line-{escape(s.tone)}" x1="{legend_x}" x2="{legend_x + 14}" y1="9" y2="9" '
            f'stroke="currentColor" stroke-width="2"/>'
        )
        out.append(f'<text x="{legend_x + 18}" y="13">{escape(s.label)}</text>')
        legend_x += 30 + 7 * len(s.label)
    if cap_label is not None:
        out.append(
            f'<line class="chart-cap" x1="{legend_x}" x2="{legend_x + 14}" y1="9" y2="9" '
            f'stroke="currentColor" stroke-dasharray="4 3"/>'
        )
        out.append(f'<text x="{legend_x + 18}" y="13">{escape(cap_label)}</text>')
    return out


def line_chart(
    *,
    title: str,
    series: Sequence[Series],
    start: datetime,
    end: datetime,
    fmt: Callable[[float], str] = _count,
    cap: Sequence[Point] | None = None,
    cap_label: str = "cap",
    binary: bool = False,
    max_gap: timedelta | None = None,
    time_label: Callable[[datetime], str] = _local_hhmm,
    point_time: Callable[[datetime], str] = _local_minute,
) -> Chart:
    """Chart ``series`` over ``[start, end]`` with ``cap`` (if given) as a dashed step line: the value
    axis from 0 to :func:`nice_ceiling` (``binary`` for bytes) labelled in ``fmt``, the time axis by
    ``time_label`` (the end reads "now"), lines broken at ``None`` and at gaps over ``max_gap``, hover
    data by ``point_time`` and ``fmt``; every text escaped (docs/capacity-charts.md, "Drawing").
    Raises ``ValueError`` when ``end`` is not after ``start``.
    """
    if end <= start:
        raise ValueError(f"line_chart: end ({end}) must be after start ({start})")
    span = (end - start).total_seconds()
    drawn = [_bucketed(s.points, start, end, MAX_POINTS) for s in series]
    cap_drawn = _bucketed(cap, start, end, MAX_POINTS) if cap is not None else []
    if max_gap is not None and any(len(p) > MAX_POINTS for p in [*(s.points for s in series), cap or ()]):
        # a bucket's point is its last sample: two neighbours can be two bucket widths apart
        max_gap += timedelta(seconds=2 * span / MAX_POINTS)
    values = [v for pts in drawn for _, v in pts if v is not None] + [v for _, v in cap_drawn if v is not None]
    top = nice_ceiling(max(values, default=0), binary=binary)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_at(t: datetime) -> float:
        return LEFT + (t - start).total_seconds() / span * plot_w

    def y_at(v: float) -> float:
        return TOP + plot_h - min(v, top) / top * plot_h

    def x(t: datetime) -> str:
        return f"{x_at(t):.1f}"

    def y(v: float) -> str:
        return f"{y_at(v):.1f}"

    summary = _summary(title, series, cap, cap_label, fmt)
    hover = _hover_data(series, drawn, cap_label, cap_drawn if cap is not None else None, x_at, y_at, fmt, point_time)
    out = [
        f'<svg class="chart" role="img" aria-label="{escape(summary)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg" tabindex="0" '
        f'data-hover="{escape(json.dumps(hover, separators=(",", ":")))}">',
        f"<title>{escape(summary)}</title>",
        '<g class="chart-axes" aria-hidden="true" font-size="11" fill="currentColor">',
    ]
    for frac in (0, 0.5, 1):
        v = top * frac
        out.append(
            f'<line class="chart-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v)}" y2="{y(v)}" '
            f'stroke="currentColor" stroke-opacity="0.15"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{y(v)}" dy="4" text-anchor="end">{escape(fmt(v))}</text>')
    middle = start + (end - start) / 2
    for t, anchor, text in (
        (start, "start", time_label(start)),
        (middle, "middle", time_label(middle)),
        (end, "end", "now"),
    ):
        out.append(f'<text x="{x(t)}" y="{HEIGHT - 6}" text-anchor="{anchor}">{escape(text)}</text>')
    out += _legend(series, cap_label if cap is not None else None)
    out.append("</g>")
    if cap is not None:
        for run in _steps(cap_drawn, max_gap):
            coords = " ".join(f"{x(t)},{y(v)}" for t, v in run)
            out.append(
                f'<polyline class="chart-cap" points="{coords}" fill="none" stroke="currentColor" '
                f'stroke-width="1.5" stroke-dasharray="6 4"/>'
            )
    for s, pts in zip(series, drawn, strict=True):
        tone = escape(s.tone)
        for run in _segments(pts, max_gap):
            if len(run) == 1:
                t, v = run[0]
                out.append(f'<circle class="chart-line-{tone}" cx="{x(t)}" cy="{y(v)}" r="2" fill="currentColor"/>')
                continue
            coords = " ".join(f"{x(t)},{y(v)}" for t, v in run)
            out.append(
                f'<polyline class="chart-line-{tone}" points="{coords}" fill="none" stroke="currentColor" '
                f'stroke-width="2" stroke-linejoin="round"/>'
            )
    out.append("</svg>")
    return Chart(title=title, summary=summary, svg=mark_safe("".join(out)))  # every text is escaped above


def _seconds(value: float) -> str:
    """Latency for an axis: ``2.5 s`` under a minute, else ``format_duration`` (``1m 15s``)."""
    if value < 60:
        return f"{value:.1f}".rstrip("0").rstrip(".") + " s"
    return format_duration(value)


class _Window(TypedDict):
    """The time axis every chart of a scaler page shares: :func:`line_chart`'s keywords."""

    start: datetime
    end: datetime
    max_gap: timedelta | None
    time_label: NotRequired[Callable[[datetime], str]]


def _local_day(t: datetime) -> str:
    return timezone.localtime(t).strftime("%a %d %H:%M")


def scaler_charts(samples: Sequence, *, start: datetime, end: datetime, sample_seconds: int) -> list[Chart]:
    """The scaler page's charts from its capacity samples (oldest first): agents against
    maxAgents, CPUs against resourceCap.maxCpu, memory against resourceCap.maxMemory, and the
    /scale to registration latency p50 / p95. Lines break where samples are missing for more
    than 2.5 sample intervals (the sweeper was not leading). A window that starts on another
    local day than it ends labels its time axis with the weekday and date (a bare "11:07" at the
    start of the last 24 hours reads as today's)."""
    gap = timedelta(seconds=2.5 * sample_seconds)

    def pts(attr: str) -> list[Point]:
        return [(s.taken_at, getattr(s, attr)) for s in samples]

    common: _Window = {"start": start, "end": end, "max_gap": gap}
    if timezone.localtime(start).date() != timezone.localtime(end).date():
        common["time_label"] = _local_day
    return [
        line_chart(
            title="Agents",
            series=[Series("reserved", pts("agents")), Series("running", pts("running"), tone="b")],
            cap=pts("max_agents"),
            cap_label="maxAgents",
            fmt=_count,
            **common,
        ),
        line_chart(
            title="CPU reserved",
            series=[Series("reserved", pts("cpus"))],
            cap=pts("max_cpu"),
            cap_label="maxCpu",
            fmt=lambda v: f"{format_cpus(v)} CPU",
            **common,
        ),
        line_chart(
            title="Memory reserved",
            series=[Series("reserved", pts("memory_bytes"))],
            cap=pts("max_memory_bytes"),
            cap_label="maxMemory",
            fmt=format_bytes_iec,
            binary=True,
            **common,
        ),
        line_chart(
            title="Scale to registered",
            series=[
                Series("p50", pts("latency_p50_seconds")),
                Series("p95", pts("latency_p95_seconds"), tone="b"),
            ],
            fmt=_seconds,
            **common,
        ),
    ]
