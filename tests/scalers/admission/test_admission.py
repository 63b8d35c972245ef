"""Admission: routing, every cap in check order, refusal accounting. Decisions go through
``request_scale`` against real PostgreSQL."""

from __future__ import annotations

import logging
import re

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.admission import ledger, matching
from scalers.admission.caps import CAP_ORDER
from scalers.admission.validate import InvalidScaleRequest, validate_resources
from scalers.jobs import start_waiting_spawns
from scalers.metrics import REDISPATCH
from scalers.models import MetricCounter, Reservation, ScaleRequest
from tests.support.admission import request_scale
from tests.support.scalers import make_pool, make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

GiB = 1024**3


def counter(name: str, **labels) -> float:
    from scalers.metrics import label_key

    row = MetricCounter.objects.filter(name=name, label_key=label_key(labels)).first()
    return row.value if row else 0.0


def test_it_admits_and_writes_agent_and_reservation():
    make_scaler("c", labels=("linux", "docker"), max_agents=3)
    d = request_scale(["linux", "docker"], "job-1", run_id="run-1")
    assert d.action == "spawning"
    assert d.scaler == "c" and d.backend_type == "container"
    assert re.fullmatch(r"scaler-container-[0-9a-f]{8}", d.agent)
    agent = Agent.objects.get(agent_id=d.agent)
    assert agent.state == AgentState.SPAWNING
    assert agent.bound_job_id == "job-1" and agent.run_id == "run-1"
    assert agent.labels[:2] == ["linux", "docker"] and "kici:agent:container" in agent.labels
    assert Reservation.objects.get(agent=agent).owner_instance
    rec = ScaleRequest.objects.get(job_id="job-1")
    assert rec.outcome == "spawning" and rec.agent_ref == d.agent


def test_it_answers_no_backend_for_labels_that_match_nothing():
    make_scaler("c")
    d = request_scale(["windows"], "job-x")
    assert d.action == "no-backend" and d.reason == "no-matching-label-set"
    assert not Agent.objects.exists() and not Reservation.objects.exists()
    assert ScaleRequest.objects.get(job_id="job-x").outcome == "no-backend"


def test_it_skips_when_the_label_set_resources_do_not_resolve():
    make_scaler("c", ls_config={"resources": {"memory": "lots"}})
    d = request_scale(["linux"], "job-d")
    assert d.action == "skipped" and d.scaler == "c"
    assert d.reason.startswith("resources of c label set [0] do not resolve: Invalid memory format")
    assert not Reservation.objects.exists()
    assert ScaleRequest.objects.get(job_id="job-d").outcome == "skipped"


def test_it_refuses_at_max_agents_and_counts_the_refusal():
    make_scaler("c", max_agents=3)
    actions = [request_scale(["linux"], f"j{i}").action for i in range(4)]
    assert actions == ["spawning"] * 3 + ["at-capacity"]
    d = request_scale(["linux"], "j-late")
    assert d.cap == "maxAgents"
    assert counter("kici_scaler_spawn_refusals_total", scaler="c", cap="maxAgents") == 2
    assert counter("kici_orch_scaler_spawn_refusals_total") == 2
    rec = ScaleRequest.objects.get(job_id="j-late")
    assert (rec.outcome, rec.cap) == ("at-capacity", "maxAgents")


def test_global_count_refuses_first_even_when_resources_would_too():
    # order global count -> scaler count -> resources; one refusal per request.
    set_global(max_agents=1, cpu=1)
    make_scaler("c", max_agents=1, cpu=1)
    assert request_scale(["linux"], "a", resources={"cpus": 1}).action == "spawning"
    d = request_scale(["linux"], "b", resources={"cpus": 1})
    assert d.cap == "globalMaxAgents"
    assert counter("kici_orch_scaler_spawn_refusals_total") == 1


def test_resource_cap_admits_equal_and_refuses_over():
    make_scaler("c", max_agents=10, cpu=2)
    assert request_scale(["linux"], "a", resources={"cpus": 1.5}).action == "spawning"
    d = request_scale(["linux"], "b", resources={"cpus": 1})
    assert (d.action, d.cap) == ("at-capacity", "resourceCap.cpu")
    assert request_scale(["linux"], "c", resources={"cpus": 0.5}).action == "spawning"


def test_limits_only_requests_are_mirrored_before_the_cap():
    make_scaler("c", max_agents=10, cpu=2)
    assert request_scale(["linux"], "a", resources={"limits": {"cpus": 2}}).action == "spawning"
    assert request_scale(["linux"], "b", resources={"limits": {"cpus": 0.5}}).cap == "resourceCap.cpu"


def test_global_memory_cap():
    set_global(max_agents=50, memory=2 * GiB)
    make_scaler("c", max_agents=10)
    assert request_scale(["linux"], "a", resources={"memory": "1500m"}).action == "spawning"
    assert request_scale(["linux"], "b", resources={"memory": "1g"}).cap == "globalResourceCap.memory"


def test_scaler_memory_then_global_cpu_order():
    set_global(max_agents=50, cpu=1)
    make_scaler("c", max_agents=10, memory=GiB)
    d = request_scale(["linux"], "a", resources={"cpus": 2, "memory": "2g"})
    assert (d.action, d.cap) == ("exceeds-cap", "resourceCap.memory")
    d = request_scale(["linux"], "b", resources={"cpus": 2, "memory": "512m"})
    assert (d.action, d.cap) == ("exceeds-cap", "globalResourceCap.cpu")
    assert "even with nothing else running" in d.reason


@pytest.mark.parametrize(
    ("caps", "resources", "cap"),
    [
        ({"global_cpu": 4}, {"cpus": 5}, "globalResourceCap.cpu"),
        ({"global_memory": GiB}, {"memory": "2g"}, "globalResourceCap.memory"),
        ({"cpu": 2}, {"cpus": 3}, "resourceCap.cpu"),
        ({"memory": GiB}, {"memory": "1025m"}, "resourceCap.memory"),
        ({"pool_cpu": 2}, {"cpus": 2.5}, "machinePool.cpu"),
        ({"pool_memory": GiB}, {"memory": "2g"}, "machinePool.memory"),
    ],
)
def test_a_request_larger_than_a_cap_alone_is_refused_for_good_not_at_capacity(caps, resources, cap):
    # Retrying cannot help: the answer is the permanent exceeds-cap, nothing is reserved, and the
    # request record says so (an orchestrator told "at-capacity" would retry forever).
    set_global(max_agents=50, cpu=caps.get("global_cpu"), memory=caps.get("global_memory"))
    pool = (
        make_pool("box", cpu=caps.get("pool_cpu"), memory=caps.get("pool_memory"))
        if "pool_cpu" in caps or "pool_memory" in caps
        else None
    )
    make_scaler("c", max_agents=10, cpu=caps.get("cpu"), memory=caps.get("memory"), pool=pool)
    d = request_scale(["linux"], "too-big", resources=resources)
    assert (d.action, d.cap, d.scaler) == ("exceeds-cap", cap, "c")
    assert "can never be admitted" in d.reason
    assert not Agent.objects.exists() and not Reservation.objects.exists()
    rec = ScaleRequest.objects.get(job_id="too-big")
    assert (rec.outcome, rec.cap) == ("exceeds-cap", cap)
    assert counter("kici_scaler_spawn_refusals_total", scaler="c", cap=cap) == 1


def test_a_request_that_fits_the_caps_alone_still_waits_at_capacity_when_they_are_full():
    set_global(max_agents=50, cpu=4)
    make_scaler("c", max_agents=10)
    assert request_scale(["linux"], "a", resources={"cpus": 3}).action == "spawning"
    d = request_scale(["linux"], "b", resources={"cpus": 4})
    assert (d.action, d.cap) == ("at-capacity", "globalResourceCap.cpu")


def test_machine_pool_is_shared_by_scalers_and_not_in_the_unlabelled_gauge():
    # a machine-pool refusal leaves the unlabelled refusal gauge unchanged.
    pool = make_pool("box", cpu=3)
    make_scaler("a", max_agents=10, pool=pool, label_sets=[["linux", "a"]])
    make_scaler("b", max_agents=10, pool=pool, label_sets=[["linux", "b"]])
    assert request_scale(["a"], "j1", resources={"cpus": 2}).action == "spawning"
    d = request_scale(["b"], "j2", resources={"cpus": 2})
    assert (d.action, d.cap, d.scaler) == ("at-capacity", "machinePool.cpu", "b")
    assert counter("kici_orch_scaler_spawn_refusals_total") == 0
    assert counter("kici_scaler_spawn_refusals_total", scaler="b", cap="machinePool.cpu") == 1
    assert request_scale(["b"], "j3", resources={"cpus": 1}).action == "spawning"


def test_machine_pool_memory():
    pool = make_pool("box", memory=GiB)
    make_scaler("a", max_agents=10, pool=pool)
    assert request_scale(["linux"], "j1", resources={"memory": "1g"}).action == "spawning"
    assert request_scale(["linux"], "j2", resources={"memory": "8m"}).cap == "machinePool.memory"


def test_max_concurrent_spawns_admits_and_holds_the_spawn_until_a_slot_frees(monkeypatch):
    enqueued = []
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": enqueued.append(agent.agent_id))
    make_scaler("c", max_agents=10, max_concurrent_spawns=2)
    decisions = [request_scale(["linux"], f"j{i}") for i in range(3)]
    assert [d.action for d in decisions] == ["spawning"] * 3, "over the cap is queued, never refused"
    assert enqueued == [d.agent for d in decisions[:2]]
    waiting = Agent.objects.get(agent_id=decisions[2].agent)
    assert waiting.state == AgentState.SPAWNING and waiting.rq_job_id == ""
    # the first backend call ends (its agent now only waits for its registration): the slot frees
    Agent.objects.filter(agent_id=decisions[0].agent).update(state=AgentState.CONNECTING)
    start_waiting_spawns(waiting.scaler_id)
    assert enqueued[-1] == decisions[2].agent and len(enqueued) == 3


def test_cap_order_constant_is_the_check_order():
    assert CAP_ORDER == (
        "globalMaxAgents",
        "maxAgents",
        "resourceCap.cpu",
        "resourceCap.memory",
        "globalResourceCap.cpu",
        "globalResourceCap.memory",
        "machinePool.cpu",
        "machinePool.memory",
    )


def test_resources_cascade_from_label_set_and_defaults():
    set_global(defaults={"requests": {"cpus": 1, "memory": "1g"}, "limits": {"cpus": 2, "memory": "2g"}})
    make_scaler("c", ls_config={"resources": {"requests": {"cpus": 4}, "limits": {"cpus": 4}}})
    d = request_scale(["linux"], "j", resources={"limits": {"memory": "16g"}})
    r = Reservation.objects.get(agent__agent_id=d.agent)
    assert (r.cpus, r.memory_bytes, r.limit_cpus, r.limit_memory_bytes) == (4, 16 * GiB, 4, 16 * GiB)


def test_resources_resolve_with_the_defaults_of_the_config_version_in_force():
    set_global(defaults={"requests": {"cpus": 1}})
    make_scaler("c", max_agents=5)
    first = request_scale(["linux"], "j1")
    set_global(defaults={"requests": {"cpus": 3}})
    second = request_scale(["linux"], "j2")
    cpus = dict(Reservation.objects.values_list("agent__agent_id", "cpus"))
    assert (cpus[first.agent], cpus[second.agent]) == (1, 3)


def test_a_world_resolves_each_label_set_and_resources_shape_once(monkeypatch):
    make_scaler("c", ls_config={"resources": {"cpus": 2}})
    make_scaler("b", labels=("linux", "bad"), ls_config={"resources": {"memory": "lots"}})
    with connection.cursor() as cur:
        world = ledger.load_world(cur, ledger.read_config(cur))
    ls, bad_ls = (world.by_name(name).label_sets[0] for name in ("c", "b"))
    calls = []
    real = matching.resolve_resources
    monkeypatch.setattr(matching, "resolve_resources", lambda *a: calls.append(a) or real(*a))
    parsed = validate_resources({"cpus": 1})
    assert world.resolve(ls, parsed) is world.resolve(ls, parsed)
    assert world.resolve(ls, parsed).requests.cpus == 1
    assert len(calls) == 1
    world.resolve(ls, {"cpus": 1})  # a caller's own dict (unhashable): resolved each time
    world.resolve(ls, {"cpus": 1})
    for _ in range(2):  # a refusal is not remembered
        with pytest.raises(ValueError):
            world.resolve(bad_ls, parsed)
    assert len(calls) == 5


def test_the_tables_a_batch_inserts_into_carry_no_index_nothing_reads():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('agents_agent', 'scalers_scalerequest')"
        )
        indexes = dict(cur.fetchall())
    assert not [name for name, d in indexes.items() if "varchar_pattern_ops" in d]
    assert not [name for name, d in indexes.items() if d.endswith("ON public.agents_agent USING btree (scaler_id)")]
    assert any("(scaler_id, state)" in d for d in indexes.values())  # what serves look-ups by scaler


def test_a_retiring_scaler_admits_nothing():
    make_scaler("old", retiring=True)
    assert request_scale(["linux"], "j").action == "no-backend"


def test_it_warns_only_when_the_ledger_outruns_the_active_agents(caplog):
    make_scaler("c", max_agents=1)
    first = request_scale(["linux"], "a")
    with caplog.at_level(logging.WARNING, logger="scalers.admission"):
        assert request_scale(["linux"], "b").cap == "maxAgents"
    assert "no running agent accounts for" not in caplog.text  # ordinary saturation
    # The agent failed but its reservation was never released: capacity billed to nobody.
    Agent.objects.filter(agent_id=first.agent).update(state=AgentState.FAILED)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scalers.admission"):
        assert request_scale(["linux"], "c").cap == "maxAgents"
    assert "refused a spawn on reserved capacity no running agent accounts for" in caplog.text


def test_an_event_scaler_in_provision_backoff_is_skipped():
    from agents.choices import EventType
    from agents.events import record_event

    scaler = make_scaler("ev", type="event", config={"provisioningTargets": ["x"]})
    d = request_scale(["linux"], "j1")
    agent = Agent.objects.get(agent_id=d.agent)
    record_event(agent, EventType.FAILED, "boom")
    d2 = request_scale(["linux"], "j2")
    assert d2.action == "skipped" and "consecutive failures" in d2.reason
    record_event(agent, EventType.REGISTERED, "ok")
    assert request_scale(["linux"], "j3").action == "spawning"
    assert scaler.pk


def test_the_same_job_requested_twice_keeps_one_record_with_attempts():
    make_scaler("c", max_agents=1)
    request_scale(["linux"], "other")
    request_scale(["linux"], "j")
    request_scale(["linux"], "j")
    rec = ScaleRequest.objects.get(job_id="j")
    assert (rec.outcome, rec.attempts) == ("at-capacity", 2)


def test_routing_prefers_the_smallest_label_set_and_respects_exclude():
    make_scaler("docker-linux", label_sets=[["linux", "docker"], ["linux", "node20"]])
    make_scaler("gpu", type="bare-metal", label_sets=[["linux", "gpu", "cuda"]])
    assert request_scale(["linux", "gpu", "cuda"], "a").scaler == "gpu"
    d = request_scale(["linux"], "b", exclude=["gpu"])
    assert Agent.objects.get(agent_id=d.agent).label_set.index == 0
    d = request_scale(["linux", "node20"], "c")
    assert Agent.objects.get(agent_id=d.agent).label_set.index == 1


@pytest.mark.parametrize("inside_a_transaction", [False, True], ids=["own transaction", "caller's transaction"])
def test_an_agent_id_that_already_exists_is_minted_again(monkeypatch, inside_a_transaction):
    """A minted id that is taken undoes the batch, which is decided again with new ids: its own
    transaction is rolled back, or in a caller's transaction its savepoint (the caller's own
    writes stay)."""
    from scalers.admission import decide

    make_scaler("c", max_agents=5)
    first = request_scale(["linux"], "a").agent
    ids = iter([first, first, "scaler-container-0000000b", "scaler-container-0000000c"])
    monkeypatch.setattr(decide, "mint_agent_id", lambda kind: next(ids))
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)
    if inside_a_transaction:
        with transaction.atomic():
            set_global(max_agents=40)
            d = request_scale(["linux"], "b")
        assert ledger.read_config(connection.cursor())["global_max_agents"] == 40
    else:
        d = request_scale(["linux"], "b")
    assert d.action == "spawning" and d.agent not in (first,)
    assert Agent.objects.count() == 2 == Reservation.objects.count()
    rec = ScaleRequest.objects.get(job_id="b")
    assert rec.agent_ref == d.agent and rec.attempts == 1
    assert Reservation.objects.get(agent__agent_id=d.agent).agent.bound_job_id == "b"


def test_a_taken_agent_id_is_told_apart_by_its_constraint_not_by_the_message_language():
    """The unique violation of ``agent_id`` is recognised under any ``lc_messages`` (its detail
    text is translated), and another unique violation of the agents table is not taken for it."""
    import psycopg

    make_scaler("c")
    taken = request_scale(["linux"], "a").agent
    other = request_scale(["linux"], "b").agent
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        with transaction.atomic(), connection.connection.cursor() as cur:
            cur.execute("UPDATE agents_agent SET agent_id = %s WHERE agent_id = %s", [taken, other])
    real = raised.value
    assert real.diag.constraint_name == ledger.AGENT_ID_CONSTRAINT and ledger.agent_id_taken(real)

    class Diag:
        def __init__(self, constraint):
            self.table_name, self.constraint_name = "agents_agent", constraint
            self.message_detail = f"Schlüssel »(agent_id)=({taken})« existiert bereits."

    class Translated(psycopg.errors.UniqueViolation):
        def __init__(self, constraint):
            super().__init__("doppelter Schlüsselwert verletzt Unique-Constraint")
            self._fake = Diag(constraint)

        @property
        def diag(self):
            return self._fake

    assert ledger.agent_id_taken(Translated(ledger.AGENT_ID_CONSTRAINT))
    assert not ledger.agent_id_taken(Translated("agents_agent_other_key"))


def test_inside_a_transaction_the_spawn_is_enqueued_only_on_commit(monkeypatch):
    from django.db import transaction

    enqueued = []
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": enqueued.append(agent.agent_id))
    make_scaler("c")
    with transaction.atomic():
        d = request_scale(["linux"], "j")
        assert d.action == "spawning" and enqueued == []
    assert enqueued == [d.agent]


def test_a_rolled_back_caller_transaction_leaves_nothing(monkeypatch):
    from django.db import transaction

    enqueued = []
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": enqueued.append(agent.agent_id))
    make_scaler("c")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert request_scale(["linux"], "j").action == "spawning"
        raise RuntimeError("caller failed after admission")
    assert enqueued == [] and not Agent.objects.exists() and not Reservation.objects.exists()


def test_bad_input_to_request_scale_names_the_field():
    from scalers.admission.validate import InvalidScaleRequest

    make_scaler("c")
    with pytest.raises(InvalidScaleRequest, match=r"labels\[0\]"):
        request_scale([3], "j")
    with pytest.raises(InvalidScaleRequest, match="jobId"):
        request_scale(["linux"], "")
    with pytest.raises(InvalidScaleRequest, match=r"resources\.cpus"):
        request_scale(["linux"], "j", resources={"cpus": -2})
    assert not Agent.objects.exists() and not ScaleRequest.objects.exists()


def _generation() -> str:
    from scalers.models import ConfigGeneration

    return ConfigGeneration.objects.get(pk=1).token


def test_every_write_to_the_routing_rows_is_seen_by_the_next_decision():
    # The cached routing table is keyed by the generation token the tables' triggers change: a
    # raw UPDATE, an ORM update and a delete are each seen at once, with no cache clear between.
    from django.db import connection

    from scalers.models import LabelSet, Scaler

    scaler = make_scaler("c", max_agents=1)
    assert request_scale(["linux"], "g1").action == "spawning"
    assert request_scale(["linux"], "g2").cap == "maxAgents"
    before = _generation()
    with connection.cursor() as cur:
        cur.execute("UPDATE scalers_scaler SET max_agents = 2 WHERE name = 'c'")
    assert _generation() != before
    assert request_scale(["linux"], "g2").action == "spawning"
    Scaler.objects.filter(pk=scaler.pk).update(retiring=True)
    assert request_scale(["linux"], "g3").action != "spawning"
    Scaler.objects.filter(pk=scaler.pk).update(retiring=False, max_agents=5)
    LabelSet.objects.filter(scaler=scaler).delete()
    assert request_scale(["linux"], "g4").action == "no-backend"


def test_a_truncate_of_the_routing_rows_gives_a_token_never_seen_before():
    from django.db import connection

    seen = {_generation()}
    for _ in range(3):
        with connection.cursor() as cur:
            cur.execute("TRUNCATE scalers_labelset, scalers_configgeneration CASCADE")
        token = _generation()
        assert token not in seen
        seen.add(token)


def test_a_job_image_is_kept_on_the_agent_and_an_unusable_credential_is_refused_before_anything():
    make_scaler("c", labels=("linux",))
    with pytest.raises(InvalidScaleRequest) as exc:
        request_scale(["linux"], "j1", job_image={"image": "reg.example/x:1", "credentialsRef": "nope"})
    assert exc.value.field == "container.credentialsRef" and "no registry credential named 'nope'" in str(exc.value)
    assert not Agent.objects.exists() and not ScaleRequest.objects.exists()
    decision = request_scale(["linux"], "j2", job_image={"image": "reg.example/x:1"})
    assert decision.action == "spawning"
    assert Agent.objects.get(agent_id=decision.agent).job_image == "reg.example/x:1"


def test_a_job_image_routed_to_a_process_mode_label_set_is_refused_naming_it():
    make_scaler("bm", type="bare-metal", labels=("linux",), ls_config={"binaryPath": "/bin/true"})
    decision = request_scale(["linux"], "j1", job_image={"image": "debian:12"})
    assert decision.action == "no-backend" and "label set [0] of scaler bm (bare-metal) cannot run a job image" in (
        decision.reason
    )
    assert not Agent.objects.exists()


def test_the_redispatch_count_looks_up_the_batchs_jobs_not_every_stored_refusal(monkeypatch):
    """The batch write counts the admitted jobs whose stored decision was at-capacity. It must cost
    one look-up per job of the batch whatever the planner's statistics say (here none yet, as
    for a table that grew since its last analyze): a join let it scan every stored at-capacity
    record (they accumulate for the retention period) for each batch."""
    now = timezone.now()
    ScaleRequest.objects.bulk_create(
        ScaleRequest(job_id=f"old-{i}", labels=["linux"], outcome="at-capacity", decided_at=now, first_requested_at=now)
        for i in range(3000)
    )
    record = {
        "job_id": "old-7",  # waiting since its refusal, admitted now
        "run_id": "",
        "labels": ["linux"],
        "resources": None,
        "cpus": 1.0,
        "memory_bytes": 0,
        "outcome": "spawning",
        "cap": "",
        "reason": "",
        "scaler_name": "s",
        "agent_ref": "",
        "token_name": "",
    }
    sql, args = ledger.write_query(
        now=now,
        instance_id="i",
        agents=[],
        reservations=[],
        records=[record, {**record, "job_id": "new-1"}],
        counters={},
        redispatch=(REDISPATCH, {"trigger": "sweep"}),
    )
    with transaction.atomic():
        raw = connection.connection
        ledger.prepare_statements(raw)
        with psycopg.ClientCursor(raw) as cur:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
            plan = cur.fetchone()[0]
        transaction.set_rollback(True)

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    read = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        for n in nodes(plan[0]["Plan"])
        if n.get("Relation Name") == "scalers_scalerequest" and "Scan" in n["Node Type"]
    )
    assert read <= 2, f"the redispatch count read {read} stored request records for a batch of 2 jobs"


def test_a_batch_runs_its_statements_as_prepared_ones():
    """A batch's statements are prepared once per connection and executed by name from then on:
    parsing and planning them again would be most of a small batch's server time."""
    from scalers.admission.decide import Request, decide_batch

    make_scaler("c", labels=("linux",), max_agents=5)
    for i in range(3):
        decide_batch([Request(labels=("linux",), job_id=f"prep-{i}")])
    with connection.cursor() as cur:
        cur.execute("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements")
        executed = dict(cur.fetchall())
    assert set(executed) == set(ledger._statements()), "only admission's own statements are prepared"
    assert executed[ledger.WRITE_STATEMENT] == 3
    # The first batch reads a fresh snapshot; the next two decide from the one the last left.
    assert executed[ledger.LOCK_STATEMENT] == 1
    assert executed[ledger.LOCK_ONLY_STATEMENT] == executed[ledger.GUARD_STATEMENT] == 2


def _round_trips(tmp_path, requests) -> tuple[list, list[str]]:
    """Decide ``requests`` as one batch on the test's connection; its decisions and the queries
    it sent (each a round trip: it ends in a ReadyForQuery)."""
    from scalers.admission.decide import decide_batch

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    trace = tmp_path / "trace"
    with trace.open("w") as f:
        pgconn.trace(f.fileno())
        try:
            decisions = decide_batch(requests).decisions
        finally:
            pgconn.untrace()
    lines = trace.read_text().splitlines()
    queries = [line.split("\tQuery\t", 1)[1].strip() for line in lines if "\tF\t" in line and "\tQuery\t" in line]
    assert len([line for line in lines if "ReadyForQuery" in line]) == len(queries), trace.read_text()
    assert connection.connection.info.transaction_status == 0  # idle: committed or rolled back
    return decisions, queries


def test_a_connections_first_batch_takes_two_round_trips(tmp_path):
    """BEGIN travels with the lock and the snapshot, COMMIT with the write."""
    from scalers.admission.decide import Request, decide_batch

    make_scaler("c", labels=("linux",), max_agents=5)
    decide_batch([Request(labels=("linux",), job_id="warm-up")])  # prepares the statements
    ledger.take_held_snapshot(connection.connection)  # as on a new connection: none held
    decisions, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id="first")])
    assert decisions[0].action == "spawning"
    assert Agent.objects.filter(agent_id=decisions[0].agent).exists()
    assert len(queries) == 2, queries
    assert queries[0].startswith(f'"BEGIN; EXECUTE {ledger.LOCK_STATEMENT}; EXECUTE {ledger.SNAPSHOT_STATEMENT}')
    assert queries[1].startswith(f'"EXECUTE {ledger.WRITE_STATEMENT}(') and queries[1].endswith('; COMMIT"')


def test_a_batch_after_the_connections_last_one_takes_one_round_trip(tmp_path):
    """Decided from the snapshot the previous batch left after its own writes: BEGIN, the lock,
    the check that nothing moved it, the write and COMMIT in one round trip."""
    from scalers.admission.decide import Request, decide_batch

    make_scaler("c", labels=("linux",), max_agents=5)
    decide_batch([Request(labels=("linux",), job_id="before")])
    decisions, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id="traced")])
    assert decisions[0].action == "spawning"
    assert Agent.objects.filter(agent_id=decisions[0].agent).exists()
    assert len(queries) == 1, queries
    assert queries[0].startswith(f"\"BEGIN; EXECUTE {ledger.LOCK_ONLY_STATEMENT}; EXECUTE {ledger.GUARD_STATEMENT}('")
    assert f"EXECUTE {ledger.WRITE_STATEMENT}(" in queries[0] and queries[0].endswith('; COMMIT"')


def _release_first_agent():
    agent = Agent.objects.get(bound_job_id="a")
    Reservation.objects.filter(agent=agent).delete()
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED)


def _lower_the_global_cap():
    set_global(max_agents=1)


def _lower_the_scaler_cap():
    from scalers.models import Scaler

    Scaler.objects.filter(name="c").update(max_agents=1)


def _bump_the_config_row():
    from scalers.models import ConfigState

    ConfigState.objects.filter(pk=1).update(global_max_agents=1)


@pytest.mark.parametrize(
    ("change", "second"),
    [
        (_release_first_agent, "spawning"),  # another writer freed the only slot
        (_lower_the_global_cap, "at-capacity"),  # the config row, through the ORM
        (_bump_the_config_row, "at-capacity"),  # the config row, one column
        (_lower_the_scaler_cap, "at-capacity"),  # the routing rows
    ],
)
def test_a_batch_decided_from_a_held_snapshot_sees_what_others_committed_since(tmp_path, change, second):
    """The held snapshot moved: the write's check fails under the lock before anything is
    written, and the batch is decided again from a fresh snapshot."""
    from scalers.admission.decide import Request, decide_batch

    make_scaler("c", labels=("linux",), max_agents=2 if second == "at-capacity" else 1)
    set_global(max_agents=2 if second == "at-capacity" else 50)
    assert decide_batch([Request(labels=("linux",), job_id="a")]).decisions[0].action == "spawning"
    change()
    decisions, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id="b")])
    assert decisions[0].action == second
    assert ledger.GUARD_STATEMENT in queries[0] and queries[1] == '"ROLLBACK"', queries  # moved
    assert any(q.startswith(f'"BEGIN; EXECUTE {ledger.LOCK_STATEMENT};') for q in queries[2:]), queries
    assert Agent.objects.filter(bound_job_id="b").count() == (second == "spawning")


def test_a_connection_whose_held_snapshots_keep_moving_stops_holding_them_for_a_while(tmp_path):
    """Another console admitting on the same database moves nearly every held snapshot: after two
    moves in a row a connection reads a fresh one for :data:`HOLD_OFF_BATCHES` batches."""
    from scalers.admission.decide import Request, decide_batch

    make_scaler("c", labels=("linux",), max_agents=50)

    def other_console_admits() -> None:
        with connection.cursor() as cur:  # a write that moves the usage, as another console's batch
            cur.execute(
                "INSERT INTO scalers_usagetally (scaler_id, reservations, cpus, memory_bytes, active, "
                "spawns_in_flight, spawns_waiting) VALUES (NULL, 0, 0, 0, 0, 0, 0)"
            )

    decide_batch([Request(labels=("linux",), job_id="j0")])
    for i in (1, 2):
        other_console_admits()
        _, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id=f"j{i}")])
        assert ledger.GUARD_STATEMENT in queries[0]  # tried the held snapshot, which had moved
    for i in range(3, 3 + ledger.HOLD_OFF_BATCHES):
        _, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id=f"j{i}")])
        assert len(queries) == 2 and ledger.GUARD_STATEMENT not in queries[0], (i, queries)
    decide_batch([Request(labels=("linux",), job_id="again")])  # holds one again
    _, queries = _round_trips(tmp_path, [Request(labels=("linux",), job_id="last")])
    assert len(queries) == 1
