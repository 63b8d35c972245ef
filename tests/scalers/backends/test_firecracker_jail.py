"""Jailer argv, config.json, VM shape, MMDS payload and env budget, chroot layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from scalers.backends.firecracker import jail
from scalers.backends.firecracker.failure import classify_failure, is_failure_line, read_failure_type, wrap_serial_line

AGENT = "scaler-firecracker-1d993749"
OWNER_LABELS = {
    "kici-managed": "true",
    "kici-installation-id": "0f" * 16,
    "kici-instance-id": "console-a",
    "kici-scaler-name": "fc",
    "kici-agent-id": AGENT,
}


def test_jailer_argv_is_the_jailer_options_then_the_firecracker_options():
    args = jail.jailer_args(AGENT, "/usr/local/bin/firecracker", 10000, 10000, "/srv/jailer")
    assert " ".join(args) == (
        "--id scaler-firecracker-1d993749 --exec-file /usr/local/bin/firecracker --uid 10000 --gid 10000 "
        "--chroot-base-dir /srv/jailer --new-pid-ns -- --config-file /config.json --log-path /vmm.log --level Warning"
    )


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", "x" * 65, "-leading"])
def test_it_refuses_an_agent_id_the_jailer_would_not_take(bad):
    with pytest.raises(ValueError, match="agent_id"):
        jail.vm_dir("/srv/jailer", bad)


def test_config_json_boots_from_the_kernel_with_two_drives_and_mmds_on_eth0():
    vcpus, mib = jail.resolve_vm_shape(None, {}, {"vcpuCount": 2, "memSizeMib": 512})
    cfg = jail.build_vm_config(
        ip="10.0.0.2", gateway="10.0.0.1", netmask="255.255.255.0", mac="06:00:AC:00:00:02",
        tap="kici-1d993749", vcpus=vcpus, mem_mib=mib,
    )  # fmt: skip
    assert cfg["boot-source"] == {
        "kernel_image_path": "/kernel",
        "boot_args": "console=ttyS0 reboot=k panic=1 random.trust_cpu=on init=/init "
        "ip=10.0.0.2::10.0.0.1:255.255.255.0::eth0:off",
    }
    assert cfg["drives"] == [
        {"drive_id": "rootfs", "path_on_host": "/rootfs.ext4", "is_root_device": True, "is_read_only": True},
        {"drive_id": "overlay", "path_on_host": "/overlay.ext4", "is_root_device": False, "is_read_only": False},
    ]
    assert cfg["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 512, "smt": False}
    assert cfg["network-interfaces"] == [
        {"iface_id": "eth0", "guest_mac": "06:00:AC:00:00:02", "host_dev_name": "kici-1d993749"}
    ]
    assert cfg["mmds-config"] == {"network_interfaces": ["eth0"], "ipv4_address": "169.254.169.254"}
    assert "InstanceStart" not in json.dumps(cfg)


@pytest.mark.parametrize(
    "limits, expected",
    [
        ({"cpus": 0.5}, (1, 1024)),
        ({"cpus": 2.2}, (3, 1024)),
        ({"memory_bytes": int(1.5 * 1024**3)}, (4, 1536)),
        ({"memory_bytes": 1000}, (4, 1024)),  # floors to 0 MiB: ignored
        ({"cpus": 0, "memBytes": 0}, (4, 1024)),
        (None, (4, 1024)),
    ],
)
def test_effective_limits_win_over_label_set_and_scaler(limits, expected):
    assert (
        jail.resolve_vm_shape(limits, {"vcpuCount": 4, "memSizeMib": 1024}, {"vcpuCount": 2, "memSizeMib": 512})
        == expected
    )


def test_the_scaler_shape_applies_when_the_label_set_has_none():
    assert jail.resolve_vm_shape(None, {}, {"vcpuCount": 6, "memSizeMib": 2048}) == (6, 2048)
    assert jail.resolve_vm_shape(None, {}, {}) == (2, 512)


def test_mmds_payload_carries_the_bootstrap_keys_and_only_the_optional_ones_that_are_set():
    bare = jail.build_mmds_payload(
        orchestrator_url="ws://10.0.0.1:8080/ws",
        agent_id=AGENT,
        labels=["linux", "kici:agent:firecracker"],
        gateway="10.0.0.1",
    )
    assert bare == {
        "latest": {
            "meta-data": {
                "kici-orchestrator-url": "ws://10.0.0.1:8080/ws",
                "kici-agent-id": AGENT,
                "kici-labels": "linux,kici:agent:firecracker",
                "kici-scaler-managed": "1",
                "kici-gateway-ip": "10.0.0.1",
            }
        }
    }
    full = jail.build_mmds_payload(
        orchestrator_url="u",
        agent_id=AGENT,
        labels=[],
        gateway="10.0.0.1",
        token="tok",
        backpressure_mode="pause",
        env={"A": "1"},
    )["latest"]["meta-data"]
    assert (
        full["kici-agent-token"] == "tok"
        and full["kici-backpressure-mode"] == "pause"
        and full["kici-env"] == {"A": "1"}
    )


def test_forwarded_env_strips_the_prefix_overlays_label_env_and_drops_bad_keys():
    warnings: list[str] = []
    env = jail.forwarded_env(
        {"KICI_AGENT_ENV_HTTP_PROXY": "x", "PATH": "/bin", "KICI_AGENT_ENV_NODE_ENV": "dev"},
        {"NODE_ENV": "production", "BAD-KEY": "1"},
        warnings.append,
    )
    assert env == {"HTTP_PROXY": "x", "NODE_ENV": "production"}
    assert any("BAD-KEY" in w for w in warnings)


def test_an_entry_past_the_32768_byte_budget_is_skipped_and_later_small_ones_still_fit():
    warnings: list[str] = []
    big = "v" * 20000
    env = jail.forwarded_env({}, {"A": big, "B": big, "C": "small"}, warnings.append)
    assert list(env) == ["A", "C"]
    assert len(warnings) == 1 and "'B'" in warnings[0]
    # exactly at the budget is allowed: 1 + 32765 + 2 == 32768
    assert jail.forwarded_env({}, {"K": "v" * 32765}, warnings.append) == {"K": "v" * 32765}
    assert jail.forwarded_env({}, {"K": "v" * 32766}, warnings.append) == {}


def test_sudo_wraps_commands_only_when_required():
    assert jail.sudo_wrap(["chown", "-R", "1:1", "/x"], True) == ["sudo", "-n", "chown", "-R", "1:1", "/x"]
    assert jail.sudo_wrap(["ip", "link"], False) == ["ip", "link"]


@pytest.fixture
def jail_base(tmp_path):
    base = tmp_path / "jailer"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _images(where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True, exist_ok=True)
    rootfs, kernel = where / "rootfs.ext4", where / "vmlinux"
    rootfs.write_bytes(b"R" * 4096)
    kernel.write_bytes(b"K" * 512)
    for p in (rootfs, kernel):
        p.chmod(0o644)  # world-readable, as operators keep images; a hard link then suffices
    return rootfs, kernel


def test_prepare_chroot_lays_out_the_jail_and_formats_a_sparse_overlay(jail_base, tmp_path):
    rootfs, kernel = _images(tmp_path / "images")
    cfg = {"boot-source": {"kernel_image_path": "/kernel"}}
    layout = jail.prepare_chroot(
        base=jail_base,
        agent_id=AGENT,
        rootfs_path=rootfs,
        kernel_path=kernel,
        overlay_mib=16,
        config=cfg,
        uid=10000,
        gid=10001,
        owner_labels=OWNER_LABELS,
    )
    assert layout.chroot == jail_base / "firecracker" / AGENT / "root"
    assert layout.owner == layout.vm_dir / "owner.json" and layout.owner.parent != layout.chroot
    assert jail.read_owner(jail_base, AGENT) == OWNER_LABELS
    assert layout.socket == layout.chroot / "run" / "firecracker.socket"
    assert os.stat(layout.rootfs).st_ino == os.stat(rootfs).st_ino  # hard link on the same device
    assert layout.kernel.read_bytes() == kernel.read_bytes()
    st = os.stat(layout.overlay)
    assert st.st_size == 16 * 1024 * 1024 and st.st_blocks * 512 < st.st_size  # sparse
    assert subprocess.run(["dumpe2fs", "-h", str(layout.overlay)], capture_output=True).returncode == 0
    assert json.loads(layout.config.read_text()) == cfg
    assert layout.serial_log.read_bytes() == b"" and layout.vmm_log.read_bytes() == b""
    for p in (layout.overlay, layout.vmm_log, layout.socket.parent):
        assert (os.stat(p).st_uid, os.stat(p).st_gid) == (10000, 10001)
    for p in (layout.vm_dir, layout.chroot, layout.serial_log, layout.config):
        assert os.stat(p).st_uid == os.geteuid()  # the VM's uid can write neither the directories nor these
    assert jail.remove_vm_dir(jail_base, AGENT) is True
    assert not layout.vm_dir.exists() and rootfs.exists()
    assert jail.remove_vm_dir(jail_base, AGENT) is False


def test_prepare_chroot_copies_the_rootfs_across_devices(tmp_path):
    shm = Path("/dev/shm") / f"fc-test-{os.getpid()}"
    try:
        base = shm / "jailer"
        rootfs, kernel = _images(tmp_path / "images")
        if os.stat(tmp_path).st_dev == os.stat("/dev/shm").st_dev:
            pytest.skip("/dev/shm is on the same device as the test tmp dir")
        layout = jail.prepare_chroot(
            base=base,
            agent_id=AGENT,
            rootfs_path=rootfs,
            kernel_path=kernel,
            overlay_mib=8,
            config={},
            uid=0,
            gid=0,
            owner_labels=OWNER_LABELS,
        )
        assert os.stat(layout.rootfs).st_ino != os.stat(rootfs).st_ino
        assert layout.rootfs.read_bytes() == rootfs.read_bytes()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_prepare_chroot_names_a_missing_rootfs(jail_base, tmp_path):
    _, kernel = _images(tmp_path / "images")
    with pytest.raises(FileNotFoundError, match="rootfsPath '/nope/rootfs.ext4'"):
        jail.prepare_chroot(
            base=jail_base,
            agent_id=AGENT,
            rootfs_path="/nope/rootfs.ext4",
            kernel_path=kernel,
            overlay_mib=8,
            config={},
            uid=0,
            gid=0,
            owner_labels=OWNER_LABELS,
        )
    assert not (jail_base / "firecracker" / AGENT).exists()


def test_an_owner_file_that_is_missing_or_not_an_object_of_strings_reads_as_none(jail_base):
    assert jail.read_owner(jail_base, AGENT) is None
    path = jail.owner_path(jail_base, AGENT)
    path.parent.mkdir(parents=True)
    for text in ("", "{not json", '["kici-managed"]', '{"kici-instance-id": 7}'):
        path.write_text(text)
        assert jail.read_owner(jail_base, AGENT) is None, text
    jail.write_owner(path, OWNER_LABELS)
    assert jail.read_owner(jail_base, AGENT) == OWNER_LABELS
    assert [p.name for p in path.parent.iterdir()] == ["owner.json"]  # the temporary file is gone


@pytest.mark.parametrize(
    "text, kind",
    [
        ("[    0.5] Kernel panic - not syncing: Attempted to kill init!", "kernel-panic"),
        ("Failed to execute /init (error -2)", "init-failure"),
        ("VFS: Unable to mount root fs on unknown-block(0,0)", "rootfs-mount-failure"),
        ("Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(254,0)", "rootfs-mount-failure"),
        ("all good\nlogin:", "unknown"),
        ("KERNEL PANIC", "kernel-panic"),
    ],
)
def test_failure_type_is_read_from_the_serial_text(text, kind):
    assert classify_failure(text) == kind


def test_failure_lines_are_wrapped_as_errors_and_json_lines_pass_through(tmp_path):
    assert wrap_serial_line("systemd[1]: Failed to start foo") == {
        "level": "error",
        "message": "systemd[1]: Failed to start foo",
    }
    assert wrap_serial_line("hello") == {"level": "debug", "message": "hello"}
    assert wrap_serial_line('{"level": "info", "msg": "x"}') == {"level": "info", "msg": "x"}
    assert is_failure_line("end Kernel Panic - not syncing")
    log = tmp_path / "serial.log"
    log.write_text("boot\nFailed to execute /init\n")
    assert read_failure_type(log) == "init-failure"
    assert read_failure_type(tmp_path / "missing.log") == "unknown"


def test_an_agent_environment_goes_to_mmds_under_the_reference_keys_and_the_rest_in_kici_env():
    pairs = [
        ("KICI_ORCHESTRATOR_URL", "ws://10.0.0.1:8480/ws"), ("KICI_AGENT_ID", "scaler-firecracker-0000aaaa"),
        ("KICI_LABELS", "linux,vm"), ("KICI_AGENT_TOKEN", "kat_x"), ("KICI_ROLES", "builder"),
        ("KICI_SCALER_MANAGED", "1"), ("KICI_EXECUTION_MODE", "firecracker"),
    ]  # fmt: skip
    assert jail.agent_env_mmds(pairs, "10.0.0.1") == {
        "latest": {
            "meta-data": {
                "kici-gateway-ip": "10.0.0.1",
                "kici-orchestrator-url": "ws://10.0.0.1:8480/ws",
                "kici-agent-id": "scaler-firecracker-0000aaaa",
                "kici-labels": "linux,vm",
                "kici-agent-token": "kat_x",
                "kici-scaler-managed": "1",
                "kici-env": {"KICI_ROLES": "builder", "KICI_EXECUTION_MODE": "firecracker"},
            }
        }
    }
    assert "kici-env" not in jail.agent_env_mmds(pairs[:4], "10.0.0.1")["latest"]["meta-data"]


@pytest.mark.parametrize(
    ("pairs", "words"),
    [
        ([("KICI-ROLES", "x")], "'KICI-ROLES' is not a variable name"),
        ([("KICI_ROLES", "a"), ("KICI_ROLES", "b")], "KICI_ROLES is given twice"),
        ([("KICI_BIG", "x" * jail.ENV_BUDGET_BYTES)], f"over the {jail.ENV_BUDGET_BYTES}-byte MMDS budget"),
    ],
)
def test_an_agent_environment_mmds_cannot_carry_is_refused_naming_it(pairs, words):
    # Nothing is skipped quietly: the environment is the console's own, so a variable it cannot
    # carry is a fault to name, not a value to drop.
    with pytest.raises(ValueError, match=words):
        jail.agent_env_mmds(pairs, "10.0.0.1")
