"""``/metrics``: refusals by scaler and cap, the unlabelled refusal gauge, usage rollups,
spawn failures, and the in-process cap-lock counter."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from agents.retention import prune_old_records
from operations.attention import KINDS
from scalers.admission.queue import lock_failure_reason
from scalers.metrics import REAP_BLOCKED, SCALE_UP_EMITTED, count, set_gauge
from scalers.models import Scaler
from tests.support.admission import request_scale
from tests.support.scalers import make_agent, make_pool, make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]


def scrape() -> str:
    r = Client().get("/metrics")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    return r.content.decode()


def test_refusals_are_counted_by_scaler_and_cap():
    make_scaler("c", max_agents=1, cpu=1)
    request_scale(["linux"], "a")
    request_scale(["linux"], "b")
    request_scale(["linux"], "c")
    body = scrape()
    assert 'kici_scaler_spawn_refusals_total{cap="maxAgents",scaler="c"} 2.0' in body
    assert "kici_orch_scaler_spawn_refusals_total 2.0" in body
    assert "# TYPE kici_orch_scaler_spawn_refusals_total counter" in body


def test_machine_pool_refusals_stay_out_of_the_unlabelled_gauge():
    pool = make_pool("box", cpu=1)
    make_scaler("c", max_agents=5, pool=pool)
    request_scale(["linux"], "a", resources={"cpus": 1})
    request_scale(["linux"], "b", resources={"cpus": 1})
    body = scrape()
    assert 'kici_scaler_spawn_refusals_total{cap="machinePool.cpu",scaler="c"} 1.0' in body
    assert "kici_orch_scaler_spawn_refusals_total 0.0" in body


def test_usage_has_a_row_per_scaler_and_a_global_rollup():
    make_scaler("ci-pool", max_agents=5, label_sets=[["ci"]])
    make_scaler("heavy", type="bare-metal", max_agents=5, label_sets=[["heavy"]])
    request_scale(["ci"], "a", resources={"cpus": 2, "memory": "8m"})
    request_scale(["heavy"], "b", resources={"cpus": 4, "memory": "16m"})
    body = scrape()
    assert 'kici_orch_scaler_cpus_used{scaler="ci-pool",scaler_type="container"} 2.0' in body
    assert 'kici_orch_scaler_cpus_used{scaler="heavy",scaler_type="bare-metal"} 4.0' in body
    assert 'kici_orch_scaler_cpus_used{scaler="__global__",scaler_type="__global__"} 6.0' in body
    assert 'kici_orch_scaler_memory_bytes_used{scaler="__global__",scaler_type="__global__"} 2.5165824e+07' in body
    assert 'kici_scaler_agents{scaler="heavy",state="spawning"} 1.0' in body


def test_spawn_failures_are_counted_by_backend_and_binding():
    make_scaler("c")
    d = request_scale(["linux"], "a")
    record_event(Agent.objects.get(agent_id=d.agent), EventType.FAILED, "boom")
    assert 'kici_orch_scaler_spawn_failures_total{backend="container",bound="true"} 1.0' in scrape()


def test_spawn_failures_never_go_down_when_their_events_are_pruned():
    make_scaler("c", type="bare-metal")
    agent = make_agent(Scaler.objects.get(name="c"), AgentState.FAILED, reserve=False, finished_at=timezone.now())
    record_event(agent, EventType.FAILED, "one")
    record_event(agent, EventType.FAILED, "two")
    line = 'kici_orch_scaler_spawn_failures_total{backend="bare-metal",bound="false"}'
    assert f"{line} 2.0" in scrape()
    later = timezone.now() + timedelta(days=settings.KICI_RETENTION_DAYS + 1)
    assert prune_old_records(now=later)
    assert not ScalerEvent.objects.exists()
    assert f"{line} 2.0" in scrape()


def test_batches_are_observed():
    make_scaler("c")
    request_scale(["linux"], "a")
    assert "kici_scaler_admission_batch_size_count" in scrape()


def test_lock_failures_are_classified():
    from django.db import OperationalError

    class LockNotAvailable(Exception):
        sqlstate = "55P03"

    contended = OperationalError("canceling statement due to lock timeout")
    contended.__cause__ = LockNotAvailable()
    assert lock_failure_reason(contended) == "contended"
    assert lock_failure_reason(OperationalError("connection refused")) == "unreachable"
    assert lock_failure_reason(ValueError("x")) is None


def test_a_real_lock_timeout_is_reported_as_contended():
    """Hold the admission row lock on another connection; a queue with a 200 ms lock timeout
    gives up, the request fails, and the counter says contended."""
    import psycopg
    from django.db import connection

    from scalers.admission.decide import Request
    from scalers.admission.queue import AdmissionQueue
    from scalers.metrics import CAP_LOCK_FAILURES

    make_scaler("c")
    set_global(max_agents=10)
    before = CAP_LOCK_FAILURES.labels(reason="contended")._value.get()
    db = connection.settings_dict
    holder = psycopg.connect(
        dbname=db["NAME"], user=db["USER"] or "postgres", host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432
    )
    q = AdmissionQueue(lock_timeout_ms=200, name="adm-lock-test")
    try:
        holder.execute("SELECT 1 FROM scalers_configstate WHERE id = 1 FOR UPDATE")
        with pytest.raises(Exception) as info:
            q.submit(Request(labels=("linux",), job_id="j"), timeout=10)
        assert lock_failure_reason(info.value) == "contended"
    finally:
        holder.rollback()
        holder.close()
        q.shutdown()
    assert CAP_LOCK_FAILURES.labels(reason="contended")._value.get() == before + 1
    assert not Agent.objects.exists()


def test_metrics_refuses_post():
    assert Client().post("/metrics").status_code == 405


def test_event_provisions_in_flight_and_the_reaper_gauges_are_exported():
    cloud = make_scaler("cloud", type="event", config={"provisioningTargets": ["http://127.0.0.1:9/"]})
    make_scaler("idle-cloud", type="event", config={"provisioningTargets": ["http://127.0.0.1:9/"]})
    for state in ("spawning", "connecting", "running", "draining", "destroying", "failed"):
        make_agent(cloud, state=state, reserve=False)
    body = scrape()
    assert 'kici_orch_scaler_external_provisioning_active{scaler="cloud"} 4.0' in body
    assert 'kici_orch_scaler_external_provisioning_active{scaler="idle-cloud"} 0.0' in body
    assert "kici_orch_scaler_reap_blocked 0.0" in body and "kici_orch_scaler_reap_unseen_provisions 0.0" in body
    set_gauge(REAP_BLOCKED, 1)
    set_gauge(REAP_BLOCKED, 1)
    count(SCALE_UP_EMITTED, {"scaler": "cloud"})
    body = scrape()
    assert "# TYPE kici_orch_scaler_reap_blocked gauge" in body and "kici_orch_scaler_reap_blocked 1.0" in body
    assert 'kici_orch_scaler_scale_up_emitted_total{scaler="cloud"} 1.0' in body


def test_attention_is_a_gauge_per_kind_read_at_scrape_time():
    make_scaler("c", max_agents=1)
    body = scrape()
    assert "# TYPE kici_scaler_attention gauge" in body
    for kind in KINDS:
        assert f'kici_scaler_attention{{kind="{kind}"}} 0.0' in body
    request_scale(["linux"], "a")
    request_scale(["linux"], "b")  # at capacity: waiting
    request_scale(["linux"], "c")
    Scaler.objects.filter(name="c").update(host_error="RuntimeError: no bridge")
    body = scrape()
    assert 'kici_scaler_attention{kind="waiting"} 2.0' in body
    assert 'kici_scaler_attention{kind="not_ready"} 1.0' in body
    assert 'kici_scaler_attention{kind="approval"} 0.0' in body
    Scaler.objects.filter(name="c").update(host_error="")
    assert 'kici_scaler_attention{kind="not_ready"} 0.0' in scrape()
