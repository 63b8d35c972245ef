"""Event backend: signed scale-up/scale-down deliveries with retries, what the scale-up carries,
the claim store, reload."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import timedelta

import django_rq
import pytest
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from agents.choices import AgentState, EventType
from agents.models import Agent, AgentToken, ScalerEvent
from scalers.backends.base import SpawnControl, SpawnError
from scalers.backends.claims import ClaimError, create_claim, redeem_claim
from scalers.backends.emitter import EventEmitError, HttpEventEmitter, resolve_target
from scalers.backends.event import EventBackend
from scalers.backends.event_reaper import Verdict, flap_grace_ms, may_reap, reap_verdict
from scalers.jobs import spawn_agent, watch_registration
from scalers.lifecycle import expire_registration, prune_stale_spawns
from scalers.metrics import SCALE_DOWN_EMITTED, SCALE_UP_EMITTED
from scalers.models import MetricCounter, Reservation
from tests.support.provisioner import Provisioner
from tests.support.scalers import make_agent, make_scaler

SECRET = "ctr-test-secret"


@pytest.fixture
def receiver():
    r = Provisioner(secret=SECRET)
    yield r
    r.close()


@pytest.fixture(autouse=True)
def secret(settings):
    settings.KICI_PROVISIONING_SECRET = SECRET


def event_scaler(url, **extra):
    config = {"provisioningTargets": [url], "claimTtlSeconds": 600, "agentTokenTtlSeconds": 900, **extra}
    return make_scaler(
        type="event", config=config, ls_config={}, orchestrator_url="http://172.30.0.1:8000", mandatory_labels=["cloud"]
    )


def fast(secret=SECRET):
    return HttpEventEmitter(secret, backoff=0.01, max_backoff=0.02, timeout=5)


@pytest.mark.django_db
def test_spawn_emits_one_signed_scale_up_without_the_token(receiver):
    scaler = event_scaler(receiver.url)
    agent = make_agent(scaler, bound_job_id="job-7")
    Reservation.objects.filter(agent=agent).update(limit_cpus=2, limit_memory_bytes=4 << 30)
    assert spawn_agent(agent.pk) == "spawned"
    assert len(receiver.requests) == 1
    req = receiver.requests[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), req["body"], hashlib.sha256).hexdigest()
    assert (
        req["headers"]["X-Kici-Signature-256"] == expected and req["headers"]["X-Kici-Event"] == "kici.scaler.scale-up"
    )
    body = json.loads(req["body"])
    payload = body["payload"]
    assert set(payload) == {
        "scalerName",
        "agentId",
        "labels",
        "mandatoryLabels",
        "resources",
        "orchestratorUrl",
        "claimCode",
        "jobId",
        "requestId",
    }
    assert (
        payload["agentId"] == agent.agent_id and payload["jobId"] == "job-7" and payload["mandatoryLabels"] == ["cloud"]
    )
    assert payload["resources"] == {"cpus": 2.0, "memBytes": 4 << 30}, "the limits, not the requests (1 cpu, 1 GiB)"
    assert len(payload["claimCode"]) == 64
    assert b"ket_" not in req["body"] and b"kas_" not in req["body"]
    agent.refresh_from_db()
    assert agent.state == AgentState.CONNECTING
    assert not AgentToken.objects.filter(agent=agent).exists(), "the token is minted at claim time"


def counter(name: str, **labels) -> float:
    row = MetricCounter.objects.filter(name=name, labels=labels).first()
    return row.value if row else 0.0


@pytest.mark.django_db
def test_the_scale_up_names_the_label_sets_gate_and_only_the_declared_limits(receiver):
    scaler = make_scaler(
        type="event",
        labels=("cloud", "gpu", "arm64"),
        config={"provisioningTargets": [receiver.url], "platform": {"os": "windows", "arch": "x64"}},
        ls_config={},
        mandatory=["cloud"],
    )
    agent = make_agent(scaler)
    Reservation.objects.filter(agent=agent).update(limit_cpus=0, limit_memory_bytes=2 << 30)
    assert spawn_agent(agent.pk) == "spawned"
    payload = receiver.deliveries()[0]["payload"]
    assert payload["mandatoryLabels"] == ["cloud", "windows", "arm64"], "mandatory, platform taint, plain taint"
    assert payload["resources"] == {"memBytes": 2 << 30}, "an undeclared limit is left out"
    assert counter(SCALE_UP_EMITTED, scaler=scaler.name) == 1


@pytest.mark.django_db
def test_a_failing_target_is_retried_with_backoff():
    r = Provisioner(fail_first=2)
    try:
        agent = make_agent(event_scaler(r.url))
        EventBackend(agent.scaler, emitter=fast()).spawn(agent, SpawnControl(deadline=time.time() + 30))
        assert len(r.requests) == 3
        ids = {req["headers"]["X-Kici-Delivery"] for req in r.requests}
        assert len(ids) == 1, "a retry re-sends the same delivery"
    finally:
        r.close()


@pytest.mark.django_db
def test_a_refused_scale_up_fails_the_spawn_and_releases(settings):
    r = Provisioner(fail_first=99, status=400)
    try:
        agent = make_agent(event_scaler(r.url))
        assert spawn_agent(agent.pk) == "failed"
        assert len(r.requests) == 1, "a 4xx is not retried"
        assert "refused: HTTP 400" in ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).detail
        assert not Reservation.objects.filter(agent=agent).exists()
        code = json.loads(r.requests[0]["body"])["payload"]["claimCode"]
        with pytest.raises(ClaimError, match="invalid claim code"):
            redeem_claim(code)
    finally:
        r.close()


@pytest.mark.django_db
def test_retries_stop_at_the_deadline():
    r = Provisioner(fail_first=99)
    try:
        agent = make_agent(event_scaler(r.url))
        emitter = HttpEventEmitter(SECRET, backoff=0.3, max_backoff=0.3, attempts=50)
        with pytest.raises(SpawnError, match="failed after"):
            EventBackend(agent.scaler, emitter=emitter).spawn(agent, SpawnControl(deadline=time.time() + 1))
        assert 2 <= len(r.requests) <= 5
    finally:
        r.close()


@pytest.mark.django_db
def test_destroy_twice_emits_exactly_one_scale_down_and_invalidates_claims(receiver):
    agent = make_agent(event_scaler(receiver.url))
    assert spawn_agent(agent.pk) == "spawned"
    code = receiver.deliveries()[0]["payload"]["claimCode"]
    agent.refresh_from_db()
    backend = EventBackend(agent.scaler, emitter=fast())
    backend.destroy(agent)
    backend.destroy(Agent.objects.get(pk=agent.pk))
    downs = [d for d in receiver.deliveries() if d["event"] == "kici.scaler.scale-down"]
    assert counter(SCALE_DOWN_EMITTED, scaler=agent.scaler.name, reason="shutdown") == 1
    assert (
        len(downs) == 1
        and downs[0]["payload"]["reason"] == "shutdown"
        and downs[0]["payload"]["agentId"] == agent.agent_id
    )
    with pytest.raises(ClaimError, match="invalid claim code"):
        redeem_claim(code)
    backend.shutdown_all()
    assert len(receiver.requests) == 2, "shutdown_all emits nothing"


@pytest.mark.django_db
def test_the_registration_deadline_and_the_stale_prune_leave_a_delivered_provision_to_the_reaper(receiver, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 1
    agent = make_agent(event_scaler(receiver.url))
    registry = ScheduledJobRegistry(queue=django_rq.get_queue(settings.KICI_HOST_QUEUE))
    before = set(registry.get_job_ids())
    assert spawn_agent(agent.pk) == "spawned"
    assert Agent.objects.get(pk=agent.pk).state == AgentState.CONNECTING
    assert set(registry.get_job_ids()) == before, "no registration watch: the reaper watches a delivered provision"
    Agent.objects.filter(pk=agent.pk).update(spawn_started_at=timezone.now() - timedelta(hours=1))
    assert not expire_registration(agent.pk)
    assert watch_registration(agent.pk) == "over"
    assert prune_stale_spawns() == 0
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.SPAWNING)  # its job died before the move
    assert prune_stale_spawns() == 0
    assert len(receiver.requests) == 1, "no scale-down: the reaper decides (tests/scalers/test_provision_reaper.py)"


@pytest.mark.django_db
def test_a_claim_is_redeemed_once_for_a_token_that_registers(client, receiver):
    agent = make_agent(event_scaler(receiver.url))
    assert spawn_agent(agent.pk) == "spawned"
    code = receiver.deliveries()[0]["payload"]["claimCode"]
    resp = client.post("/api/v1/agents/claim", data=json.dumps({"claimCode": code}), content_type="application/json")
    assert resp.status_code == 200, resp.content
    grant = resp.json()
    assert grant["agentId"] == agent.agent_id and grant["orchestratorUrl"] == "http://172.30.0.1:8000"
    token_row = AgentToken.objects.get(agent=agent)
    ttl = (token_row.expires_at - token_row.created_at).total_seconds()
    assert 899 <= ttl <= 901, "agentTokenTtlSeconds"
    again = client.post("/api/v1/agents/claim", data=json.dumps({"claimCode": code}), content_type="application/json")
    assert again.status_code == 401 and again.json()["reason"] == "claim-used"
    assert again.json()["error"]["message"] == "claim code already consumed"
    reg = client.post(
        "/api/v1/agents/register",
        data="",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {grant['token']}",
    )
    assert reg.status_code == 200
    assert Agent.objects.get(pk=agent.pk).state == AgentState.RUNNING


@pytest.mark.django_db
def test_expired_and_unknown_claims_are_refused(client):
    agent = make_agent(event_scaler("http://127.0.0.1:9/"))
    code = create_claim(agent, ttl_seconds=1)
    time.sleep(1.05)
    with pytest.raises(ClaimError, match="claim code expired"):
        redeem_claim(code)
    with pytest.raises(ClaimError, match="invalid claim code"):
        redeem_claim("0" * 64)
    resp = client.post("/api/v1/agents/claim", data="{}", content_type="application/json")
    assert (
        resp.status_code == 400
        and resp.json()["error"]["field"] == "claimCode"
        and "got null" in resp.json()["error"]["message"]
    )


@pytest.mark.django_db
def test_reload_replaces_targets_and_token_ttl_for_the_next_spawn(receiver):
    other = Provisioner()
    try:
        scaler = event_scaler(receiver.url)
        backend = EventBackend(scaler, emitter=fast())
        first = make_agent(scaler)
        backend.spawn(first, SpawnControl(deadline=time.time() + 10))
        scaler.config = {**scaler.config, "provisioningTargets": [other.url], "agentTokenTtlSeconds": 120}
        scaler.save()
        backend.reload(scaler)
        second = make_agent(scaler)
        backend.spawn(second, SpawnControl(deadline=time.time() + 10))
        assert len(receiver.requests) == 1 and len(other.requests) == 1
        grant = redeem_claim(other.deliveries()[0]["payload"]["claimCode"])
        row = AgentToken.objects.get(agent=second)
        assert grant["agentId"] == second.agent_id and 119 <= (row.expires_at - row.created_at).total_seconds() <= 121
    finally:
        other.close()


def test_targets_must_be_urls_or_mapped_names_and_events_must_be_signed(settings):
    settings.KICI_PROVISIONING_TARGET_URLS = {"myorg/infra": "http://127.0.0.1:9/hook"}
    assert resolve_target("myorg/infra") == "http://127.0.0.1:9/hook"
    with pytest.raises(EventEmitError, match='"other/repo" has no URL'):
        resolve_target("other/repo")
    with pytest.raises(EventEmitError, match="KICI_PROVISIONING_SECRET"):
        HttpEventEmitter("").emit("kici.scaler.scale-up", {}, ["http://127.0.0.1:9/"])


def test_the_reaper_flap_grace_and_guard():
    assert flap_grace_ms(60_000, 60_000) == 120_000
    assert flap_grace_ms(300_000, 60_000) == 300_000
    assert may_reap(0, 0) and not may_reap(2, 0) and may_reap(2, 1)


def test_the_reaper_verdicts():
    base = dict(
        now_ms=10_000_000,
        grace_ms=120_000,
        owner="i1",
        adopted_by=None,
        adopter_alive=False,
        spawned_at_ms=0,
        spawn_timeout_ms=300_000,
    )
    assert reap_verdict(registered=True, unseen_since_ms=None, **base) == Verdict("spare", "reset", "registered")
    assert reap_verdict(registered=False, unseen_since_ms=None, **base).clock == "start"
    assert reap_verdict(registered=False, unseen_since_ms=10_000_000 - 1000, **base).action == "spare"
    old = 10_000_000 - 200_000
    assert (
        reap_verdict(registered=False, unseen_since_ms=old, **{**base, "adopted_by": "i2"}).action
        == "heartbeat-timeout"
    )
    live = {**base, "adopted_by": "i2", "adopter_alive": True}
    assert reap_verdict(registered=False, unseen_since_ms=old, **live).action == "spare"
    assert reap_verdict(registered=False, unseen_since_ms=10_000_000 - 1_800_000, **live).action == "heartbeat-timeout"
    assert reap_verdict(registered=False, unseen_since_ms=old, **{**base, "owner": None}).action == "spare"
    assert reap_verdict(registered=False, unseen_since_ms=old, **base).action == "spawn-timeout"
