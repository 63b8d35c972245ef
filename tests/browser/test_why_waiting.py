"""The "Why is this job waiting?" page in Debian Chromium: the refusing cap and who holds it."""

from __future__ import annotations

import pytest

from scalers.admission.queue import shutdown_queue
from tests.support.admission import request_scale
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def no_spawns(monkeypatch):
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)
    yield
    shutdown_queue()


def test_an_operator_sees_which_cap_refused_a_job_and_the_reservations_holding_it(browser_page, off_loop):
    make_scaler("waiting-ci", max_agents=1)
    holder_id = off_loop(request_scale, ["linux"], "job-holding").agent
    refused = off_loop(request_scale, ["linux"], "job-waiting")
    assert refused.action == "at-capacity" and refused.cap == "maxAgents"

    page = browser_page()
    page.goto("/")
    page.get_by_role("link", name="Why waiting").first.click()
    page.wait_for_url("**/scalers/why-waiting/")
    group = page.locator("section[data-cap='maxAgents']")
    group.wait_for()
    text = group.inner_text()
    assert "job-waiting" in text and "waiting-ci" in text
    holders = group.locator("table.holders")
    assert holder_id in holders.inner_text()
    holders.get_by_role("link", name=holder_id).click()
    page.wait_for_url(f"**/agents/{holder_id}/")
