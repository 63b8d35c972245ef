"""The Firecracker guest sandbox_agent/build_guest.sh makes: its artifacts, its init and MMDS reader
running the reference agent against an MMDS-shaped server in network namespaces, and a real boot
where the CPU has hardware virtualization.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest

from scalers.backends.firecracker import jail
from scalers.backends.firecracker.api import FirecrackerApi
from scalers.backends.firecracker.logs import SERIAL_SOURCE
from scalers.backends.spawn_env import kici_agent_pairs
from tests.support.firecracker import real_binaries, require_kvm
from tests.support.guest import (
    BUSYBOX,
    GUEST_DIR,
    REPO,
    XEN_ELFNOTE_PHYS32_ENTRY,
    Console,
    Mmds,
    build_guest,
    busybox_path,
    elf_load_ranges,
    elf_notes,
    environ_for_guest,
    has_hardware_virtualization,
    module_depends,
    read_cpio,
    serve_in_netns,
)
from tests.support.root import require_root
from tests.support.scalers import make_agent, make_scaler

AGENT = REPO / "sandbox_agent"
NO_HARDWARE_KVM = (
    "real boot needs hardware virtualization: /proc/cpuinfo has no vmx or svm flag, so /dev/kvm here is a "
    "software nested hypervisor, on which a stock kernel stops with KVM_EXIT_INTERNAL_ERROR"
)


@pytest.fixture(scope="module")
def guest():
    return build_guest()


def test_the_guest_kernel_is_an_elf_firecracker_boots_through_its_pvh_entry(guest):
    data = (guest / "vmlinux").read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and int.from_bytes(data[18:20], "little") == 62  # x86-64
    entries = [d for owner, t, d in elf_notes(data) if owner == "Xen" and t == XEN_ELFNOTE_PHYS32_ENTRY]
    assert len(entries) == 1, "no PVH entry note (Xen, XEN_ELFNOTE_PHYS32_ENTRY)"
    entry = int.from_bytes(entries[0][:4], "little")
    assert any(lo <= entry < hi for lo, hi in elf_load_ranges(data)), f"PVH entry {entry:#x} is in no PT_LOAD"


def test_the_initramfs_holds_init_busybox_the_same_agent_and_the_virtio_modules_in_dependency_order(guest):
    files = read_cpio(guest / "initrd.img")
    for name, source in (
        ("init", "guest_init.sh"),
        ("kici_mmds.sh", "guest_mmds.sh"),
        ("kici_agent.sh", "kici_agent.sh"),
    ):
        mode, content = files[name]
        assert content == (AGENT / source).read_bytes() and mode & 0o111, name
    assert files["bin/busybox"][1] == open(BUSYBOX, "rb").read()
    assert files["bin/wget"][1] == b"busybox" and files["bin/nc"][1] == b"busybox"
    order = files["lib/modules/load-order"][1].decode().split()
    assert {"virtio_mmio", "virtio_blk", "virtio_net"} <= set(order)
    for i, name in enumerate(order):
        ko = files[f"lib/modules/{name}.ko"][1]
        assert ko[:4] == b"\x7fELF", f"{name}.ko is not an uncompressed module"
        for dep in module_depends(ko):
            assert dep in order[:i], f"{name} needs {dep}, which is not loaded before it"
    # virtio_mmio binds the devices Firecracker describes in its ACPI tables (the cloud kernel has
    # no virtio_mmio.device= command line devices).
    assert b"alias=acpi*:LNRO0005:*" in files["lib/modules/virtio_mmio.ko"][1]


def test_the_rootfs_image_holds_the_same_tree_and_a_second_build_changes_nothing(guest):
    for path, source in (("/init", "guest_init.sh"), ("/kici_agent.sh", "kici_agent.sh")):
        proc = subprocess.run(
            ["debugfs", "-R", f"cat {path}", str(guest / "rootfs.ext4")], capture_output=True, timeout=30
        )
        assert proc.stdout == (AGENT / source).read_bytes(), path
    before = {f: (guest / f).stat().st_mtime_ns for f in ("vmlinux", "initrd.img", "rootfs.ext4")}
    build_guest()
    assert {f: (guest / f).stat().st_mtime_ns for f in before} == before


def test_the_build_refuses_an_agent_tree_without_the_real_agent(tmp_path):
    (tmp_path / "tree" / "usr" / "local" / "bin").mkdir(parents=True)
    with pytest.raises(AssertionError, match="holds no executable usr/local/bin/kici-agent"):
        build_guest(tmp_path / "out", agent_tree=tmp_path / "tree")
    assert not (tmp_path / "out").exists()


def test_an_initrd_path_reaches_the_vm_config_and_the_chroot(tmp_path):
    config = jail.build_vm_config(
        ip="10.0.0.2", gateway="10.0.0.1", netmask="255.255.255.0", mac="06:00:0a:00:00:02", tap="kici-tap0",
        vcpus=1, mem_mib=128, initrd=True,
    )  # fmt: skip
    assert config["boot-source"]["initrd_path"] == "/initrd"
    images = {}
    for name in ("rootfs", "kernel", "initrd"):
        images[name] = tmp_path / name
        images[name].write_bytes(name.encode())
        images[name].chmod(0o644)
    layout = jail.prepare_chroot(
        base=tmp_path / "jailer", agent_id="scaler-firecracker-0000aaaa", rootfs_path=images["rootfs"],
        kernel_path=images["kernel"], initrd_path=images["initrd"], overlay_mib=8, config=config,
        uid=os.getuid(), gid=os.getgid(), owner_labels={"kici-managed": "true"},
    )  # fmt: skip
    assert layout.initrd.read_bytes() == b"initrd"
    with pytest.raises(FileNotFoundError, match="initrdPath"):
        jail.prepare_chroot(
            base=tmp_path / "jailer", agent_id="scaler-firecracker-0000bbbb", rootfs_path=images["rootfs"],
            kernel_path=images["kernel"], initrd_path=tmp_path / "missing", overlay_mib=8, config=config,
            uid=os.getuid(), gid=os.getgid(), owner_labels={"kici-managed": "true"},
        )  # fmt: skip


# ---- the init and the MMDS reader, for real, in network namespaces --------------------------------

_count = iter(range(1, 1000))


@pytest.fixture
def guest_net():
    """Two namespaces joined by a veth: the "host" side holds the gateway and the MMDS address, the
    "guest" side an unconfigured eth0 (what the VM's virtio_net gives the init)."""
    require_root()
    n = next(_count)
    host, vm = f"kgst-{os.getpid()}-{n}-h", f"kgst-{os.getpid()}-{n}-g"
    octet = 10 + (os.getpid() + n) % 200
    net = {"host": host, "guest": vm, "gateway": f"10.252.{octet}.1", "ip": f"10.252.{octet}.2"}
    for ns in (host, vm):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    try:
        subprocess.run(["ip", "link", "add", "kgst0", "netns", host, "type", "veth", "peer", "name", "eth0",
                        "netns", vm], check=True)  # fmt: skip
        for addr in (f"{net['gateway']}/24", f"{jail.MMDS_ADDRESS}/32"):
            subprocess.run(["ip", "-n", host, "addr", "add", addr, "dev", "kgst0"], check=True)
        subprocess.run(["ip", "-n", host, "link", "set", "kgst0", "up"], check=True)
        yield net
    finally:
        for ns in (host, vm):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def _in_guest(net, argv, env, timeout=60):
    return subprocess.run(
        ["ip", "netns", "exec", net["guest"], "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.root
@pytest.mark.parametrize("version", ["V2", "V1"])
def test_the_guest_init_and_mmds_reader_register_the_agent_with_the_id_token_and_url_from_mmds(
    guest_net, tmp_path, version
):
    net = guest_net
    agent_id, token = "scaler-firecracker-0000c0de", "tok-from-mmds"
    console = Console(agent_id, token)
    # V1 (what config.json asks for: no version) refuses the session-token PUT: the reader must
    # then read without a session.
    mmds = Mmds(version=version)
    servers = [
        serve_in_netns(net["host"], jail.MMDS_ADDRESS, 80, mmds.handler()),
        serve_in_netns(net["host"], net["gateway"], 8000, console.handler()),
    ]
    meta = jail.build_mmds_payload(
        orchestrator_url=f"http://{net['gateway']}:8000", agent_id=agent_id, labels=["linux", "vm"],
        gateway=net["gateway"], token=token, env={"KICI_GUEST_MARK": "a b=c"},
    )  # fmt: skip
    # The VM boots before the backend PUTs /mmds: the reader must wait for the keys.
    fill = threading.Timer(2.0, lambda: mmds.data.update(meta))
    fill.start()
    try:
        cmdline = tmp_path / "cmdline"
        cmdline.write_text(
            f"console=ttyS0 reboot=k panic=1 init=/init ip={net['ip']}::{net['gateway']}:255.255.255.0::eth0:off\n"
        )
        path = busybox_path(tmp_path)
        init = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_init.sh"), "net"],
                         environ_for_guest(path, KICI_GUEST_CMDLINE=str(cmdline)))  # fmt: skip
        assert init.returncode == 0, init.stdout + init.stderr
        routes = subprocess.run(["ip", "-n", net["guest"], "route"], capture_output=True, text=True).stdout
        assert f"default via {net['gateway']} dev eth0" in routes and f"{jail.MMDS_ADDRESS} dev eth0" in routes
        env = environ_for_guest(path, KICI_AGENT_SCRIPT=str(AGENT / "kici_agent.sh"), KICI_MMDS_WAIT_SECONDS="20")
        started = time.monotonic()
        run = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_mmds.sh")], env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert time.monotonic() - started > 1.5  # it waited for MMDS to be filled
        register = [r for r in console.requests if r[0] == "/api/v1/agents/register"]
        assert len(register) == 1 and register[0][1] == f"Bearer {token}"
        assert '"agentId":"scaler-firecracker-0000c0de"' in register[0][2] and '"labels":"linux,vm"' in register[0][2]
        assert (f"/api/v1/agents/{agent_id}/heartbeat", f"Bearer {console.session}") in [
            r[:2] for r in console.requests
        ]
        gets = [r for r in mmds.requests if r[0] == "GET"]
        if version == "V2":
            assert all(r[2].get("X-metadata-token") in mmds.tokens for r in gets), [
                r for r in gets if r[2].get("X-metadata-token") not in mmds.tokens
            ]
        else:
            assert all("X-metadata-token" not in r[2] for r in gets)
        # kici-env entries become the agent's environment.
        show = tmp_path / "show_env.sh"
        show.write_text('echo "id=$KICI_AGENT_ID url=$KICI_ORCHESTRATOR_URL mark=$KICI_GUEST_MARK"\n')
        seen = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_mmds.sh")], {**env, "KICI_AGENT_SCRIPT": str(show)})
        assert f"id={agent_id} url=http://{net['gateway']}:8000 mark=a b=c" in seen.stdout, seen.stdout + seen.stderr
    finally:
        fill.cancel()
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.root
def test_the_mmds_reader_gives_up_naming_the_keys_when_mmds_stays_empty(guest_net, tmp_path):
    net = guest_net
    mmds = Mmds()
    server = serve_in_netns(net["host"], jail.MMDS_ADDRESS, 80, mmds.handler())
    try:
        subprocess.run(["ip", "-n", net["guest"], "addr", "add", f"{net['ip']}/24", "dev", "eth0"], check=True)
        subprocess.run(["ip", "-n", net["guest"], "link", "set", "eth0", "up"], check=True)
        env = environ_for_guest(busybox_path(tmp_path), KICI_AGENT_SCRIPT="/nonexistent", KICI_MMDS_WAIT_SECONDS="2")
        run = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_mmds.sh")], env)
        assert run.returncode == 1
        assert "held no kici-orchestrator-url, kici-agent-id and kici-agent-token after 2s" in run.stdout
    finally:
        server.shutdown()
        server.server_close()


def _real_agent_row(gateway: str, roles=None):
    """A firecracker agent row of a label set running the real KiCI agent of ``ws://<gateway>:8480/ws``."""
    scaler = make_scaler(
        type="firecracker", labels=("real-vm", "linux"), roles=roles,
        ls_config={"kiciAgent": {"orchestratorUrl": f"ws://{gateway}:8480/ws", "adminTokenRef": "orch"}},
    )  # fmt: skip
    return make_agent(scaler)


def _guest_eth0(net) -> None:
    """eth0 of the guest side up with its address and the route to MMDS, as the init leaves it."""
    subprocess.run(["ip", "-n", net["guest"], "addr", "add", f"{net['ip']}/24", "dev", "eth0"], check=True)
    subprocess.run(["ip", "-n", net["guest"], "link", "set", "eth0", "up"], check=True)
    subprocess.run(["ip", "-n", net["guest"], "route", "add", jail.MMDS_ADDRESS, "dev", "eth0"], check=True)


def _env_lines(stdout: str) -> dict[str, str]:
    """The environment busybox ``env`` printed (the reader's own log lines left out)."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line and not line.startswith("kici-"))


@pytest.mark.root
@pytest.mark.django_db
@pytest.mark.parametrize("version", ["V2", "V1"])
def test_the_mmds_reader_starts_the_real_kici_agent_with_exactly_the_environment_the_console_gives_it(
    guest_net, tmp_path, version
):
    # The console's document for a VM of a kiciAgent label set (the reference's keys), read by the
    # guest reader, which execs the real agent: here busybox env, which prints what it was given.
    # Whatever the reader's own environment holds (its KICI_* knobs, a stray variable) must not
    # reach the agent, which refuses any KICI_* variable it does not know.
    net = guest_net
    agent = _real_agent_row(net["gateway"], roles=["builder"])
    pairs = kici_agent_pairs(agent, "kat_from-the-orchestrator", execution_mode="firecracker")
    mmds = Mmds(version=version)
    mmds.data.update(jail.agent_env_mmds(pairs, net["gateway"]))
    meta = mmds.data["latest"]["meta-data"]
    assert meta["kici-orchestrator-url"] == f"ws://{net['gateway']}:8480/ws"
    assert (meta["kici-agent-token"], meta["kici-scaler-managed"]) == ("kat_from-the-orchestrator", "1")
    assert meta["kici-env"] == {"KICI_ROLES": "builder", "KICI_EXECUTION_MODE": "firecracker"}
    server = serve_in_netns(net["host"], jail.MMDS_ADDRESS, 80, mmds.handler())
    try:
        _guest_eth0(net)
        path = busybox_path(tmp_path)
        env = environ_for_guest(
            path, KICI_REAL_AGENT=f"{path}/env", KICI_AGENT_SCRIPT="/nonexistent", KICI_MMDS_WAIT_SECONDS="5",
            KICI_STRAY="from the init", TERM="linux",
        )  # fmt: skip
        run = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_mmds.sh")], env)
        assert run.returncode == 0, run.stdout + run.stderr
        expected = {
            "HOME": "/root",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "TMPDIR": "/tmp",
            **dict(pairs),
        }
        assert _env_lines(run.stdout) == expected, run.stdout + run.stderr
        assert f"kici-mmds: real KiCI agent {agent.agent_id}, orchestrator ws://{net['gateway']}:8480/ws" in run.stdout
        assert "kat_from-the-orchestrator" not in run.stdout.replace("KICI_AGENT_TOKEN=kat_from-the-orchestrator", "")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.root
@pytest.mark.django_db
def test_the_mmds_reader_refuses_a_websocket_orchestrator_when_the_guest_has_no_real_agent(guest_net, tmp_path):
    net = guest_net
    agent = _real_agent_row(net["gateway"])
    mmds = Mmds()
    pairs = kici_agent_pairs(agent, "kat_x", execution_mode="firecracker")
    mmds.data.update(jail.agent_env_mmds(pairs, net["gateway"]))
    server = serve_in_netns(net["host"], jail.MMDS_ADDRESS, 80, mmds.handler())
    try:
        _guest_eth0(net)
        shown = tmp_path / "console_agent.sh"
        shown.write_text('echo "the console agent ran"\n')
        env = environ_for_guest(busybox_path(tmp_path), KICI_REAL_AGENT=str(tmp_path / "missing"),
                                KICI_AGENT_SCRIPT=str(shown), KICI_MMDS_WAIT_SECONDS="5")  # fmt: skip
        run = _in_guest(net, ["busybox", "sh", str(AGENT / "guest_mmds.sh")], env)
        assert run.returncode == 127, run.stdout + run.stderr
        assert (
            f"kici-mmds: MMDS names the WebSocket orchestrator ws://{net['gateway']}:8480/ws (the real KiCI agent), "
            f"but {tmp_path / 'missing'} is not installed in this guest"
        ) in run.stdout
        assert "the console agent ran" not in run.stdout and "kat_x" not in run.stdout
    finally:
        server.shutdown()
        server.server_close()


# ---- the whole guest, booted -------------------------------------------------------------------


def _boot_emulated(guest, tmp_path, meta_for, console_for=None) -> tuple[int | None, str, Mmds, list]:
    """Boot the built ``guest`` in QEMU's microvm machine (software emulation) on a TAP in a
    namespace of its own, whose host side holds the gateway, an MMDS (V2) serving
    ``meta_for(gateway)`` and, when ``console_for`` is given, the HTTP handler
    ``console_for(gateway)`` on the gateway's port 8000. Returns ``(exit code or None when it did not
    reset within 240 s, serial log, the MMDS, the servers' handlers)``."""
    require_root()
    qemu = shutil.which("qemu-system-x86_64")
    assert qemu, "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86: make test installs it)"
    n = next(_count)
    ns, tap = f"kgst-{os.getpid()}-{n}-q", "kgst-tap0"
    octet = 10 + (os.getpid() + n) % 200
    gateway, ip = f"10.253.{octet}.1", f"10.253.{octet}.2"
    mmds = Mmds(version="V2")
    mmds.data.update(meta_for(gateway))
    boot_args = jail.build_vm_config(
        ip=ip, gateway=gateway, netmask="255.255.255.0", mac="06:00:0a:fd:00:02", tap=tap, vcpus=1, mem_mib=256
    )["boot-source"]["boot_args"]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    servers, vm = [], None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap"], check=True)
        for addr in (f"{gateway}/24", f"{jail.MMDS_ADDRESS}/32"):
            subprocess.run(["ip", "-n", ns, "addr", "add", addr, "dev", tap], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", tap, "up"], check=True)
        servers = [serve_in_netns(ns, jail.MMDS_ADDRESS, 80, mmds.handler())]
        if console_for is not None:
            servers.append(serve_in_netns(ns, gateway, 8000, console_for(gateway)))
        serial = tmp_path / "serial.log"
        machine = "microvm,acpi=on,x-option-roms=off,pit=on,pic=on,isa-serial=on,rtc=on"
        # Virtual time from the instruction count: on a loaded host, real-time emulation makes the
        # kernel's TSC calibration against the PIT fail, and the boot then hangs.
        clock = ["-icount", "shift=3,sleep=off"]
        with open(serial, "wb") as out:
            vm = subprocess.Popen(
                ["ip", "netns", "exec", ns, qemu, "-accel", "tcg", *clock, "-M", machine, "-m", "256", "-smp", "1",
                 "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
                 "-kernel", str(guest / "vmlinux"), "-initrd", str(guest / "initrd.img"), "-append", boot_args,
                 "-drive", f"id=root,file={guest / 'rootfs.ext4'},format=raw,if=none,readonly=on",
                 "-device", "virtio-blk-device,drive=root",
                 "-netdev", f"tap,id=eth0,ifname={tap},script=no,downscript=no",
                 "-device", "virtio-net-device,netdev=eth0,mac=06:00:0a:fd:00:02"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                code = vm.wait(timeout=240)
            except subprocess.TimeoutExpired:
                code = None
        log = serial.read_text(errors="replace")
        assert f"kici-init: eth0 is {ip}/24 via {gateway}" in log and "virtio_blk" in log, log[-4000:]
        return code, log, mmds, servers
    finally:
        if vm is not None and vm.poll() is None:
            vm.kill()
            vm.wait()
        for server in servers:
            server.shutdown()
            server.server_close()
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.root
@pytest.mark.slow
def test_the_built_guest_boots_emulated_and_its_init_and_agent_register_through_mmds(guest, tmp_path):
    # QEMU's microvm machine in software emulation (no KVM needed) describes its virtio-mmio
    # devices in ACPI (LNRO0005) as Firecracker does: the same kernel, initramfs and boot arguments
    # boot through the modules, eth0 from ip=, MMDS and the agent's registration; the agent's
    # stop ends the init, which resets the machine.
    agent_id, token = "scaler-firecracker-0000e1e1", "tok-emulated"
    console = Console(agent_id, token)
    code, log, mmds, _ = _boot_emulated(
        guest, tmp_path,
        lambda gateway: jail.build_mmds_payload(
            orchestrator_url=f"http://{gateway}:8000", agent_id=agent_id, labels=["linux", "vm"], gateway=gateway,
            token=token,
        ),
        lambda gateway: console.handler(),
    )  # fmt: skip
    assert code == 0, f"the emulated guest did not reset after its agent stopped (exit {code}):\n{log[-4000:]}"
    assert "kici-agent: registered" in log and "kici-agent: console asked us to stop" in log, log[-4000:]
    register = [r for r in console.requests if r[0] == "/api/v1/agents/register"]
    assert len(register) == 1 and register[0][1] == f"Bearer {token}"
    assert any(r[0] == "PUT" for r in mmds.requests)  # a V2 session


#: A stand-in for the real KiCI agent in a guest's agent tree: prints the environment it was
#: exec'd with (its /proc environ: what the reader gave it, nothing its own shell adds), then exits
#: 0 as the real agent does once idle.
REAL_AGENT_STAND_IN = """#!/bin/sh
tr '\\000' '\\n' < /proc/$$/environ | sed 's/^/real-agent-env: /'
"""


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.django_db
def test_a_guest_built_with_an_agent_tree_boots_emulated_and_starts_the_real_agent_with_exactly_its_environment(
    tmp_path,
):
    # sandbox_agent/build_guest.sh with KICI_GUEST_AGENT_TREE puts the tree's usr/local/bin/kici-agent in
    # the guest; booted, the init reads the console's MMDS document for a kiciAgent VM and execs
    # it with exactly the real agent's environment; its exit resets the VM.
    tree = tmp_path / "tree"
    (tree / "usr" / "local" / "bin").mkdir(parents=True)
    stand_in = tree / "usr" / "local" / "bin" / "kici-agent"
    stand_in.write_text(REAL_AGENT_STAND_IN)
    stand_in.chmod(0o755)
    guest = build_guest(GUEST_DIR.parent / "test-guest-agent-tree", agent_tree=tree)
    files = read_cpio(guest / "initrd.img")
    assert files["usr/local/bin/kici-agent"][1] == REAL_AGENT_STAND_IN.encode()
    pairs: list[tuple[str, str]] = []

    def meta_for(gateway: str) -> dict:
        pairs.extend(kici_agent_pairs(_real_agent_row(gateway), "kat_emulated", execution_mode="firecracker"))
        return jail.agent_env_mmds(pairs, gateway)

    code, log, _, _ = _boot_emulated(guest, tmp_path, meta_for)
    assert code == 0, f"the emulated guest did not reset after its agent exited (exit {code}):\n{log[-4000:]}"
    seen = dict(
        line.split("real-agent-env: ", 1)[1].rstrip("\r").split("=", 1)
        for line in log.splitlines()
        if "real-agent-env: " in line
    )
    expected = {"HOME": "/root", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "TMPDIR": "/tmp", **dict(pairs)}  # fmt: skip
    assert seen == expected, log[-4000:]
    assert "kici-init: agent exited (0)" in log, log[-4000:]


# ---- a real boot --------------------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.django_db(transaction=True)
def test_the_real_jailer_and_firecracker_start_the_built_guest_with_its_initrd(fc_env, guest):
    # Up to the boot, on any /dev/kvm: the chroot holds the initrd, and the running firecracker
    # took boot-source.initrd_path (its GET /vm/config shows what it loaded).
    fc, jailer = real_binaries()
    require_kvm()
    env = fc_env
    b = env.backend(jailer=jailer, firecracker=fc, kernel=guest / "vmlinux", initrd_path=str(guest / "initrd.img"),
                    destroy_wait_s=2)  # fmt: skip
    assert b.ensure_host_ready()
    agent_id = "scaler-firecracker-0000f00d"
    label_set = {"labels": ["linux", "vm"], "rootfsPath": str(guest / "rootfs.ext4"), "overlayDriveSizeMib": 8,
                 "memSizeMib": 256, "vcpuCount": 1}  # fmt: skip
    vm = b.spawn(agent_id, label_set, None, f"http://{env.gateway}:8000", labels=["linux", "vm"], timeout_s=30)
    try:
        assert vm.layout.initrd.read_bytes() == (guest / "initrd.img").read_bytes()
        api = FirecrackerApi(str(vm.layout.socket))
        assert api.get_info()["state"] == "Running"
        boot = api.request("GET", "/vm/config")["boot-source"]
        assert (boot["kernel_image_path"], boot["initrd_path"]) == ("/kernel", "/initrd")
        assert api.get_mmds()["latest"]["meta-data"]["kici-agent-token"] == f"tok-{agent_id}"
    finally:
        b.mark_registered(agent_id)
        assert b.destroy(agent_id)


@pytest.mark.root
@pytest.mark.django_db(transaction=True)
def test_the_built_guest_boots_in_real_firecracker_and_its_agent_registers(fc_env, guest):
    if not has_hardware_virtualization():
        pytest.skip(NO_HARDWARE_KVM)
    fc, jailer = real_binaries()
    require_kvm()
    env = fc_env
    b = env.backend(jailer=jailer, firecracker=fc, kernel=guest / "vmlinux", initrd_path=str(guest / "initrd.img"),
                    destroy_wait_s=20)  # fmt: skip
    assert b.ensure_host_ready()
    agent_id = "scaler-firecracker-0000b007"
    console = Console(agent_id, f"tok-{agent_id}")
    server = serve_in_netns(env.netns, env.gateway, 8000, console.handler())
    try:
        label_set = {"labels": ["linux", "vm"], "rootfsPath": str(guest / "rootfs.ext4"), "overlayDriveSizeMib": 8,
                     "memSizeMib": 256, "vcpuCount": 1}  # fmt: skip
        b.spawn(agent_id, label_set, None, f"http://{env.gateway}:8000", labels=["linux", "vm"], timeout_s=60)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(r[0].endswith("/heartbeat") for r in console.requests):
            time.sleep(0.5)
        serial = [r.get("message") for _, source, r in env.log_lines if source == SERIAL_SOURCE]
        register = [r for r in console.requests if r[0] == "/api/v1/agents/register"]
        assert register and register[0][1] == f"Bearer tok-{agent_id}", "\n".join(map(str, serial[-50:]))
        b.mark_registered(agent_id)
        assert b.destroy(agent_id)
    finally:
        server.shutdown()
        server.server_close()
