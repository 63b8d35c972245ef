"""``/audit/``: each kind of change is a record after its action; the filters, the exports and
who may read it."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import Client
from django.utils import timezone

from audit.models import AuditRecord
from audit.records import record_audit
from operations.services import approve_operation, create_operation, reject_operation
from tests.scalers.test_import_scalers import BASE, apply_text
from tests.support.operations import listening_worker, login
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_queues")]


def approve_and_run(op, approver, run_rq_jobs, on_commit, *, confirm: bool = False):
    """Approve ``op`` (its enqueue runs on commit, captured), run its job, return it reloaded."""
    with listening_worker(op.host_queue), on_commit(execute=True):
        approve_operation(op, approver, warnings_confirmed=confirm)
    run_rq_jobs(op.host_queue)
    op.refresh_from_db()
    return op


def actions(**filters) -> list[str]:
    return list(AuditRecord.objects.filter(**filters).order_by("at", "id").values_list("action", flat=True))


def body(response) -> bytes:
    """The streamed body, read from its async iterator as daphne reads it."""

    async def collect() -> bytes:
        return b"".join([part async for part in response])

    return async_to_sync(collect)()


def test_an_approved_reload_is_recorded_from_request_to_each_target(
    users, config_file, run_rq_jobs, django_capture_on_commit_callbacks
):
    op = create_operation("config-reload", {}, users["operator"])
    op = approve_and_run(op, users["approver"], run_rq_jobs, django_capture_on_commit_callbacks)
    assert actions(operation_id=op.pk) == [
        "operation.requested",
        "operation.approved",
        "operation.started",
        "target.done",
        "target.done",
        "operation.succeeded",
    ]
    approved = AuditRecord.objects.get(operation_id=op.pk, action="operation.approved")
    assert (approved.actor, approved.actor_kind, approved.operation_kind) == ("ops-approver", "user", "config-reload")
    assert AuditRecord.objects.get(action="operation.requested").actor == "ops-operator"
    assert AuditRecord.objects.filter(action="operation.started", actor="system", actor_kind="system").exists()
    done = AuditRecord.objects.filter(action="target.done", operation_id=op.pk).values_list("detail", flat=True)
    assert any("ops-reload" in d for d in done)


def test_a_rejection_is_recorded_with_its_note(users, config_file):
    op = create_operation("config-reload", {}, users["operator"])
    reject_operation(op, users["approver"], note="not today")
    rejected = AuditRecord.objects.get(action="operation.rejected")
    assert (rejected.actor, rejected.operation_id) == ("ops-approver", op.pk)
    assert "not today" in rejected.detail


def test_a_host_access_change_is_recorded_on_its_scaler_and_label_set(
    users, run_rq_jobs, django_capture_on_commit_callbacks
):
    scaler = make_scaler(name="audit-ha", orchestrator_url="http://172.30.0.1:8000")
    label_set = scaler.label_sets.get()
    op = create_operation(
        "host-access-apply",
        {"label_set": label_set, "params": {"host_access": ["*:8000", "*:9000"]}},
        users["operator"],
    )
    op = approve_and_run(op, users["approver"], run_rq_jobs, django_capture_on_commit_callbacks, confirm=True)
    assert op.status == "succeeded", (op.error, op.log)
    assert actions(operation_kind="host-access-apply", scaler_name="audit-ha", action__startswith="operation.") == [
        "operation.requested",
        "operation.approved",
        "operation.started",
        "operation.succeeded",
    ]
    assert AuditRecord.objects.filter(action="target.done", operation_id=op.pk).count() == len(op.plan)


def test_a_configuration_change_by_an_import_is_recorded():
    apply_text(BASE)
    assert actions(action="config.changed") == [], "a first import changes nothing in force"
    apply_text(BASE.replace("maxAgents: 3", "maxAgents: 7"))
    changed = AuditRecord.objects.get(action="config.changed")
    assert (changed.scaler_name, changed.actor) == ("alpha", "system")
    assert "maxAgents" in changed.detail


def test_sign_ins_refusals_and_sign_outs_are_recorded_with_the_address(users):
    client = Client(REMOTE_ADDR="127.0.0.9")
    client.post(settings.LOGIN_URL, {"username": "ops-viewer", "password": "wrong"})
    client.post(settings.LOGIN_URL, {"username": "ops-viewer", "password": "pw-viewer"})
    client.post("/accounts/logout/")
    assert list(AuditRecord.objects.order_by("at", "id").values_list("action", "actor", "remote_addr")) == [
        ("login.failed", "ops-viewer", "127.0.0.9"),
        ("login.succeeded", "ops-viewer", "127.0.0.9"),
        ("logout", "ops-viewer", "127.0.0.9"),
    ]


@pytest.fixture
def trail(db):
    now = timezone.now()
    rows = [
        ("operation.approved", "ops-approver", "user", "ci", 7, "orphan-containers", "", now - timedelta(hours=3)),
        ("target.done", "system", "system", "ci", 7, "orphan-containers", "", now - timedelta(hours=2)),
        ("api.release", "ci-token", "token", "gpu", None, "", "scaler-container-0000abcd", now - timedelta(minutes=30)),
        ("login.succeeded", "ops-viewer", "user", "", None, "", "", now - timedelta(minutes=5)),
    ]
    for action, actor, kind, scaler, op, op_kind, agent, at in rows:
        record_audit(
            action,
            actor=actor,
            actor_kind=kind,
            scaler_name=scaler,
            operation_id=op,
            operation_kind=op_kind,
            agent_ref=agent,
            detail=f"{action}, with a comma",
            at=at,
        )
    return now


def shown(response) -> list[str]:
    page = response.content.decode().partition('id="audit-rows"')[2]
    return [a for a in ("operation.approved", "target.done", "api.release", "login.succeeded") if f">{a}<" in page]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ["operation.approved", "target.done", "api.release", "login.succeeded"]),
        ("who=approver", ["operation.approved"]),
        ("what=api.release", ["api.release"]),
        ("what=orphan-containers", ["operation.approved", "target.done"]),
        ("scaler=ci", ["operation.approved", "target.done"]),
        ("agent=scaler-container-0000abcd", ["api.release"]),
        ("operation=7", ["operation.approved", "target.done"]),
    ],
)
def test_the_page_filters_by_who_what_scaler_agent_and_operation(trail, operator_client, query, expected):
    response = operator_client.get(f"/audit/?{query}")
    assert response.status_code == 200
    assert shown(response) == expected


def test_the_page_filters_by_time_range(trail, operator_client):
    since = timezone.localtime(trail - timedelta(hours=2, minutes=30)).strftime("%Y-%m-%dT%H:%M:%S")
    until = timezone.localtime(trail - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S")
    response = operator_client.get("/audit/", {"since": since, "until": until})
    assert shown(response) == ["target.done", "api.release"]
    assert f'value="{since}"' in response.content.decode(), "the form keeps the range"


def test_each_entry_links_to_its_operation_or_agent(trail, operator_client):
    page = operator_client.get("/audit/").content.decode()
    assert 'href="/operations/7/"' in page
    assert 'href="/agents/scaler-container-0000abcd/"' in page
    assert 'href="/scalers/ci/"' in page


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("what=nope", "what: must be an audit action or an operation kind"),
        ("since=yesterday", "since: must be a date and time"),
        ("since=2026-12-05T10:00&until=2026-12-05T09:00", "until: must be after since"),
        ("operation=x", "operation: must be a whole number"),
        ("format=xml", "format: must be one of csv, json"),
        ("who=a&who=b", "who: takes one value"),
        ("colour=red", "colour: unknown parameter"),
    ],
)
def test_a_bad_filter_is_refused_naming_it(operator_client, query, named):
    response = operator_client.get(f"/audit/?{query}")
    assert response.status_code == 400
    assert named in response.content.decode()


def test_the_csv_export_parses_and_keeps_the_filters(trail, operator_client):
    response = operator_client.get("/audit/?scaler=ci&format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment;")
    assert (response["X-Audit-Rows"], response["X-Audit-Truncated"]) == ("2", "false")
    rows = list(csv.DictReader(io.StringIO(body(response).decode())))
    assert [(r["action"], r["operation_id"], r["detail"]) for r in rows] == [
        ("target.done", "7", "target.done, with a comma"),
        ("operation.approved", "7", "operation.approved, with a comma"),
    ]


def test_the_json_export_parses_and_says_when_it_was_cut(trail, operator_client, monkeypatch):
    monkeypatch.setattr("front.views.audit.EXPORT_MAX", 3)
    monkeypatch.setattr("front.views.audit.EXPORT_CHUNK", 2)
    response = operator_client.get("/audit/?format=json")
    data = json.loads(body(response))
    # The newest is the operator's own sign-in (force_login sends the signal too).
    assert [(e["action"], e["actor"]) for e in data["entries"]] == [
        ("login.succeeded", "ops-operator"),
        ("login.succeeded", "ops-viewer"),
        ("api.release", "ci-token"),
    ]
    assert (data["count"], data["total"], data["truncated"]) == (3, 5, True)
    assert response["X-Audit-Truncated"] == "true"
    assert data["entries"][2]["agent"] == "scaler-container-0000abcd"


def test_operators_and_approvers_read_it_viewers_and_outsiders_do_not(users, client):
    for who, status in (("operator", 200), ("approver", 200), ("viewer", 403), ("outsider", 403)):
        login(client, users[who])
        assert client.get("/audit/").status_code == status, who
        assert client.get("/audit/?format=csv").status_code == status, who
        nav = client.get("/events/").content.decode() if who != "outsider" else ""
        assert ('href="/audit/"' in nav) == (status == 200), who
    client.logout()
    assert client.get("/audit/").status_code == 302


def test_records_past_their_retention_are_pruned_by_the_sweepers_retention_unit(settings):
    from operations.management.commands.scaler_sweeper import Command

    settings.KICI_AUDIT_RETENTION_DAYS = 30
    now = timezone.now()
    record_audit("logout", actor="old", at=now - timedelta(days=31))
    record_audit("logout", actor="kept", at=now - timedelta(days=29))
    assert Command().handle_old_records() is True
    assert list(AuditRecord.objects.values_list("actor", flat=True)) == ["kept"]


def test_the_last_hour_link_keeps_the_other_filters_and_selects_the_last_hour(trail, operator_client):
    import re
    from html import unescape

    page = operator_client.get("/audit/?what=login.succeeded").content.decode()
    href = unescape(re.search(r'<a href="\?([^"]*)">last hour</a>', page).group(1))
    assert "what=login.succeeded" in href and "since=" in href
    assert shown(operator_client.get(f"/audit/?{href}")) == ["login.succeeded"]
    hour = unescape(re.search(r'<a href="\?([^"]*)">last hour</a>', page).group(1)).replace("what=login.succeeded", "")
    assert shown(operator_client.get(f"/audit/?{hour}")) == ["api.release", "login.succeeded"]
