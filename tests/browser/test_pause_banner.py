"""The pause banner in Debian Chromium against a real daphne: a pause planned from the scaler
page's form and approved shows who asked, who approved and why on every page; a resume planned
from the same panel and approved takes it away."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from operations.jobs import run_operation
from operations.models import Operation
from operations.services import approve_operation
from scalers.models import Pause
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.browser

PERMS = ("operations.view_operation", "operations.request_operation", "operations.approve_operation")


def _approve_and_run_latest() -> Operation:
    op = Operation.objects.latest("pk")
    approve_operation(op, User.objects.get(username="pause-browser"), require_worker=False, enqueue=False)
    run_operation(op.pk)
    return op


def test_a_pause_shows_a_banner_with_who_and_why_until_it_is_resumed(browser_page):
    make_scaler("paused-c", labels=("linux",), host="h1")
    page = browser_page(*PERMS, username="pause-browser")

    page.goto("/scalers/paused-c/")
    expect(page.locator("#pause-banner")).to_be_hidden()
    form = page.locator("#pause-scaler")
    form.get_by_label("why pause scaler paused-c").fill("firmware update on the docker host")
    form.get_by_role("button", name="Pause scaler…").click()
    page.get_by_role("button", name="Request approval").click()  # from the preview, which stores nothing
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    assert "pause: no new agent" in page.locator("#op-targets").inner_text()
    _approve_and_run_latest()
    assert Pause.objects.get().reason == "firmware update on the docker host"

    for url in ("/", "/scalers/paused-c/"):
        page.goto(url)
        banner = page.locator("#pause-banner")
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("scaler paused-c is paused by pause-browser, approved by pause-browser")
        expect(banner).to_contain_text("firmware update on the docker host")
    expect(page.locator("#paused")).to_be_visible()

    page.get_by_role("button", name="Resume scaler…").click()
    page.get_by_role("button", name="Request approval").click()
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    expect(page.locator("#pause-banner")).to_be_visible()
    _approve_and_run_latest()
    # The open page drops the banner once the resume took effect, without a reload.
    expect(page.locator("#pause-banner")).to_be_hidden(timeout=15_000)
    page.goto("/scalers/paused-c/")
    expect(page.locator("#pause-banner")).to_be_hidden()
    expect(page.locator("#pause-state")).to_contain_text("Not paused")
    assert not page.js_errors, page.js_errors


def test_an_open_scaler_page_follows_a_pause_and_a_resume_in_its_pause_panel(browser_page):
    from scalers.pauses import lift_pause, set_pause

    scaler = make_scaler("paused-live", labels=("linux",))
    page = browser_page(*PERMS, username="pause-live")
    page.goto("/scalers/paused-live/")
    expect(page.locator("#pause-state")).to_contain_text("Not paused")
    set_pause(scaler=scaler, reason="rack move", requested_by="ops", approved_by="lead", operation=None)
    expect(page.locator("#pause-banner")).to_be_visible(timeout=15_000)
    expect(page.locator("#pause-state")).to_contain_text("rack move")  # the panel, not only the banner
    expect(page.locator("#pause-group-scaler")).to_contain_text("Resume scaler…")
    lift_pause(scaler=scaler)
    expect(page.locator("#pause-state")).to_contain_text("Not paused", timeout=15_000)
    expect(page.locator("#pause-scaler")).to_be_visible()
    assert not page.js_errors, page.js_errors
