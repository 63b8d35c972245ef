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
