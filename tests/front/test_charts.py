"""The server-rendered SVG charts (front.charts) and the scaler page's "Last 24 hours" panel."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from front.charts import MAX_POINTS, Series, line_chart, nice_ceiling
from lib.units import format_bytes_iec
from scalers.models import CapacitySample
from tests.support.scalers import make_scaler

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def polylines(svg: str, cls: str) -> list[list[str]]:
    return [m.split() for m in re.findall(rf'<polyline class="{cls}" points="([^"]*)"', svg)]


def test_points_are_scaled_into_the_plot_with_zero_at_the_bottom_and_the_nice_top_at_the_top():
    chart = line_chart(
        title="Agents", series=[Series("reserved", [(at(0), 0), (at(50), 5), (at(100), 9)])], start=T0, end=at(100)
    )
    # plot: x 70..590, y 22 (top = nice_ceiling(9) = 10) .. 148 (0)
    assert polylines(chart.svg, "chart-line-a") == [["70.0,148.0", "330.0,85.0", "590.0,34.6"]]
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', chart.svg)
    assert labels[:3] == ["0", "5", "10"]  # the value axis: 0, half, top
    assert "now</text>" in chart.svg


def test_the_cap_is_a_dashed_step_line_and_counts_in_the_axis():
    chart = line_chart(
        title="CPU",
        series=[Series("reserved", [(at(0), 1), (at(100), 2)])],
        cap=[(at(0), 4), (at(50), 8), (at(100), 8)],
        cap_label="maxCpu",
        start=T0,
        end=at(100),
    )
    (cap,) = polylines(chart.svg, "chart-cap")
    # top = 10: 4 -> y 97.6, 8 -> y 47.2; the step holds 4 until t=50, then rises
    assert cap == ["70.0,97.6", "330.0,97.6", "330.0,47.2", "590.0,47.2"]
    assert re.search(r'<polyline class="chart-cap"[^>]*stroke-dasharray="6 4"', chart.svg)
    assert chart.summary == "CPU: reserved latest 2, peak 2; maxCpu 8."


def test_an_uncapped_series_says_so_and_draws_no_cap_line():
    chart = line_chart(
        title="Memory", series=[Series("reserved", [(at(0), GIB)])], cap=[(at(0), None)], start=T0, end=at(60)
    )
    assert not polylines(chart.svg, "chart-cap")
    assert chart.summary.endswith("no cap.")
    lifted = line_chart(
        title="CPU", series=[], cap=[(at(0), 8), (at(30), None)], cap_label="maxCpu", start=T0, end=at(60)
    )
    assert lifted.summary == "CPU: maxCpu none now (was 8)."


def test_memory_axes_are_in_binary_units():
    chart = line_chart(
        title="Memory",
        series=[Series("reserved", [(at(0), 3 * GIB), (at(60), 5 * GIB)])],
        cap=[(at(0), 12 * GIB), (at(60), 12 * GIB)],
        cap_label="maxMemory",
        start=T0,
        end=at(60),
        fmt=format_bytes_iec,
        binary=True,
    )
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', chart.svg)
    assert labels[:3] == ["0 B", "8 GiB", "16 GiB"]
    assert chart.summary == "Memory: reserved latest 5 GiB, peak 5 GiB; maxMemory 12 GiB."


def test_nice_ceiling():
    assert [nice_ceiling(v) for v in (0, -3, 0.7, 3, 7, 10, 11, 240)] == [1, 1, 1, 5, 10, 10, 20, 250]
    assert nice_ceiling(12 * GIB, binary=True) == 16 * GIB
    assert nice_ceiling(1.5 * GIB, binary=True) == 2 * GIB
    assert nice_ceiling(700, binary=True) == 1024
    with pytest.raises(ValueError, match="finite"):
        nice_ceiling(float("nan"))


def test_lines_break_at_missing_values_and_gaps_and_a_lone_point_is_a_dot():
    points = [(at(0), 1), (at(60), 2), (at(120), None), (at(180), 3), (at(240), 4), (at(900), 5)]
    chart = line_chart(
        title="p50", series=[Series("p50", points)], start=T0, end=at(900), max_gap=timedelta(seconds=150)
    )
    assert [len(run) for run in polylines(chart.svg, "chart-line-a")] == [2, 2]
    assert len(re.findall(r'<circle class="chart-line-a"', chart.svg)) == 1  # the one after the gap


def test_a_day_of_minute_samples_is_thinned_to_bucket_peaks_and_stays_one_line():
    points = [(at(60 * i), 1.0) for i in range(1440)]
    points[700] = (points[700][0], 7.0)  # one short burst
    chart = line_chart(
        title="Agents",
        series=[Series("reserved", points)],
        cap=[(t, 8) for t, _ in points],
        start=T0,
        end=at(60 * 1440),
        max_gap=timedelta(seconds=150),
    )
    (run,) = polylines(chart.svg, "chart-line-a")
    assert len(run) <= MAX_POINTS
    assert [len(cap) for cap in polylines(chart.svg, "chart-cap")] == [2]  # a steady cap: its two ends
    assert min(float(p.split(",")[1]) for p in run) == pytest.approx(22 + 126 - 7 / 10 * 126)  # the peak is kept


def test_every_text_is_escaped_and_the_chart_is_an_image_named_by_its_summary():
    chart = line_chart(
        title='<b>"x" & y</b>',
        series=[Series("<script>alert(1)</script>", [(at(0), 1)])],
        cap=[(at(0), 2)],
        cap_label="<i>cap</i>",
        start=T0,
        end=at(60),
    )
    assert "<script>" not in chart.svg and "<b>" not in chart.svg and "<i>" not in chart.svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in chart.svg
    assert chart.svg.startswith('<svg class="chart" role="img" aria-label="&lt;b&gt;&quot;x&quot; &amp; y&lt;/b&gt;: ')
    assert f"<title>{chart.svg.split('aria-label="')[1].split('"')[0]}</title>" in chart.svg


def test_a_chart_needs_a_window():
    with pytest.raises(ValueError, match="must be after start"):
        line_chart(title="x", series=[], start=T0, end=T0)


# --- the scaler page -------------------------------------------------------------------------------


def samples(scaler, n: int, *, every: int = 60) -> None:
    now = timezone.now()
    CapacitySample.objects.bulk_create(
        CapacitySample(
            scaler=scaler,
            taken_at=now - timedelta(seconds=every * (n - i)),
            agents=i % 4,
            running=i % 3,
            cpus=i % 4 * 0.5,
            memory_bytes=i % 4 * GIB,
            max_agents=4,
            max_cpu=2,
            max_memory_bytes=4 * GIB,
            registered=1,
            latency_p50_seconds=2.5,
            latency_p95_seconds=9,
        )
        for i in range(n)
    )


@pytest.mark.django_db
def test_the_scaler_page_without_samples_says_when_they_come(viewer_client):
    scaler = make_scaler()
    page = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    assert "No samples yet: the sweeper samples every minute." in page
    assert '<svg class="chart"' not in page  # (the capacity bars are SVG too)


@pytest.mark.django_db
def test_the_scaler_page_charts_the_last_day_with_the_same_queries_however_many_samples(viewer_client):
    scaler = make_scaler()
    other = make_scaler()
    samples(other, 50)
    CapacitySample.objects.create(
        scaler=scaler, taken_at=timezone.now() - timedelta(hours=30), max_agents=4, agents=3
    )  # older than the window
    samples(scaler, 3)
    viewer_client.get(f"/scalers/{scaler.name}/")  # the session and config rows
    with CaptureQueriesContext(connection) as few:
        page = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    assert page.count('<svg class="chart" role="img"') == 4
    for title in ("Agents", "CPU reserved", "Memory reserved", "Scale to registered"):
        assert f"<figcaption>{title}</figcaption>" in page
    assert 'aria-label="Agents: reserved latest 2, peak 2; running latest 2, peak 2; maxAgents 4."' in page
    assert 'aria-label="Memory reserved: reserved latest 2 GiB, peak 2 GiB; maxMemory 4 GiB."' in page
    assert 'aria-label="Scale to registered: p50 latest 2.5 s, peak 2.5 s; p95 latest 9 s, peak 9 s."' in page
    CapacitySample.objects.filter(scaler=scaler).delete()
    samples(scaler, 1440)
    with CaptureQueriesContext(connection) as many:
        page = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    assert page.count('<svg class="chart" role="img"') == 4
    assert len(few) == len(many)


# --- hover data and the range picker -----------------------------------------------------------------


def hover(svg: str) -> dict:
    import html
    import json

    return json.loads(html.unescape(re.search(r'data-hover="([^"]*)"', svg).group(1)))


def test_the_hover_data_gives_each_drawn_time_every_lines_value_formatted_and_placed():
    chart = line_chart(
        title="Memory",
        series=[Series("reserved", [(at(0), 0), (at(60), None), (at(120), 3 * GIB)])],
        cap=[(at(0), 4 * GIB), (at(60), 4 * GIB), (at(120), 4 * GIB)],
        cap_label="maxMemory",
        start=at(0),
        end=at(120),
        fmt=format_bytes_iec,
        binary=True,
        point_time=lambda t: t.strftime("%H:%M"),
    )
    data = hover(chart.svg)
    assert data["box"] == [70, 22, 590, 148]
    assert data["t"] == [[70.0, "12:00"], [330.0, "12:01"], [590.0, "12:02"]]
    reserved, cap = data["s"]
    assert (reserved["label"], reserved["tone"], cap["label"], cap["tone"]) == ("reserved", "a", "maxMemory", "cap")
    assert reserved["v"] == [[148.0, "0 B"], None, [53.5, "3 GiB"]]
    assert cap["v"][2] == [22.0, "4 GiB"]
    assert 'tabindex="0"' in chart.svg, "a keyboard reaches the values too"


def test_the_hover_data_of_a_long_window_holds_at_most_the_drawn_points():
    points = [(at(60 * i), float(i % 7)) for i in range(7 * 1440)]
    chart = line_chart(title="x", series=[Series("a", points)], start=at(0), end=at(60 * 7 * 1440))
    data = hover(chart.svg)
    assert len(data["t"]) <= MAX_POINTS and len(data["s"][0]["v"]) == len(data["t"])
    assert len(chart.svg) < 40_000


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "heading", "shown"),
    [
        ("", "Last 24 hours", 2),
        ("range=1h", "Last hour", 1),
        ("range=6h", "Last 6 hours", 2),
        ("range=7d", "Last 7 days", 3),
    ],
)
def test_the_range_picker_charts_the_chosen_window(viewer_client, query, heading, shown):
    scaler = make_scaler()
    now = timezone.now()
    for ago, agents in ((timedelta(minutes=5), 1), (timedelta(hours=3), 2), (timedelta(days=3), 3)):
        CapacitySample.objects.create(scaler=scaler, taken_at=now - ago, agents=agents, max_agents=4)
    page = viewer_client.get(f"/scalers/{scaler.name}/?{query}").content.decode()
    assert f'<h2 id="h-charts">{heading}</h2>' in page
    agents = next(c for c in re.findall(r"<svg class=\"chart\".*?</svg>", page) if "Agents:" in c)
    assert len(hover(agents)["t"]) == shown
    current = re.findall(r'<a href="\?range=(\w+)"[^>]*aria-current="true"', page)
    assert current == [query.removeprefix("range=") or "24h"]


@pytest.mark.django_db
def test_the_range_picker_gets_the_charts_alone_over_htmx(viewer_client):
    scaler = make_scaler()
    samples(scaler, 3)
    response = viewer_client.get(f"/scalers/{scaler.name}/?range=1h", HTTP_HX_REQUEST="true")
    page = response.content.decode()
    assert page.lstrip().startswith('<section class="panel" aria-labelledby="h-charts" id="capacity-charts">')
    assert page.count('<svg class="chart" role="img"') == 4 and "<html" not in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "named"), [("range=2d", "range: must be one of 1h, 6h, 24h, 7d"), ("ranged=1h", "ranged: unknown")]
)
def test_an_unknown_range_is_refused_naming_it(viewer_client, query, named):
    scaler = make_scaler()
    response = viewer_client.get(f"/scalers/{scaler.name}/?{query}")
    assert response.status_code == 400 and named in response.content.decode()


@pytest.mark.django_db
def test_a_week_of_minute_samples_is_kept_and_read_in_one_query_as_bucket_peaks(viewer_client):
    from scalers.samples import CHART_ROWS, prune_samples, recent_samples

    scaler = make_scaler()
    samples(scaler, 7 * 1440)
    assert prune_samples() == 0, "the longest range's samples are kept"
    burst = CapacitySample.objects.filter(scaler=scaler).order_by("taken_at")[5000]
    CapacitySample.objects.filter(pk=burst.pk).update(agents=40)
    with CaptureQueriesContext(connection) as queries:
        rows = recent_samples(scaler, timedelta(days=7), sample_seconds=60)
    assert len(queries) == 1 and CHART_ROWS // 2 < len(rows) <= CHART_ROWS
    assert sorted(r.agents for r in rows)[-2:] == [3, 40], "each bucket keeps its peak: a one-minute burst shows"
    assert [r.taken_at for r in rows] == sorted(r.taken_at for r in rows)
    assert {r.max_memory_bytes for r in rows} == {4 * GIB}
    hour = recent_samples(scaler, timedelta(hours=1), sample_seconds=60)
    assert 59 <= len(hour) <= 61 and {r.agents for r in hour} == {0, 1, 2, 3}, "a short window is read as stored"


@pytest.mark.django_db
def test_a_window_starting_on_another_day_dates_its_time_axis(viewer_client):
    """The last 24 hours always start yesterday: the start reads "Fri 04 11:07", not "11:07"."""
    from front.charts import scaler_charts

    end = timezone.make_aware(datetime(2026, 12, 5, 11, 7))
    day = scaler_charts([], start=end - timedelta(days=1), end=end, sample_seconds=60)[0].svg
    assert ">Fri 04 11:07</text>" in day and ">now</text>" in day
    hour = scaler_charts([], start=end - timedelta(hours=1), end=end, sample_seconds=60)[0].svg
    assert ">10:07</text>" in hour
