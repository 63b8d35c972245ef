"""Firecracker spawn, failure paths and destroy with the fake jailer/VMM. The fake speaks the real
API on the real socket path, in a real chroot."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest

from network.ipalloc import mac_for_ip
from network.models import IpAllocation
from network.netlink import port_isolated
from scalers.backends.firecracker.api import FirecrackerApi
from scalers.backends.firecracker.backend import FirecrackerSpawnError
from scalers.backends.firecracker.pidprobe import probe_vm_pid
from tests.support.firecracker import FAKE_JAILER, fake_kernel, make_agent_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.root]


def _label_set(env, **extra):
    ls = {
        "labels": ["linux", "vm"],
        "rootfsPath": str(env.rootfs()),
        "overlayDriveSizeMib": 8,
        "env": {"NODE_ENV": "production", "BAD-KEY": "1"},
        "networkPolicy": {"allowlist": ["10.67.0.0/16"]},
        "backpressureMode": "pause",
    }
    ls.update(extra)
    return ls


def _backend(env, *directives, **overrides):
    kernel = env.write_image("vmlinux", fake_kernel(*directives))
    b = env.backend(jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel, **overrides)
    assert b.ensure_host_ready() is True
    return b


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _assert_nothing_left(env, b, agent_id, ip=None):
    assert agent_id not in b.tracked_ids()
    assert not (env.base / "firecracker" / agent_id).exists()
    assert not IpAllocation.objects.filter(vm_id=agent_id).exists()
    assert not any(name.startswith("kici-") and name != "kici-br0" for name in env.links())
    if ip:
        assert ip not in {str(a) for a in b.nft.list_agents()}


def test_a_vm_boots_serves_its_token_over_mmds_and_is_destroyed_without_a_trace(fc_env):
    env = fc_env
    # A generous budget: this test is about leaving on Ctrl-Alt-Del, not about how fast a loaded
    # host answers; a VM that ignores it still fails the test, only later.
    b = _backend(env, "serial fake guest: init started", destroy_wait_s=15)
    agent_id = "scaler-firecracker-0a1b2c3d"
    make_agent_row("fc-test", agent_id)
    url = f"ws://{env.gateway}:8080/ws"
    full = ["linux", "vm", "kici:agent:firecracker", "kici:scaler:fc-test"]
    vm = b.spawn(agent_id, _label_set(env), {"cpus": 1.5}, url, labels=full, timeout_s=30)

    assert [(t, d) for a, t, d, _ in env.events if a == agent_id] == [
        ("scaler.provisioning", "preparing rootfs and kernel"),
        ("scaler.network", f"configuring TAP device {vm.tap}"),
        ("scaler.network", f"allocating IP {vm.ip}"),
        ("scaler.provisioning", "booting microVM"),
        ("scaler.ready", "microVM booted"),
        ("agent.connecting", "waiting for agent WS registration from VM"),
    ]
    assert vm.state == "running" and vm.tap == "kici-0a1b2c3d" and vm.mac == mac_for_ip(vm.ip)
    row = IpAllocation.objects.get(vm_id=agent_id)
    assert (str(row.ip), row.scaler_name, row.tap_device) == (vm.ip, "fc-test", "kici-0a1b2c3d")
    assert port_isolated(vm.tap, netns=env.netns)
    rules = b.nft.list_agents()
    assert any(str(a) == vm.ip and r.complete for a, r in rules.items())

    from agents.models import Agent

    assert Agent.objects.get(agent_id=agent_id).host_access == [f"{env.gateway}:53", f"{env.gateway}:8080"]
    config = json.loads(vm.layout.config.read_text())
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 512, "smt": False}
    assert config["network-interfaces"][0]["host_dev_name"] == "kici-0a1b2c3d"
    probe = probe_vm_pid(vm.layout.chroot)
    assert probe.running and probe.identity_confirmed

    # A guest agent reads its bootstrap data from MMDS and registers with the token.
    seen: dict = {}

    def guest_agent():
        meta = FirecrackerApi(str(vm.layout.socket)).get_mmds()["latest"]["meta-data"]
        seen.update(meta)
        b.mark_registered(meta["kici-agent-id"])

    t = threading.Thread(target=guest_agent)
    t.start()
    t.join(10)
    assert seen == {
        "kici-orchestrator-url": url,
        "kici-agent-id": agent_id,
        "kici-labels": ",".join(full),
        "kici-scaler-managed": "1",
        "kici-gateway-ip": env.gateway,
        "kici-agent-token": f"tok-{agent_id}",
        "kici-backpressure-mode": "pause",
        "kici-env": {"HTTP_PROXY": "http://proxy:3128", "NODE_ENV": "production"},
    }
    assert b.get(agent_id).registered
    b.clear_mmds(agent_id)
    assert FirecrackerApi(str(vm.layout.socket)).get_mmds() == {"latest": {"meta-data": {}}}
    assert _wait(lambda: any("fake guest: init started" in r.get("message", "") for _, s, r in env.log_lines))

    pid = probe.pid
    forwarder = b.get(agent_id).logs
    trace_file = vm.layout.chroot / "run" / "fake-vmm-trace.log"
    started = time.monotonic()
    trace_text = ""

    def read_trace():
        nonlocal trace_text
        trace_text = trace_file.read_text() if trace_file.exists() else "(no trace)"
        return True

    real_stop = b.teardown.stop_vm_process

    def stop_and_read_trace(*args, **kwargs):
        try:
            return real_stop(*args, **kwargs)
        finally:
            read_trace()  # before the VM dir goes

    b.teardown.stop_vm_process = stop_and_read_trace
    assert b.destroy(agent_id) is True
    took = time.monotonic() - started
    # It left on Ctrl-Alt-Del (the "guest" says so on its console), not through the SIGKILL fallback.
    assert _wait(lambda: any(r.get("message") == "reboot: Restarting system" for _, s, r in env.log_lines), 5), (
        f"destroy took {took:.2f} s (from {started:.3f}); last serial lines read: {list(forwarder.recent)}; "
        f"the fake's trace: {trace_text}"
    )
    assert _wait(lambda: _gone(pid), 1)
    _assert_nothing_left(env, b, agent_id, vm.ip)
    assert env.failed() == []
    assert b.destroy(agent_id) is False


@pytest.fixture
def strict_umask():
    """This process runs with umask 077 (a hardened operator shell) for the test."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_a_console_running_with_umask_077_still_boots_its_vm(fc_env, strict_umask):
    # The jailed VMM runs as the VM's uid: a chroot or config.json made 0700/0600 by the umask
    # shuts it out, and it exits before its API socket appears.
    env = fc_env
    b = _backend(env, "serial fake guest: init started")
    agent_id = "scaler-firecracker-0a1b0077"
    make_agent_row("fc-test", agent_id)
    vm = b.spawn(agent_id, _label_set(env), {}, f"ws://{env.gateway}:8080/ws", timeout_s=30)
    assert vm.state == "running"
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in (vm.layout.chroot, vm.layout.config,
                                                                 vm.layout.socket.parent)}  # fmt: skip
    assert modes == {"root": 0o755, "config.json": 0o644, "run": 0o755}
    assert b.destroy(agent_id) is True
    _assert_nothing_left(env, b, agent_id, vm.ip)


def test_a_socket_that_never_answers_fails_the_spawn_and_cleans_up(fc_env):
    env = fc_env
    b = _backend(env, "api off")
    agent_id = "scaler-firecracker-00000f06"
    with pytest.raises(FirecrackerSpawnError) as err:
        b.spawn(agent_id, _label_set(env), None, "ws://10.213.0.1:4000/ws")
    want = f"Firecracker API socket not ready within 5s for agent {agent_id}"
    assert err.value.reason == want
    assert [e[2] for e in env.failed(agent_id)] == [want]
    _assert_nothing_left(env, b, agent_id)


def test_a_jailer_that_exits_non_zero_is_reported_once_with_the_failure_type(fc_env, monkeypatch):
    env = fc_env
    b = _backend(env)
    monkeypatch.setenv("FAKE_JAILER_EXIT", "3")
    agent_id = "scaler-firecracker-0000aaa3"
    with pytest.raises(FirecrackerSpawnError, match=r"jailer exited during boot \(code 3, unknown\)"):
        b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws")
    failed = env.failed(agent_id)
    assert len(failed) == 1 and failed[0][3] == {
        "reason": "jailer exited during boot (code 3, unknown)",
        "failureType": "unknown",
    }
    _assert_nothing_left(env, b, agent_id)


def test_a_guest_that_panics_during_boot_is_abandoned_with_kernel_panic(fc_env):
    env = fc_env
    b = _backend(env, "api off", "serial Kernel panic - not syncing: VFS is fine, init is not", "exit 0.3 1")
    agent_id = "scaler-firecracker-0000bad1"
    with pytest.raises(FirecrackerSpawnError) as err:
        b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws")
    assert err.value.reason.startswith("jailer exited during boot (code 0, firecracker pid ")
    assert err.value.failure_type == "kernel-panic"
    failed = env.failed(agent_id)
    assert len(failed) == 1 and failed[0][3]["failureType"] == "kernel-panic"
    assert any(r == {"level": "error", "message": "Kernel panic - not syncing: VFS is fine, init is not"}
               for _, s, r in env.log_lines if s == "firecracker-serial")  # fmt: skip
    _assert_nothing_left(env, b, agent_id)


def test_a_guest_that_dies_right_after_its_socket_answered_is_reported_by_its_exit_not_the_refused_call(fc_env):
    """The MMDS write that follows readiness is refused because the VM exited; the failure is the exit
    (with its failure type), whichever of the spawn and the boot watcher sees it first."""
    env = fc_env
    b = _backend(env, "panic-after-ready Kernel panic - not syncing: Attempted to kill init!")
    agent_id = "scaler-firecracker-0000bad2"
    with pytest.raises(FirecrackerSpawnError) as err:
        b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws")
    assert err.value.reason.startswith("jailer exited during boot (code 0, firecracker pid "), err.value.reason
    assert err.value.reason.endswith(" exited, kernel-panic)")
    assert err.value.failure_type == "kernel-panic"
    failed = env.failed(agent_id)
    assert len(failed) == 1 and failed[0][3] == {"reason": err.value.reason, "failureType": "kernel-panic"}
    _assert_nothing_left(env, b, agent_id)


def test_a_spawn_deadline_aborts_kills_the_vm_and_releases_everything(fc_env):
    env = fc_env
    b = _backend(env, "api off")
    agent_id = "scaler-firecracker-0000dead"
    started = time.monotonic()
    with pytest.raises(FirecrackerSpawnError, match=r"spawn aborted \(deadline or shutdown\)"):
        b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws", timeout_s=1.5)
    assert time.monotonic() - started < 4.5  # not the 5 s socket wait
    assert [e[2] for e in env.failed(agent_id)] == ["spawn aborted (deadline or shutdown)"]
    assert b.abandon_spawn(agent_id, "again") is False
    _assert_nothing_left(env, b, agent_id)
    assert not list((env.base / "firecracker").glob("*/root/firecracker.pid"))


def test_destroy_kills_a_vm_that_ignores_ctrl_alt_del_only_when_its_identity_is_confirmed(fc_env):
    env = fc_env
    b = _backend(env, "ignore-ctrl-alt-del", destroy_wait_s=0.6)
    agent_id = "scaler-firecracker-0000c0de"
    vm = b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws")
    pid = probe_vm_pid(vm.layout.chroot).pid
    assert b.destroy(agent_id) is True
    assert _wait(lambda: _gone(pid), 3)
    _assert_nothing_left(env, b, agent_id, vm.ip)


def test_spawn_refuses_past_max_agents_and_a_duplicate_id(fc_env):
    env = fc_env
    b = _backend(env, max_agents=1)
    vm = b.spawn("scaler-firecracker-00000001", _label_set(env), None, "ws://x:1/ws")
    with pytest.raises(FirecrackerSpawnError, match="maxAgents"):
        b.spawn("scaler-firecracker-00000002", _label_set(env), None, "ws://x:1/ws")
    with pytest.raises(ValueError, match="already tracked"):
        b.spawn("scaler-firecracker-00000001", _label_set(env), None, "ws://x:1/ws")
    assert b.destroy(vm.agent_id)
    _assert_nothing_left(env, b, vm.agent_id, vm.ip)


def test_a_stopped_log_forwarder_still_forwards_what_a_starved_tail_had_not_read(tmp_path, monkeypatch):
    import functools

    from scalers.backends.firecracker import logs

    serial, vmm = tmp_path / "serial-console.log", tmp_path / "vmm.log"
    serial.write_text("")
    vmm.write_text("")
    # A starved tail: it looked once at start and does not look again before stop.
    monkeypatch.setattr(logs, "FileTail", functools.partial(logs.FileTail, poll_interval=60))
    got = []
    fwd = logs.LogForwarder("scaler-firecracker-0a0a0a0a", serial, vmm, lambda a, s, r: got.append(r.get("message")))
    fwd.start()
    assert _wait(lambda: len(fwd._tails) == 2)
    time.sleep(0.3)
    monkeypatch.setattr(fwd, "caught_up", lambda: True)  # stop does not wait for it either
    with open(serial, "a") as f:
        f.write("reboot: Restarting system\n")
    serial.unlink()  # even once the VM's directory is gone (a forwarder that stopped late)
    fwd.stop()
    assert got.count("reboot: Restarting system") == 1


def test_the_disk_guard_refuses_a_vm_on_a_chroot_volume_below_its_floor(fc_env):
    import re
    import subprocess

    env = fc_env
    env.base.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "kici-fc19", str(env.base)], check=True)
    try:
        b = _backend(env)  # the default floor, 1 GiB, is above this 64 MiB volume
        agent_id = "scaler-firecracker-0000f019"
        with pytest.raises(FirecrackerSpawnError) as err:
            b.spawn(agent_id, _label_set(env), None, "ws://x:1/ws")
        assert re.fullmatch(
            rf"disk guard: the chroot volume of {re.escape(str(env.base))} has 6[34] MiB free, below the 1024 MiB "
            r"floor; no VM is spawned until space is freed "
            r"\(plan an orphan-VM reap under Operations, or free the volume\)",
            err.value.reason,
        ), err.value.reason
        assert [e[2] for e in env.failed(agent_id)] == [err.value.reason]
        _assert_nothing_left(env, b, agent_id)

        # Below the volume's size, the floor lets the same volume take the VM.
        b2 = _backend(env, min_free_bytes=16 << 20)
        vm = b2.spawn("scaler-firecracker-0000f01a", _label_set(env), None, "ws://x:1/ws")
        assert b2.destroy(vm.agent_id)
        _assert_nothing_left(env, b2, vm.agent_id, vm.ip)
    finally:
        subprocess.run(["umount", "-l", str(env.base)], check=False)


def test_free_space_is_read_from_the_nearest_existing_directory_and_a_zero_floor_is_off(tmp_path):
    from scalers.backends.firecracker import jail

    missing = tmp_path / "not" / "yet"
    assert jail.free_bytes(missing) > 0
    assert jail.check_free_space(missing, 0) > 0
    with pytest.raises(jail.ChrootVolumeFull) as err:
        jail.check_free_space(missing, 1 << 62)
    assert err.value.floor == 1 << 62 and err.value.free < err.value.floor
