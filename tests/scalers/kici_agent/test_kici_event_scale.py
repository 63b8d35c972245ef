"""The console behind a KiCI 0.9 event scaler: ``POST /api/v1/scale/kici-event/scale-up`` takes the
``kici.scaler.scale-up`` payload a provisioning workflow holds and admits that agent, with that id
and claim code, keyed by ``requestId`` (the ``/scale`` idempotency); ``.../scale-down`` takes the
``kici.scaler.scale-down`` payload and releases it. The spawn job is not run here (``no_enqueue``):
what the spawn would start is read from the agent row (its container environment)."""

from __future__ import annotations

import json

import pytest
import requests
from django.test import Client

from agents.choices import AgentState
from agents.models import Agent, ScalerEvent
from audit.models import AuditRecord
from scalers.backends.container.spawn import mint_spawn_token
from scalers.backends.spawn_env import container_env
from scalers.kici_orchestrator import kici_agent_target
from scalers.models import Pause, Reservation
from tests.support.concurrency import run_threads
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]

TOKEN = "test-kici-event-token"
UP = "/api/v1/scale/kici-event/scale-up"
DOWN = "/api/v1/scale/kici-event/scale-down"
WS = "ws://172.30.0.1:8480/ws"
CLAIM = "c0de" * 16
PAYLOAD = {
    "scalerName": "cloud",
    "agentId": "scaler-event-0a1b2c3d",
    "labels": ["linux-real", "kici:agent:event", "kici:scaler:cloud", "kici:role:builder"],
    "mandatoryLabels": [],
    "resources": {"cpus": 1, "memBytes": 512 * 1024 * 1024},
    "orchestratorUrl": WS,
    "claimCode": CLAIM,
    "jobId": "job-7",
    "requestId": "req-1",
}
DOWN_PAYLOAD = {"scalerName": "cloud", "agentId": "scaler-event-0a1b2c3d", "reason": "job-complete", "requestId": "d-1"}


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def real_scaler(url: str = WS, **kwargs):
    return make_scaler(
        "real",
        labels=("linux-real",),
        ls_config={"image": "kici-real-agent:test", "kiciAgent": {"orchestratorUrl": url, "adminTokenRef": "orch"}},
        **kwargs,
    )


def post(path: str, body, **headers):
    return Client().post(
        path, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers
    )


def test_a_scale_up_admits_the_agent_of_its_id_with_its_claim_code():
    real_scaler()
    r = post(UP, PAYLOAD)
    assert r.status_code == 201, r.content
    assert r.json() == {"agentId": PAYLOAD["agentId"], "scaler": "real", "backendType": "container"}
    agent = Agent.objects.select_related("scaler", "label_set").get()
    assert agent.agent_id == PAYLOAD["agentId"] and agent.state == AgentState.SPAWNING
    assert agent.labels == PAYLOAD["labels"] and agent.bound_job_id == "job-7"
    assert agent.idempotency_key == "req-1"
    assert Reservation.objects.get().agent == agent
    # What the spawn starts: the real agent of that id, redeeming the claim code at that orchestrator.
    env = dict(pair.split("=", 1) for pair in container_env(agent, "", image="kici-real-agent:test"))
    assert env == {
        "KICI_ORCHESTRATOR_URL": WS,
        "KICI_AGENT_ID": PAYLOAD["agentId"],
        "KICI_LABELS": ",".join(PAYLOAD["labels"]),
        "KICI_SCALER_CLAIM_CODE": CLAIM,
        "KICI_ROLES": "builder",
        "KICI_SCALER_MANAGED": "1",
        "KICI_EXECUTION_MODE": "bare-metal",
    }
    # No orchestrator token is minted for it (no admin call: the admin token "orch" does not exist).
    assert mint_spawn_token(agent, kici_agent_target(agent.label_set)) == ("", "")
    assert "redeems the claim code" in ScalerEvent.objects.filter(agent=agent).order_by("pk").last().detail
    assert AuditRecord.objects.filter(detail__contains="kici.scaler.scale-up of scaler cloud for job job-7").exists()


def test_a_scale_up_without_a_job_is_admitted_unbound():
    real_scaler()
    r = post(UP, {k: v for k, v in PAYLOAD.items() if k != "jobId"})
    assert r.status_code == 201, r.content
    agent = Agent.objects.get()
    assert (agent.agent_id, agent.bound_job_id, agent.warm) == (PAYLOAD["agentId"], "", False)


@pytest.mark.parametrize("drop", ["jobId", None], ids=["unbound", "bound"])
def test_a_duplicate_request_id_answers_the_same_agent(drop):
    real_scaler()
    payload = {k: v for k, v in PAYLOAD.items() if k != drop}
    first = post(UP, payload)
    again = post(UP, payload, HTTP_IDEMPOTENCY_KEY="req-1")
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Agent.objects.count() == 1 == Reservation.objects.count()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"agentId": "scaler-event-ffffffff"}, "agentId"),
        ({"claimCode": "other-code"}, "claimCode"),
        ({"labels": ["linux-real", "kici:role:init-runner"]}, "labels"),
        ({"resources": {"cpus": 2}}, "resources"),
    ],
)
def test_the_same_request_id_with_another_payload_is_422_naming_the_field(change, field):
    real_scaler()
    payload = {k: v for k, v in PAYLOAD.items() if k != "jobId"}
    assert post(UP, payload).status_code == 201
    r = post(UP, payload | change)
    assert r.status_code == 422, r.content
    body = r.json()
    assert body["reason"] == "idempotency-mismatch" and body["error"]["field"] == field
    assert body["agentId"] == PAYLOAD["agentId"]
    assert "other-code" not in r.content.decode() and CLAIM not in r.content.decode()  # a secret is never shown
    assert Agent.objects.count() == 1


def test_an_agent_id_that_exists_is_422_naming_agentid():
    real_scaler()
    assert post(UP, PAYLOAD).status_code == 201
    live = post(UP, PAYLOAD | {"requestId": "req-2", "jobId": "job-8"})
    assert live.status_code == 422 and live.json()["error"]["field"] == "agentId", live.content
    assert "is live (spawning)" in live.json()["error"]["message"]
    Agent.objects.update(state=AgentState.DESTROYED)
    ended = post(UP, PAYLOAD)  # the same request after its agent ended: not started twice
    assert ended.status_code == 422 and "has ended (destroyed)" in ended.json()["error"]["message"], ended.content
    assert Agent.objects.count() == 1


def test_20_concurrent_duplicates_to_daphne_make_one_agent(daphne_server):
    real_scaler(max_agents=50)

    def one(_i: int):
        r = requests.post(
            f"{daphne_server}{UP}", json=PAYLOAD, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        )
        return r.status_code, r.json()

    results = run_threads(20, one)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(code for code, _ in results) == [200] * 19 + [201], results
    assert {body["agentId"] for _, body in results} == {PAYLOAD["agentId"]}
    assert Agent.objects.count() == 1 == Reservation.objects.count()


def test_two_request_ids_for_one_agent_id_at_once_make_one_agent(daphne_server):
    """Different requests naming the same agent id in one batch or in racing ones: one admitted,
    the other refused naming agentId (never a second agent under another id)."""
    real_scaler(max_agents=50)

    def one(i: int):
        body = PAYLOAD | {"requestId": f"req-{i}", "jobId": f"job-{i}"}
        r = requests.post(f"{daphne_server}{UP}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return r.status_code, r.json()

    results = run_threads(10, one)
    assert sorted(code for code, _ in results) == [201] + [422] * 9, results
    assert all(body["error"]["field"] == "agentId" for code, body in results if code == 422)
    assert list(Agent.objects.values_list("agent_id", flat=True)) == [PAYLOAD["agentId"]]


def test_a_paused_or_full_scaler_answers_409_with_retry_after():
    scaler = real_scaler(max_agents=1)
    Pause.objects.create(scaler=scaler, reason="maintenance", requested_by="ops", approved_by="ops")
    paused = post(UP, PAYLOAD)
    assert paused.status_code == 409 and paused.json()["reason"] == "paused" and paused["Retry-After"], paused.content
    Pause.objects.all().delete()
    assert post(UP, PAYLOAD).status_code == 201
    full = post(UP, PAYLOAD | {"agentId": "scaler-event-2", "requestId": "req-2", "jobId": "job-2"})
    assert full.status_code == 409 and full.json()["reason"] == "at-capacity" and full["Retry-After"], full.content


def test_a_label_set_not_running_the_kici_agent_of_that_orchestrator_is_refused():
    make_scaler("own", labels=("linux-real",))
    r = post(UP, PAYLOAD)
    assert r.status_code == 422 and r.json()["reason"] == "no-matching-label-set", r.content
    assert "runs the console's own agent" in r.json()["error"]["message"]
    assert not Agent.objects.exists()


def test_another_orchestrator_is_refused_naming_both():
    real_scaler(url="ws://172.30.0.1:9999/ws")
    r = post(UP, PAYLOAD)
    assert r.status_code == 422 and r.json()["reason"] == "no-matching-label-set", r.content
    assert "ws://172.30.0.1:9999/ws" in r.json()["error"]["message"] and WS in r.json()["error"]["message"]
    assert not Agent.objects.exists()


BAD = [
    ({"agentId": "no spaces"}, "agentId"),
    ({"agentId": None}, "agentId"),
    ({"claimCode": ""}, "claimCode"),
    ({"claimCode": 7}, "claimCode"),
    ({"requestId": ""}, "requestId"),
    ({"requestId": "caf\u00e9"}, "requestId"),
    ({"scalerName": ""}, "scalerName"),
    ({"labels": []}, "labels"),
    ({"labels": ["kici:agent:event"]}, "labels"),
    ({"labels": ["linux-real", 3]}, "labels[1]"),
    ({"mandatoryLabels": "x"}, "mandatoryLabels"),
    ({"orchestratorUrl": "http://172.30.0.1:8480/ws"}, "orchestratorUrl"),
    ({"orchestratorUrl": "ws://172.30.0.1:8480/socket"}, "orchestratorUrl"),
    ({"resources": {"cpus": -1}}, "resources.cpus"),
    ({"resources": {"memBytes": 1.5}}, "resources.memBytes"),
    ({"resources": {"memBytes": 1000}}, "resources.memBytes"),
    ({"resources": {"gpus": 1}}, "resources.gpus"),
    ({"jobId": ""}, "jobId"),
    ({"token": "x"}, "token"),
]


@pytest.mark.parametrize(("change", "field"), BAD)
def test_a_bad_scale_up_is_400_naming_the_field(change, field):
    real_scaler()
    r = post(UP, PAYLOAD | change)
    assert r.status_code == 400, r.content
    assert r.json()["reason"] == "invalid-request" and r.json()["error"]["field"] == field
    assert r.json()["error"]["message"].startswith(field)
    assert not Agent.objects.exists()


def test_a_missing_field_is_named_and_a_claim_code_is_never_echoed():
    real_scaler()
    r = post(UP, {k: v for k, v in PAYLOAD.items() if k != "claimCode"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "claimCode"
    bad = post(UP, PAYLOAD | {"claimCode": "has space " + CLAIM})
    assert bad.status_code == 400 and CLAIM not in bad.content.decode(), bad.content


def test_an_idempotency_key_other_than_the_request_id_is_400_naming_the_header():
    real_scaler()
    r = post(UP, PAYLOAD, HTTP_IDEMPOTENCY_KEY="other")
    assert r.status_code == 400 and r.json()["error"]["field"] == "Idempotency-Key", r.content
    assert not Agent.objects.exists()


def test_a_scale_down_releases_the_agent_and_is_idempotent():
    real_scaler()
    assert post(UP, PAYLOAD).status_code == 201
    Agent.objects.update(state=AgentState.RUNNING)
    down = post(DOWN, DOWN_PAYLOAD)
    assert down.status_code == 200, down.content
    assert down.json() == {"agentId": PAYLOAD["agentId"], "state": "destroying", "reason": "job-complete"}
    agent = Agent.objects.get()
    assert agent.state == AgentState.DESTROYING
    assert agent.teardown_reason.startswith("released by the orchestrator: kici.scaler.scale-down job-complete")
    again = post(DOWN, DOWN_PAYLOAD | {"requestId": "d-2"})
    assert again.status_code == 200 and again.json()["state"] == "destroying", again.content
    # A released agent frees its request id: the same scale-up is not the same agent, and its id is taken.
    assert post(UP, PAYLOAD).json()["error"]["field"] == "agentId"


def test_a_scale_down_of_an_agent_never_here_is_200_with_no_state():
    r = post(DOWN, DOWN_PAYLOAD | {"reason": "spawn-timeout"})
    assert r.status_code == 200, r.content
    assert r.json() == {"agentId": PAYLOAD["agentId"], "state": None, "reason": "spawn-timeout"}


def test_a_scale_down_for_another_scaler_is_422_naming_scalername():
    real_scaler()
    assert post(UP, PAYLOAD).status_code == 201
    r = post(DOWN, DOWN_PAYLOAD | {"scalerName": "other"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "scalerName", r.content
    assert Agent.objects.get().state == AgentState.SPAWNING


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reason": "bored"}, "reason"),
        ({"reason": None}, "reason"),
        ({"agentId": ""}, "agentId"),
        ({"requestId": 5}, "requestId"),
        ({"scalerName": 5}, "scalerName"),
        ({"extra": 1}, "extra"),
    ],
)
def test_a_bad_scale_down_is_400_naming_the_field(change, field):
    r = post(DOWN, DOWN_PAYLOAD | change)
    assert r.status_code == 400 and r.json()["error"]["field"] == field, r.content


def test_both_need_the_scale_scope():
    for path, body in ((UP, PAYLOAD), (DOWN, DOWN_PAYLOAD)):
        r = Client().post(path, data=json.dumps(body), content_type="application/json")
        assert r.status_code == 401, (path, r.content)
