"""The console in a phone-sized window (390 px) in Debian Chromium: nothing runs off the side."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}


def test_the_agents_search_box_fits_and_every_section_link_is_in_sight_at_390_px(browser_page):
    page = browser_page("operations.request_operation", username="ui-narrow", viewport=PHONE)
    User.objects.filter(username="ui-narrow").update(is_staff=True, is_superuser=True)  # the longest nav
    page.goto("/agents/")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], "the page scrolls sideways"
    search = page.locator("input[name=q]").bounding_box()
    panel = page.locator("form[role=search]").bounding_box()
    assert search["x"] >= panel["x"] and search["x"] + search["width"] <= panel["x"] + panel["width"] + 0.5, (
        search,
        panel,
    )
    nav = page.locator("nav.nav")
    assert nav.evaluate("n => n.scrollWidth <= n.clientWidth"), "the nav is cut"
    links = nav.locator("a:not([hidden])")
    assert links.count() >= 9
    for i in range(links.count()):
        box = links.nth(i).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (
            links.nth(i).inner_text(),
            box,
        )
