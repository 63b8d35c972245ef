"""The other operation kinds, each planned, approved and run for real: Firecracker orphans (links and
rules in a namespace of our own), stale reservations, drain, destroy, retirement, host-access apply;
then the periodic sweeps and their policy."""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import django_rq
import pytest
from django.conf import settings
from django.utils import timezone
from rq import Queue, SimpleWorker
from rq.job import JobStatus

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from operations.choices import OperationStatus, RequestedVia, TargetOutcome
from operations.kinds.base import Scope, ScopeInvalid
from operations.kinds.host_access_apply import HostAccessApply
from operations.kinds.stale_reservations import StaleReservations
from operations.models import Operation
from operations.services import NothingToDo, approve_operation, create_operation
from operations.sweeps import fail_lost_runs
from scalers.backends.ownership import Owner
from scalers.models import ConfigState, Installation, Reservation, ScalerTeardown
from tests.support.firecracker import owned_vm_dir
from tests.support.operations import approve_and_run, listening_worker, outcome
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_queues")]

QUEUE = settings.KICI_HOST_QUEUE


# --- Firecracker orphans ------------------------------------------------------------------------


@pytest.fixture
def fc_scaler(netns_nft, tmp_path, settings):
    from network import netlink

    ConfigState.objects.update_or_create(
        pk=1,
        defaults={
            "firecracker": {
                "cidr": "10.213.77.0/24",
                "gateway": "10.213.77.1",
                "bridgeName": "ops-br0",
                "table": "ops_fc",
                "netmask": "255.255.255.0",
            }
        },
    )
    netlink.ensure_bridge("ops-br0", netns=settings.KICI_NFT_NETNS)
    base = tmp_path / "jailer"
    (base / "firecracker").mkdir(parents=True)
    config = {
        "firecrackerPath": "/bin/true",
        "jailerPath": "/bin/true",
        "kernelPath": "/nonexistent",
        "chrootBaseDir": str(base),
        "uid": 0,
        "gid": 0,
    }
    scaler = make_scaler(name=f"ops-fc-{secrets.token_hex(2)}", type="firecracker", config=config)
    procs = []
    yield scaler, base, procs
    for p in procs:
        p.kill()
        p.wait()


def _chroot(base: Path, vm_id: str, scaler_name: str) -> Path:
    root = owned_vm_dir(base, vm_id, scaler_name)
    (root / "serial-console.log").write_text("")
    return root


def test_firecracker_orphans_are_reaped_pass_by_pass_and_a_vm_tracked_since_the_preview_is_spared(
    users, fc_scaler, run_rq_jobs, settings
):
    from network import netlink
    from network.models import IpAllocation
    from network.nft.apply import NftClient
    from network.nft.spec import AgentSpec

    scaler, base, procs = fc_scaler
    ns = settings.KICI_NFT_NETNS
    vm_a, vm_b, vm_c, vm_d = (f"scaler-firecracker-{secrets.token_hex(4)}" for _ in range(4))
    tap_a = netlink.tap_name_for(vm_a)
    _chroot(base, vm_a, scaler.name)
    IpAllocation.objects.create(
        ip="10.213.77.2", vm_id=vm_a, scaler_name=scaler.name, tap_device=tap_a, mac_address="06:00:AC:D5:4D:02"
    )
    netlink.create_tap(tap_a, "ops-br0", netns=ns)
    netlink.create_tap("kici-0badf00d", "ops-br0", netns=ns)
    fc_nft = NftClient("ops_fc", netns=ns)
    fc_nft.ensure_table()
    fc_nft.apply_agent(AgentSpec.build("10.213.77.2", "10.213.77.1", host_access=[]))
    _chroot(base, vm_b, scaler.name)  # no allocation, no process: pass 2
    live_root = _chroot(base, vm_c, scaler.name)  # a running process: spared
    sleeper = subprocess.Popen(["sleep", "300"])
    procs.append(sleeper)
    time.sleep(0.05)
    (live_root / "firecracker.pid").write_text(str(sleeper.pid))
    # a dead VM of a second console on a restored copy of the database: same installation and scaler
    second = Owner(Installation.current_id(), "console-b", scaler.name)
    foreign_root = owned_vm_dir(base, vm_d, scaler.name, owner=second)

    op = create_operation("orphan-vms", {"scaler": scaler.name}, users["operator"])
    plan = {t["key"]: t for t in op.plan}
    assert set(plan) == {f"allocation:{vm_a}", f"chroot:{vm_b}", "tap:kici-0badf00d", "rules:10.213.77.2"}
    assert plan[f"allocation:{vm_a}"]["evidence"]["pid_probe"] == "no-pid-file"
    assert plan[f"allocation:{vm_a}"]["evidence"]["allocation_owner"] == scaler.name
    spared = {s["key"]: s for s in op.spared}
    assert set(spared) == {f"chroot:{vm_c}", f"chroot:{vm_d}"}
    assert spared[f"chroot:{vm_c}"]["reason"] == "its pid file names a running process"
    assert spared[f"chroot:{vm_c}"]["evidence"]["pid_probe"].startswith("comm-mismatch")
    assert spared[f"chroot:{vm_d}"]["reason"] == "skipped: another console's (kici-instance-id=console-b)"
    # no VM has an agent row: the owner each names is its owner file's, and a stray TAP names none
    owners = {key: t["evidence"]["owner_instance"] for key, t in plan.items()}
    mine = settings.KICI_INSTANCE_ID
    assert owners == {
        f"allocation:{vm_a}": mine,
        f"chroot:{vm_b}": mine,
        "tap:kici-0badf00d": None,
        "rules:10.213.77.2": mine,
    }
    assert {key: s["evidence"]["owner_instance"] for key, s in spared.items()} == {
        f"chroot:{vm_c}": mine,
        f"chroot:{vm_d}": "console-b",
    }

    make_agent(scaler, state=AgentState.SPAWNING, agent_id=vm_b, reserve=False)  # vm_b becomes tracked
    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.outcomes)
    assert outcome(op, f"chroot:{vm_b}") == (
        TargetOutcome.SKIPPED,
        "spared since the preview: tracked: an active agent row or this process owns it",
    )
    for key in (f"allocation:{vm_a}", "tap:kici-0badf00d", "rules:10.213.77.2"):
        assert outcome(op, key)[0] == TargetOutcome.DONE, (key, op.outcomes[key])
    assert not (base / "firecracker" / vm_a).exists() and (base / "firecracker" / vm_b).exists() and live_root.exists()
    assert not IpAllocation.objects.filter(vm_id=vm_a).exists()
    links = netlink.link_names(netns=ns)
    assert tap_a not in links and "kici-0badf00d" not in links
    assert fc_nft.list_agents() == {}
    assert sleeper.poll() is None, "the live process was never signalled"
    assert foreign_root.exists()


# --- stale reservations -------------------------------------------------------------------------


def test_stale_reservations_are_released_and_a_live_spawn_or_an_unlistable_runtime_is_spared(
    users, run_rq_jobs, settings
):
    settings.DOCKER_HOST = "unix:///run/ops-no-such-docker.sock"
    event = make_scaler(name=f"ops-ev-{secrets.token_hex(2)}", type="event")
    failed = make_agent(event, state=AgentState.FAILED, finished_at=timezone.now())
    old = timezone.now() - timedelta(hours=1)
    stuck = make_agent(event, state=AgentState.SPAWNING, spawn_started_at=old)
    young = make_agent(event, state=AgentState.SPAWNING, spawn_started_at=timezone.now())
    running = make_agent(event, state=AgentState.RUNNING, registered_at=timezone.now())
    container = make_scaler(name=f"ops-ct-{secrets.token_hex(2)}")
    blind = make_agent(container, state=AgentState.FAILED)

    op = create_operation("stale-reservations", {}, users["operator"])
    assert {t["subject"] for t in op.plan} == {failed.agent_id, stuck.agent_id}
    stuck_evidence = next(t["evidence"] for t in op.plan if t["subject"] == stuck.agent_id)
    assert (
        stuck_evidence["spawn_job"] is None
        and stuck_evidence["registered"] is False
        and stuck_evidence["spawning_seconds"] >= 3600
    )
    spared = {s["subject"]: s["reason"] for s in op.spared}
    assert spared == {blind.agent_id: "agent failed, but its runtime could not be listed"}

    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert op.status == OperationStatus.SUCCEEDED, op.log
    left = set(Reservation.objects.values_list("agent__agent_id", flat=True))
    assert left == {young.agent_id, running.agent_id, blind.agent_id}
    assert ScalerEvent.objects.filter(
        agent=failed, type=EventType.RELEASED, detail__contains=f"operation #{op.pk}"
    ).exists()


def test_a_stuck_spawn_whose_job_is_still_queued_or_started_is_spared(settings):
    # Past the stale window, but rq still holds its spawn job (a busy host queue, a long backend
    # call): its reservation is in use, not stale. The evidence names the status by its value.
    settings.DOCKER_HOST = "unix:///run/ops-no-such-docker.sock"
    event = make_scaler(name=f"ops-ev-{secrets.token_hex(2)}", type="event")
    old = timezone.now() - timedelta(hours=1)
    queue = Queue(
        f"ops-stale-{secrets.token_hex(4)}",
        connection=django_rq.get_connection("default"),
        serializer=settings.KICI_JOB_SERIALIZER,
    )
    try:
        queued = make_agent(event, state=AgentState.SPAWNING, spawn_started_at=old)
        started = make_agent(event, state=AgentState.SPAWNING, spawn_started_at=old)
        for agent in (queued, started):
            job = queue.enqueue("os.getpid", job_id=f"spawn-{agent.agent_id}")
            Agent.objects.filter(pk=agent.pk).update(rq_job_id=job.id)
        queue.fetch_job(f"spawn-{started.agent_id}").set_status(JobStatus.STARTED)
        plan = StaleReservations().plan(Scope())
    finally:
        queue.delete(delete_jobs=True)
    assert plan.targets == []
    spared = {s.subject: (s.reason, s.evidence["spawn_job"]) for s in plan.spared}
    assert spared == {
        queued.agent_id: ("its spawn job is still queued", "queued"),
        started.agent_id: ("its spawn job is still started", "started"),
    }


# --- drain and destroy --------------------------------------------------------------------------


def test_drain_marks_running_agents_draining_and_spares_a_spawning_one(users, run_rq_jobs):
    scaler = make_scaler(name=f"ops-dr-{secrets.token_hex(2)}", type="event")
    busy = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now(), active_jobs=2)
    spawning = make_agent(scaler, state=AgentState.SPAWNING)
    op = create_operation("agent-drain", {"agent_ids": [busy.agent_id, spawning.agent_id]}, users["operator"])
    assert op.scaler == scaler and [t["subject"] for t in op.plan] == [busy.agent_id]
    assert op.spared[0]["reason"].startswith("still spawning")
    Agent.objects.filter(pk=busy.pk).update(active_jobs=1)  # volatile: a job ended meanwhile
    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert outcome(op, f"agent:{busy.agent_id}") == (
        TargetOutcome.DONE,
        "draining; torn down once its 1 active job(s) finish",
    )
    busy.refresh_from_db()
    assert busy.state == AgentState.DRAINING


@pytest.mark.docker
def test_destroy_tears_an_idle_agent_down_and_leaves_a_busy_one_running(users, docker_client, agent_image, run_rq_jobs):
    from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network

    ensure_isolated_network(docker_client)
    scaler = make_scaler(name=f"ops-ds-{secrets.token_hex(2)}", config={"networkIsolation": False})
    api = docker_client.api
    idle = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now())
    busy = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now())
    c = api.create_container(
        agent_image,
        command=["sleep", "600"],
        host_config=api.create_host_config(network_mode=ISOLATED_NETWORK_NAME, init=True),
        labels={"kici-managed": "true", "kici-scaler-name": scaler.name, "kici-agent-id": idle.agent_id},
    )
    try:
        api.start(c["Id"])
        Agent.objects.filter(pk=idle.pk).update(managed_id=c["Id"])
        op = create_operation("agent-destroy", {"agent_ids": [idle.agent_id, busy.agent_id]}, users["operator"])
        Agent.objects.filter(pk=busy.pk).update(active_jobs=1)  # a job started on it after the preview
        op = approve_and_run(op, users["approver"], run_rq_jobs)
        assert outcome(op, f"agent:{idle.agent_id}")[0] == TargetOutcome.DONE, op.outcomes
        detail = outcome(op, f"agent:{busy.agent_id}")
        assert detail[0] == TargetOutcome.SKIPPED and "active_jobs: 0 → 1" in detail[1]
        idle.refresh_from_db()
        busy.refresh_from_db()
        assert idle.state == AgentState.DESTROYED and busy.state == AgentState.RUNNING
        assert not Reservation.objects.filter(agent=idle).exists() and Reservation.objects.filter(agent=busy).exists()
        assert not api.containers(all=True, filters={"id": c["Id"]})
    finally:
        api.remove_container(c["Id"], force=True) if api.containers(all=True, filters={"id": c["Id"]}) else None


def test_destroy_skips_an_agent_whose_jobs_started_at_run_time(users, run_rq_jobs, monkeypatch):
    from scalers.lifecycle import mark_draining

    scaler = make_scaler(name=f"ops-dj-{secrets.token_hex(2)}", type="event")
    agent = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now())
    op = create_operation("agent-destroy", {"agent_ids": [agent.agent_id]}, users["operator"])
    real = mark_draining

    def job_arrives_first(agent_id):
        Agent.objects.filter(agent_id=agent_id).update(active_jobs=1)
        return real(agent_id)

    monkeypatch.setattr("operations.kinds.agent_destroy.mark_draining", job_arrives_first)
    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert outcome(op, f"agent:{agent.agent_id}") == (TargetOutcome.SKIPPED, "has 1 active job(s); drain it first")
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING, "the drain was undone"


# --- retirement ---------------------------------------------------------------------------------


def test_an_empty_retiring_scaler_is_torn_down_and_a_busy_one_waits(users, run_rq_jobs):
    empty = make_scaler(
        name=f"ops-rt-{secrets.token_hex(2)}", type="event", retiring=True, retiring_since=timezone.now()
    )
    busy = make_scaler(
        name=f"ops-rb-{secrets.token_hex(2)}", type="event", retiring=True, retiring_since=timezone.now()
    )
    make_agent(busy, state=AgentState.RUNNING, registered_at=timezone.now())
    with pytest.raises(NothingToDo) as exc:
        create_operation("scaler-retirement", {"scaler": busy.name}, users["operator"])
    assert exc.value.plan.spared[0].reason == "still draining: 1 active agent(s), 1 reservation(s)"
    op = create_operation("scaler-retirement", {"scaler": empty.name}, users["operator"])
    assert op.plan[0]["evidence"]["active_agents"] == 0
    op = approve_and_run(op, users["approver"], run_rq_jobs)
    assert op.status == OperationStatus.SUCCEEDED, op.log
    assert (
        ScalerTeardown.objects.filter(scaler=empty).exists() and not ScalerTeardown.objects.filter(scaler=busy).exists()
    )


# --- host-access apply --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, message",
    [
        ({"revert_to_file": "yes"}, 'revert_to_file: must be true or false, got "yes"'),
        ({"host_access": {"*": 8000}}, 'host_access: must be a list of entries (strings), got {"*": 8000}'),
        ({"host_access": ["*:53", 8000]}, 'host_access: must be a list of entries (strings), got ["*:53", 8000]'),
        (
            {"host_access": ["*:53", "127.0.0.1 :8000"]},
            'host_access[1]: hostAccess entry "127.0.0.1 :8000" has whitespace inside it: did you mean '
            '"127.0.0.1:8000"?',
        ),
    ],
)
def test_a_bad_host_access_scope_reads_field_what_is_wrong_and_the_value(params, message):
    with pytest.raises(ScopeInvalid) as exc:
        HostAccessApply().validate_scope(Scope(label_set=object(), params=params))
    assert str(exc.value) == message


def test_a_host_access_change_shows_the_rule_diff_then_rewrites_the_live_agents_rules(
    users, netns_nft, run_rq_jobs, client
):
    from network.nft.spec import AgentSpec

    scaler = make_scaler(name=f"ops-ha-{secrets.token_hex(2)}", orchestrator_url="http://172.30.0.1:8000")
    label_set = scaler.label_sets.get()
    agent = make_agent(
        scaler,
        state=AgentState.RUNNING,
        ip="172.30.250.31",
        registered_at=timezone.now(),
        host_access=["172.30.0.1:53", "*:8000"],
    )
    other = make_agent(
        scaler,
        state=AgentState.RUNNING,
        ip="172.30.250.32",
        registered_at=timezone.now(),
        host_access=["172.30.0.1:53", "*:8000"],
    )
    netns_nft.ensure_table()
    for a in (agent, other):
        # Bound to its bridge port, as every container and VM is: the guard's binding is not host
        # access, so the diff must not list it and the apply must leave it.
        port = "veth" + a.ip.rsplit(".", 1)[1]
        mac = "02:4b:43:00:00:" + a.ip.rsplit(".", 1)[1]
        netns_nft.apply_agent(AgentSpec.build(a.ip, "172.30.0.1", host_access=a.host_access, port=port, mac=mac))

    client.force_login(users["operator"])
    bad = client.post(
        "/operations/plan/",
        {"kind": "host-access-apply", "label_set": label_set.pk, "host_access": "*:9000\nbuild.example.com:443"},
    )
    assert bad.status_code == 400 and "host_access[1]: hostAccess entry &quot;build.example.com:443&quot; names" in (
        bad.content.decode()
    )
    assert Operation.objects.count() == 0

    response = client.post(
        "/operations/plan/",
        {"kind": "host-access-apply", "label_set": label_set.pk, "host_access": "*:9000", "request": "1"},
    )
    assert response.status_code == 302
    op = Operation.objects.get()
    plan = {t["key"]: t for t in op.plan}
    assert plan[f"labelset:{label_set.pk}"]["evidence"]["host_access_to"] == ["*:9000"]
    diff = plan[f"agent:{agent.agent_id}"]["evidence"]
    assert any("dport 9000" in line for line in diff["rules_add"]) and any(
        "dport 8000" in line for line in diff["rules_remove"]
    )
    assert all(line.startswith("input: ") for line in diff["rules_add"] + diff["rules_remove"]), (
        "forward rules do not change"
    )
    assert any("scalers.yaml says hostAccess" in note for note in op.notes)
    assert [w for w in op.warnings if "does not open the console's port 8000" in w], "*:9000 closes it"

    op = approve_and_run(op, users["approver"], run_rq_jobs, confirm_warnings=True)
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.log)
    label_set.refresh_from_db()
    agent.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.host_access_override
    assert label_set.host_access_override_operation == op.pk
    assert label_set.file_host_access is None, "the file's entry is left as imported"
    assert agent.host_access == ["*:9000"] and agent.host_access_explicit
    rules = netns_nft.list_agents()
    from ipaddress import ip_address

    from network.nft.describe import describe_expr

    lines = [describe_expr(e) for e in rules[ip_address(agent.ip)].input]
    assert any("dport 9000" in line for line in lines) and not any("dport 8000" in line for line in lines)
    assert rules[ip_address(other.ip)].complete
    assert rules[ip_address(agent.ip)].ports == ["veth31"] and rules[ip_address(other.ip)].ports == ["veth32"]
    assert op.outcomes[f"agent:{agent.agent_id}"]["detail"] == (
        f"{len(diff['rules_add'])} rule(s) added, {len(diff['rules_remove'])} removed"
    )
    timeline = ScalerEvent.objects.filter(agent=agent, type=EventType.NETWORK).values_list("detail", flat=True)
    assert list(timeline) == [
        f"host access rewritten by operation #{op.pk}: [*:9000] "
        f"({len(diff['rules_add'])} rule(s) added, {len(diff['rules_remove'])} removed)"
    ], "the agent's timeline records its rules being rewritten"


def test_a_host_access_plan_compares_entries_as_a_set_not_as_a_sequence(users, netns_nft):
    from network.nft.spec import AgentSpec

    scaler = make_scaler(name=f"ops-ho-{secrets.token_hex(2)}", orchestrator_url="http://172.30.0.1:8000")
    label_set = scaler.label_sets.get()
    entries = ["172.30.0.1:53", "*:8000"]
    type(label_set).objects.filter(pk=label_set.pk).update(host_access=entries, host_access_override=True)
    agent = make_agent(
        scaler, state=AgentState.RUNNING, ip="172.30.250.41", registered_at=timezone.now(), host_access=entries
    )
    netns_nft.ensure_table()
    spec = AgentSpec.build(agent.ip, "172.30.0.1", host_access=entries, port="veth41", mac="02:4b:43:00:00:41")
    netns_nft.apply_agent(spec)

    with pytest.raises(NothingToDo) as nothing:
        create_operation(
            "host-access-apply",
            {"label_set": label_set, "params": {"host_access": ["*:8000", "172.30.0.1:53"]}},
            users["operator"],
        )
    reasons = {s.key: s.reason for s in nothing.value.plan.spared}
    assert reasons[f"labelset:{label_set.pk}"].startswith("the label set already has this value (the same entries")
    assert reasons[f"agent:{agent.agent_id}"].startswith("its rules already match (the same entries in another order")

    op = create_operation(
        "host-access-apply",
        {"label_set": label_set, "params": {"host_access": ["*:9000", "*:8000", "172.30.0.1:53"]}},
        users["operator"],
    )
    evidence = {t["key"]: t for t in op.plan}[f"agent:{agent.agent_id}"]["evidence"]
    assert evidence["rules_remove"] == []
    assert evidence["rules_add"] == [
        "input: meta nfproto ipv4 tcp dport 9000 accept",
        "input: meta nfproto ipv4 udp dport 9000 accept",
    ]


def test_a_host_access_plan_warns_about_entries_opening_the_consoles_backing_services(settings, monkeypatch):
    """Redis (REDIS_URL) and the operator listener (KICI_OPERATOR_LISTEN) are the console's own:
    an approver confirms a warning naming them; the default list opens neither."""
    # This Redis listens on every address of the host, as its packaged default may.
    monkeypatch.setattr(
        "operations.kinds.host_access_apply.tcp_listening", lambda: {6379: (ipaddress.ip_address("0.0.0.0"),)}
    )
    settings.REDIS_URL = "redis://127.0.0.1:6379/12"
    settings.KICI_OPERATOR_LISTEN = [("192.168.1.10", 8000)]
    scaler = make_scaler(name=f"ops-hs-{secrets.token_hex(2)}", orchestrator_url="http://172.30.0.1:8000")
    label_set = scaler.label_sets.get()
    entries = ["172.30.0.1:53", "172.30.0.1:8000", "172.30.0.1:6379", "*:8000"]
    plan = HostAccessApply().plan(Scope(label_set=label_set, params={"host_access": entries}))
    warned = [w for w in plan.warnings if "opens the console's own" in w]
    assert len(warned) == 2, plan.warnings
    assert warned[0].startswith('hostAccess entry "172.30.0.1:6379" opens the console\'s own Redis (REDIS_URL)')
    assert warned[1].startswith(
        'hostAccess entry "*:8000" opens the console\'s own operator listener (KICI_OPERATOR_LISTEN) on 192.168.1.10'
    )
    default = HostAccessApply().plan(Scope(label_set=label_set, params={"host_access": None}))
    assert not [w for w in default.warnings if "console's own" in w], default.warnings


# --- sweeps -------------------------------------------------------------------------------------


@pytest.fixture
def only_reservation_sweeps(monkeypatch):
    for kind in ("ORPHAN_CONTAINERS", "ORPHAN_VMS", "STALE_ISOLATION_RULES", "SCALER_RETIREMENT"):
        monkeypatch.setenv(f"KICI_SWEEP_{kind}_SECONDS", "0")
    monkeypatch.setenv("KICI_SWEEP_STALE_RESERVATIONS_SECONDS", "900")
    monkeypatch.delenv("KICI_AUTO_APPROVE", raising=False)


def test_sweeps_plan_once_per_interval_never_duplicate_and_create_nothing_when_clean(
    only_reservation_sweeps, monkeypatch
):
    from operations.sweeps import run_periodic_sweeps

    now = timezone.now()
    assert run_periodic_sweeps(now) == [], "nothing stale: nothing created"
    scaler = make_scaler(name=f"ops-sw-{secrets.token_hex(2)}", type="event")
    failed = make_agent(scaler, state=AgentState.FAILED)
    assert run_periodic_sweeps(now + timedelta(seconds=60)) == [], "not due yet"
    (op,) = run_periodic_sweeps(now + timedelta(seconds=901))
    assert (op.kind, op.status, op.requested_via, op.requested_by) == (
        "stale-reservations",
        OperationStatus.PLANNED,
        RequestedVia.SWEEP,
        None,
    )
    assert [t["subject"] for t in op.plan] == [failed.agent_id]
    assert run_periodic_sweeps(now + timedelta(seconds=1802)) == [], "the identical plan is still open"
    assert Operation.objects.count() == 1
    later = now + timedelta(seconds=1802 + settings.KICI_OPERATION_PLAN_TTL_SECONDS)
    monkeypatch.setenv("KICI_AUTO_APPROVE", "stale-reservations")
    (again,) = run_periodic_sweeps(later)
    op.refresh_from_db()
    assert op.status == OperationStatus.EXPIRED
    assert again.pk != op.pk and again.status == OperationStatus.APPROVED and again.auto_approved
    import django_rq

    assert django_rq.get_queue(again.host_queue).count == 1


def test_an_unknown_kind_in_the_auto_approve_policy_is_refused_by_name(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from operations.policy import sweep_policy

    monkeypatch.setenv("KICI_AUTO_APPROVE", "orphan-containers,reap-everything")
    with pytest.raises(ImproperlyConfigured, match="'reap-everything' is not an operation kind"):
        sweep_policy("orphan-containers")
    monkeypatch.setenv("KICI_AUTO_APPROVE", "")
    monkeypatch.setenv("KICI_SWEEP_ORPHAN_VMS_SECONDS", "3")
    with pytest.raises(ImproperlyConfigured, match="KICI_SWEEP_ORPHAN_VMS_SECONDS=3"):
        sweep_policy("orphan-vms")


def test_a_run_whose_rq_job_vanished_is_marked_failed(users, config_file):
    op = create_operation("config-reload", {}, users["operator"])
    with listening_worker(QUEUE):
        approve_operation(op, users["approver"], enqueue=False)
    Operation.objects.filter(pk=op.pk).update(
        rq_job_id="operation-gone", decided_at=timezone.now() - timedelta(minutes=5)
    )
    assert fail_lost_runs() == [op.pk]
    op.refresh_from_db()
    assert op.status == OperationStatus.FAILED and "vanished" in op.error


def test_a_run_whose_rq_job_failed_is_marked_failed_with_the_status_by_name(users, config_file):
    op = create_operation("config-reload", {}, users["operator"])
    with listening_worker(QUEUE):
        approve_operation(op, users["approver"], enqueue=False)
    queue = django_rq.get_queue(QUEUE)
    job = queue.enqueue("builtins.int", "not a number")  # dies like a run whose worker crashed
    SimpleWorker([queue], connection=queue.connection, serializer=settings.KICI_JOB_SERIALIZER).work(burst=True)
    assert job.get_status(refresh=True) == JobStatus.FAILED
    Operation.objects.filter(pk=op.pk).update(rq_job_id=job.id, decided_at=timezone.now() - timedelta(minutes=5))
    assert fail_lost_runs() == [op.pk]
    op.refresh_from_db()
    assert op.status == OperationStatus.FAILED
    assert op.error == f"its rq job {job.id} is failed (worker killed or timed out)"


def test_two_approvers_at_once_approve_it_exactly_once(users, config_file):
    import threading

    import django_rq
    from django.db import connections

    from operations.choices import AuditAction
    from operations.models import AuditEntry
    from operations.services import OperationError

    op = create_operation("config-reload", {}, users["operator"])
    barrier = threading.Barrier(2)
    results = []

    def approve(user):
        try:
            barrier.wait(5)
            approve_operation(Operation.objects.get(pk=op.pk), user)
            results.append("approved")
        except OperationError as exc:
            results.append(str(exc))
        finally:
            connections.close_all()

    with listening_worker(QUEUE):
        threads = [threading.Thread(target=approve, args=(users[name],)) for name in ("approver", "approver2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert sorted(results)[0] == "approved" and results.count("approved") == 1, results
    assert AuditEntry.objects.filter(operation=op, action=AuditAction.APPROVED).count() == 1
    assert django_rq.get_queue(QUEUE).count == 1
