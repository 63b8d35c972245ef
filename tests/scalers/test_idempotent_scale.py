"""``POST /api/v1/scale`` is idempotent per job (and per ``Idempotency-Key``) while the job's agent
is live: a repeat answers that agent, a different ask is a 422 naming the field, and 20 identical
requests at once make one agent, over HTTP and across connections contending for the lock."""

from __future__ import annotations

import json

import pytest
import requests
from django.db import transaction
from django.test import Client

from agents.choices import AgentState
from agents.models import Agent
from scalers.lifecycle import complete_job, release_agent
from scalers.models import Pause, Reservation, ScaleOutcome
from tests.scalers.test_warm_pools import warm_agent, warm_scaler
from tests.support.admission import request_scale
from tests.support.concurrency import run_threads
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

TOKEN = "test-orchestrator-token"
BODY = {"labels": ["linux"], "jobId": "job-1", "runId": "run-1", "resources": {"cpus": 1}}


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def post(body, key: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return Client().post("/api/v1/scale", data=json.dumps(body), content_type="application/json", **headers)


def test_a_repeated_scale_for_a_live_job_answers_its_agent_with_200_and_the_first_body():
    make_scaler("c", max_agents=5)
    first = post(BODY)
    assert first.status_code == 201, first.content
    again = post(BODY)
    assert again.status_code == 200, again.content
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Agent.objects.count() == 1 == Reservation.objects.count()


def test_the_same_key_and_body_answer_the_agent_again():
    make_scaler("c", max_agents=5)
    first = post(BODY, key="k-1")
    again = post(BODY, key="k-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["agentId"] == first.json()["agentId"]
    assert Agent.objects.get().idempotency_key == "k-1"


@pytest.mark.parametrize(
    ("first_key", "again_key"),
    [("k-1", "k-2"), ("k-1", None), (None, "k-2")],
)
def test_another_key_for_a_live_job_is_422_naming_the_header(first_key, again_key):
    make_scaler("c", max_agents=5)
    agent_id = post(BODY, key=first_key).json()["agentId"]
    r = post(BODY, key=again_key)
    assert r.status_code == 422, r.content
    body = r.json()
    assert body["reason"] == "idempotency-mismatch" and body["error"]["field"] == "Idempotency-Key"
    assert body["agentId"] == agent_id and agent_id in body["error"]["message"]
    assert Agent.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"labels": ["linux", "ctr"]}, "labels"),
        ({"resources": {"cpus": 2}}, "resources"),
        ({"runId": "run-2"}, "runId"),
        ({"exclude": ["gpu"]}, "exclude"),
    ],
)
def test_the_same_key_with_another_body_is_422_naming_the_field_and_both_values(change, field):
    make_scaler("c", max_agents=5)
    assert post(BODY, key="k-1").status_code == 201
    r = post(BODY | change, key="k-1")
    assert r.status_code == 422, r.content
    assert r.json()["error"]["field"] == field
    assert f"asked for with {field} " in r.json()["error"]["message"]
    assert Agent.objects.count() == 1


def test_a_repeat_is_answered_its_agent_while_the_scaler_is_full():
    """The repeat would be refused at capacity (its own agent fills the scaler): it is answered
    with that agent, from the held snapshot's batch as from a fresh one."""
    make_scaler("c", max_agents=1)
    first = post(BODY)
    assert first.status_code == 201
    for _ in range(3):
        again = post(BODY)
        assert again.status_code == 200 and again.json() == first.json(), again.content
    assert post(BODY | {"jobId": "job-2"}).status_code == 409
    assert Agent.objects.count() == 1


def test_a_repeat_is_answered_its_agent_while_the_scaler_is_paused():
    scaler = make_scaler("c", max_agents=5)
    first = post(BODY)
    Pause.objects.create(scaler=scaler, reason="maintenance", requested_by="ops", approved_by="ops")
    again = post(BODY)
    assert again.status_code == 200 and again.json() == first.json(), again.content
    assert post(BODY | {"jobId": "job-2"}).status_code == 409


def test_a_key_used_for_another_live_job_is_422_naming_jobid():
    make_scaler("c", max_agents=5)
    assert post(BODY, key="k-1").status_code == 201
    r = post(BODY | {"jobId": "job-2"}, key="k-1")
    assert r.status_code == 422 and r.json()["error"]["field"] == "jobId", r.content
    assert '"job-1"' in r.json()["error"]["message"]
    assert Agent.objects.count() == 1


@pytest.mark.parametrize("key", ["", " ", "x" * 256, "caf\u00e9", "a\tb"])
def test_a_bad_idempotency_key_is_400_naming_the_header_and_the_value(key):
    make_scaler("c", max_agents=5)
    r = post(BODY, key=key)
    assert r.status_code == 400, r.content
    assert r.json()["error"]["field"] == "Idempotency-Key"
    assert "printable ASCII" in r.json()["error"]["message"]
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    "end",
    [
        lambda agent_id: release_agent(agent_id, "gave up"),
        lambda agent_id: complete_job(agent_id, "job-1"),
        lambda agent_id: Agent.objects.filter(agent_id=agent_id).update(state=AgentState.FAILED),
    ],
    ids=["release", "job-complete", "failed-spawn"],
)
def test_the_end_of_the_agent_ends_the_key(end):
    make_scaler("c", max_agents=5)
    first = post(BODY, key="k-1").json()["agentId"]
    Agent.objects.filter(agent_id=first).update(state=AgentState.RUNNING)
    end(first)
    r = post(BODY, key="k-1")
    assert r.status_code == 201, r.content
    assert r.json()["agentId"] != first


def test_a_repeat_answers_a_warm_agent_bound_to_the_job_as_warm():
    warm = warm_agent(warm_scaler(size=1))
    body = {"labels": ["linux", "docker"], "jobId": "job-1"}
    first = post(body, key="k-1")
    assert first.status_code == 200 and first.json()["agentId"] == warm.agent_id, first.content
    again = post(body, key="k-1")
    assert again.status_code == 200 and again.json() == first.json() and again.json()["warm"] is True
    assert again["Idempotent-Replayed"] == "true"


def test_an_existing_live_agent_of_the_job_is_answered_by_request_scale():
    """A job bound by any writer (here: a row) is found under the lock; nothing else is admitted."""
    scaler = make_scaler("c", max_agents=5)
    agent = make_agent(scaler, AgentState.RUNNING, bound_job_id="job-9")
    decision = request_scale(["linux"], "job-9")
    assert decision.action == ScaleOutcome.REPLAYED and decision.agent == agent.agent_id
    assert Agent.objects.count() == 1


def test_20_identical_posts_to_daphne_at_once_make_one_agent(daphne_server):
    make_scaler("c", max_agents=50)
    url = f"{daphne_server}/api/v1/scale"

    def one(_i: int):
        r = requests.post(
            url, json=BODY, headers={"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "k-1"}, timeout=60
        )
        return r.status_code, r.json()

    results = run_threads(20, one)
    assert not [r for r in results if isinstance(r, BaseException)], results
    codes = sorted(code for code, _ in results)
    assert codes == [200] * 19 + [201], results
    assert len({body["agentId"] for _, body in results}) == 1
    assert Agent.objects.count() == 1 == Reservation.objects.count()


@pytest.mark.parametrize("own_transaction", [False, True], ids=["one-queue", "a-transaction-each"])
def test_20_identical_requests_on_their_own_connections_make_one_agent(own_transaction):
    """``a-transaction-each``: every request decides its own batch on its own connection (as
    separate console processes do), so 19 writes meet the unique index and are decided again
    reading the live agent under the lock."""
    make_scaler("c", max_agents=50)

    def ask(_i):
        if not own_transaction:
            return request_scale(["linux"], "job-1", idempotency_key="k-1")
        with transaction.atomic():
            return request_scale(["linux"], "job-1", idempotency_key="k-1")

    results = run_threads(20, ask)
    assert not [r for r in results if isinstance(r, BaseException)], results
    actions = sorted(d.action for d in results)
    assert actions == [ScaleOutcome.REPLAYED] * 19 + [ScaleOutcome.SPAWNING], actions
    assert len({d.agent for d in results}) == 1
    assert Agent.objects.count() == 1 == Reservation.objects.count()


@pytest.mark.parametrize(
    ("sent", "shown"),
    [("caf\u00e9".encode(), '"caf\u00e9"'), ("\u2603".encode(), '"\u2603"'), (b"k\xff", '"k\\\\xff"')],
)
def test_a_non_ascii_key_is_refused_repeating_it_as_sent_not_as_mojibake(sent, shown):
    """A server hands each header byte to Django as one latin-1 character: UTF-8 "café" arrives
    as "cafÃ©". The refusal names the header and repeats what the client sent."""
    make_scaler("c", max_agents=5)
    r = post(BODY, key=sent.decode("latin-1"))
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["field"] == "Idempotency-Key"
    assert error["message"].startswith("Idempotency-Key: must be 1 to 255 printable ASCII characters, got "), error
    assert error["message"].endswith(f"got {shown}"), error
    assert "\u00c3" not in error["message"] and "\u00e2" not in error["message"]
    assert not Agent.objects.exists()
