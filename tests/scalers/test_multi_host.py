"""Several hosts on one database and one Redis (docs/multi-host.md), in one process: the host a
process is on is ``settings.KICI_HOST_NAME``, so another host is a scaler row whose ``host`` is
another name. Each scaler belongs to the host that imported it; its agents' spawns, watches,
teardowns, reclaims and operations go to that host's queue; each host's sweeper sweeps only its
own scalers and the global units run on the leader only."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from rq import Queue

from agents.choices import AgentState
from agents.models import Agent
from operations import sweeps
from operations.choices import OperationKind, OperationStatus, RequestedVia
from operations.kinds.base import Plan, Scope, Target
from operations.kinds.catalog import get_kind
from operations.management.commands.scaler_sweeper import Command
from operations.models import Operation, SweepState
from operations.services import NoWorkerListening, approve_operation, store_plan
from scalers.backends.firecracker import adapter
from scalers.backends.firecracker.adapter import FirecrackerScalerBackend, provision_marker
from scalers.backends.sandboxes import probe_sandboxes
from scalers.config.loader import ConfigInvalid, parse_scalers_config_text
from scalers.hosts import queue_named
from scalers.importing import apply_scalers_config
from scalers.jobs import enqueue_spawn, schedule_watch
from scalers.leader import Leadership, host_lock_key
from scalers.lifecycle import drain_idle_agents, enqueue_reclaim, enqueue_teardown, retry_stuck_teardowns
from scalers.models import Scaler
from scalers.recovery import recover_state
from tests.support.operations import listening_worker
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_queues")]

OTHER = "kici-test-other-host"
OTHER_QUEUE = f"host:{OTHER}"


@pytest.fixture
def other_queue():
    """Host ``OTHER``'s queue on the shared Redis, empty (scheduled jobs too) before and after."""
    queue = queue_named(OTHER_QUEUE)
    clear(queue)
    yield queue
    clear(queue)


def clear(queue: Queue) -> None:
    queue.empty()
    for job_id in queue.scheduled_job_registry.get_job_ids():
        queue.scheduled_job_registry.remove(job_id, delete_job=True)


def queued(queue: Queue) -> list[str]:
    return [job.func_name.rsplit(".", 1)[-1] for job in queue.get_jobs()]


# --- where an agent's work runs ----------------------------------------------------------------


def test_the_work_of_another_hosts_agent_goes_to_that_hosts_queue(other_queue):
    """A spawn, a registration watch, a teardown and a reclaim of an agent of host B's scaler are
    put on ``host:B`` by whichever console admitted or ended it, never on this host's queue."""
    here = queue_named(settings.KICI_HOST_QUEUE)
    clear(here)
    scaler = make_scaler(type="container", host=OTHER)
    agent = make_agent(scaler, state=AgentState.SPAWNING)
    enqueue_spawn(agent)
    schedule_watch(agent, SimpleNamespace())
    enqueue_teardown(agent, "released", destroy_reason="released")
    enqueue_reclaim(agent)
    assert queued(other_queue) == ["spawn_agent", "teardown_job", "reclaim_job"]
    assert other_queue.scheduled_job_registry.count == 1  # the registration watch
    assert here.count == 0 and here.scheduled_job_registry.count == 0

    mine = make_agent(make_scaler(type="container"), state=AgentState.SPAWNING)
    enqueue_spawn(mine)
    assert queued(here) == ["spawn_agent"]
    assert len(other_queue.get_jobs()) == 3


def test_an_admitted_agents_spawn_goes_to_its_hosts_queue_without_reading_its_scaler(
    other_queue, django_assert_num_queries
):
    """Admission knows the host of every scaler it admits to, so starting a spawn after the
    commit reads nothing from the database (it read the agent's scaler row, on the requester's
    time)."""
    from scalers.admission.decide import Request, decide_batch
    from scalers.jobs import enqueue_spawn_or_fail

    here = queue_named(settings.KICI_HOST_QUEUE)
    clear(here)
    make_scaler("far", type="container", host=OTHER, labels=("far",))
    make_scaler("near", type="container", labels=("near",))
    result = decide_batch([Request(labels=("far",), job_id="job-far"), Request(labels=("near",), job_id="job-near")])
    far, near = result.decisions
    with django_assert_num_queries(0):
        for decision, admitted in zip(result.decisions, result.admitted, strict=True):
            assert enqueue_spawn_or_fail(decision, admitted) == decision
    assert [job.args[0] for job in other_queue.get_jobs()] == [far.agent_pk]
    assert [job.args[0] for job in here.get_jobs()] == [near.agent_pk]


def test_an_operation_of_another_hosts_scaler_runs_there_and_is_refused_while_no_worker_listens(
    other_queue, django_user_model
):
    scaler = make_scaler(type="container", host=OTHER)
    agent = make_agent(scaler, state=AgentState.RUNNING)
    plan = Plan()
    plan.targets = get_kind(OperationKind.AGENT_DESTROY).plan(Scope(scaler=scaler, agent_ids=(agent.agent_id,))).targets
    assert plan.targets
    scope = Scope(scaler=scaler, agent_ids=(agent.agent_id,))
    op = store_plan(OperationKind.AGENT_DESTROY, scope, plan, None, via=RequestedVia.UI)
    assert op.host_queue == OTHER_QUEUE
    approver = django_user_model.objects.create_superuser("multi-host-approver", password="x")
    with listening_worker(settings.KICI_HOST_QUEUE):  # this host's worker does not count
        with pytest.raises(NoWorkerListening, match=f"no rq worker listens on queue {OTHER_QUEUE}"):
            approve_operation(op, approver)
    with listening_worker(OTHER_QUEUE):
        approve_operation(op, approver)
    assert queued(other_queue) == ["run_operation"]
    assert queue_named(settings.KICI_HOST_QUEUE).count == 0


# --- what each host's sweeper sweeps ------------------------------------------------------------


@pytest.fixture
def planned(monkeypatch):
    """Record the scopes each swept kind plans (the plans themselves find nothing)."""
    seen: list[tuple[str, str]] = []
    for kind_name in (
        OperationKind.ORPHAN_CONTAINERS,
        OperationKind.STALE_ISOLATION_RULES,
        OperationKind.STALE_RESERVATIONS,
        OperationKind.LOST_AGENTS,
    ):
        kind = type(get_kind(kind_name))

        def plan(self, scope, _name=kind_name):
            label = scope.scaler.name if scope.scaler else "-"
            evidence = scope.params.get("evidence")
            seen.append((str(_name), f"{label}:{evidence}" if evidence else label))
            return Plan()

        monkeypatch.setattr(kind, "plan", plan)
    return seen


def test_a_host_plans_the_sweeps_of_its_own_scalers_and_the_leader_only_the_global_ones(planned):
    mine = make_scaler("mh-mine", type="container")
    theirs = make_scaler("mh-theirs", type="container", host=OTHER)
    for scaler in (mine, theirs):
        make_agent(scaler, state=AgentState.RUNNING)
    now = timezone.now()
    sweeps.run_periodic_sweeps(now, global_scopes=False)  # what every host's sweeper runs
    assert sorted(planned) == [
        ("lost-agents", "mh-mine:sandbox-gone"),
        ("orphan-containers", "mh-mine"),
        ("stale-isolation-rules", "mh-mine"),
    ]
    planned.clear()
    sweeps.run_periodic_sweeps(now, host_scopes=False)  # what only the leader runs
    assert sorted(planned) == [
        ("lost-agents", "mh-mine:heartbeat"),
        ("lost-agents", "mh-theirs:heartbeat"),
        ("stale-reservations", "-"),
    ]


def test_a_scope_whose_operation_runs_is_not_planned_again_until_it_ends(planned):
    """A reap that is stopping containers must not see its own targets planned once more."""
    mine = make_scaler("mh-busy", type="container")
    scope = Scope(scaler=mine)
    target = Plan(targets=[Target("container:x", "stop and remove container", "x", {"n": 1})])
    op = store_plan(OperationKind.ORPHAN_CONTAINERS, scope, target, None, via=RequestedVia.SWEEP)
    Operation.objects.filter(pk=op.pk).update(status=OperationStatus.RUNNING)
    sweeps.run_periodic_sweeps(timezone.now(), global_scopes=False)
    assert ("orphan-containers", "mh-busy") not in planned
    assert "is running" in SweepState.objects.get(sweep_key=scope.key(OperationKind.ORPHAN_CONTAINERS)).last_result
    Operation.objects.filter(pk=op.pk).update(status=OperationStatus.SUCCEEDED)
    sweeps.run_periodic_sweeps(timezone.now() + timedelta(hours=1), global_scopes=False)
    assert ("orphan-containers", "mh-busy") in planned


def test_the_stale_rule_sweep_of_a_host_is_not_hidden_by_another_hosts_scaler_on_the_same_table(planned):
    """Both hosts' scalers use the default table name: each host still sweeps its own table."""
    make_scaler("mh-a-first", type="container", host=OTHER)
    make_scaler("mh-b-second", type="container")
    sweeps.run_periodic_sweeps(timezone.now(), global_scopes=False)
    assert ("stale-isolation-rules", "mh-b-second") in planned


def test_another_hosts_sandboxes_are_not_probed_here():
    """A look at this host's runtime would call host B's containers missing."""
    theirs = make_scaler(type="container", host=OTHER, config={"socketPath": "/nonexistent/docker.sock"})
    agent = make_agent(theirs, state=AgentState.RUNNING, managed_id="0" * 64)
    probe = probe_sandboxes(theirs, [agent])[agent.agent_id]
    assert probe.state == "not probed" and OTHER in probe.detail


def test_the_leaders_stale_reservation_sweep_spares_a_container_on_another_host():
    """The leader cannot list host B's docker: B's failed agent, whose container may still run
    there, keeps its reservation instead of being called gone and released."""
    theirs = make_agent(make_scaler(type="container", host=OTHER), state=AgentState.FAILED)
    plan = get_kind(OperationKind.STALE_RESERVATIONS).plan(Scope())
    assert plan.targets == []
    (spared,) = plan.spared
    assert spared.subject == theirs.agent_id and f"on host {OTHER}" in spared.reason


class FakeBackend:
    destroyed: list[str] = []

    def __init__(self, scaler, **kw):
        self.scaler = scaler

    def destroy(self, agent, reason):
        FakeBackend.destroyed.append(agent.agent_id)


def test_a_follower_runs_its_hosts_units_and_leaves_the_global_ones_and_other_hosts_agents(monkeypatch):
    """A sweeper that does not lead still runs its host's units: it tears down its host's drained
    agents (its own docker) and plans its host's sweeps; another host's drained agent is that
    host's, and the global units wait for the leader."""
    monkeypatch.setattr("scalers.lifecycle.get_backend", FakeBackend)
    FakeBackend.destroyed = []
    mine = make_agent(make_scaler(type="container"), state=AgentState.DRAINING, active_jobs=0)
    theirs = make_agent(make_scaler(type="container", host=OTHER), state=AgentState.DRAINING, active_jobs=0)
    ran = []
    for unit in ("handle_host_readiness", "handle_isolation_drift", "handle_output_caps"):
        monkeypatch.setattr(Command, unit, lambda self, _u=unit: ran.append(_u))
    monkeypatch.setattr(Command, "handle_host_operation_sweeps", lambda self: ran.append("host sweeps"))
    monkeypatch.setattr(Command, "handle_operation_sweeps", lambda self: ran.append("global sweeps"))
    monkeypatch.setattr(Command, "handle_old_records", lambda self: ran.append("retention"))
    cmd = Command()
    cmd.shutdown, cmd.warm, cmd.booted, cmd.leading = False, False, True, False
    cmd.instance_id = settings.KICI_INSTANCE_ID
    cmd.hosts_ready = set()
    cmd.reaper = SimpleNamespace(stand_down=lambda: None, tick=lambda: None)
    cmd.leadership = SimpleNamespace(poll=lambda: (False, False), release=lambda: None)
    cmd.host_lock = SimpleNamespace(poll=lambda: (True, False), release=lambda: None)
    cmd.tick()
    assert FakeBackend.destroyed == [mine.agent_id]
    assert ran == ["handle_host_readiness", "handle_isolation_drift", "handle_output_caps", "host sweeps"]
    theirs.refresh_from_db()
    assert theirs.state == AgentState.DRAINING
    ran.clear()
    cmd.leadership = SimpleNamespace(poll=lambda: (True, False), release=lambda: None)
    cmd.tick()
    assert ran[-2:] == ["global sweeps", "retention"]
    assert FakeBackend.destroyed == [mine.agent_id]


def test_one_sweeper_per_host_runs_its_hosts_units(monkeypatch, settings):
    """A second sweeper started on the same host (a restart overlapping, a second unit file) waits:
    the host's units are run by the one holding the host's lock, and by the other once it ends."""
    ran = []
    monkeypatch.setattr(Command, "host_units", lambda self: (lambda: ran.append(self.name),))
    sweepers = []
    for name in ("first", "second"):
        cmd = Command()
        cmd.name = name
        cmd.shutdown, cmd.warm, cmd.booted, cmd.leading = False, False, True, False
        cmd.leadership = SimpleNamespace(poll=lambda: (False, False), release=lambda: None)
        cmd.host_lock = Leadership(host_lock_key(settings.KICI_HOST_NAME))
        sweepers.append(cmd)
    first, second = sweepers
    try:
        first.tick()
        second.tick()
        assert ran == ["first"]
        first.host_lock.release()
        second.tick()
        assert ran == ["first", "second"]
        other = Command()
        other.name = "another host"
        other.shutdown, other.warm, other.booted, other.leading = False, False, True, False
        other.leadership = first.leadership
        other.host_lock = Leadership(host_lock_key(OTHER))
        other.tick()  # another host's sweeper has its own lock
        assert ran == ["first", "second", "another host"]
        other.host_lock.release()
    finally:
        for cmd in sweepers:
            cmd.host_lock.release()


def test_drains_of_another_host_are_left_to_it(monkeypatch, settings):
    monkeypatch.setattr("scalers.lifecycle.get_backend", FakeBackend)
    FakeBackend.destroyed = []
    theirs = make_agent(make_scaler(type="container", host=OTHER), state=AgentState.DRAINING, active_jobs=0)
    assert drain_idle_agents() == 0
    settings.KICI_HOST_NAME = OTHER
    assert drain_idle_agents() == 1
    assert FakeBackend.destroyed == [theirs.agent_id]


def test_recovery_leaves_the_sandbox_of_another_hosts_dropped_spawn_to_that_host(monkeypatch, settings):
    """This console admitted an agent of host B's scaler (it owns the row) and restarted: the
    dropped spawn's sandbox is B's to remove, so it is left destroying for B's sweeper."""
    monkeypatch.setattr("scalers.lifecycle.get_backend", FakeBackend)
    FakeBackend.destroyed = []
    theirs = make_agent(make_scaler(type="container", host=OTHER), state=AgentState.SPAWNING)
    mine = make_agent(make_scaler(type="container"), state=AgentState.SPAWNING)
    Agent.objects.filter(pk__in=[theirs.pk, mine.pk]).update(owner_instance="mh-me")
    recover_state("mh-me", spawn_alive=lambda agent: False)
    assert FakeBackend.destroyed == [mine.agent_id]
    theirs.refresh_from_db()
    assert theirs.state == AgentState.DESTROYING and theirs.reservation is not None
    settings.KICI_HOST_NAME = OTHER  # host B's sweeper retries the teardown
    assert retry_stuck_teardowns(min_age_seconds=0) == 1
    assert FakeBackend.destroyed == [mine.agent_id, theirs.agent_id]
    theirs.refresh_from_db()
    assert theirs.state == AgentState.FAILED


def test_stop_agents_leaves_another_hosts_agents_to_that_host(monkeypatch):
    """This console admitted an agent of host B's scaler (it owns the row): stopping this host's
    agents must not remove it through this host's runtime."""
    monkeypatch.setattr("scalers.lifecycle.get_backend", FakeBackend)
    FakeBackend.destroyed = []
    theirs = make_agent(make_scaler(type="container", host=OTHER), state=AgentState.RUNNING)
    mine = make_agent(make_scaler(type="container"), state=AgentState.RUNNING)
    Agent.objects.filter(pk__in=[theirs.pk, mine.pk]).update(owner_instance=settings.KICI_INSTANCE_ID)
    out = io.StringIO()
    call_command("stop_agents", stdout=out)
    assert "1 of 1 agent(s) ended" in out.getvalue()
    assert FakeBackend.destroyed == [mine.agent_id]
    assert Agent.objects.get(pk=theirs.pk).state == AgentState.RUNNING


# --- each host imports its own file ---------------------------------------------------------------


def config(*names: str) -> str:
    entries = "".join(
        f"""
  - name: {name}
    type: container
    maxAgents: 2
    labelSets:
      - labels: ['linux', '{name}']
        image: 'kici-agent:local'
"""
        for name in names
    )
    return f"version: 1\nglobalMaxAgents: 10\nscalers:{entries}"


def import_on(host: str, *names: str, settings_fixture):
    settings_fixture.KICI_HOST_NAME = host
    return apply_scalers_config(parse_scalers_config_text(config(*names), f"{host}.yaml"), f"{host}.yaml")


def test_an_import_touches_only_its_hosts_scalers_and_refuses_a_name_another_host_owns(settings):
    a = import_on("mh-host-a", "mh-a1", "mh-shared", settings_fixture=settings)
    assert a.created == ["mh-a1", "mh-shared"]
    b = import_on("mh-host-b", "mh-b1", settings_fixture=settings)
    assert b.created == ["mh-b1"] and b.retiring == []  # host A's scalers are not in B's file, and stay
    assert dict(Scaler.objects.values_list("name", "host")) == {
        "mh-a1": "mh-host-a",
        "mh-shared": "mh-host-a",
        "mh-b1": "mh-host-b",
    }
    assert not Scaler.objects.filter(retiring=True).exists()
    with pytest.raises(ConfigInvalid) as refused:
        import_on("mh-host-b", "mh-b1", "mh-shared", settings_fixture=settings)
    message = str(refused.value)
    assert 'scaler "mh-shared" belongs to host mh-host-a' in message and "this host is mh-host-b" in message
    assert Scaler.objects.get(name="mh-shared").host == "mh-host-a"
    # host A drops it; once retired with nothing live it may move to host B
    live = make_agent(Scaler.objects.get(name="mh-shared"), state=AgentState.RUNNING)
    assert import_on("mh-host-a", "mh-a1", settings_fixture=settings).retiring == ["mh-shared"]
    with pytest.raises(ConfigInvalid, match="it has 2 live agent"):  # the agent and its reservation
        import_on("mh-host-b", "mh-b1", "mh-shared", settings_fixture=settings)
    live.reservation.delete()
    live.delete()
    moved = import_on("mh-host-b", "mh-b1", "mh-shared", settings_fixture=settings)
    assert moved.resurrected == ["mh-shared"]
    shared = Scaler.objects.get(name="mh-shared")
    assert shared.host == "mh-host-b" and not shared.retiring


# --- provisioning a Firecracker host once per boot --------------------------------------------


@dataclass(frozen=True)
class FakeSettings:
    chroot_base_dir: str
    bridge_name: str
    auto_provision_host: bool = True
    netns: str | None = None


def fake_backend(s: FakeSettings, calls: list):
    fc = SimpleNamespace(settings=s, ensure_host_ready=lambda: calls.append("provision") or True)
    backend = SimpleNamespace(fc=fc)
    backend._provisioned = lambda marker: FirecrackerScalerBackend._provisioned(backend, marker)
    return lambda **kw: FirecrackerScalerBackend.ensure_host_ready(backend, **kw)


def test_a_provisioned_firecracker_host_is_not_provisioned_again_by_each_worker(tmp_path, monkeypatch):
    """The marker is shared by every process of the host: a second worker's spawn skips the work;
    another boot, other settings or a bridge gone provision again; the sweeper's readiness always
    provisions."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(adapter, "BOOT_ID_PATH", str(boot))
    calls: list[str] = []
    s = FakeSettings(str(tmp_path / "fc"), "lo")  # "lo" exists in every namespace: the bridge is there
    first_worker, second_worker = fake_backend(s, calls), fake_backend(s, calls)
    first_worker(unless_provisioned=True)
    second_worker(unless_provisioned=True)
    assert calls == ["provision"]
    assert json.loads(provision_marker(s).read_text())["boot"] == "boot-1"
    provision_marker(s).unlink()  # the file is the host's memory, not the process's
    second_worker(unless_provisioned=True)
    first_worker(unless_provisioned=True)
    assert calls == ["provision"] * 2
    calls.clear()
    first_worker(unless_provisioned=True)
    assert calls == []
    boot.write_text("boot-2\n")  # a reboot: the bridge and the table are gone
    second_worker(unless_provisioned=True)
    first_worker(unless_provisioned=True)
    assert calls == ["provision"]
    fake_backend(FakeSettings(s.chroot_base_dir, "lo", netns=None, auto_provision_host=True), calls)(
        unless_provisioned=True
    )
    assert calls == ["provision"]  # equal settings: the same fingerprint
    missing = FakeSettings(s.chroot_base_dir, "kici-mh-nobr0")
    gone = fake_backend(missing, calls)
    gone(unless_provisioned=True)
    gone(unless_provisioned=True)  # the bridge is still not there (the fake makes none)
    assert calls == ["provision"] * 3
    first_worker()  # the sweeper: always
    assert calls == ["provision"] * 4


def test_the_scaler_page_names_its_host(viewer_client):
    scaler = make_scaler("mh-page", type="container", host=OTHER)
    page = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    shown = "the console that imported it: its spawns, teardowns and operations run on queue"
    assert f'id="scaler-host" title="{shown} {OTHER_QUEUE}">{OTHER}<' in page
