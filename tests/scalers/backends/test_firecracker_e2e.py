"""A firecracker scaler end to end through the product's common path:
scalers.yaml import → ``request_scale`` → the rq spawn job (``get_backend`` → the firecracker
adapter), which returns once the VM is handed over → registration through the real endpoint (the
registration watch, a scheduled job on the same queue, looks at the VM meanwhile) → teardown, and
guests that cannot boot. Jobs run on ONE worker with the rq scheduler, as on a host queue.

The network side (bridge, TAPs, nft table) lives in a throwaway namespace (``fc_env``). The
success path uses the fake VMM (it serves the real API and MMDS; the guest agent is a thread of
this test that reads MMDS through the API socket, as the guest reads 169.254.169.254, and
registers with the Django test client). The failure path boots the REAL jailer + firecracker
v1.12.1 on a tiny kernel that panics at once.
"""

from __future__ import annotations

import json
import threading
import time

import django_rq
import pytest
from django.test import Client

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from network.models import IpAllocation
from network.nft.apply import NftClient
from scalers.backends.factory import get_backend
from scalers.backends.firecracker.adapter import FirecrackerScalerBackend
from scalers.backends.firecracker.api import FirecrackerApi
from scalers.backends.firecracker.jail import agent_env_mmds
from scalers.backends.firecracker.pidprobe import probe_vm_pid
from scalers.backends.spawn_env import kici_agent_pairs
from scalers.config.loader import load_scalers_config
from scalers.credentials import encrypt_secret
from scalers.importing import apply_scalers_config
from scalers.kici_orchestrator import token_labels
from scalers.lifecycle import release_agent, teardown_agent
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.admission import request_scale
from tests.support.firecracker import FAKE_JAILER, fake_kernel, owned_vm_dir, real_binaries, require_kvm, tiny_kernel
from tests.support.kici_stand_in import ADMIN_TOKEN, stand_in_orchestrator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.root]

TABLE = "fcint"
REGISTER = "/api/v1/agents/register"


@pytest.fixture
def product(fc_env, settings):
    """Settings for a spawn in ``fc_env``'s namespace, an empty host queue."""
    settings.KICI_FIRECRACKER_NETNS = fc_env.netns
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 20
    django_rq.get_queue(settings.KICI_HOST_QUEUE).empty()
    return fc_env


def import_scalers(env, *, jailer, firecracker, kernel, label_set: str = "") -> str:
    """Write and import a scalers.yaml with one firecracker scaler (``label_set``: more yaml lines of
    its label set, indented as its keys); returns the scaler name."""
    name = "fcint-vm"
    text = f"""version: 1
globalMaxAgents: 4
firecracker:
  cidr: '{env.cidr}'
  gateway: '{env.gateway}'
  netmask: '255.255.255.0'
  bridgeName: {env.bridge}
  table: {TABLE}
  autoProvisionHost: true
scalers:
  - name: {name}
    type: firecracker
    maxAgents: 2
    firecrackerPath: {firecracker}
    jailerPath: {jailer}
    kernelPath: {kernel}
    chrootBaseDir: {env.base}
    uid: 10000
    gid: 10000
    vcpuCount: 1
    memSizeMib: 128
    orchestratorUrl: 'http://{env.gateway}:8000'
    labelSets:
      - labels: [linux, vm]
        rootfsPath: {env.rootfs()}
        overlayDriveSizeMib: 8
{label_set}"""
    path = env.images / "scalers.yaml"
    path.write_text(text)
    apply_scalers_config(load_scalers_config(str(path), None), str(path))
    return name


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    return pred()


def nothing_left(env, agent_id: str, ip: str | None) -> list[str]:
    """What of the VM is still there (empty when nothing)."""
    left = []
    if (env.base / "firecracker" / agent_id).exists():
        left.append("directory")
    if IpAllocation.objects.filter(vm_id=agent_id).exists():
        left.append("ip row")
    taps = [n for n in env.links() if n.startswith("kici-") and n != env.bridge]
    if taps:
        left.append(f"taps {taps}")
    if ip and ip in {str(a) for a in NftClient(TABLE, netns=env.netns).list_agents()}:
        left.append("rules")
    if Reservation.objects.filter(agent__agent_id=agent_id).exists():
        left.append("reservation")
    return left


def events(agent_id: str) -> list[ScalerEvent]:
    return list(ScalerEvent.objects.filter(agent_ref=agent_id).order_by("pk"))


class FakeGuest(threading.Thread):
    """The guest agent: reads its bootstrap data from MMDS, then registers with the console."""

    def __init__(self, socket_path):
        super().__init__(name="fake-guest", daemon=True)
        self.socket_path = socket_path
        self.meta: dict | None = None
        self.response = None

    def run(self):
        from django.db import connection

        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    meta = FirecrackerApi(str(self.socket_path), timeout=1).get_mmds()["latest"]["meta-data"]
                except (OSError, KeyError, TypeError):
                    meta = None
                if meta and meta.get("kici-agent-token"):
                    self.meta = meta
                    break
                time.sleep(0.05)
            if self.meta is None:
                return
            body = json.dumps({"agentId": self.meta["kici-agent-id"]})
            self.response = Client().post(
                REGISTER, data=body, content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {self.meta['kici-agent-token']}",
            )  # fmt: skip
        finally:
            connection.close()


def test_a_firecracker_agent_is_admitted_spawned_registers_and_leaves_nothing_after_teardown(
    product, settings, run_rq_jobs, drive_rq
):
    env = product
    kernel = env.write_image("vmlinux", fake_kernel("serial fake guest: init started"))
    name = import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)
    assert isinstance(get_backend(_scaler(name)), FirecrackerScalerBackend)

    decision = request_scale(["linux", "vm"], "job-fcint-1")
    assert decision.action == "spawning", decision
    agent_id = decision.agent
    socket_path = env.base / "firecracker" / agent_id / "root" / "run" / "firecracker.socket"
    guest = FakeGuest(socket_path)
    guest.start()
    run_rq_jobs(settings.KICI_HOST_QUEUE)  # the job returns once the VM is handed over
    assert drive_rq(lambda: Agent.objects.get(agent_id=agent_id).state == AgentState.RUNNING, 15)
    guest.join(5)

    assert guest.response is not None and guest.response.status_code == 200, getattr(guest.response, "content", None)
    job = django_rq.get_queue(settings.KICI_HOST_QUEUE).fetch_job(f"spawn-{agent_id}")
    assert job.return_value() == "spawned"
    agent = Agent.objects.get(agent_id=agent_id)
    assert agent.state == AgentState.RUNNING and agent.registered_at is not None
    assert guest.meta["kici-orchestrator-url"] == f"http://{env.gateway}:8000"
    assert guest.meta["kici-labels"].split(",")[:2] == ["linux", "vm"]
    assert agent.host_access == [f"{env.gateway}:53", f"{env.gateway}:8000"] and agent.host_access_explicit is False
    ctx = agent.backend_context
    assert ctx["console_path"].endswith(f"/firecracker/{agent_id}/root/serial-console.log")
    assert ctx["vmm_log_path"].endswith("/vmm.log") and ctx["chroot"].endswith(f"/{agent_id}/root")
    assert "fake guest: init started" in open(ctx["console_path"]).read()
    assert agent.ip and IpAllocation.objects.filter(vm_id=agent_id, ip=agent.ip).exists()
    assert ctx["tap"] in env.links()
    assert agent.ip in {str(a) for a in NftClient(TABLE, netns=env.netns).list_agents()}
    assert [e.type for e in events(agent_id)] == [
        "scaler.provisioning", "scaler.network", "scaler.network", "scaler.provisioning",
        "scaler.ready", "agent.connecting", "agent.registered",
    ]  # fmt: skip
    # registration acted as the config ack: the spent token left the metadata service
    assert FirecrackerApi(str(socket_path)).get_mmds() == {"latest": {"meta-data": {}}}
    pid = probe_vm_pid(socket_path.parent.parent).pid
    assert pid

    assert teardown_agent(agent, "shutdown") is True
    agent.refresh_from_db()
    assert agent.state == AgentState.DESTROYED
    assert nothing_left(env, agent_id, agent.ip) == []
    assert wait_for(lambda: not _alive(pid), 5)
    assert ScalerEvent.objects.filter(agent_ref=agent_id, type=EventType.RELEASED).count() == 1
    assert not ScalerEvent.objects.filter(agent_ref=agent_id, type=EventType.FAILED).exists()


def test_a_vm_of_the_real_kici_agent_gets_its_environment_through_mmds_and_ends_with_its_token(
    product, settings, run_rq_jobs, drive_rq
):
    # A kiciAgent label set on a firecracker scaler: the orchestrator (a stand-in of its admin
    # interface) mints the token; MMDS carries exactly the real agent's environment under the
    # reference's keys; the default host access is the orchestrator's port on the VM gateway; the
    # follow sees the agent registered (the orchestrator lists it) and MMDS drops the token; the
    # guest's agent exits (the init's serial line, then the VM resets) and the console ends it:
    # token revoked, nothing left.
    env = product
    kernel = env.write_image("vmlinux", fake_kernel("serial fake guest: init started"))
    with stand_in_orchestrator() as orchestrator:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        ws_url = f"ws://{env.gateway}:8480/ws"
        kici = (
            f"        kiciAgent:\n          orchestratorUrl: {ws_url}\n"
            f"          adminUrl: http://127.0.0.1:{orchestrator.port}\n          adminTokenRef: orch\n"
        )
        import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel, label_set=kici)

        agent_id = request_scale(["linux", "vm"], "job-fcint-kici").agent
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent = Agent.objects.select_related("scaler", "label_set").get(agent_id=agent_id)
        assert agent.state == AgentState.CONNECTING, agent.failure_reason
        assert orchestrator.tokens["at-1"]["labels"] == token_labels(agent.label_set, agent.scaler.roles)
        socket_path = env.base / "firecracker" / agent_id / "root" / "run" / "firecracker.socket"
        mmds = FirecrackerApi(str(socket_path)).get_mmds()
        pairs = kici_agent_pairs(agent, "kat_at-1", execution_mode="firecracker")
        assert mmds == agent_env_mmds(pairs, env.gateway)
        meta = mmds["latest"]["meta-data"]
        assert (meta["kici-orchestrator-url"], meta["kici-agent-id"], meta["kici-agent-token"]) == (
            ws_url, agent_id, "kat_at-1"
        )  # fmt: skip
        assert (meta["kici-labels"], meta["kici-scaler-managed"]) == ("linux,vm", "1")
        assert meta["kici-env"] == {"KICI_EXECUTION_MODE": "firecracker"}  # no KICI_ROLES: all roles
        assert agent.host_access == [f"{env.gateway}:8480"] and agent.host_access_explicit is False
        assert agent.ip in {str(a) for a in NftClient(TABLE, netns=env.netns).list_agents()}
        assert agent.backend_context["kici_token_id"] == "at-1" and agent.backend_context["tap"]
        assert ScalerEvent.objects.filter(
            agent_ref=agent_id, detail=f"creating microVM for the KiCI agent of {ws_url} (orchestrator token at-1)"
        ).exists()

        orchestrator.connected = [agent_id]
        assert drive_rq(lambda: Agent.objects.get(agent_id=agent_id).state == AgentState.RUNNING, 10)
        assert wait_for(lambda: FirecrackerApi(str(socket_path)).get_mmds() == {"latest": {"meta-data": {}}}, 5)

        # The guest's agent exits once idle: the init logs its status and resets the VM.
        with open(env.base / "firecracker" / agent_id / "root" / "serial-console.log", "a") as serial:
            serial.write("kici-init: agent exited (0)\n")
        FirecrackerApi(str(socket_path)).request("PUT", "/actions", {"action_type": "SendCtrlAltDel"})
        orchestrator.connected = []
        assert drive_rq(lambda: Agent.objects.get(agent_id=agent_id).state == AgentState.DESTROYED, 15)
        agent = Agent.objects.get(agent_id=agent_id)
        assert agent.teardown_reason == "the KiCI agent exited with code 0 (it shuts down once idle)"
        assert orchestrator.tokens == {}  # revoked
        assert nothing_left(env, agent_id, agent.ip) == []


def test_a_vm_whose_guest_has_no_real_agent_fails_at_once_with_the_inits_words_and_its_token_revoked(
    product, settings, drive_rq
):
    env = product
    # The guest's reader finds no /usr/local/bin/kici-agent: it exits 127, the init says so and
    # resets the VM, 1.5 s after MMDS was written.
    kernel = env.write_image(
        "vmlinux",
        fake_kernel(
            "serial kici-mmds: MMDS names the WebSocket orchestrator ws://x/ws (the real KiCI agent), "
            "but /usr/local/bin/kici-agent is not installed in this guest",
            "serial kici-init: agent exited (127)",
            "exit 1.5 0",
        ),
    )
    with stand_in_orchestrator() as orchestrator:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        ws_url = f"ws://{env.gateway}:8480/ws"
        kici = (
            f"        kiciAgent:\n          orchestratorUrl: {ws_url}\n"
            f"          adminUrl: http://127.0.0.1:{orchestrator.port}\n          adminTokenRef: orch\n"
        )
        import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel, label_set=kici)
        agent_id = request_scale(["linux", "vm"], "job-fcint-kici-3").agent
        t0 = time.monotonic()
        assert drive_rq(lambda: Agent.objects.get(agent_id=agent_id).state == AgentState.FAILED, 15)
        assert time.monotonic() - t0 < 10, "failed when the VM ended, long before the 20 s deadline"
        agent = Agent.objects.get(agent_id=agent_id)
        assert agent.failure_reason.startswith(
            f"the KiCI agent exited with code 127 without registering with {ws_url}; the orchestrator lists no "
            f"agent {agent_id} among those registered with it; its token at-1 was never presented"
        ), agent.failure_reason
        assert "/usr/local/bin/kici-agent is not installed in this guest" in agent.failure_reason
        assert orchestrator.tokens == {}  # revoked
        assert nothing_left(env, agent_id, agent.ip) == []


def test_a_failed_vm_spawn_of_the_real_kici_agent_revokes_the_token_it_minted(product, settings, run_rq_jobs):
    env = product
    # The guest dies as soon as its API socket answered: MMDS (and the token) cannot be written.
    kernel = env.write_image("vmlinux", fake_kernel("panic-after-ready Kernel panic - not syncing: test"))
    with stand_in_orchestrator() as orchestrator:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        kici = (
            f"        kiciAgent:\n          orchestratorUrl: ws://{env.gateway}:8480/ws\n"
            f"          adminUrl: http://127.0.0.1:{orchestrator.port}\n          adminTokenRef: orch\n"
        )
        import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel, label_set=kici)
        agent_id = request_scale(["linux", "vm"], "job-fcint-kici-2").agent
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent = Agent.objects.get(agent_id=agent_id)
        assert agent.state == AgentState.FAILED
        assert [c[:2] for c in orchestrator.calls if c[0] == "POST"] == [("POST", "/api/v1/agent-tokens")]
        assert orchestrator.tokens == {}  # minted, then revoked with the failed spawn
        assert nothing_left(env, agent_id, agent.ip) == []


def test_a_real_guest_that_panics_fails_the_spawn_with_its_failure_type_and_releases_everything(
    product, settings, run_rq_jobs
):
    env = product
    fc, jailer = real_binaries()
    require_kvm()
    kernel = env.write_image("vmlinux", tiny_kernel("Kernel panic - not syncing: VFS: no PVM guest kernel here"))
    import_scalers(env, jailer=jailer, firecracker=fc, kernel=kernel)

    decision = request_scale(["linux", "vm"], "job-fcint-2")
    assert decision.action == "spawning", decision
    agent_id = decision.agent
    run_rq_jobs(settings.KICI_HOST_QUEUE)

    job = django_rq.get_queue(settings.KICI_HOST_QUEUE).fetch_job(f"spawn-{agent_id}")
    assert job.return_value() == "failed"
    agent = Agent.objects.get(agent_id=agent_id)
    assert agent.state == AgentState.FAILED
    failed = [e for e in events(agent_id) if e.type == EventType.FAILED]
    assert len(failed) == 1, [(e.type, e.detail) for e in events(agent_id)]
    assert failed[0].detail.startswith("jailer exited during boot (code 0, ")  # the watcher, not the 20 s deadline
    assert failed[0].payload["failureType"] == "kernel-panic"
    assert "--- captured output ---\nKernel panic - not syncing: VFS: no PVM guest kernel here" in failed[0].detail
    assert agent.failure_reason.startswith("jailer exited during boot")
    assert nothing_left(env, agent_id, agent.ip) == []
    released = ScalerEvent.objects.filter(agent_ref=agent_id, type=EventType.RELEASED)
    assert released.count() == 1 and released.get().detail == "spawn-failed"
    assert not ScalerEvent.objects.filter(agent_ref=agent_id, type=EventType.REGISTERED).exists()


def test_a_vm_that_dies_before_registering_fails_the_spawn_before_the_deadline(product, settings, drive_rq):
    env = product
    # MMDS is written and spawn returns; 1.5 s later the "guest" panics and the VMM exits.
    kernel = env.write_image(
        "vmlinux", fake_kernel("serial Kernel panic - not syncing: Attempted to kill init!", "exit 1.5 0")
    )
    import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)

    decision = request_scale(["linux", "vm"], "job-fcint-3")
    agent_id = decision.agent
    t0 = time.monotonic()
    assert drive_rq(lambda: Agent.objects.get(agent_id=agent_id).state == AgentState.FAILED, 15)
    assert time.monotonic() - t0 < 10, "the registration watch saw the VM die, long before the 20 s deadline"

    job = django_rq.get_queue(settings.KICI_HOST_QUEUE).fetch_job(f"spawn-{agent_id}")
    assert job.return_value() == "spawned"  # the spawn job did not wait for the boot
    types = [e.type for e in events(agent_id)]
    assert types[-3:] == ["agent.connecting", "scaler.failed", "reservation.released"], types
    failed = ScalerEvent.objects.get(agent_ref=agent_id, type=EventType.FAILED)
    assert failed.detail.startswith("jailer exited during boot (code 0, firecracker pid ")
    assert failed.payload["failureType"] == "kernel-panic"
    assert "\n--- captured output ---\n" in failed.detail
    assert failed.detail.endswith("\nKernel panic - not syncing: Attempted to kill init!")
    released = ScalerEvent.objects.get(agent_ref=agent_id, type=EventType.RELEASED)
    assert released.detail == "spawn-failed"
    agent = Agent.objects.get(agent_id=agent_id)
    assert agent.state == AgentState.FAILED
    assert nothing_left(env, agent_id, agent.ip) == []


def test_a_vm_that_never_registers_holds_no_worker_and_fails_at_its_deadline(product, settings, drive_rq):
    env = product
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 15
    kernel = env.write_image("vmlinux", fake_kernel("serial a guest whose agent never starts"))
    import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)

    agent_id = request_scale(["linux", "vm"], "job-fcint-4").agent  # nobody reads its MMDS
    other = request_scale(["linux", "vm"], "job-fcint-4b").agent
    guest = FakeGuest(env.base / "firecracker" / other / "root" / "run" / "firecracker.socket")
    guest.start()
    t0 = time.monotonic()

    def state(aid):
        return Agent.objects.get(agent_id=aid).state

    # one worker: the silent VM's spawn is queued first, yet the second spawn registers at once
    assert drive_rq(lambda: state(other) == AgentState.RUNNING, 6)
    assert state(agent_id) == AgentState.CONNECTING
    release_agent(other, "test")  # and a destroy on the same queue completes meanwhile
    assert drive_rq(lambda: state(other) == AgentState.DESTROYED, 8)  # Ctrl-Alt-Del wait: ≤ 5 s
    assert time.monotonic() - t0 < 14 and state(agent_id) == AgentState.CONNECTING, "all before the deadline"
    guest.join(5)

    assert drive_rq(lambda: state(agent_id) == AgentState.FAILED, 20)
    assert time.monotonic() - t0 >= 14
    job = django_rq.get_queue(settings.KICI_HOST_QUEUE).fetch_job(f"spawn-{agent_id}")
    assert job.return_value() == "spawned"
    failed = ScalerEvent.objects.get(agent_ref=agent_id, type=EventType.FAILED)
    assert failed.detail.startswith("agent did not register within 15 s")
    assert "a guest whose agent never starts" in failed.detail  # the captured serial output
    released = ScalerEvent.objects.get(agent_ref=agent_id, type=EventType.RELEASED)
    assert released.detail == "spawn-timeout"
    agent = Agent.objects.get(agent_id=agent_id)
    assert agent.state == AgentState.FAILED
    assert nothing_left(env, agent_id, agent.ip) == []


def test_the_spawn_deadline_aborts_a_boot_that_hangs_before_its_api_socket_appears(product, settings, run_rq_jobs):
    env = product
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 1  # the socket wait alone would take 5 s
    kernel = env.write_image("vmlinux", fake_kernel("api off", "serial stuck before the API"))
    import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)

    agent_id = request_scale(["linux", "vm"], "job-fcint-5").agent
    run_rq_jobs(settings.KICI_HOST_QUEUE)

    job = django_rq.get_queue(settings.KICI_HOST_QUEUE).fetch_job(f"spawn-{agent_id}")
    assert job.return_value() == "failed"
    failed = ScalerEvent.objects.filter(agent_ref=agent_id, type=EventType.FAILED)
    assert failed.count() == 1  # recorded once: the job does not repeat the backend's report
    # the bridged deadline cancelled the socket wait (not its own 5 s timeout)
    assert failed.get().detail.startswith("spawn aborted (deadline or shutdown)")
    assert ScalerEvent.objects.get(agent_ref=agent_id, type=EventType.RELEASED).detail == "spawn-timeout"
    agent = Agent.objects.get(agent_id=agent_id)
    assert agent.state == AgentState.FAILED
    assert nothing_left(env, agent_id, agent.ip) == []


def test_the_orphan_plan_of_a_firecracker_scaler_is_reachable_through_get_backend(product):
    env = product
    kernel = env.write_image("vmlinux", fake_kernel("serial idle"))
    name = import_scalers(env, jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)
    backend = get_backend(_scaler(name))
    assert backend.ensure_host_ready() is True
    stray = owned_vm_dir(env.base, "scaler-firecracker-0000dead", name)
    legacy = env.base / "firecracker" / "scaler-firecracker-0000beee"  # no owner file: never reaped
    legacy.mkdir(parents=True)
    env.ip("tuntap", "add", "kici-0000beef", "mode", "tap")
    plan = backend.plan_orphans()
    assert sorted((t.pass_no, t.kind, t.agent_id or t.tap) for t in plan) == [
        (2, "chroot", "scaler-firecracker-0000dead"), (3, "tap", "kici-0000beef"),
    ]  # fmt: skip
    assert backend.apply_orphans(plan) == 2
    assert not stray.parent.exists() and "kici-0000beef" not in env.links()
    assert backend.plan_orphans() == [] and legacy.exists()


def _scaler(name):
    from scalers.models import Scaler

    return Scaler.objects.get(name=name)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
