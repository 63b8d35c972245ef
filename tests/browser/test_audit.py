"""The audit page in Debian Chromium, under the console's Content-Security-Policy: filtering by
what, who and time range narrows the rows, and the export links carry the filters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.records import record_audit

pytestmark = pytest.mark.browser


def test_filtering_the_audit_page_narrows_its_rows_and_its_exports(browser_page):
    now = timezone.now()
    record_audit(
        "operation.approved", actor="ops-anna", actor_kind="user", operation_id=41, at=now - timedelta(hours=5)
    )
    record_audit(
        "api.release", actor="ci-token", actor_kind="token", agent_ref="scaler-x-1", at=now - timedelta(hours=2)
    )
    record_audit("api.release", actor="other-token", actor_kind="token", agent_ref="scaler-x-2", at=now)
    page = browser_page("audit.view_auditrecord", csp=True)
    page.goto("/audit/")
    rows = page.locator("#audit-rows tr")
    assert page.get_by_role("link", name="Audit").get_attribute("aria-current") == "page"
    rows.nth(3).wait_for()  # three records and this user's own sign-in

    page.get_by_label("What").select_option("api.release")  # data-autosubmit: kici.js submits
    page.wait_for_url("**/audit/?*what=api.release*")
    assert rows.count() == 2

    page.get_by_label("Who", exact=True).fill("ci-tok")
    page.get_by_label("Who", exact=True).press("Enter")
    page.wait_for_url("**who=ci-tok*")
    assert rows.count() == 1 and "scaler-x-1" in rows.first.inner_text()

    page.get_by_label("Who", exact=True).fill("")
    page.get_by_label("From", exact=True).fill(timezone.localtime(now - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M"))
    page.get_by_label("To", exact=True).fill(timezone.localtime(now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**since=*")
    assert rows.count() == 1 and "ci-token" in rows.first.inner_text()
    csv_href = page.get_by_role("link", name="CSV").get_attribute("href") or ""
    assert "what=api.release" in csv_href and "since=" in csv_href and csv_href.endswith("format=csv")
    assert page.js_errors == []
