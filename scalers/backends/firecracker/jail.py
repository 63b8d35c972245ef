"""The VM's jail: paths, jailer argv, ``config.json``, MMDS payload, and the chroot on disk.

Pure builders (``jailer_args``, ``resolve_vm_shape``, ``build_vm_config``, ``forwarded_env``,
``build_mmds_payload``) are separate from the functions that touch the disk (``prepare_chroot``,
``remove_vm_dir``, and the VM's owner file: ``write_owner``, ``read_owner``).

The owner file ``<vm_dir>/owner.json`` holds the VM's ownership labels (``kici-managed``,
``kici-installation-id``, ``kici-instance-id``, ``kici-scaler-name``, ``kici-agent-id``: see
``scalers.backends.ownership``). It sits beside the chroot, out of the jailed process's reach, and
is written before anything else of the VM, so a half-made VM is never nobody's.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_OVERLAY_MIB = 2048
MMDS_ADDRESS = "169.254.169.254"
ENV_BUDGET_BYTES = 32768
HOST_ENV_PREFIX = "KICI_AGENT_ENV_"
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The jailer accepts ids of alphanumerics and hyphens, at most 64 characters.
AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
MIB = 1024 * 1024
OWNER_FILE = "owner.json"


# ---- paths ---------------------------------------------------------------------------------


def vm_dir(base: str | os.PathLike, agent_id: str) -> Path:
    """``<base>/firecracker/<agent_id>``; raises ValueError naming ``agent_id`` if it is not a jailer id."""
    if not AGENT_ID_RE.match(agent_id or ""):
        raise ValueError(f"agent_id {agent_id!r} is not a valid jailer id (letters, digits, '-', at most 64)")
    return Path(base) / "firecracker" / agent_id


def chroot_dir(base: str | os.PathLike, agent_id: str) -> Path:
    """``<base>/firecracker/<agent_id>/root``: where the jailer chroots."""
    return vm_dir(base, agent_id) / "root"


def owner_path(base: str | os.PathLike, agent_id: str) -> Path:
    """``<base>/firecracker/<agent_id>/owner.json``: the VM's ownership labels."""
    return vm_dir(base, agent_id) / OWNER_FILE


def api_socket_path(chroot: Path) -> Path:
    """``<chroot>/run/firecracker.socket``: the API socket the jailed firecracker binds."""
    return Path(chroot) / "run" / "firecracker.socket"


# ---- pure builders -------------------------------------------------------------------------


def jailer_args(agent_id: str, firecracker_path: str, uid: int, gid: int, chroot_base: str | os.PathLike) -> list[str]:
    """Jailer arguments (without the jailer program itself): the jailer's own options, ``--``, then
    firecracker's (paths inside the chroot). Raises ``ValueError`` for an id the jailer would refuse."""
    vm_dir(chroot_base, agent_id)  # validates the id
    return [
        "--id", agent_id,
        "--exec-file", str(firecracker_path),
        "--uid", str(int(uid)),
        "--gid", str(int(gid)),
        "--chroot-base-dir", str(chroot_base),
        "--new-pid-ns",
        "--",
        "--config-file", "/config.json",
        "--log-path", "/vmm.log",
        "--level", "Warning",
    ]  # fmt: skip


def _limit(limits: Any, *names: str) -> Any:
    if limits is None:
        return None
    for name in names:
        if isinstance(limits, Mapping):
            if limits.get(name) is not None:
                return limits[name]
        elif getattr(limits, name, None) is not None:
            return getattr(limits, name)
    return None


def resolve_vm_shape(limits: Any, label_set: Mapping, scaler: Mapping) -> tuple[int, int]:
    """``(vcpu_count, mem_size_mib)`` of the VM.

    ``limits``: effective limits, a mapping or object with ``cpus`` (float) and ``memory_bytes``
    (int bytes; ``memBytes`` accepted too) or None. Limits win when usable (cpus → ceil, at least 1;
    bytes → floor MiB when that is > 0), else the label set's ``vcpuCount``/``memSizeMib``, else
    the scaler's (defaults 2 and 512).
    """
    cpus = _limit(limits, "cpus")
    mem = _limit(limits, "memory_bytes", "memBytes", "mem_bytes")
    vcpus = max(1, math.ceil(float(cpus))) if cpus is not None and float(cpus) > 0 else None
    mib = int(mem) // MIB if mem is not None and int(mem) // MIB > 0 else None
    if vcpus is None:
        vcpus = int(label_set.get("vcpuCount") or scaler.get("vcpuCount") or 2)
    if mib is None:
        mib = int(label_set.get("memSizeMib") or scaler.get("memSizeMib") or 512)
    return vcpus, mib


def build_vm_config(*, ip: str, gateway: str, netmask: str, mac: str, tap: str, vcpus: int, mem_mib: int) -> dict:
    """The ``config.json`` the jailed firecracker boots from: kernel, rootfs and overlay drives, MMDS on eth0."""
    return {
        "boot-source": {
            "kernel_image_path": "/kernel",
            "boot_args": (
                f"console=ttyS0 reboot=k panic=1 random.trust_cpu=on init=/init ip={ip}::{gateway}:{netmask}::eth0:off"
            ),
        },
        "drives": [
            {"drive_id": "rootfs", "path_on_host": "/rootfs.ext4", "is_root_device": True, "is_read_only": True},
            {"drive_id": "overlay", "path_on_host": "/overlay.ext4", "is_root_device": False, "is_read_only": False},
        ],
        "machine-config": {"vcpu_count": int(vcpus), "mem_size_mib": int(mem_mib), "smt": False},
        "network-interfaces": [{"iface_id": "eth0", "guest_mac": mac, "host_dev_name": tap}],
        "mmds-config": {"network_interfaces": ["eth0"], "ipv4_address": MMDS_ADDRESS},
    }


def forwarded_env(
    host_env: Mapping[str, str], label_env: Mapping[str, str] | None, warn: Callable[[str], None] = log.warning
) -> dict[str, str]:
    """The ``kici-env`` map: the environment the agent inside the VM is started with.

    ``KICI_AGENT_ENV_<K>`` host variables (prefix stripped), overlaid by the label set's ``env``.
    Keys must match ``^[A-Za-z_][A-Za-z0-9_]*$``; each kept entry costs bytes(key)+bytes(value)+2
    of a 32 768-byte budget, and an entry that would exceed it is skipped (later smaller ones are
    still taken). Every skip calls ``warn`` with a message naming the key.
    """
    merged: dict[str, str] = {}
    for k, v in host_env.items():
        if k.startswith(HOST_ENV_PREFIX) and len(k) > len(HOST_ENV_PREFIX):
            merged[k[len(HOST_ENV_PREFIX) :]] = str(v)
    for k, v in (label_env or {}).items():
        merged[str(k)] = str(v)
    out: dict[str, str] = {}
    used = 0
    for k, v in merged.items():
        if not ENV_KEY_RE.match(k):
            warn(f"kici-env: skipping invalid variable name {k!r}")
            continue
        cost = len(k.encode()) + len(v.encode()) + 2
        if used + cost > ENV_BUDGET_BYTES:
            warn(f"kici-env: skipping {k!r} ({cost} bytes): the {ENV_BUDGET_BYTES}-byte MMDS env budget is spent")
            continue
        out[k] = v
        used += cost
    return out


def build_mmds_payload(
    *,
    orchestrator_url: str,
    agent_id: str,
    labels: Sequence[str],
    gateway: str,
    token: str | None = None,
    backpressure_mode: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """``{"latest": {"meta-data": {...}}}`` for ``PUT /mmds``; optional keys only when set."""
    meta: dict[str, Any] = {
        "kici-orchestrator-url": orchestrator_url,
        "kici-agent-id": agent_id,
        "kici-labels": ",".join(labels),
        "kici-scaler-managed": "1",
        "kici-gateway-ip": gateway,
    }
    if token:
        meta["kici-agent-token"] = token
    if backpressure_mode:
        meta["kici-backpressure-mode"] = backpressure_mode
    if env:
        meta["kici-env"] = dict(env)
    return {"latest": {"meta-data": meta}}


def sudo_wrap(argv: Sequence[str], require_sudo: bool) -> list[str]:
    """``argv`` prefixed with ``sudo -n`` when ``require_sudo`` (the scaler's ``requireSudo``)."""
    return (["sudo", "-n"] if require_sudo else []) + list(argv)


# ---- disk ----------------------------------------------------------------------------------

#: The disk guard's floor, in bytes: no VM is spawned on a chroot volume with less than 1 GiB free.
MIN_FREE_BYTES = 1 << 30


class ChrootVolumeFull(RuntimeError):
    """The chroot volume has less free space than the disk guard's floor; ``free``/``floor`` in bytes."""

    def __init__(self, base: str | os.PathLike, free: int, floor: int):
        self.base, self.free, self.floor = str(base), free, floor
        super().__init__(
            f"disk guard: the chroot volume of {self.base} has {free / 2**20:.0f} MiB free, below the "
            f"{floor / 2**20:.0f} MiB floor; no VM is spawned until space is freed (plan an orphan-VM "
            f"reap under Operations, or free the volume)"
        )


def free_bytes(base: str | os.PathLike) -> int:
    """Bytes available to unprivileged writers on the volume holding ``base`` (its nearest existing
    ancestor when ``base`` does not exist yet). Raises ``OSError`` from ``statvfs``."""
    path = Path(base)
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_free_space(base: str | os.PathLike, floor: int = MIN_FREE_BYTES) -> int:
    """The disk guard: returns the free bytes of ``base``'s volume, or raises
    :class:`ChrootVolumeFull` when they are below ``floor`` (bytes; 0 turns the guard off)."""
    free = free_bytes(base)
    if floor > 0 and free < floor:
        raise ChrootVolumeFull(base, free, floor)
    return free


@dataclass(frozen=True)
class ChrootLayout:
    """Host paths of one VM's jail (all under ``vm_dir``)."""

    vm_dir: Path
    chroot: Path
    rootfs: Path
    kernel: Path
    overlay: Path
    config: Path
    serial_log: Path
    vmm_log: Path
    socket: Path
    pid_file: Path
    owner: Path

    @classmethod
    def for_agent(cls, base: str | os.PathLike, agent_id: str) -> ChrootLayout:
        root = chroot_dir(base, agent_id)
        return cls(
            vm_dir=root.parent, chroot=root, rootfs=root / "rootfs.ext4", kernel=root / "kernel",
            overlay=root / "overlay.ext4", config=root / "config.json", serial_log=root / "serial-console.log",
            vmm_log=root / "vmm.log", socket=api_socket_path(root), pid_file=root / "firecracker.pid",
            owner=root.parent / OWNER_FILE,
        )  # fmt: skip


def write_owner(path: Path, labels: Mapping[str, str]) -> None:
    """Write the owner file ``path`` (JSON object of ``labels``) whole: a temporary file renamed
    into place, so a reader sees all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict(labels), indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_owner(base: str | os.PathLike, agent_id: str) -> dict[str, str] | None:
    """The labels in the VM's owner file; None when it is missing, unreadable or not a JSON object
    of strings (the ownership is then unknown)."""
    try:
        data = json.loads(owner_path(base, agent_id).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None
    return data


def link_or_copy(src: str | os.PathLike, dst: Path) -> str:
    """Hard-link ``src`` to ``dst``; copy instead when the link crosses devices (EXDEV) or is refused
    (EPERM, e.g. ``fs.protected_hardlinks``). Returns ``"linked"`` or ``"copied"``."""
    try:
        os.link(src, dst)
        return "linked"
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM):
            raise
    shutil.copyfile(src, dst)
    return "copied"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(argv)}): exit {proc.returncode}: {proc.stderr.strip()}")


def _chown_tree(path: Path, uid: int, gid: int, require_sudo: bool) -> None:
    if require_sudo:
        _run(sudo_wrap(["chown", "-R", f"{uid}:{gid}", str(path)], True), "chown")
        return
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, uid, gid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def prepare_chroot(
    *,
    base: str | os.PathLike,
    agent_id: str,
    rootfs_path: str | os.PathLike,
    kernel_path: str | os.PathLike,
    overlay_mib: int,
    config: Mapping,
    uid: int,
    gid: int,
    owner_labels: Mapping[str, str],
    require_sudo: bool = False,
    mkfs: str = "mkfs.ext4",
) -> ChrootLayout:
    """Lay out ``<base>/firecracker/<id>/root`` for the jailer.

    First the owner file (``owner_labels``, beside the chroot: :func:`write_owner`); then rootfs →
    ``rootfs.ext4`` and kernel → ``kernel`` (hard-linked, copied on EXDEV); a sparse
    ``overlay.ext4`` of ``overlay_mib`` MiB formatted with ``mkfs.ext4 -qF``; ``config.json``;
    empty ``serial-console.log`` and ``vmm.log``; ``chown -R uid:gid`` of the VM dir; when this
    process is not root, rootfs and kernel are chowned back to it (a hard link shares the inode).
    Raises FileNotFoundError naming a missing ``rootfsPath``/``kernelPath``, FileExistsError if the
    VM dir already exists, RuntimeError when ``mkfs.ext4`` is missing or fails.
    """
    for field, p in (("rootfsPath", rootfs_path), ("kernelPath", kernel_path)):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{field} {str(p)!r} does not exist or is not a file")
    if int(overlay_mib) <= 0:
        raise ValueError(f"overlayDriveSizeMib {overlay_mib!r} must be a positive integer")
    mkfs_bin = shutil.which(mkfs) or shutil.which(mkfs, path="/usr/sbin:/sbin")
    if mkfs_bin is None:
        raise RuntimeError(f"{mkfs} not found: install e2fsprogs")
    layout = ChrootLayout.for_agent(base, agent_id)
    layout.vm_dir.parent.mkdir(parents=True, exist_ok=True)
    layout.vm_dir.mkdir()
    write_owner(layout.owner, owner_labels)
    layout.chroot.mkdir()
    link_or_copy(rootfs_path, layout.rootfs)
    link_or_copy(kernel_path, layout.kernel)
    with open(layout.overlay, "wb") as f:
        f.truncate(int(overlay_mib) * MIB)
    _run([mkfs_bin, "-qF", str(layout.overlay)], "mkfs.ext4")
    layout.config.write_text(json.dumps(dict(config), indent=2))
    layout.serial_log.touch()
    layout.vmm_log.touch()
    _chown_tree(layout.vm_dir, uid, gid, require_sudo)
    if os.geteuid() != 0:
        for p in (layout.rootfs, layout.kernel):
            if require_sudo:
                _run(sudo_wrap(["chown", f"{os.getuid()}:{os.getgid()}", str(p)], True), "chown")
            else:
                os.lchown(p, os.getuid(), os.getgid())
    return layout


def remove_vm_dir(base: str | os.PathLike, agent_id: str, require_sudo: bool = False) -> bool:
    """``rm -rf <base>/firecracker/<id>``; with ``require_sudo`` the tree is first chowned back to this
    process. Returns True when something was removed."""
    path = vm_dir(base, agent_id)
    if not path.exists():
        return False
    if require_sudo and os.geteuid() != 0:
        _chown_tree(path, os.getuid(), os.getgid(), True)
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        shutil.rmtree(path)
    return True
