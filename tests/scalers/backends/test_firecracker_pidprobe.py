"""PID-reuse-safe probing of ``<chroot>/firecracker.pid`` with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from scalers.backends.firecracker.pidprobe import (
    is_chroot_pid_running,
    is_vm_process_alive,
    kill_confirmed,
    probe_vm_pid,
    read_vm_pid,
)
from tests.support.root import require_root

REPO = Path(__file__).resolve().parents[3]

# Renames itself, optionally chroots and drops privileges, says "ready", then sleeps.
_CHILD = r"""
import ctypes, os, sys, time
comm, root, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctypes.CDLL(None).prctl(15, comm.encode(), 0, 0, 0)
if root:
    os.chroot(root); os.chdir("/")
if uid:
    os.setgid(uid); os.setuid(uid)
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    time.sleep(60)
"""


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(comm: str, root: Path | None = None, uid: int = 0) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", _CHILD, comm, str(root or ""), str(uid)], stdout=subprocess.PIPE, text=True
        )
        started.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.fixture
def dirs():
    # World-traversable, so an unprivileged prober can read the pid file.
    top = Path(tempfile.mkdtemp(prefix="fc-pidprobe-"))
    os.chmod(top, 0o755)
    chroot = top / "firecracker" / "scaler-firecracker-0000abcd" / "root"
    other = top / "elsewhere"
    chroot.mkdir(parents=True)
    other.mkdir()
    for d in (top / "firecracker", chroot.parent, chroot):
        os.chmod(d, 0o755)
    yield chroot, other
    subprocess.run(["rm", "-rf", str(top)], check=False)


def _write_pid(chroot: Path, pid: int, age_s: float) -> None:
    pid_file = chroot / "firecracker.pid"
    pid_file.write_text(f"{pid}\n")
    os.chmod(pid_file, 0o644)
    t = time.time() - age_s
    os.utime(pid_file, (t, t))


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def test_a_firecracker_process_in_this_chroot_is_confirmed_and_may_be_signalled(procs, dirs):
    require_root()
    chroot, _ = dirs
    p = procs("firecracker", root=chroot)
    _write_pid(chroot, p.pid, age_s=30)  # process started 30 s after the file was written
    probe = probe_vm_pid(chroot)
    assert (probe.pid, probe.running, probe.identity_confirmed, probe.reason) == (p.pid, True, True, "confirmed")
    assert read_vm_pid(chroot) == p.pid and is_vm_process_alive(chroot) and is_chroot_pid_running(chroot)
    assert kill_confirmed(chroot) == p.pid
    p.wait(timeout=5)
    assert p.returncode == -signal.SIGKILL
    assert probe_vm_pid(chroot).reason == "no-process"


def test_a_process_started_after_the_pid_file_was_written_is_a_recycled_number(procs, dirs):
    require_root()
    chroot, _ = dirs
    p = procs("firecracker", root=chroot)
    _write_pid(chroot, p.pid, age_s=120)
    probe = probe_vm_pid(chroot)
    assert (probe.running, probe.identity_confirmed, probe.reason) == (False, False, "recycled")
    assert read_vm_pid(chroot) is None and not is_chroot_pid_running(chroot) and not is_vm_process_alive(chroot)
    assert kill_confirmed(chroot) is None
    time.sleep(0.2)
    assert _alive(p)


def test_a_firecracker_in_another_root_is_running_but_not_ours(procs, dirs):
    require_root()
    chroot, other = dirs
    p = procs("firecracker", root=other)
    _write_pid(chroot, p.pid, age_s=5)
    probe = probe_vm_pid(chroot)
    assert (probe.running, probe.identity_confirmed, probe.reason) == (True, False, "root-mismatch")
    assert is_chroot_pid_running(chroot)  # the reaper spares it
    assert read_vm_pid(chroot) is None and not is_vm_process_alive(chroot)
    assert kill_confirmed(chroot) is None
    time.sleep(0.2)
    assert _alive(p)


def test_a_live_process_with_another_name_is_never_signalled(procs, dirs):
    require_root()
    chroot, _ = dirs
    p = procs("bash", root=chroot)
    _write_pid(chroot, p.pid, age_s=5)
    probe = probe_vm_pid(chroot)
    assert (probe.running, probe.identity_confirmed, probe.reason) == (True, False, "comm-mismatch")
    assert is_chroot_pid_running(chroot)
    assert kill_confirmed(chroot) is None
    time.sleep(0.2)
    assert _alive(p)


def test_an_unreadable_root_link_counts_as_confirmed(procs, dirs):
    require_root()
    chroot, other = dirs
    # Runs as uid 10001 in ANOTHER root: a readable link would say root-mismatch.
    p = procs("firecracker", root=other, uid=10001)
    _write_pid(chroot, p.pid, age_s=5)
    assert probe_vm_pid(chroot).reason == "root-mismatch"  # as root the link is readable
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from scalers.backends.firecracker.pidprobe import probe_vm_pid;"
        "p = probe_vm_pid(sys.argv[2]); print(json.dumps([p.running, p.identity_confirmed, p.reason]))"
    )
    drop = ["setpriv", "--reuid=10002", "--regid=10002", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    # The venv's interpreter may live under a directory uid 10002 cannot enter (e.g. /root/.pyenv).
    python = next(
        (
            c
            for c in (sys.executable, "/usr/bin/python3")
            if subprocess.run([*drop, c, "-c", "pass"], capture_output=True).returncode == 0
        ),
        None,
    )
    assert python, "no Python interpreter usable by an unprivileged user"
    out = subprocess.run(
        [*drop, python, "-c", code, str(REPO), str(chroot)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, True, "confirmed-root-unreadable"]


def test_missing_and_garbled_pid_files_mean_gone(dirs):
    chroot, _ = dirs
    assert probe_vm_pid(chroot).reason == "no-pid-file"
    (chroot / "firecracker.pid").write_text("not-a-pid")
    assert probe_vm_pid(chroot).reason == "bad-pid"
    (chroot / "firecracker.pid").write_text("-4")
    assert probe_vm_pid(chroot).reason == "bad-pid"
    (chroot / "firecracker.pid").write_text("4194999")  # above pid_max: no such process
    assert probe_vm_pid(chroot).reason == "no-process"
    assert not is_chroot_pid_running(chroot) and read_vm_pid(chroot) is None


def test_a_zombie_is_not_running(dirs):
    chroot, _ = dirs
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 5
    while time.time() < deadline:
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    _write_pid(chroot, p.pid, age_s=1)
    try:
        assert probe_vm_pid(chroot).running is False
    finally:
        p.wait()
