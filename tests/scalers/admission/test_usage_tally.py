"""The usage tally (``scalers.models.UsageTally``): kept by the database's triggers, it must equal
a count of the tables themselves after every kind of write, whoever makes it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent
from scalers.admission import ledger
from scalers.admission.decide import Request, decide_batch
from scalers.models import Reservation, UsageTally
from tests.support.scalers import make_agent, make_pool, make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


def counted() -> dict:
    """Usage as counted from the reservations and agents now: ``{(scaler, pool): [n, cpus, mem]}``
    and ``{scaler: [active, in flight, waiting]}``, zero entries left out."""
    res, agents = {}, {}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT scaler_id, machine_pool_id, count(*), sum(cpus), sum(memory_bytes) FROM scalers_reservation "
            "GROUP BY 1, 2"
        )
        for scaler, pool, n, cpus, mem in cur.fetchall():
            res[(scaler, pool)] = [n, float(cpus), int(mem)]
        cur.execute(
            "SELECT scaler_id, count(*) FILTER (WHERE state = ANY(%s)), "
            "count(*) FILTER (WHERE state = 'spawning' AND rq_job_id <> ''), "
            "count(*) FILTER (WHERE state = 'spawning' AND rq_job_id = '') FROM agents_agent GROUP BY 1",
            [[str(s) for s in ACTIVE_STATES]],
        )
        for scaler, *counts in cur.fetchall():
            if any(counts):
                agents[scaler] = counts
    return {"reservations": res, "agents": agents}


def tallied() -> dict:
    """The same, as the admission snapshot sums the tally."""
    with connection.cursor() as cur:
        cur.execute(ledger._SNAPSHOT_SQL)
        rows = cur.fetchall()
    res, agents = {}, {}
    for kind, scaler, pool, n, cpus, mem, active, in_flight, waiting, _, _ in rows:
        if kind != 0:
            continue
        if n or cpus or mem:
            key = (scaler, pool)
            prev = res.get(key, [0, 0.0, 0])
            res[key] = [prev[0] + n, prev[1] + cpus, prev[2] + mem]
        if active or in_flight or waiting:
            prev = agents.get(scaler, [0, 0, 0])
            agents[scaler] = [prev[0] + active, prev[1] + in_flight, prev[2] + waiting]
    return {"reservations": res, "agents": agents}


def assert_tally_counts():
    assert tallied() == counted()


def test_every_agent_state_counts_as_the_admission_rule_says():
    """Each state (and a spawning agent with and without its spawn job id) is counted active,
    in flight or waiting exactly as ``ACTIVE_STATES`` and the spawn-slot rule say: the trigger
    writes the states out, so a state added to the code must be added to it too."""
    s = make_scaler("c")
    for state in AgentState:
        agent = make_agent(s, state=state, reserve=False)
        assert_tally_counts()
        agent.delete()
        assert_tally_counts()
    make_agent(s, state=AgentState.SPAWNING, reserve=False, rq_job_id="spawn-x")
    make_agent(s, state=AgentState.SPAWNING, reserve=False)
    assert tallied()["agents"] == {s.pk: [2, 1, 1]}


def test_the_tally_follows_inserts_updates_and_deletes_of_every_kind():
    pool = make_pool("box", cpu=64)
    s1, s2 = make_scaler("a", pool=pool), make_scaler("b")
    a1 = make_agent(s1)
    a2 = make_agent(s2, rq_job_id="spawn-a2")
    assert_tally_counts()

    Agent.objects.filter(pk=a1.pk).update(state=AgentState.RUNNING)  # a bulk update
    a2.state = AgentState.CONNECTING
    a2.save()  # a full-row save
    Agent.objects.filter(pk=a1.pk).update(last_heartbeat=None)  # changes nothing counted
    assert_tally_counts()

    Reservation.objects.filter(agent=a1).update(cpus=0.1, memory_bytes=7)
    Reservation.objects.filter(agent=a2).update(scaler=s1)  # moves between scalers
    assert_tally_counts()

    pool.delete()  # SET NULL on its reservations: their usage leaves the pool
    assert_tally_counts()
    a1.delete()  # cascades to its reservation
    with connection.cursor() as cur:
        cur.execute("DELETE FROM scalers_reservation")  # raw SQL, as any other writer
    assert_tally_counts()
    Agent.objects.all().delete()
    assert tallied() == {"reservations": {}, "agents": {}}


def test_fractional_cpus_return_to_exactly_zero():
    """cpus are summed exactly: a thousand tenths added and taken away leave nothing behind."""
    s = make_scaler("c")
    agents = [make_agent(s, reserve=False) for _ in range(10)]
    for _ in range(100):
        Reservation.objects.bulk_create(
            Reservation(scaler=s, agent=a, cpus=0.1, memory_bytes=1, owner_instance="t") for a in agents
        )
        Reservation.objects.all().delete()
    with connection.cursor() as cur:
        cur.execute("SELECT sum(cpus) FROM scalers_usagetally")
        assert cur.fetchone()[0] == 0


def test_a_rolled_back_change_leaves_no_tally_behind():
    s = make_scaler("c")
    with transaction.atomic():
        make_agent(s)
        transaction.set_rollback(True)
    assert tallied() == {"reservations": {}, "agents": {}} == counted()


def test_a_truncate_counts_the_tally_again_from_the_tables():
    """TRUNCATE fires no row triggers: a TRUNCATE of either table, or of the tally itself, recounts
    the tally from the tables instead (the test database's flush truncates them all)."""
    s = make_scaler("c")
    make_agent(s)
    with connection.cursor() as cur:
        cur.execute("TRUNCATE scalers_usagetally")  # the tally alone lost: recounted from the tables
    assert tallied()["agents"] == {s.pk: [1, 0, 1]}
    assert_tally_counts()
    with connection.cursor() as cur:
        cur.execute("TRUNCATE scalers_reservation")
    assert_tally_counts()


def test_a_batch_folds_the_tally_once_it_piles_up_and_the_sums_stay():
    set_global(max_agents=1000)
    s = make_scaler("c", labels=("linux",), max_agents=1000)
    for i in range(ledger.FOLD_ROWS):  # one statement each: a tally row each
        make_agent(s, reserve=False, rq_job_id=f"spawn-{i}" if i % 2 else "")
    assert UsageTally.objects.count() >= ledger.FOLD_ROWS
    before = counted()
    d = decide_batch([Request(labels=("linux",), job_id="folds")]).decisions[0]
    assert d.action == "spawning"
    rows = UsageTally.objects.count()
    assert rows <= 2, f"{rows} tally rows after the fold: one per scaler and pool is what it keeps"
    assert_tally_counts()
    assert counted()["agents"][s.pk][0] == before["agents"][s.pk][0] + 1


def test_admission_decides_on_the_tally():
    """Caps hold against the tallied usage: agents written outside admission count."""
    s = make_scaler("c", labels=("linux",), max_agents=2)
    make_agent(s, state=AgentState.RUNNING)
    assert decide_batch([Request(labels=("linux",), job_id="j1")]).decisions[0].action == "spawning"
    refused = decide_batch([Request(labels=("linux",), job_id="j2")]).decisions[0]
    assert refused.action == "at-capacity" and refused.cap == "maxAgents"
    assert_tally_counts()
