"""Approval notices: a planned operation that waits for a person is POSTed, signed, to
KICI_NOTIFY_URL by an rq job; nothing is sent for what a policy approves by itself, for what was
decided before the job ran, or when notices are off. A live HTTP receiver on loopback checks each
signature."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from datetime import timedelta

import django_rq
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from agents.choices import AgentState
from operations.choices import OperationStatus
from operations.notify import APPROVAL_NEEDED, NOTICES, send_approval_notice
from operations.services import create_operation, reject_operation
from operations.sweeps import run_periodic_sweeps
from scalers.backends.emitter import HttpEventEmitter
from scalers.models import MetricCounter
from tests.support.provisioner import Provisioner
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_queues")]

SECRET = "notice-test-secret"


@pytest.fixture
def receiver(settings):
    hook = Provisioner(secret=SECRET)
    settings.KICI_NOTIFY_URL = hook.url
    settings.KICI_NOTIFY_SECRET = SECRET
    settings.KICI_OPERATOR_URL = "https://ops.example.test/"
    yield hook
    hook.server.shutdown()


def counted(result: str) -> float:
    row = MetricCounter.objects.filter(name=NOTICES, labels={"event": APPROVAL_NEEDED, "result": result}).first()
    return row.value if row else 0.0


def test_a_plan_waiting_for_a_person_is_announced_once_signed_with_a_link(
    receiver, users, config_file, run_rq_jobs, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        op = create_operation("config-reload", {}, users["operator"])
    assert django_rq.get_queue("default").count == 1
    run_rq_jobs("default")
    (delivery,) = receiver.deliveries()
    assert receiver.signed == [True]
    assert receiver.requests[0]["headers"]["X-Kici-Event"] == APPROVAL_NEEDED
    assert delivery["event"] == APPROVAL_NEEDED
    payload = delivery["payload"]
    assert payload["operationId"] == op.pk and payload["kind"] == "config-reload"
    assert payload["requestedBy"] == users["operator"].username and payload["targets"] == len(op.plan)
    assert payload["url"] == f"https://ops.example.test/operations/{op.pk}/"
    assert counted("sent") == 1
    # The same plan asked for again is the open operation: no second notice.
    with django_capture_on_commit_callbacks(execute=True):
        assert create_operation("config-reload", {}, users["operator"]).reused
    assert django_rq.get_queue("default").count == 0


def test_an_operation_decided_before_the_job_runs_gets_no_notice(
    receiver, users, config_file, run_rq_jobs, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        op = create_operation("config-reload", {}, users["operator"])
    reject_operation(op, users["approver"], note="not now")
    run_rq_jobs("default")
    assert receiver.deliveries() == [] and counted("skipped") == 1


def test_a_sweep_announces_what_waits_for_a_person_and_not_what_it_approves_itself(
    receiver, monkeypatch, django_capture_on_commit_callbacks
):
    for kind in ("ORPHAN_CONTAINERS", "ORPHAN_VMS", "STALE_ISOLATION_RULES", "SCALER_RETIREMENT", "LOST_AGENTS"):
        monkeypatch.setenv(f"KICI_SWEEP_{kind}_SECONDS", "0")
    monkeypatch.setenv("KICI_SWEEP_STALE_RESERVATIONS_SECONDS", "900")
    monkeypatch.setenv("KICI_AUTO_APPROVE", "stale-reservations")
    scaler = make_scaler(name=f"ops-nt-{secrets.token_hex(2)}", type="event")
    make_agent(scaler, state=AgentState.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        (op,) = run_periodic_sweeps(timezone.now() + timedelta(seconds=901))
    assert op.status == OperationStatus.APPROVED
    assert django_rq.get_queue("default").count == 0
    monkeypatch.delenv("KICI_AUTO_APPROVE")
    make_agent(scaler, state=AgentState.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        (waiting,) = run_periodic_sweeps(timezone.now() + timedelta(seconds=1900))
    assert waiting.status == OperationStatus.PLANNED
    assert django_rq.get_queue("default").count == 1


def test_a_receiver_that_keeps_failing_is_logged_and_counted_and_the_plan_stands(settings, users, config_file, caplog):
    hook = Provisioner(fail_first=10, status=503, secret=SECRET)
    try:
        settings.KICI_NOTIFY_URL, settings.KICI_NOTIFY_SECRET = hook.url, SECRET
        op = create_operation("config-reload", {}, users["operator"])
        quick = HttpEventEmitter(secret=SECRET, attempts=2, backoff=0.01, timeout=2)
        assert send_approval_notice(op.pk, emitter=quick) == "failed"
    finally:
        hook.server.shutdown()
    assert len(hook.requests) == 2 and counted("failed") == 1
    assert f"approval notice of operation #{op.pk} not delivered" in caplog.text
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED


def test_notices_are_off_without_a_url_and_never_sent_unsigned(
    settings, users, config_file, monkeypatch, django_capture_on_commit_callbacks
):
    settings.KICI_NOTIFY_URL = ""
    with django_capture_on_commit_callbacks(execute=True):
        create_operation("config-reload", {}, users["operator"])
    assert django_rq.get_queue("default").count == 0
    from lib.env import env_http_url

    monkeypatch.setenv("KICI_NOTIFY_URL", "ftp://hooks.example.test/x")
    with pytest.raises(ImproperlyConfigured, match="KICI_NOTIFY_URL: expected an http"):
        env_http_url("KICI_NOTIFY_URL")
    # A URL without a secret stops the settings from loading: a console never sends unsigned.
    env = {k: v for k, v in os.environ.items() if k != "KICI_NOTIFY_SECRET"}
    env.update(KICI_NOTIFY_URL="http://127.0.0.1:9/hook", DJANGO_SETTINGS_MODULE="kici_site.settings")
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and "KICI_NOTIFY_SECRET is not" in out.stderr
