"""An htmx request the console refuses (4xx) replaces its target with the error, in Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from scalers.models import LabelSet, Scaler

pytestmark = pytest.mark.browser


def test_a_refused_preview_replaces_the_stale_ok_and_leaves_nothing_to_apply(browser_page):
    scaler = Scaler.objects.create(name="ui-htmx-errors", type="container", max_agents=4)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux", host_access=["172.30.0.1:53"])
    page = browser_page("operations.request_operation")
    page.goto(f"/scalers/{scaler.name}/label-sets/0/host-access/")
    textarea = page.locator("#entries")
    textarea.fill("172.30.0.1:53\n10.0.0.5:443")
    expect(page.locator("#preview #apply")).to_be_enabled()

    textarea.fill("172.30.0.1:53\n10.0.0.5:443\x00")  # the server answers 400
    error = page.locator("#preview[role=alert]")
    expect(error).to_contain_text("entries contains a NUL byte")
    assert "10.0.0.5:443\\x00" in error.inner_text()
    assert page.locator("#entry-checks").count() == 0  # the stale "ok" preview is gone
    assert page.locator("#host-access-form button[type=submit]:enabled").count() == 0

    textarea.fill("172.30.0.1:53\n10.0.0.6:443")  # corrected: the preview comes back
    expect(page.locator("#preview #apply")).to_be_enabled()
    assert "10.0.0.6:443" in page.locator("#effective").inner_text()
    assert not page.locator("#preview[role=alert]").count()


def test_typing_entries_in_the_default_mode_picks_the_explicit_list(browser_page):
    scaler = Scaler.objects.create(name="ui-picks-explicit", type="container", max_agents=4)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    page = browser_page("operations.request_operation")
    page.goto(f"/scalers/{scaler.name}/label-sets/0/host-access/")
    expect(page.locator("input[name=mode][value=default]")).to_be_checked()
    page.locator("#entries").press("End")
    page.locator("#entries").type("\n172.30.0.1:5000")
    expect(page.locator("#mode-explicit")).to_be_checked()
    expect(page.locator("#effective")).to_contain_text("172.30.0.1:5000")  # the preview follows
    expect(page.locator("#preview-ignored")).to_have_count(0)
    assert not page.js_errors, page.js_errors
