"""The nav badge and the dashboard's "Needs attention" panel in Debian Chromium against a real
daphne: they follow an operation awaiting approval without reload, and an opted-in browser gets a
notification when the count goes up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from operations.models import Operation, operation_progress

pytestmark = pytest.mark.browser

#: The Notification API, recorded: headless Chromium shows nothing, so the page's calls are kept.
FAKE_NOTIFICATION = """
window.__notes = [];
window.Notification = function (title, options) { window.__notes.push(title + " | " + (options || {}).body); };
window.Notification.permission = "granted";
window.Notification.requestPermission = function () { return Promise.resolve("granted"); };
"""


def _plan() -> Operation:
    """A planned operation, announced as services.store_plan announces it."""
    op = Operation.objects.create(
        kind="orphan-containers",
        scaler_name="ui-attn",
        host_queue="host:test",
        scope_key="k",
        plan_digest="d",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    operation_progress.send(sender=Operation, operation_id=op.pk, keys=[])
    return op


def test_the_badge_and_panel_follow_an_operation_and_notify_an_opted_in_browser(browser_page, off_loop):
    page = browser_page()
    page.add_init_script(FAKE_NOTIFICATION)
    page.goto("/")
    assert page.locator("#attention-items").inner_text().strip() == "Nothing needs you."
    assert page.locator("#attention-badge").is_hidden()
    toggle = page.locator("[data-notify-toggle]")
    assert toggle.inner_text() == "Notify me in this browser"
    toggle.click()
    page.wait_for_function("document.querySelector('[data-notify-toggle]').textContent === 'Stop notifying'")
    page.evaluate("window.__not_reloaded = true")

    op = off_loop(_plan)
    page.wait_for_selector("#attention-badge:not([hidden])")
    assert page.locator("#attention-badge").get_attribute("data-count") == "1"
    assert "1 operation awaits approval" in page.locator("#attention-items").inner_text()
    assert page.locator(f'#attention-items a[href="/operations/{op.pk}/"]').count() == 1
    page.wait_for_function("window.__notes.length === 1")
    assert page.evaluate("window.__notes") == ["KiCI: 1 thing needs you | 1 awaiting approval"]
    assert page.evaluate("window.__not_reloaded") is True

    other = browser_page(username="ui-browser-2")
    other.add_init_script(FAKE_NOTIFICATION)
    other.goto("/agents/")  # every page carries the badge; a page load notifies nothing
    assert other.locator("#attention-badge").inner_text().startswith("1")
    Operation.objects.filter(pk=op.pk).update(status="rejected")
    off_loop(operation_progress.send, sender=Operation, operation_id=op.pk, keys=[])
    other.wait_for_selector("#attention-badge[hidden]", state="attached")
    page.wait_for_selector("#attention-badge[hidden]", state="attached")
    assert page.evaluate("window.__notes.length") == 1 and other.evaluate("window.__notes.length") == 0
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors
