"""The scaler page's capacity charts in Debian Chromium: inline SVG drawn at size, styled by
kici.css, and named for assistive technology by their summary."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from scalers.models import CapacitySample
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.browser


def test_the_charts_are_drawn_as_named_images_in_the_page_colours(browser_page):
    scaler = make_scaler("charted-ci", max_agents=4, cpu=2)
    now = timezone.now()
    CapacitySample.objects.bulk_create(
        CapacitySample(
            scaler=scaler,
            taken_at=now - timedelta(minutes=60 - i),
            agents=i % 4,
            cpus=i % 4 * 0.5,
            max_agents=4,
            max_cpu=2,
        )
        for i in range(60)
    )
    page = browser_page()
    page.goto(f"/scalers/{scaler.name}/")
    agents = page.get_by_role("img", name=re.compile(r"^Agents: reserved latest 3, peak 3; .*maxAgents 4\.$"))
    agents.wait_for()
    box = agents.bounding_box()
    assert box and box["width"] > 250 and box["height"] > 60
    assert agents.evaluate("e => e.namespaceURI") == "http://www.w3.org/2000/svg"
    line = agents.locator("polyline.chart-line-a").first
    cap = agents.locator("polyline.chart-cap").first
    accent, red = page.evaluate(
        "() => { const s = getComputedStyle(document.documentElement);"
        " return [s.getPropertyValue('--accent').trim(), s.getPropertyValue('--red').trim()]; }"
    )

    def rgb(hex_colour: str) -> str:
        r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return f"rgb({r}, {g}, {b})"

    assert line.evaluate("e => getComputedStyle(e).stroke") == rgb(accent)
    assert cap.evaluate("e => getComputedStyle(e).stroke") == rgb(red)
    assert cap.evaluate("e => getComputedStyle(e).strokeDasharray") != "none"
    assert page.get_by_role("img", name=re.compile(r"^Scale to registered: p50 no data; p95 no data\.$")).count() == 1


def test_picking_a_range_redraws_the_charts_and_pointing_shows_the_values(browser_page):
    scaler = make_scaler("ranged-ci", max_agents=12, cpu=2)
    now = timezone.now()
    CapacitySample.objects.create(scaler=scaler, taken_at=now - timedelta(days=3), agents=9, max_agents=12)
    CapacitySample.objects.bulk_create(
        CapacitySample(scaler=scaler, taken_at=now - timedelta(minutes=59 - i), agents=i % 4, running=1, max_agents=12)
        for i in range(60)
    )
    page = browser_page(csp=True)  # the console's policy: no inline script or style
    page.goto(f"/scalers/{scaler.name}/")
    picker = page.get_by_role("navigation", name="Chart range")
    assert picker.get_by_role("link", name="24 h").get_attribute("aria-current") == "true"

    picker.get_by_role("link", name="7 d").click()
    page.get_by_role("heading", name="Last 7 days").wait_for()
    page.get_by_role("img", name=re.compile(r"^Agents: reserved latest 3, peak 9;")).wait_for()
    assert page.url.endswith("?range=7d"), "the range is in the address, for a reload or a link"

    picker = page.get_by_role("navigation", name="Chart range")
    picker.get_by_role("link", name="1 h").click()
    page.get_by_role("heading", name="Last hour").wait_for()
    agents = page.get_by_role("img", name=re.compile(r"^Agents: reserved latest 3, peak 3;"))
    agents.wait_for()
    box = agents.bounding_box()
    assert box
    # The last sample sits at the plot's right end (viewBox x 590 of 600): point just left of it.
    page.mouse.move(box["x"] + box["width"] * 589 / 600, box["y"] + box["height"] / 2)
    tip = agents.locator(".chart-tip")
    tip.locator("text", has_text="reserved: 3").wait_for()
    assert tip.locator("text", has_text="running: 1").count() == 1
    assert tip.locator("text", has_text="maxAgents: 12").count() == 1
    shown_time = tip.locator(".chart-tip-time").text_content() or ""
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", shown_time)
    crosshair = agents.locator("line.chart-crosshair")
    assert abs(float(crosshair.get_attribute("x1") or 0) - 590) < 1
    assert agents.locator("g.chart-hover").get_attribute("visibility") == "visible"

    # Nine samples to the left (each 520/60 viewBox units apart): the value there.
    page.mouse.move(box["x"] + box["width"] * (590 - 9 * 520 / 60) / 600, box["y"] + box["height"] / 2)
    tip.locator("text", has_text="reserved: 2").wait_for()  # sample 50: 50 % 4
    page.mouse.move(box["x"] - 20, box["y"] - 20)
    assert agents.locator("g.chart-hover").get_attribute("visibility") == "hidden"

    agents.focus()
    page.keyboard.press("End")
    tip.locator("text", has_text="reserved: 3").wait_for()
    page.keyboard.press("ArrowLeft")
    tip.locator("text", has_text="reserved: 2").wait_for()
    assert page.js_errors == []
