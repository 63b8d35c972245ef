"""The VM's jail: paths, jailer argv, ``config.json``, MMDS payload, and the chroot on disk.

Pure builders (``jailer_args``, ``resolve_vm_shape``, ``build_vm_config``, ``forwarded_env``,
``build_mmds_payload``) are apart from what touches the disk (``prepare_chroot``, ``remove_vm_dir``,
``open_vm_file``, the one way any file of a chroot is opened, and the owner file ``<vm_dir>/owner.json``:
``write_owner``, ``read_owner``). Why the chroot is laid out so, and the owner file:
docs/firecracker-adapter.md ("The chroot's files") and docs/sandbox-ownership.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib.safe_open import open_last

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


def build_vm_config(
    *, ip: str, gateway: str, netmask: str, mac: str, tap: str, vcpus: int, mem_mib: int, initrd: bool = False
) -> dict:
    """The ``config.json`` the jailed firecracker boots from: kernel (and ``/initrd`` when
    ``initrd``), rootfs and overlay drives, MMDS on eth0."""
    boot = {
        "kernel_image_path": "/kernel",
        "boot_args": (
            f"console=ttyS0 reboot=k panic=1 random.trust_cpu=on init=/init ip={ip}::{gateway}:{netmask}::eth0:off"
        ),
    }
    if initrd:
        boot["initrd_path"] = "/initrd"
    return {
        "boot-source": boot,
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


#: The MMDS meta-data key of each agent variable the reference's Firecracker backend writes under a
#: key of its own; the guest (``sandbox_agent/guest_mmds.sh``) maps each back. Every other variable of an
#: agent's environment travels in the ``kici-env`` map under its own name.
MMDS_ENV_KEYS = {
    "KICI_ORCHESTRATOR_URL": "kici-orchestrator-url",
    "KICI_AGENT_ID": "kici-agent-id",
    "KICI_LABELS": "kici-labels",
    "KICI_AGENT_TOKEN": "kici-agent-token",
    "KICI_SCALER_MANAGED": "kici-scaler-managed",
    "KICI_BACKPRESSURE_MODE": "kici-backpressure-mode",
}


def agent_env_mmds(env: Sequence[tuple[str, str]], gateway: str) -> dict:
    """``{"latest": {"meta-data": {...}}}`` for ``PUT /mmds`` that starts the guest's agent with
    exactly the environment ``env`` (``(name, value)`` pairs, e.g. the real KiCI agent's,
    ``spawn_env.kici_agent_pairs``): each variable of :data:`MMDS_ENV_KEYS` under its key, every
    other one in ``kici-env``, plus ``kici-gateway-ip``. Nothing is skipped: raises ``ValueError``
    naming the variable for a name that is not a shell variable name, a repeated name, or a
    ``kici-env`` over the :data:`ENV_BUDGET_BYTES` budget."""
    meta: dict[str, Any] = {"kici-gateway-ip": gateway}
    extra: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in env:
        if not ENV_KEY_RE.match(name):
            raise ValueError(f"agent environment: {name!r} is not a variable name")
        if name in seen:
            raise ValueError(f"agent environment: {name} is given twice")
        seen.add(name)
        if name in MMDS_ENV_KEYS:
            meta[MMDS_ENV_KEYS[name]] = str(value)
        else:
            extra[name] = str(value)
    used = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in extra.items())
    if used > ENV_BUDGET_BYTES:
        raise ValueError(
            f"agent environment: kici-env needs {used} bytes, over the {ENV_BUDGET_BYTES}-byte MMDS budget"
        )
    if extra:
        meta["kici-env"] = extra
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
    initrd: Path
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
            initrd=root / "initrd", overlay=root / "overlay.ext4", config=root / "config.json",
            serial_log=root / "serial-console.log", vmm_log=root / "vmm.log", socket=api_socket_path(root),
            pid_file=root / "firecracker.pid", owner=root.parent / OWNER_FILE,
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


#: The chroot names of the operator's images (:func:`place_base_image`); the initrd is optional.
BASE_IMAGES = ("rootfs.ext4", "kernel", "initrd")
#: ``ioctl(dst, FICLONE, src)``: share the source's extents (btrfs, XFS); a copy costs no space.
FICLONE = 0x40049409
#: The chroot entries the VM's uid owns: the API socket's directory, the writable drive, the VMM log.
VM_OWNED = ("run", "overlay.ext4", "vmm.log")
#: A file of a chroot is opened walking its last three components (VM dir, chroot, file) without
#: following a link: see :func:`open_vm_file`.
VM_PATH_DEPTH = 3


def open_vm_file(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """A descriptor of ``<base>/firecracker/<id>/root/<name>`` opened with ``flags`` without following
    a symbolic link in ``<id>``, ``root`` or ``<name>`` (``lib.safe_open.open_last``).

    Every file of a VM's chroot is opened through this: the VM's uid writes inside the chroot, and
    a planted link must not make this (root) process read or write a file elsewhere. Raises
    ``lib.safe_open.UnsafePathError`` naming the path for a link or a non-regular file, and the
    ``OSError`` of the open otherwise.
    """
    return open_last(path, VM_PATH_DEPTH, flags, mode)


def vm_may_write(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether the VM's ``uid``/``gid`` could write a file with stat ``st`` (owner, group or other bits)."""
    if uid == 0 or st.st_uid == uid:
        return True
    if st.st_gid == gid and st.st_mode & stat.S_IWGRP:
        return True
    return bool(st.st_mode & stat.S_IWOTH)


def vm_may_read(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether the VM's ``uid``/``gid`` could read a file with stat ``st`` by its mode bits."""
    if uid == 0 or (st.st_uid == uid and st.st_mode & stat.S_IRUSR):
        return True
    if st.st_gid == gid and st.st_mode & stat.S_IRGRP:
        return True
    return bool(st.st_mode & stat.S_IROTH)


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Copy ``length`` bytes at ``offset`` in the kernel (``copy_file_range``), else by reads and writes."""
    end = offset + length
    try:
        while offset < end:
            done = os.copy_file_range(src, dst, end - offset, offset, offset)
            if done == 0:
                break
            offset += done
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while offset < end:
        chunk = os.pread(src, min(MIB, end - offset), offset)
        if not chunk:
            break
        os.pwrite(dst, chunk, offset)
        offset += len(chunk)


def copy_sparse(src: int, dst: int) -> None:
    """Copy the file open as ``src`` into the empty file ``dst``: only its data ranges
    (``SEEK_DATA``/``SEEK_HOLE``), so holes stay holes and a sparse image costs its data only."""
    size = os.fstat(src).st_size
    os.ftruncate(dst, size)
    offset = 0
    while offset < size:
        try:
            data = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole up to the end
                return
            raise
        hole = os.lseek(src, data, os.SEEK_HOLE)
        _copy_range(src, dst, data, hole - data)
        offset = hole


def place_base_image(src: str | os.PathLike, chroot_fd: int, name: str, uid: int, gid: int) -> str:
    """Put the operator's image ``src`` into the chroot (open as ``chroot_fd``) as ``name``: a hard link
    when the VM's ``uid``/``gid`` can read it and cannot write it, else the chroot's own copy (reflink,
    else sparse; mode 0440, group ``gid`` when this process is root, else set by the caller through
    sudo). Returns ``"linked"``, ``"reflinked"`` or ``"copied"``; the image's owner, mode and content
    are never changed. Why: docs/firecracker-adapter.md ("The chroot's files").
    """
    st = os.stat(src)
    if vm_may_read(st, uid, gid) and not vm_may_write(st, uid, gid):
        try:
            os.link(src, name, dst_dir_fd=chroot_fd, follow_symlinks=True)
            return "linked"
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM):
                raise
    how = "copied"
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst_fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=chroot_fd
        )
        try:
            try:
                fcntl.ioctl(dst_fd, FICLONE, src_fd)
                how = "reflinked"
            except OSError:
                copy_sparse(src_fd, dst_fd)
            os.fchmod(dst_fd, 0o440)
            if os.geteuid() == 0:
                os.fchown(dst_fd, -1, gid)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return how


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(argv)}): exit {proc.returncode}: {proc.stderr.strip()}")


def _create(chroot_fd: int, name: str, data: bytes = b"", mode: int = 0o644) -> int:
    """Create ``name`` in the chroot (``O_EXCL``: never an existing file or link) with exactly
    ``mode`` (whatever this process's umask), write ``data``; returns the open descriptor."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=chroot_fd)
    os.fchmod(fd, mode)
    if data:
        os.write(fd, data)
    return fd


def _mkdir(path: str | os.PathLike, dir_fd: int | None = None) -> None:
    """Make the directory ``path`` with mode 0755 exactly: an operator's umask (077 is common) must
    not shut the VM's uid out of the chroot it is jailed in."""
    os.mkdir(path, 0o755, dir_fd=dir_fd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)


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
    initrd_path: str | os.PathLike = "",
) -> ChrootLayout:
    """Lay out ``<base>/firecracker/<id>/root`` for the jailer: the owner file first (:func:`write_owner`),
    the images (:func:`place_base_image`), a sparse ``overlay.ext4`` of ``overlay_mib`` MiB made with
    ``mkfs``, ``config.json``, empty logs and ``run/``; only :data:`VM_OWNED` is chowned to ``uid:gid``
    (``sudo -n chown`` with ``require_sudo``); files are made ``O_EXCL|O_NOFOLLOW`` in the chroot
    (docs/firecracker-adapter.md, "The chroot's files"). Raises FileNotFoundError naming a missing
    ``rootfsPath``/``kernelPath``/``initrdPath``, FileExistsError if the VM dir exists, RuntimeError
    when ``mkfs.ext4`` is missing or fails.
    """
    images = [(rootfs_path, "rootfsPath", "rootfs.ext4"), (kernel_path, "kernelPath", "kernel")]
    if initrd_path:
        images.append((initrd_path, "initrdPath", "initrd"))
    for p, field, _name in images:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{field} {str(p)!r} does not exist or is not a file")
    if int(overlay_mib) <= 0:
        raise ValueError(f"overlayDriveSizeMib {overlay_mib!r} must be a positive integer")
    mkfs_bin = shutil.which(mkfs) or shutil.which(mkfs, path="/usr/sbin:/sbin")
    if mkfs_bin is None:
        raise RuntimeError(f"{mkfs} not found: install e2fsprogs")
    layout = ChrootLayout.for_agent(base, agent_id)
    layout.vm_dir.parent.mkdir(parents=True, exist_ok=True)
    _mkdir(layout.vm_dir)
    write_owner(layout.owner, owner_labels)
    _mkdir(layout.chroot)
    chroot_fd = os.open(layout.chroot, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        copies = [name for src, _field, name in images if place_base_image(src, chroot_fd, name, uid, gid) != "linked"]
        fd = _create(chroot_fd, layout.overlay.name, mode=0o600)
        try:
            os.ftruncate(fd, int(overlay_mib) * MIB)
        finally:
            os.close(fd)
        _run([mkfs_bin, "-qF", str(layout.overlay)], "mkfs.ext4")
        for name, data in ((layout.config.name, json.dumps(dict(config), indent=2).encode()),
                           (layout.serial_log.name, b""), (layout.vmm_log.name, b"")):  # fmt: skip
            os.close(_create(chroot_fd, name, data))
        _mkdir("run", dir_fd=chroot_fd)
        if require_sudo:
            paths = [str(layout.chroot / name) for name in VM_OWNED]
            _run(sudo_wrap(["chown", "-h", f"{uid}:{gid}", *paths], True), "chown")
            if copies and os.geteuid() != 0:
                copied = [str(layout.chroot / name) for name in copies]
                _run(sudo_wrap(["chown", "-h", f":{gid}", *copied], True), "chown")
        else:
            for name in VM_OWNED:
                os.chown(name, uid, gid, dir_fd=chroot_fd, follow_symlinks=False)
    finally:
        os.close(chroot_fd)
    return layout


def _shared_files(path: Path) -> list[str]:
    """Regular files under ``path`` with more than one link: another path shares their inode."""
    shared = []
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                shared.append(full)
    return shared


def remove_vm_dir(base: str | os.PathLike, agent_id: str, require_sudo: bool = False) -> bool:
    """``rm -rf <base>/firecracker/<id>``. Returns True when something was removed.

    With ``require_sudo`` (this process is not root) the tree is first chowned back to this process
    (``sudo -n chown -R``, which follows no link), after the links of the base images are removed, so
    no chown reaches an operator's image. Raises RuntimeError naming them, and removes nothing, when
    other files in the tree still share an inode with another path.
    """
    path = vm_dir(base, agent_id)
    if not path.exists():
        return False
    if require_sudo and os.geteuid() != 0:
        for name in BASE_IMAGES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path / "root" / name)
        shared = _shared_files(path)
        if shared:
            raise RuntimeError(
                f"not removing {path}: {', '.join(shared)} share an inode with a file elsewhere, which "
                "the chown back would change; remove them by hand"
            )
        _run(sudo_wrap(["chown", "-R", f"{os.getuid()}:{os.getgid()}", str(path)], True), "chown")
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        shutil.rmtree(path)
    return True
