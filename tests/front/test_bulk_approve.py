"""Bulk approval from ``/operations/``: approvers tick planned operations, a confirmation step lists
each with its targets, and the POST approves all of them or none."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

import operations.services
from agents.choices import AgentState
from operations.choices import OperationStatus
from operations.models import Operation
from operations.services import BULK_APPROVE_LIMIT, create_operation, reject_operation
from tests.support.operations import listening_worker
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_queues")]

QUEUE = settings.KICI_HOST_QUEUE


@pytest.fixture
def planned(users):
    """Two planned drains (one agent each, of two scalers) requested by the operator."""
    made = []
    for name in ("bulk-a", "bulk-b"):
        agent = make_agent(make_scaler(name), AgentState.RUNNING)
        made.append(create_operation("agent-drain", {"agent_ids": [agent.agent_id]}, users["operator"]))
    return made


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def query(*operations) -> str:
    return "&".join(f"op={op.pk}" for op in operations)


def test_approvers_get_a_checkbox_on_planned_rows_only(users, planned):
    reject_operation(planned[1], users["approver"])
    html = client_of(users["approver"]).get("/operations/").content.decode()
    assert '<section class="panel selectable">' in html and 'id="bulk-approve"' in html
    assert f'value="{planned[0].pk}" form="bulk-approve"' in html
    assert f'value="{planned[1].pk}" form="bulk-approve"' not in html
    html = client_of(users["operator"]).get("/operations/").content.decode()
    assert 'id="bulk-approve"' not in html and '<section class="panel">' in html


def test_the_confirmation_step_lists_each_operation_with_its_targets(users, planned):
    response = client_of(users["approver"]).get(f"/operations/approve/?{query(*planned)}")
    html = response.content.decode()
    assert response.status_code == 200
    for op in planned:
        assert f'id="bulk-operation-{op.pk}"' in html and op.plan[0]["subject"] in html
        assert f'<input type="hidden" name="op" value="{op.pk}">' in html
    assert "Approve 2 operations (2 targets)</button>" in html and "data-cannot" not in html
    assert all(op.status == OperationStatus.PLANNED for op in Operation.objects.all()), "a GET changes nothing"


def test_the_post_approves_every_selected_operation(users, planned, django_capture_on_commit_callbacks):
    import django_rq

    with listening_worker(QUEUE), django_capture_on_commit_callbacks(execute=True):
        response = client_of(users["approver"]).post("/operations/approve/", {"op": [op.pk for op in planned]})
    assert response.status_code == 302 and response.url == "/operations/"
    for op in planned:
        op.refresh_from_db()
        assert (op.status, op.approved_by, op.rq_job_id) == (
            OperationStatus.APPROVED,
            users["approver"],
            f"operation-{op.pk}",
        )
    assert django_rq.get_queue(QUEUE).count == 2


def test_one_that_cannot_be_approved_blocks_all_and_says_why(users, planned):
    reject_operation(planned[1], users["approver"])
    approver = client_of(users["approver"])
    html = approver.get(f"/operations/approve/?{query(*planned)}").content.decode()
    assert 'id="bulk-blocked"' in html and "cannot be approved: the operation is rejected" in html
    assert "disabled>Approve 2 operations" in html
    with listening_worker(QUEUE):
        response = approver.post("/operations/approve/", {"op": [op.pk for op in planned]})
    assert response.status_code == 409
    assert f"nothing was approved: #{planned[1].pk}: the operation is rejected" in response.content.decode()
    planned[0].refresh_from_db()
    assert planned[0].status == OperationStatus.PLANNED and not planned[0].rq_job_id


def test_without_a_worker_nothing_is_approved(users, planned):
    response = client_of(users["approver"]).post("/operations/approve/", {"op": [op.pk for op in planned]})
    assert response.status_code == 409
    assert f"#{planned[0].pk}: no rq worker listens on queue {QUEUE}" in response.content.decode()
    assert set(Operation.objects.values_list("status", flat=True)) == {OperationStatus.PLANNED}


def test_a_race_lost_by_one_rolls_back_every_approval(users, planned, monkeypatch, django_capture_on_commit_callbacks):
    import django_rq

    real = operations.services.transition
    calls = []

    def rejected_meanwhile(operation, *args, **kwargs):
        calls.append(operation.pk)
        if operation.pk == planned[1].pk:  # decided by someone else after the checks
            Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.REJECTED)
        return real(operation, *args, **kwargs)

    monkeypatch.setattr(operations.services, "transition", rejected_meanwhile)
    with listening_worker(QUEUE), django_capture_on_commit_callbacks(execute=True):
        response = client_of(users["approver"]).post("/operations/approve/", {"op": [op.pk for op in planned]})
    assert calls == [op.pk for op in planned]
    assert response.status_code == 409
    assert f"nothing was approved: operation #{planned[1].pk} has status rejected" in response.content.decode()
    planned[0].refresh_from_db()
    assert (planned[0].status, planned[0].approved_by, planned[0].rq_job_id) == (OperationStatus.PLANNED, None, "")
    assert django_rq.get_queue(QUEUE).count == 0


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "op: select at least one operation"),
        ({"op": ["x"]}, "op: must be an operation id, got &quot;x&quot;"),
        ({"op": ["999999"]}, "op: no operation #999999"),
    ],
)
def test_a_bad_selection_is_refused_naming_it(users, planned, data, message):
    for method in ("get", "post"):
        response = getattr(client_of(users["approver"]), method)("/operations/approve/", data)
        assert response.status_code == 400 and message in response.content.decode()


def test_a_repeated_or_too_large_selection_is_refused(users, planned):
    approver = client_of(users["approver"])
    response = approver.get(f"/operations/approve/?{query(planned[0], planned[0])}")
    assert response.status_code == 400 and "op: an operation is selected twice" in response.content.decode()
    many = "&".join(f"op={planned[0].pk}" for _ in range(BULK_APPROVE_LIMIT + 1))
    response = approver.get(f"/operations/approve/?{many}")
    assert response.status_code == 400 and f"op: at most {BULK_APPROVE_LIMIT} operations at once" in (
        response.content.decode()
    )


def test_only_approvers_may_bulk_approve(users, planned):
    for verb in ("get", "post"):
        response = getattr(client_of(users["operator"]), verb)("/operations/approve/", {"op": [planned[0].pk]})
        assert response.status_code == 403
    assert set(Operation.objects.values_list("status", flat=True)) == {OperationStatus.PLANNED}


def test_a_note_over_its_limit_is_refused_whole_never_cut(users, planned):
    from operations.services import DECISION_NOTE_MAX

    approver = client_of(users["approver"])
    long_note = "n" * (DECISION_NOTE_MAX + 1)
    # No maxlength: the browser would cut a pasted note silently; the page states the limit and
    # the server refuses a longer note whole, saying so.
    for page in (
        approver.get(f"/operations/{planned[0].pk}/approve/").content.decode(),
        approver.get("/operations/approve/", {"op": [op.pk for op in planned]}).content.decode(),
    ):
        (field,) = re.findall(r'<input[^>]*name="note"[^>]*>', page)
        assert "maxlength" not in field, field
        assert f"at most {DECISION_NOTE_MAX} characters" in page
    with listening_worker(QUEUE):
        one = approver.post(f"/operations/{planned[0].pk}/approve/", {"note": long_note})
        rejected = approver.post(f"/operations/{planned[0].pk}/reject/", {"note": long_note})
        bulk = approver.post("/operations/approve/", {"op": [op.pk for op in planned], "note": long_note})
    assert one.status_code == 400 and rejected.status_code == 400, (one.status_code, rejected.status_code)
    expected = f"note: at most {DECISION_NOTE_MAX} characters, got {DECISION_NOTE_MAX + 1}; nothing was decided"
    assert expected in one.content.decode() and expected in bulk.content.decode()
    assert all(op.status == OperationStatus.PLANNED and not op.decision_note for op in Operation.objects.all())
    with listening_worker(QUEUE):
        fits = approver.post(f"/operations/{planned[0].pk}/reject/", {"note": " " + "n" * DECISION_NOTE_MAX + " "})
    assert fits.status_code == 302
    assert Operation.objects.get(pk=planned[0].pk).decision_note == "n" * DECISION_NOTE_MAX
