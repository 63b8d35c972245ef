"""The files of a VM's chroot: the operator's base images stay as they are, and no file the VM's
uid could replace is followed to somewhere else by this (root) process."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import redis

from agents.archive import archived_lines, archived_times
from consolelog.times import console_key_name
from lib.safe_open import UnsafePathError
from scalers.backends.firecracker import jail, logs
from scalers.backends.firecracker.failure import read_failure_type
from scalers.backends.firecracker.pidprobe import probe_vm_pid
from scalers.backends.firecracker.teardown import Teardown
from scalers.backends.firecracker.watch import serial_tail
from tests.support.firecracker import FAKE_JAILER, fake_kernel, make_agent_row

AGENT = "scaler-firecracker-0f11e5af"
VM_UID = VM_GID = 10000
SECRET = "root:$6$not-for-the-console:19000:0:99999:7:::\nKernel panic - not syncing: planted\n"


def _facts(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_uid, st.st_gid, oct(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest()


_OPEN_AS_VM = """
import errno, os, sys
chroot, name, flags, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.chroot(chroot); os.chdir("/"); os.setgroups([]); os.setgid(gid); os.setuid(uid)
try:
    os.close(os.open("/" + name, flags, 0o600))
except PermissionError:
    sys.exit(3)
"""


def _as_vm_uid_can(chroot: Path, name: str, flags: int) -> bool:
    """Whether a process of the VM's uid/gid, chrooted like the jailer's, may open ``/<name>``."""
    argv = [sys.executable, "-c", _OPEN_AS_VM, str(chroot), name, str(flags), str(VM_UID), str(VM_GID)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode in (0, 3), f"the child opening {name} failed: {proc.stderr}"
    return proc.returncode == 0


# ---- the base images -------------------------------------------------------------------------

BASES = [
    # (mode, uid, gid, how the chroot gets it)
    pytest.param(0o644, 0, 0, "linked", id="world-readable: a hard link"),
    pytest.param(0o640, 0, VM_GID, "linked", id="readable by the VM's group: a hard link"),
    pytest.param(0o600, 0, 0, "copied", id="private to root: a copy"),
    pytest.param(0o666, 0, 0, "copied", id="writable by others: a copy"),
    pytest.param(0o644, VM_UID, VM_GID, "copied", id="owned by the VM's uid: a copy"),
]


@pytest.mark.root
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode, uid, gid, how", BASES)
def test_a_spawn_and_destroy_leave_the_base_images_owner_mode_and_content_unchanged(fc_env, mode, uid, gid, how):
    env = fc_env
    kernel = env.write_image("vmlinux", fake_kernel("serial fake guest: init started"))
    rootfs = env.rootfs()
    for p in (rootfs, kernel):
        os.chown(p, uid, gid)
        os.chmod(p, mode)
    before = {p: _facts(p) for p in (rootfs, kernel)}
    b = env.backend(jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=kernel)
    assert b.ensure_host_ready() is True
    make_agent_row("fc-test", AGENT)
    vm = b.spawn(AGENT, {"labels": ["vm"], "rootfsPath": str(rootfs), "overlayDriveSizeMib": 8}, None, "ws://x:1/ws")
    try:
        layout = vm.layout
        assert {p: _facts(p) for p in (rootfs, kernel)} == before
        linked = os.stat(layout.rootfs).st_ino == os.stat(rootfs).st_ino
        assert ("linked" if linked else "copied") == how
        root = layout.chroot
        for name in ("rootfs.ext4", "kernel"):
            assert _as_vm_uid_can(root, name, os.O_RDONLY), f"the VM must read its {name}"
            assert not _as_vm_uid_can(root, name, os.O_WRONLY), f"the VM must not write its {name}"
        assert _as_vm_uid_can(root, "overlay.ext4", os.O_RDWR)  # the read-write drive is the VM's own
        assert not _as_vm_uid_can(root, "serial-console.log", os.O_WRONLY)
    finally:
        assert b.destroy(AGENT)
    assert not layout.vm_dir.exists()
    assert {p: _facts(p) for p in (rootfs, kernel)} == before
    assert os.stat(rootfs).st_nlink == 1 and os.stat(kernel).st_nlink == 1


@pytest.mark.root
def test_a_linked_image_is_not_writable_by_the_vm_and_the_chroot_dirs_are_not_its(tmp_path):
    base = tmp_path / "jailer"
    images = tmp_path / "images"
    images.mkdir()
    rootfs, kernel = images / "rootfs.ext4", images / "vmlinux"
    rootfs.write_bytes(b"R" * 8192)
    kernel.write_bytes(b"K" * 512)
    for p in (rootfs, kernel):
        p.chmod(0o644)
    before = {p: _facts(p) for p in (rootfs, kernel)}
    layout = jail.prepare_chroot(
        base=base, agent_id=AGENT, rootfs_path=rootfs, kernel_path=kernel, overlay_mib=8, config={},
        uid=VM_UID, gid=VM_GID, owner_labels={"kici-managed": "true", "kici-agent-id": AGENT},
    )  # fmt: skip
    assert os.stat(layout.rootfs).st_ino == os.stat(rootfs).st_ino
    root = layout.chroot
    assert not _as_vm_uid_can(root, "rootfs.ext4", os.O_WRONLY) and _as_vm_uid_can(root, "rootfs.ext4", os.O_RDONLY)
    # The VM's uid can create nothing beside its own files: no link can be planted in place of a log.
    assert not _as_vm_uid_can(root, "planted", os.O_WRONLY | os.O_CREAT)
    for d in (layout.vm_dir, layout.chroot):
        st = os.stat(d)
        assert st.st_uid == os.geteuid() and st.st_mode & 0o022 == 0
    assert _as_vm_uid_can(root, "run/firecracker.socket", os.O_WRONLY | os.O_CREAT)  # where its socket goes
    assert {p: _facts(p) for p in (rootfs, kernel)} == before
    assert jail.remove_vm_dir(base, AGENT) is True
    assert {p: _facts(p) for p in (rootfs, kernel)} == before


def test_a_copied_image_keeps_its_holes(tmp_path):
    src, dst = tmp_path / "sparse.ext4", tmp_path / "copy.ext4"
    with open(src, "wb") as f:
        f.truncate(64 * 1024 * 1024)
        f.write(b"superblock" * 400)
        f.seek(32 * 1024 * 1024)
        f.write(b"inode table" * 400)
    src_fd = os.open(src, os.O_RDONLY)
    dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        jail.copy_sparse(src_fd, dst_fd)
    finally:
        os.close(src_fd)
        os.close(dst_fd)
    assert dst.read_bytes() == src.read_bytes()
    assert os.stat(dst).st_size == 64 * 1024 * 1024
    assert os.stat(dst).st_blocks * 512 <= 1024 * 1024  # the data, not the 64 MiB


# ---- links planted in the chroot -------------------------------------------------------------


@pytest.fixture
def chroot(tmp_path):
    """A chroot as a VM's uid could have left it, and a file outside standing in for /etc/shadow."""
    root = tmp_path / "jailer" / "firecracker" / AGENT / "root"
    root.mkdir(parents=True)
    shadow = tmp_path / "shadow"
    shadow.write_text(SECRET)
    for name in ("serial-console.log", "vmm.log"):
        (root / name).write_text("")
    return SimpleNamespace(root=root, shadow=shadow, serial=root / "serial-console.log", vmm=root / "vmm.log")


def _plant(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def test_the_jailers_serial_log_is_never_opened_through_a_link(chroot):
    _plant(chroot.serial, chroot.shadow)
    with pytest.raises(UnsafePathError) as err:
        jail.open_vm_file(chroot.serial, os.O_WRONLY | os.O_APPEND)
    assert str(chroot.serial) in str(err.value) and "symbolic link" in str(err.value)
    assert chroot.shadow.read_text() == SECRET


def test_the_failure_type_and_the_captured_lines_are_not_read_through_a_link(chroot, caplog):
    _plant(chroot.serial, chroot.shadow)
    with caplog.at_level(logging.WARNING):
        assert read_failure_type(chroot.serial) == "unknown"  # the planted text says "Kernel panic"
    assert str(chroot.serial) in caplog.text and "symbolic link" in caplog.text
    assert serial_tail(chroot.serial) == []


def test_a_link_in_place_of_the_chroot_directory_is_refused(chroot, tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "serial-console.log").write_text(SECRET)
    os.rename(chroot.root, chroot.root.with_name("moved"))
    chroot.root.symlink_to(outside)
    with caplog.at_level(logging.WARNING):
        assert read_failure_type(chroot.serial) == "unknown"
    assert f"{chroot.root} is a symbolic link" in caplog.text


def test_the_remaining_logs_of_a_dead_vm_skip_a_link_and_a_fifo(chroot, caplog):
    _plant(chroot.serial, chroot.shadow)
    chroot.vmm.unlink()
    os.mkfifo(chroot.vmm)
    got, counted = [], []
    worker = threading.Thread(
        target=lambda: counted.append(logs.forward_remaining(AGENT, chroot.serial, chroot.vmm, got.append)),
        daemon=True,
    )
    with caplog.at_level(logging.WARNING):
        worker.start()
        worker.join(5)
    assert not worker.is_alive(), "a FIFO in place of the VMM log blocked the reader"
    assert counted == [0] and got == []
    assert str(chroot.serial) in caplog.text and str(chroot.vmm) in caplog.text


def test_the_log_forwarder_refuses_a_link_planted_before_or_during_the_tail(chroot, caplog):
    _plant(chroot.serial, chroot.shadow)
    got = []
    with caplog.at_level(logging.WARNING):
        fwd = logs.LogForwarder(AGENT, chroot.serial, chroot.vmm, lambda a, s, r: got.append(r["message"])).start()
        with open(chroot.vmm, "a") as f:
            f.write("vmm: started\n")
        deadline = time.monotonic() + 5
        while "vmm: started" not in got and time.monotonic() < deadline:
            time.sleep(0.02)
        # The VM swaps its log for a link while it is followed: the tail ends there.
        os.rename(chroot.vmm, chroot.root / "vmm.old")
        chroot.vmm.symlink_to(chroot.shadow)
        deadline = time.monotonic() + 5
        while caplog.text.count("symbolic link") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        fwd.stop()
    assert got == ["vmm: started"]
    assert f"cannot tail {chroot.serial}" in caplog.text and str(chroot.vmm) in caplog.text
    assert chroot.shadow.read_text() == SECRET


def test_a_planted_pid_file_link_is_no_pid_file(chroot, tmp_path):
    pid_target = tmp_path / "pid"
    pid_target.write_text(str(os.getpid()))
    (chroot.root / "firecracker.pid").symlink_to(pid_target)
    assert probe_vm_pid(chroot.root).reason == "no-pid-file"


async def test_the_console_stream_of_a_vm_refuses_a_planted_link(chroot):
    from live.consoles import console_source

    _plant(chroot.serial, chroot.shadow)
    agent = SimpleNamespace(
        agent_id=AGENT,
        scaler=SimpleNamespace(type="firecracker", config={}),
        backend_context={"console_logs": {"serial": str(chroot.serial)}},
    )
    source, _ = console_source(agent, "serial")
    async with asyncio.timeout(5):  # followed, the link would be tailed forever
        with pytest.raises(UnsafePathError, match=f"refusing to open {chroot.serial}"):
            async for _batch in source():
                pass


def test_the_console_download_of_a_vm_log_refuses_a_planted_link(chroot):
    from front.views.console import _file_download
    from live.consoles import console_file_opener

    _plant(chroot.vmm, chroot.shadow)
    response = _file_download(chroot.vmm, "vmm.log", console_file_opener("vmm"))
    assert response.status_code == 502
    body = response.content.decode()
    assert f"refusing to open {chroot.vmm}" in body and "not-for-the-console" not in body


def test_removing_a_vm_dir_keeps_its_serial_console_and_vmm_log_but_never_a_planted_link(tmp_path, settings):
    """Every VM dir removal (destroy, failed spawn, reap) keeps the ends of the VM's output as its
    archive first; a log the VM replaced by a link to a file elsewhere is left out, unread."""
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    base = tmp_path / "base"
    layout = jail.ChrootLayout.for_agent(base, AGENT)
    layout.chroot.mkdir(parents=True)
    layout.serial_log.write_bytes(b"[    0.0] Linux version\nkici-agent: registered\n")
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret\n")
    layout.vmm_log.symlink_to(secret)
    teardown = Teardown(SimpleNamespace(chroot_base_dir=str(base), require_sudo=False), None, None)
    assert teardown.remove_vm_dir(AGENT)
    kept = ["--- serial console ---", "[    0.0] Linux version", "kici-agent: registered"]
    assert archived_lines(AGENT).lines == kept
    assert not layout.vm_dir.exists() and secret.read_text() == "root:$6$secret\n"


def test_a_vm_archive_keeps_the_times_its_lines_were_received(tmp_path, settings):
    """The serial console's lines keep the receive times the live console showed (the stream's
    ``times`` key), at their places in the archive; the VMM log's lines no pump received have none."""
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    layout = jail.ChrootLayout.for_agent(tmp_path / "base", AGENT)
    layout.chroot.mkdir(parents=True)
    layout.serial_log.write_bytes(b"".join(b"serial %d\n" % n for n in range(1, 2001)))
    layout.vmm_log.write_bytes(b"vmm started\n")
    client = redis.Redis.from_url(settings.REDIS_URL)
    times = console_key_name(AGENT, "serial", "times")
    client.delete(times)
    try:
        client.zadd(times, {"1990:11:1800000000123": 1990})  # lines 1990..2000, received live
        # The archive keeps the serial console's last 100 bytes: it starts inside line 1990.
        with mock.patch("scalers.backends.firecracker.teardown.ARCHIVE_BYTES", 100):
            teardown = Teardown(SimpleNamespace(chroot_base_dir=str(tmp_path / "base"), require_sudo=False), None, None)
            teardown.archive_output(AGENT)
    finally:
        client.delete(times)
        client.close()
    archived = archived_lines(AGENT)
    numbered = dict(zip(range(archived.first, archived.first + len(archived.lines)), archived.lines, strict=True))
    stamped = {numbered[n]: ms for n, ms in archived_times(AGENT, 1, 100).items()}
    # The part starts with the rest of line 1992 ("992"), numbered and stamped as that line.
    assert stamped == {text: 1_800_000_000_123 for text in ["992", *(f"serial {n}" for n in range(1993, 2001))]}
