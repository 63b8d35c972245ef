"""Pause and resume a scaler or a host through approved operations: ``/scale`` answers 409 naming
the pause (who asked, who approved, why), a resume admits again, a host's pause holds only its
scalers, a drain drains, bad input names its field, the CLI twin and the pages' banner."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agents.choices import AgentState
from agents.models import Agent
from operations.jobs import run_operation
from operations.kinds.base import ScopeInvalid
from operations.models import Operation
from operations.services import approve_operation, create_operation
from scalers.models import Pause
from tests.support.operations import login
from tests.support.scalers import make_agent, make_scaler

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("stop_admission_queue", "empty_queues"),
]

TOKEN = "test-orchestrator-token"


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def scale(labels, job: str):
    return Client().post(
        "/api/v1/scale",
        data=json.dumps({"labels": labels, "jobId": job}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )


def run(kind: str, users, **scope):
    """Plan ``kind`` as the operator, approve it as the approver and run it here."""
    op = create_operation(kind, scope, users["operator"])
    approve_operation(op, users["approver"], require_worker=False, enqueue=False)
    run_operation(op.pk)
    op.refresh_from_db()
    return op


def test_a_paused_scaler_answers_409_naming_who_paused_it_and_why_and_spawns_nothing(users):
    scaler = make_scaler("c", labels=("linux",))
    assert scale(["linux"], "before").status_code == 201  # admission's routing view is cached now
    op = run("pause", users, scaler="c", params={"reason": "kernel upgrade on the docker host"})
    assert op.status == "succeeded", op.outcomes
    r = scale(["linux"], "job-1")
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["reason"] == "paused" and body["scaler"] == "c" and r["Retry-After"]
    assert body["pause"] | {"since": None} == {
        "scope": "scaler",
        "scaler": "c",
        "requestedBy": "ops-operator",
        "approvedBy": "ops-approver",
        "reason": "kernel upgrade on the docker host",
        "since": None,
        "operation": op.pk,
    }
    message = body["error"]["message"]
    assert "ops-operator" in message and "ops-approver" in message and "kernel upgrade" in message
    assert Agent.objects.filter(scaler=scaler).count() == 1


def test_a_resume_admits_again(users):
    make_scaler("c", labels=("linux",))
    run("pause", users, scaler="c", params={"reason": "maintenance"})
    assert scale(["linux"], "job-1").status_code == 409
    op = run("resume", users, scaler="c")
    assert op.status == "succeeded", op.outcomes
    assert not Pause.objects.exists()
    assert scale(["linux"], "job-1").status_code == 201


def test_a_pause_of_one_host_holds_its_scalers_only(users):
    make_scaler("on-h1", labels=("one",), host="h1")
    make_scaler("on-h2", labels=("two",), host="h2")
    op = run("pause", users, params={"host": "h1", "reason": "rack move"})
    assert op.scope_label == "host h1"
    r = scale(["one"], "job-1")
    assert r.status_code == 409 and r.json()["pause"]["scope"] == "host" and r.json()["pause"]["host"] == "h1"
    assert "host h1 is paused by ops-operator" in r.json()["error"]["message"]
    assert scale(["two"], "job-2").status_code == 201
    run("resume", users, params={"host": "h1"})
    assert scale(["one"], "job-1").status_code == 201


def test_a_pause_with_drain_drains_the_running_agents_and_one_without_leaves_them(users):
    scaler = make_scaler("c", labels=("linux",))
    running = make_agent(scaler, AgentState.RUNNING)
    run("pause", users, scaler="c", params={"reason": "no drain"})
    assert Agent.objects.get(pk=running.pk).state == AgentState.RUNNING
    run("resume", users, scaler="c")
    op = run("pause", users, scaler="c", params={"reason": "drain it", "drain": True})
    assert "1 running agent(s) draining" in op.outcomes[op.plan[0]["key"]]["detail"]
    assert Agent.objects.get(pk=running.pk).state == AgentState.DRAINING


@pytest.mark.parametrize(
    ("scope", "field", "says"),
    [
        ({"scaler": "c", "params": {}}, "reason", "got null"),
        ({"scaler": "c", "params": {"reason": "  "}}, "reason", 'got "  "'),
        ({"scaler": "c", "params": {"reason": "x" * 501}}, "reason", "at most 500"),
        ({"scaler": "c", "params": {"reason": "x", "drain": "yes"}}, "drain", 'got "yes"'),
        ({"params": {"reason": "x", "host": "nowhere"}}, "host", '"nowhere"; known hosts: h1'),
        ({"scaler": "c", "params": {"reason": "x", "host": "h1"}}, "host", "not both"),
        ({"params": {"reason": "x"}}, "scaler", "needs a scaler or a host"),
    ],
)
def test_bad_pause_input_is_refused_naming_the_field_and_value(users, scope, field, says):
    make_scaler("c", host="h1")
    with pytest.raises(ScopeInvalid) as caught:
        create_operation("pause", scope, users["operator"])
    assert caught.value.field == field and says in str(caught.value), str(caught.value)


def latest() -> int:
    return Operation.objects.latest("pk").pk


def test_the_cli_twin_pauses_and_resumes_a_host(users, capsys):
    make_scaler("c", labels=("linux",), host="h1")
    call_command(
        "operations", "plan", "pause", "--host", "h1", "--reason", "power work", "--drain", "--user", "ops-operator"
    )
    assert "pause and drain its running agents" in capsys.readouterr().out
    call_command("operations", "approve", str(latest()), "--user", "ops-approver", "--run-now")
    pause = Pause.objects.get()
    assert (pause.host, pause.reason, pause.drain, pause.requested_by) == ("h1", "power work", True, "ops-operator")
    with pytest.raises(CommandError, match="reason: must be a non-empty text"):
        call_command("operations", "plan", "pause", "--scaler", "c", "--user", "ops-operator")
    call_command("operations", "plan", "resume", "--host", "h1", "--user", "ops-operator")
    call_command("operations", "approve", str(latest()), "--user", "ops-approver", "--run-now")
    assert not Pause.objects.exists()


def test_every_page_shows_the_pause_banner_with_who_and_why(users, client):
    make_scaler("c", labels=("linux",))
    run("pause", users, scaler="c", params={"reason": "disk replacement"})
    login(client, users["viewer"])
    for url in ("/", "/scalers/c/", "/agents/"):
        page = client.get(url).content.decode()
        assert 'id="pause-banner">' in page, url
        assert "scaler c is paused by ops-operator, approved by ops-approver" in page and "disk replacement" in page
    assert 'data-testid="paused" title="scaler c is paused by ops-operator' in client.get("/").content.decode()
    run("resume", users, scaler="c")
    dashboard = client.get("/").content.decode()
    assert 'id="pause-banner" hidden>' in dashboard and 'data-testid="paused"' not in dashboard


def test_a_pause_previewed_then_requested_keeps_its_host_reason_and_drain(users, client):
    """The pause form opens a preview that stores nothing; its "Request approval" posts every field
    back, so the stored operation is the pause that was previewed, reason and drain included."""
    import re
    from html import unescape

    make_scaler("c", labels=("linux",), host="h1")
    login(client, users["operator"])
    preview = client.post("/operations/plan/", {"kind": "pause", "host": "h1", "reason": "kernel update", "drain": "1"})
    assert preview.status_code == 200 and not Operation.objects.exists()
    data: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', preview.content.decode()):
        data.setdefault(name, []).append(unescape(value))
    assert data["request"] == ["1"]
    client.post("/operations/plan/", data)
    op = Operation.objects.get()
    assert (op.kind, op.params["host"], op.params["reason"], op.params["drain"]) == (
        "pause",
        "h1",
        "kernel update",
        True,
    )


def test_the_scaler_page_groups_the_scaler_and_host_pause_controls_apart(users, client):
    """Each control sits under what it pauses or resumes: the host's reason field is not read as a
    reason for resuming the scaler."""
    make_scaler("c", labels=("linux",), host="h1")
    run("pause", users, scaler="c", params={"reason": "disk replacement"})
    login(client, users["operator"])
    page = client.get("/scalers/c/").content.decode()
    scaler_group = page[page.index('id="pause-group-scaler"') : page.index('id="pause-group-host"')]
    host_group = page[page.index('id="pause-group-host"') :]
    host_group = host_group[: host_group.index("</fieldset>")]
    assert "<legend>Scaler c</legend>" in scaler_group and "Resume scaler…" in scaler_group
    assert "pause-host" not in scaler_group
    assert "<legend>Host h1: every scaler on it</legend>" in host_group and 'id="pause-host"' in host_group


def test_the_pause_forms_never_cut_a_long_reason_the_server_refuses_it_saying_so(users, client):
    import re
    from html import unescape

    from scalers.pauses import MAX_REASON

    scaler = make_scaler("c", labels=("linux",), host="h1")
    login(client, users["operator"])
    page = client.get(f"/scalers/{scaler.name}/").content.decode()
    fields = re.findall(r'<input name="reason"[^>]*>', page)
    assert len(fields) == 2 and all("maxlength" not in f and f"at most {MAX_REASON}" in f for f in fields), fields
    refused = client.post("/operations/plan/", {"kind": "pause", "host": "h1", "reason": "r" * (MAX_REASON + 1)})
    assert refused.status_code == 400, refused.status_code
    assert f"reason: must be a non-empty text of at most {MAX_REASON} characters" in unescape(refused.content.decode())
    assert not Operation.objects.exists()
