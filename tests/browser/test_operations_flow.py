"""An operation in Debian Chromium against a real daphne: preview from the scaler page → approve with
the confirmation step → live progress over the WebSocket → done, without a reload."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from agents.choices import AgentState
from agents.models import Agent
from operations.models import Operation
from scalers.models import LabelSet, Reservation, Scaler
from tests.support.operations import listening_worker

pytestmark = pytest.mark.browser

PERMS = ("operations.view_operation", "operations.request_operation", "operations.approve_operation")


def _stale_reservation() -> Agent:
    scaler = Scaler.objects.create(name="ops-browser-ev", type="event", max_agents=4)
    ls = LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    agent = Agent.objects.create(
        agent_id="scaler-event-0b5e0001",
        scaler=scaler,
        label_set=ls,
        state=AgentState.FAILED,
        labels=["linux"],
        finished_at=timezone.now(),
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=2**30, owner_instance="ops")
    return agent


def test_preview_approve_live_progress_done(browser_page, wait_live, off_loop):
    import django_rq

    for name in settings.RQ_QUEUES:
        django_rq.get_queue(name).empty()
    agent = _stale_reservation()
    page = browser_page(*PERMS, username="ops-browser")

    # preview from the scaler page's entry point
    page.goto(f"/scalers/{agent.scaler.name}/")
    page.get_by_role("button", name="Preview stale reservations…").click()
    page.wait_for_url(re.compile(r"/operations/plan/$"))
    page.locator("#dry-run").wait_for()  # a dry run: nothing stored yet
    assert not Operation.objects.exists()
    page.get_by_role("button", name="Request approval").click()
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    op = Operation.objects.get()
    row = page.locator("#op-targets tr").first
    assert agent.agent_id in row.inner_text() and "release reservation" in row.inner_text()
    assert page.locator('[data-testid="op-status"]').inner_text() == "Planned"

    # approve, with the confirmation step, while a worker listens on the host queue
    page.get_by_role("link", name="Approve…").click()
    page.wait_for_url(re.compile(rf"/operations/{op.pk}/approve/$"))
    with listening_worker(op.host_queue):
        page.get_by_role("button", name="Approve 1 target").click()
        page.wait_for_url(re.compile(rf"/operations/{op.pk}/$"))
    assert page.locator('[data-testid="op-status"]').inner_text() == "Approved"
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")

    # the worker runs the enqueued job; the page follows live
    op.refresh_from_db()
    job = django_rq.get_queue(op.host_queue).fetch_job(op.rq_job_id)
    assert job.func_name == "operations.jobs.run_operation"
    assert "succeeded" in off_loop(job.perform)
    page.wait_for_selector('#op-status[data-status="succeeded"]')
    page.wait_for_selector('#op-targets tr[data-outcome="done"]')
    page.locator("#op-log").get_by_text("finished: 1 done, 0 skipped, 0 failed").wait_for()
    op.refresh_from_db()
    page.wait_for_function(f"document.querySelectorAll('#op-log li').length === {len(op.log)}")
    assert page.locator("#op-log-empty").count() == 0, "the placeholder goes when the first line arrives"
    expect(page.locator("#op-progress")).to_contain_text("1 of 1 target processed")
    assert page.evaluate("window.__not_reloaded") is True
    assert not Reservation.objects.filter(agent=agent).exists()
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors
