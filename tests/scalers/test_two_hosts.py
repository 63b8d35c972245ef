"""Two hosts, one PostgreSQL, one Redis (docs/multi-host.md), for real: each host is a network
namespace with its own private dockerd and its own console (daphne, an rq worker on its host
queue, the scaler sweeper) importing its own scalers.yaml; they reach the test's database and
Redis through a relay on their veth (``tests.support.two_hosts``). It proves:

1. global caps hold across both hosts under concurrent requests: 16 concurrent ``/scale`` calls,
   half to each console, against ``globalMaxAgents: 4``, admit exactly 4 (0 over-admissions);
2. each host spawns only its own scalers' agents: every request went to the *other* host's
   console, and every admitted agent's container is on its scaler's host's dockerd, none on the
   other;
3. an orphan on host B is planned only by host B (its sweeper's database session wrote the plan,
   the leader on host A planned nothing for it), runs on ``host:B`` and is reaped there;
4. the restored-copy scenario of docs/sandbox-ownership.md: a second console on host B (same host
   name and docker host, another instance id) over a pg_dump copy of the database (same
   installation id, same scaler name) holding one running agent the original does not know:
   the copy's orphan plan spares every one of B's running agents (and B's orphan) as another
   console's, and B's plan spares the copy's agent; B's own agents are never targets;
5. failover: host A's sweeper (the leader) killed with SIGKILL, host B leads within 10 s, its
   leader-change recovery runs once, and the global sweep it takes over (a stale reservation) is
   not planned twice.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent
from lib.env import redis_place
from operations.choices import OperationKind, OperationStatus
from operations.models import Operation
from operations.queues import workers_listening
from operations.services import approve_operation
from scalers.backends.ownership import Owner
from scalers.hosts import queue_named
from scalers.models import Installation, RecoveryReport, Reservation, Scaler
from tests.support.root import require_root
from tests.support.scalers import make_agent
from tests.support.soak import lock_holders
from tests.support.two_hosts import Host

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: the global cap binds (each scaler alone could take 3), and each scaler gets at least one agent
GLOBAL_MAX, SCALER_MAX = 4, 3
TOKEN = "two-hosts-api-token"
TAKEOVER_BOUND = 10.0
SCALERS_YAML = """
version: 1
globalMaxAgents: {global_max}
scalers:
  - name: {scaler}
    type: container
    maxAgents: {max_agents}
    labelSets:
      - labels: ['linux', '{label}']
        image: 'kici-agent:local'
        imagePullPolicy: Never
"""
SWEEPS = {
    "KICI_SWEEP_ORPHAN_CONTAINERS_SECONDS": "5",
    "KICI_SWEEP_STALE_RESERVATIONS_SECONDS": "5",
    "KICI_SWEEP_ORPHAN_VMS_SECONDS": "0",
    "KICI_SWEEP_STALE_ISOLATION_RULES_SECONDS": "0",
    "KICI_SWEEP_LOST_AGENTS_SECONDS": "0",
}


def wait_for(what: str, check, timeout: float, hosts):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    logs = "\n".join(f"--- {h.name} {n}\n{h.log(n, 2500)}" for h in hosts for n in ("web", "worker", "sweeper"))
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{logs}")


@pytest.fixture
def plan_trace():
    """Who (the writing session's ``application_name``) stored which operation."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE mh_trace (app text, kind text, scaler text)")
        cur.execute(
            "CREATE FUNCTION mh_trace_fn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO mh_trace"
            " VALUES (current_setting('application_name'), NEW.kind, NEW.scaler_name); RETURN NULL; END $$"
        )
        cur.execute(
            "CREATE TRIGGER mh_trace AFTER INSERT ON operations_operation FOR EACH ROW EXECUTE FUNCTION mh_trace_fn()"
        )
    try:
        yield lambda: _traced()
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS mh_trace ON operations_operation")
            cur.execute("DROP FUNCTION IF EXISTS mh_trace_fn() CASCADE")
            cur.execute("DROP TABLE IF EXISTS mh_trace")


def _traced() -> list[tuple[str, str, str]]:
    with connection.cursor() as cur:
        cur.execute("SELECT app, kind, scaler FROM mh_trace")
        return cur.fetchall()


def copy_database(source: str, target: str) -> None:
    """``target`` made a copy of ``source`` (pg_dump into a fresh database), as a restored backup."""
    drop_database(target)
    pg = ["-h", "127.0.0.1", "-U", "postgres"]
    subprocess.run(["createdb", *pg, target], check=True, capture_output=True, timeout=60)
    dump = subprocess.run(["pg_dump", *pg, source], check=True, capture_output=True, timeout=120)
    subprocess.run(["psql", "-q", *pg, "-d", target], input=dump.stdout, check=True, capture_output=True, timeout=120)


def drop_database(name: str) -> None:
    subprocess.run(
        ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", name], capture_output=True, timeout=60
    )


def scale(host: Host, label: str, job: str) -> int:
    session = requests.Session()
    session.trust_env = False
    answer = session.post(
        host.url + "/api/v1/scale",
        json={"labels": ["linux", label], "jobId": job},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    return answer.status_code


def containers_of(host: Host, scaler: str) -> dict[str, str]:
    """agent id → container id of ``scaler``'s containers on ``host``'s dockerd."""
    client = host.docker()
    try:
        found = client.containers.list(all=True, filters={"label": f"kici-scaler-name={scaler}"})
        return {c.labels.get("kici-agent-id", ""): c.id for c in found}
    finally:
        client.close()


def test_two_hosts_share_caps_and_each_sweeps_and_spawns_only_its_own(tmp_path, plan_trace):
    require_root()
    database = connection.settings_dict["NAME"]
    redis_db = str(redis_place(settings.REDIS_URL)[1])  # the suite's database (settings_test)
    installation = Installation.current_id()
    copy = f"{database}_restored"
    a, b = Host("mh-host-a", 1, tmp_path), Host("mh-host-b", 2, tmp_path)
    hosts = (a, b)
    scaler_of = {a: "mh-a-ctr", b: "mh-b-ctr"}
    label_of = {a: "mh-on-a", b: "mh-on-b"}
    try:
        for host in hosts:
            host.create()
            queue_named(f"host:{host.name}").empty()
        with ThreadPoolExecutor(2) as pool:
            started = list(pool.map(lambda h: h.start_dockerd(), hosts))
        for host, failed in zip(hosts, started, strict=True):
            assert failed is None, host.dockerd_failure()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda h: h.build_agent_image(), hosts))
        envs = {}
        for host in hosts:
            (host.workdir / "scalers.yaml").write_text(
                SCALERS_YAML.format(
                    global_max=GLOBAL_MAX, max_agents=SCALER_MAX, scaler=scaler_of[host], label=label_of[host]
                )
            )
            envs[host] = host.env(database, redis_db, TOKEN, {"KICI_INSTANCE_ID": host.name, **SWEEPS})
            host.run_in_ns([sys.executable, "manage.py", "import_scalers"], envs[host])
        assert dict(Scaler.objects.values_list("name", "host")) == {"mh-a-ctr": a.name, "mh-b-ctr": b.name}

        # The restored copy (docs/sandbox-ownership.md): a database copied now, with one running
        # agent of mh-b-ctr that only the copy knows, for a console of its own on host B.
        approver = get_user_model().objects.create_superuser("mh-approver", password="x")
        ghost = make_agent(
            Scaler.objects.get(name="mh-b-ctr"), state=AgentState.RUNNING, reserve=False,
            agent_id="scaler-container-mhrestored", registered_at=timezone.now(),
        )  # fmt: skip
        copy_database(database, copy)
        ghost.delete()
        restored_env = {
            **envs[b],
            "DATABASE_URL": f"postgres://postgres@{b.gateway}:5432/{copy}",
            "KICI_INSTANCE_ID": "mh-restored-copy",
            "KICI_NFT_TABLE": "kicimhr",
            "PGAPPNAME": "two-hosts:restored-copy",
        }

        # Host A's console first, so A leads: the orphan on B below is B's to plan anyway.
        a.start_console(envs[a])
        wait_for("host A to lead", lambda: lock_holders() == [a.name], 60, hosts)
        b.start_console(envs[b])
        for host in hosts:
            host.wait_healthy()
        wait_for("host B's worker", lambda: workers_listening(f"host:{b.name}") > 0, 60, hosts)

        # 1 + 2: concurrent requests, each to the other host's console, against one global cap.
        go = threading.Barrier(16)

        def ask(i: int) -> int:
            via, target = (a, b) if i % 2 else (b, a)
            go.wait()
            return scale(via, label_of[target], f"mh-job-{i}")

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(ask, range(16)))
        assert sorted(codes) == [201] * GLOBAL_MAX + [409] * (16 - GLOBAL_MAX), codes
        assert Reservation.objects.count() == GLOBAL_MAX
        agents = list(Agent.objects.select_related("scaler").filter(state__in=ACTIVE_STATES))
        assert len(agents) == GLOBAL_MAX

        def spawned():
            rows = list(
                Agent.objects.select_related("scaler").filter(pk__in=[x.pk for x in agents]).exclude(managed_id="")
            )
            return len(rows) == GLOBAL_MAX and rows

        agents = list(wait_for("every admitted agent to be spawned", spawned, 90, hosts))
        for agent in agents:
            own = next(h for h in hosts if h.name == agent.scaler.host)
            other = b if own is a else a
            assert containers_of(own, agent.scaler.name).get(agent.agent_id) == agent.managed_id
            assert agent.agent_id not in containers_of(other, agent.scaler.name)
            assert not containers_of(other, scaler_of[own])  # the other host's dockerd has none of them

        # 3 + 4: a restored copy's running agent (same installation and scaler name, another console
        # instance), then an orphan of B's console, on B's docker host: any plan holding the orphan
        # listed both.
        client = b.docker()
        try:
            restored = client.containers.run(
                "kici-agent:local", ["sleep", "600"], detach=True, network_mode="none",
                labels={"kici-managed": "true", **Owner(installation, "mh-restored-copy", "mh-b-ctr").labels(),
                        "kici-agent-id": "scaler-container-mhrestored"},
            )  # fmt: skip
            orphan = client.containers.run(
                "kici-agent:local", ["sleep", "600"], detach=True, network_mode="none",
                labels={"kici-managed": "true", **Owner(installation, b.name, "mh-b-ctr").labels(),
                        "kici-agent-id": "scaler-container-mhorphan"},
            )  # fmt: skip
        finally:
            client.close()

        def orphan_plan():
            return Operation.objects.filter(
                kind=OperationKind.ORPHAN_CONTAINERS, scaler_name="mh-b-ctr", status=OperationStatus.PLANNED
            ).first()

        # The restored copy's console plans the same scaler on the same docker host: it spares B's
        # running agents (and B's orphan): they carry another console's instance id.
        restored_plan = b.run_in_ns(
            [sys.executable, "manage.py", "operations", "plan", "orphan-containers", "--scaler", "mh-b-ctr",
             "--user", "mh-approver"],
            restored_env,
        ).stdout  # fmt: skip
        assert "nothing to do for orphan-containers" in restored_plan, restored_plan
        others = restored_plan.count(f"skipped: another console's (kici-instance-id={b.name})")
        assert others == 1 + sum(1 for x in agents if x.scaler.name == "mh-b-ctr"), restored_plan

        op = wait_for("host B to plan its orphan", orphan_plan, 30, hosts)
        assert op.host_queue == f"host:{b.name}"
        assert [t["key"] for t in op.plan] == [f"container:{orphan.id}"]
        spared = {s["key"]: s["reason"] for s in op.spared}
        assert "another console's (kici-instance-id=mh-restored-copy)" in spared[f"container:{restored.id}"], spared
        own_b = {f"container:{x.managed_id}" for x in agents if x.scaler.name == "mh-b-ctr"}
        assert own_b and own_b <= {s["key"] for s in op.spared}  # B's own running agents: spared, tracked
        writers = {(app, scaler) for app, kind, scaler in plan_trace() if kind == OperationKind.ORPHAN_CONTAINERS}
        assert writers == {(f"two-hosts:{b.name}", "mh-b-ctr")}, writers

        approve_operation(op, approver)  # routed to host B's worker, which listens in the shared Redis
        wait_for(
            "the reap on host B",
            lambda: Operation.objects.filter(pk=op.pk, status=OperationStatus.SUCCEEDED).exists(),
            60,
            hosts,
        )
        on_b = containers_of(b, "mh-b-ctr")
        assert "scaler-container-mhorphan" not in on_b and "scaler-container-mhrestored" in on_b
        assert all(x.agent_id in on_b for x in agents if x.scaler.name == "mh-b-ctr")
        assert len(containers_of(a, "mh-a-ctr")) == sum(1 for x in agents if x.scaler.name == "mh-a-ctr")

        # 5: a stale reservation for the leader's global sweep (a failed agent of host A whose
        # container is gone still holds its slot), then the leader killed.
        failed = next(x for x in agents if x.scaler.name == "mh-a-ctr")
        Agent.objects.filter(pk=failed.pk).update(state=AgentState.FAILED)
        client = a.docker()
        try:
            client.containers.get(failed.managed_id).remove(force=True)
        finally:
            client.close()
        wait_for(
            "the leader's stale-reservation plan",
            lambda: Operation.objects.filter(kind=OperationKind.STALE_RESERVATIONS).exists(),
            30,
            hosts,
        )
        assert {app for app, kind, _ in plan_trace() if kind == OperationKind.STALE_RESERVATIONS} == {
            f"two-hosts:{a.name}"
        }
        t0 = time.monotonic()
        a.kill("sweeper")
        wait_for("host B to lead", lambda: lock_holders() == [b.name], TAKEOVER_BOUND, hosts)
        took = time.monotonic() - t0
        print(f"two hosts: host B leads {took:.2f}s after SIGKILL of host A's sweeper")
        assert took < TAKEOVER_BOUND
        recovered = RecoveryReport.objects.filter(trigger="leader-change")
        wait_for("B's leader-change recovery", lambda: recovered.filter(instance_id=b.name).exists(), 10, hosts)
        time.sleep(6)  # more than two sweep intervals: the open plans are not stored again
        assert list(recovered.values_list("instance_id", flat=True)) == [b.name]
        assert Operation.objects.filter(kind=OperationKind.STALE_RESERVATIONS).count() == 1
        orphan_ops = Operation.objects.filter(kind=OperationKind.ORPHAN_CONTAINERS, scaler_name="mh-b-ctr")
        assert orphan_ops.count() == 1, [(o.pk, o.status, [t["key"] for t in o.plan]) for o in orphan_ops]
    finally:
        for host in hosts:
            host.remove()
        drop_database(copy)
