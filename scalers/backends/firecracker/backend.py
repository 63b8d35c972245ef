"""The Firecracker scaler backend: spawn, abandon, destroy, reap. Threads, not asyncio (a spawn runs
in an rq worker); after ``spawn`` returns everything is re-derived from disk and the
``ip_allocations`` rows, in any process. What the backend keeps, and the parts it composes:
docs/firecracker-adapter.md ("The backend's parts")."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.choices import EventType
from agents.models import Agent
from network import netlink
from network.host_access import resolve_agent_host_access
from network.nft.spec import AgentSpec

from ..ownership import MINE, Owner, current_owner, judge_ownership
from . import jail, provision
from .api import FirecrackerApi
from .bootwatch import boot_exit_reason, release_thread_db, watch_boot
from .cancel import CancelSignal
from .failure import read_failure_type
from .logs import LogForwarder, LogSink, forward_remaining
from .orphans import PeriodicSweep
from .pidprobe import kill_confirmed
from .rules import RuleWriter, agent_spec
from .settings import FirecrackerSettings
from .sweeps import OrphanSweeps, default_tracked_provider
from .teardown import Teardown

log = logging.getLogger(__name__)

ABORT_REASON = "spawn aborted (deadline or shutdown)"

Emit = Callable[[str, str, str, dict], None]


class FirecrackerSpawnError(RuntimeError):
    """A spawn that did not produce a VM; ``reason`` is the ``scaler.failed`` detail."""

    def __init__(self, agent_id: str, reason: str, failure_type: str = "unknown"):
        self.agent_id, self.reason, self.failure_type = agent_id, reason, failure_type
        super().__init__(f"firecracker spawn of {agent_id} failed: {reason}")


class FirecrackerCapacityError(FirecrackerSpawnError):
    """The VM table guard: this process already tracks ``maxAgents`` VMs of the scaler.

    Admission enforces ``maxAgents`` against the reservation ledger; this in-memory count is a
    backstop that keeps a host from booting more VMs than the cap if the ledger ever lets more
    through (or the backend is driven directly), not a second admission."""


class _Aborted(Exception):
    pass


@dataclass
class FirecrackerVm:
    """One VM this process tracks; ``host_access`` is the resolved list."""

    agent_id: str
    labels: list[str]
    label_set: dict
    host_access: list[str]
    layout: jail.ChrootLayout
    cancel: CancelSignal
    state: str = "spawning"  # spawning -> running -> destroying
    ip: str | None = None
    mac: str | None = None
    tap: str | None = None
    tap_created: bool = False
    registered: bool = False
    abandoned: bool = False
    spawn_active: bool = True
    failure_reason: str | None = None
    failure_type: str = "unknown"
    jailer: subprocess.Popen | None = None
    logs: LogForwarder | None = None
    cleaned: threading.Event = field(default_factory=threading.Event)

    @property
    def policy(self) -> dict:
        return dict(self.label_set.get("networkPolicy") or {})


def _default_store_host_access(agent_id: str, host_access: list[str]) -> None:
    Agent.objects.filter(agent_id=agent_id).update(host_access=host_access)


class FirecrackerBackend:
    """One Firecracker scaler on this host, built from its :class:`FirecrackerSettings` and what it
    calls back into the console (the IP allocator, the nft client, token minting, events, the log
    sink, the host-access store, the tracked ids and owner of its orphan sweeps, ``boot_over``), each
    described in docs/firecracker-adapter.md ("The backend's parts"). Parts: ``rules``
    (:class:`~.rules.RuleWriter`), ``teardown`` (:class:`~.teardown.Teardown`), ``orphans``
    (:class:`~.sweeps.OrphanSweeps`).
    """

    backend_type = "firecracker"
    logs_source = "firecracker-serial"

    def __init__(
        self,
        settings: FirecrackerSettings,
        ip_allocator: Any,
        nft: Any,
        mint_token: Callable[[str, list[str]], str | None] | None = None,
        emit: Emit | None = None,
        *,
        host_services: Sequence[str] = (),
        log_sink: LogSink | None = None,
        store_host_access: Callable[[str, list[str]], None] | None = _default_store_host_access,
        environ: Mapping[str, str] | None = None,
        tracked_provider: Callable[[str], Any] | None = default_tracked_provider,
        boot_over: Callable[[str], bool] | None = None,
        owner_provider: Callable[[str], Owner] = current_owner,
    ):
        self.ip_allocator = ip_allocator
        self.nft = nft
        self.mint_token = mint_token
        self._emit_cb = emit
        self.host_services = list(host_services)
        self.log_sink = log_sink
        self.store_host_access = store_host_access
        self.environ = os.environ if environ is None else environ
        self.tracked_provider = tracked_provider
        self.boot_over = boot_over
        self.owner_provider = owner_provider
        self._lock = threading.RLock()
        self._vms: dict[str, FirecrackerVm] = {}
        self._sweeper: PeriodicSweep | None = None
        self.rules = RuleWriter(nft, ip_allocator)
        self.reload(settings)

    def reload(self, settings: FirecrackerSettings) -> None:
        """Use ``settings`` from now on (the next spawn, teardown and sweep); tracked VMs keep running."""
        self.settings = settings
        self.name = settings.name
        self.teardown = Teardown(settings, self.rules, self.ip_allocator)
        self.orphans = OrphanSweeps(
            settings,
            self.nft,
            self.ip_allocator,
            self.rules,
            self._sweep_tracked,
            log_sink=self.log_sink,
            owner=self.owner,
        )

    # ---- bookkeeping ----------------------------------------------------------------------

    def active_count(self) -> int:
        with self._lock:
            return len(self._vms)

    def tracked_ids(self) -> set[str]:
        with self._lock:
            return set(self._vms)

    def get(self, agent_id: str) -> FirecrackerVm | None:
        with self._lock:
            return self._vms.get(agent_id)

    def chroot_dir(self, agent_id: str):
        return jail.chroot_dir(self.settings.chroot_base_dir, agent_id)

    def owner(self) -> Owner:
        """This console's claim on the scaler's VMs (``owner_provider(name)``, read at each use)."""
        return self.owner_provider(self.name)

    def _sweep_tracked(self) -> set[str]:
        tracked = set(self.tracked_ids())
        if self.tracked_provider is not None:
            tracked |= set(self.tracked_provider(self.name))  # a failure here aborts the sweep: never reap blind
        return tracked

    def _emit(self, agent_id: str, type_: str, detail: str, payload: dict | None = None) -> None:
        if self._emit_cb is None:
            return
        try:
            self._emit_cb(agent_id, type_, detail, payload or {})
        except Exception:  # an event sink must not break a spawn or a cleanup
            log.warning("event emitter failed for %s %s", agent_id, type_, exc_info=True)

    def rule_spec(self, ip: str, label_set: Mapping, host_access: Sequence[str], port: str | None = None) -> AgentSpec:
        """The isolation rules of one VM of this scaler (``rules.agent_spec`` with its gateway),
        bound to its TAP ``port``."""
        return agent_spec(ip, self.settings.gateway, label_set, host_access, port)

    # ---- spawn ----------------------------------------------------------------------------

    def spawn(
        self,
        agent_id: str,
        label_set: Mapping[str, Any],
        limits: Any = None,
        orchestrator_url: str = "",
        *,
        labels: Sequence[str] | None = None,
        cancel: CancelSignal | None = None,
        timeout_s: float | None = None,
        host_access: Sequence[str] | None = None,
        mmds: Callable[[], dict] | None = None,
    ) -> FirecrackerVm:
        """Boot one VM and return its record once MMDS holds the bootstrap data. ``label_set``: the
        camelCase label-set entry; ``limits``: effective ``cpus``/``memory_bytes`` or None; ``labels``:
        the agent's (default: the set's); ``cancel``/``timeout_s``: the caller's deadline or shutdown, or
        one armed here; ``host_access``: resolved (default: from ``networkPolicy``, ``orchestrator_url``
        and the host services); ``mmds``: builds the MMDS document once the API socket answers (default:
        ``mint_token`` and ``jail.build_mmds_payload``). Any failure emits one ``scaler.failed``, removes
        everything created and raises :class:`FirecrackerSpawnError`.
        """
        s = self.settings
        cancel = cancel or CancelSignal()
        label_set = dict(label_set)
        with self._lock:
            if agent_id in self._vms:
                raise ValueError(f"agent {agent_id} is already tracked by scaler {self.name}")
            if len(self._vms) >= s.max_agents:
                raise FirecrackerCapacityError(
                    agent_id,
                    f"VM table guard: scaler {self.name} already tracks maxAgents ({s.max_agents}) VMs in this "
                    "process although admission let this one through",
                )
            layout = jail.ChrootLayout.for_agent(s.chroot_base_dir, agent_id)
            if host_access is None:
                host_access = resolve_agent_host_access(
                    label_set.get("networkPolicy"), orchestrator_url, s.gateway, self.host_services
                )
            vm = FirecrackerVm(
                agent_id=agent_id, labels=list(labels or label_set.get("labels") or []), label_set=label_set,
                host_access=list(host_access), layout=layout, cancel=cancel,
            )  # fmt: skip
            self._vms[agent_id] = vm

        def on_cancel() -> None:
            self.abandon_spawn(agent_id, cancel.reason or ABORT_REASON)
            release_thread_db()

        unlisten = cancel.add_callback(on_cancel)
        timer = cancel.cancel_after(timeout_s, ABORT_REASON) if timeout_s else None
        try:
            if self.store_host_access is not None:
                self.store_host_access(agent_id, vm.host_access)
            self._boot(vm, limits, orchestrator_url, mmds)
            with self._lock:
                if vm.abandoned:
                    raise _Aborted()
                vm.state = "running"
            self._emit(agent_id, EventType.READY, "microVM booted")
            self._emit(agent_id, EventType.CONNECTING, "waiting for agent WS registration from VM")
            return vm
        except BaseException as e:
            reason = (
                vm.failure_reason
                or (cancel.reason if cancel.is_set() else None)
                or (None if isinstance(e, _Aborted) else boot_exit_reason(vm, s.exit_grace_s))
                or str(e)
                or type(e).__name__
            )
            self.abandon_spawn(agent_id, reason)
            raise FirecrackerSpawnError(agent_id, vm.failure_reason or reason, vm.failure_type) from e
        finally:
            unlisten()
            if timer is not None:
                timer.cancel()
            with self._lock:
                vm.spawn_active = False
                cleanup_now = vm.abandoned and not vm.cleaned.is_set()
            if cleanup_now:
                self._cleanup_failed_spawn(vm)

    def _check(self, vm: FirecrackerVm) -> None:
        if vm.cancel.is_set() or vm.abandoned:
            raise _Aborted()

    def _boot(self, vm: FirecrackerVm, limits: Any, orchestrator_url: str, mmds: Callable[[], dict] | None) -> None:
        s, ls, aid = self.settings, vm.label_set, vm.agent_id
        self._emit(aid, EventType.PROVISIONING, "preparing rootfs and kernel")
        jail.check_free_space(s.chroot_base_dir, s.min_free_bytes)  # the disk guard: ChrootVolumeFull
        alloc = self.ip_allocator.allocate(aid, self.name)
        vm.ip, vm.mac, vm.tap = alloc.ip, alloc.mac, alloc.tap_device
        self._check(vm)
        self._emit(aid, EventType.NETWORK, f"configuring TAP device {vm.tap}")
        netlink.create_tap(vm.tap, s.bridge_name, isolated=True, netns=s.netns)
        vm.tap_created = True
        self._emit(aid, EventType.NETWORK, f"allocating IP {vm.ip}")
        self.rules.write(
            vm.ip, s.gateway, ls, vm.host_access, vm.tap
        )  # not between a teardown's holder check and its delete
        self._check(vm)
        vcpus, mib = jail.resolve_vm_shape(limits, ls, s.scaler_shape())
        initrd = ls.get("initrdPath") or s.initrd_path
        config = jail.build_vm_config(
            ip=vm.ip, gateway=s.gateway, netmask=s.netmask, mac=vm.mac, tap=vm.tap, vcpus=vcpus, mem_mib=mib,
            initrd=bool(initrd),
        )  # fmt: skip
        jail.prepare_chroot(
            base=s.chroot_base_dir, agent_id=aid, rootfs_path=ls.get("rootfsPath") or "",
            kernel_path=ls.get("kernelPath") or s.kernel_path, initrd_path=initrd,
            overlay_mib=int(ls.get("overlayDriveSizeMib") or jail.DEFAULT_OVERLAY_MIB),
            config=config, uid=s.uid, gid=s.gid, require_sudo=s.require_sudo,
            owner_labels={"kici-managed": "true", **self.owner().labels(), "kici-agent-id": aid},
        )  # fmt: skip
        self._check(vm)
        self._emit(aid, EventType.PROVISIONING, "booting microVM")
        vm.jailer = self._launch_jailer(vm)
        vm.logs = LogForwarder(aid, vm.layout.serial_log, vm.layout.vmm_log, self.log_sink).start()
        threading.Thread(
            target=watch_boot, args=(vm, s, lambda: self._booting(vm), self.abandon_spawn),
            name=f"fc-watch:{aid}", daemon=True,
        ).start()  # fmt: skip
        self._wait_for_socket(vm)
        if mmds is not None:
            payload = mmds()
            self._check(vm)
        else:
            token = self.mint_token(aid, vm.labels) if self.mint_token else None
            self._check(vm)
            env = jail.forwarded_env(self.environ, ls.get("env"), lambda m: log.warning("%s: %s", aid, m))
            payload = jail.build_mmds_payload(
                orchestrator_url=orchestrator_url, agent_id=aid, labels=vm.labels, gateway=s.gateway,
                token=token, backpressure_mode=ls.get("backpressureMode"), env=env,
            )  # fmt: skip
        FirecrackerApi(str(vm.layout.socket), vm.cancel).put_mmds(payload)

    def _launch_jailer(self, vm: FirecrackerVm) -> subprocess.Popen:
        s = self.settings
        argv = [s.jailer_path, *jail.jailer_args(vm.agent_id, s.firecracker_path, s.uid, s.gid, s.chroot_base_dir)]
        if s.netns:
            argv = ["ip", "netns", "exec", s.netns, *argv]
        argv = jail.sudo_wrap(argv, s.require_sudo)
        serial = jail.open_vm_file(vm.layout.serial_log, os.O_WRONLY | os.O_APPEND)
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=serial, stderr=serial, start_new_session=True, close_fds=True
            )
        finally:
            os.close(serial)

    def _wait_for_socket(self, vm: FirecrackerVm) -> None:
        s = self.settings
        api = FirecrackerApi(str(vm.layout.socket), vm.cancel, timeout=1.0)
        deadline = time.monotonic() + s.socket_wait_s
        while True:
            if s.require_sudo:
                # Only what the jailer and the VM create: never the chroot's base images (a hard link
                # shares the operator's inode). chmod -R follows no link it meets below run/.
                subprocess.run(
                    jail.sudo_wrap(
                        ["chmod", "-R", "go+rX", str(vm.layout.socket.parent), str(vm.layout.pid_file)], True
                    ),
                    capture_output=True,
                )
            if api.is_ready():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Firecracker API socket not ready within {s.socket_wait_s:g}s for agent {vm.agent_id}"
                )
            if vm.cancel.wait(0.1):
                raise _Aborted()

    def _booting(self, vm: FirecrackerVm) -> bool:
        """Whether the boot watcher of ``vm`` still watches: tracked, not abandoned, registered or destroyed."""
        with self._lock:
            return (
                self._vms.get(vm.agent_id) is vm and not vm.abandoned and not vm.registered and vm.state != "destroying"
            )

    def mark_registered(self, agent_id: str) -> None:
        """The agent registered: its VM has booted, so a later exit is no longer a boot failure."""
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is not None:
                vm.registered = True

    def detach(self, agent_id: str) -> None:
        """Stop watching a VM whose boot is over (registered, or ended by someone else): the watcher
        goes quiet and the log tail stops. The VM itself is untouched."""
        vm = self.get(agent_id)
        self.mark_registered(agent_id)
        if vm is not None and vm.logs is not None:
            vm.logs.stop(2)

    def hand_over(self, agent_id: str) -> None:
        """The spawn of ``agent_id`` returned: stop this process's watcher and log tail (``detach``)
        and forget the VM. The VM runs on; every later look at it (the boot check, destroy, reap)
        works from disk, from any process of the host."""
        vm = self.get(agent_id)
        if vm is None:
            return
        self.detach(agent_id)
        with self._lock:
            if self._vms.get(agent_id) is vm:
                del self._vms[agent_id]

    def clear_mmds(self, agent_id: str) -> None:
        """``PUT /mmds`` with empty meta-data, after the agent's config.ack. Raises API errors."""
        FirecrackerApi(str(jail.api_socket_path(self.chroot_dir(agent_id))), timeout=5).clear_mmds()

    def ensure_host_ready(self) -> bool:
        """Provision bridge, baseline and isolation when autoProvisionHost is set (see ``provision``)."""
        return provision.ensure_host_ready(self)

    # ---- failure and teardown -------------------------------------------------------------

    def abandon_spawn(self, agent_id: str, reason: str) -> bool:
        """Give up on a spawn from outside ``spawn``'s own flow (deadline, jailer exit) or from its catch.

        Idempotent: the first caller wins and returns True; later ones (and calls for an agent that
        is not tracked or is being destroyed, or whose boot ``boot_over`` says is over) return
        False. Emits ``scaler.failed`` with ``reason`` and the failure type read from the serial
        log, aborts in-flight API calls, and removes rules, TAP, IP, directory (now, or when the
        spawn thread unwinds if it is still running).
        """
        vm = self.get(agent_id)
        if vm is not None and not vm.spawn_active and self.boot_over is not None and self.boot_over(agent_id):
            self.mark_registered(agent_id)
            return False
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is None or vm.abandoned or vm.state == "destroying":
                return False
            vm.abandoned = True
            vm.failure_reason = reason
            vm.failure_type = read_failure_type(vm.layout.serial_log)
            cleanup_now = not vm.spawn_active
        log.warning("firecracker spawn of %s abandoned: %s", agent_id, reason)
        self._emit(agent_id, EventType.FAILED, reason, {"reason": reason, "failureType": vm.failure_type})
        vm.cancel.cancel(reason)
        if cleanup_now:
            self._cleanup_failed_spawn(vm)
        return True

    def _cleanup_failed_spawn(self, vm: FirecrackerVm) -> None:
        if vm.cleaned.is_set():
            return
        vm.cleaned.set()
        self.teardown.stop_vm_process(vm.layout.chroot, vm.jailer, graceful=False)
        if vm.logs is not None:
            vm.logs.stop()
        self.teardown.remove_network(vm.agent_id, vm.ip, vm.tap if vm.tap_created else None, release=vm.ip is not None)
        self.teardown.remove_vm_dir(vm.agent_id)
        with self._lock:
            if self._vms.get(vm.agent_id) is vm:
                del self._vms[vm.agent_id]

    def destroy(self, agent_id: str) -> bool:
        """Ctrl-Alt-Del, wait ≤ ``destroy_wait_s`` (200 ms polls), SIGKILL only a confirmed VM process,
        then rules, TAP, IP row and directory. Works for VMs spawned by another process (state
        re-derived from disk and the allocation row). Returns False when there was nothing."""
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is not None:
                if vm.state == "destroying":
                    return False
                vm.state = "destroying"
        chroot = self.chroot_dir(agent_id)
        row = self.teardown.owned_allocation(agent_id)
        if vm is None and row is None and not chroot.parent.exists():
            return False
        self.teardown.stop_vm_process(chroot, vm.jailer if vm is not None else None, graceful=True)
        if vm is not None and vm.logs is not None:
            vm.logs.stop()
        ip = vm.ip if vm is not None else (row.ip if row else None)
        tap = (vm.tap if vm.tap_created else None) if vm is not None else (row.tap_device if row else None)
        self.teardown.remove_network(agent_id, ip, tap, release=ip is not None)
        self.teardown.remove_vm_dir(agent_id)
        with self._lock:
            if vm is not None and self._vms.get(agent_id) is vm:
                del self._vms[agent_id]
        return True

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-reclaim a VM this backend does not track.

        False (nothing touched) when tracked, when ``<base>/firecracker/<id>`` does not exist, or
        when its owner file is not this console's (``ownership.judge_ownership``: another
        console's, or unknown; logged). Otherwise forwards the remaining logs, SIGKILLs a confirmed
        VM process, removes rules, TAP and IP only when the allocation row names this scaler,
        always removes the directory: True.
        """
        if agent_id in self.tracked_ids():
            return False
        chroot = self.chroot_dir(agent_id)
        if not chroot.parent.is_dir():
            return False
        ownership = judge_ownership(jail.read_owner(self.settings.chroot_base_dir, agent_id), self.owner())
        if ownership.ownership != MINE:
            log.warning("reap_unowned(%s): VM dir left: %s", agent_id, ownership.reason)
            return False
        forward_remaining(agent_id, chroot / "serial-console.log", chroot / "vmm.log", self.log_sink)
        kill_confirmed(chroot)
        row = self.teardown.owned_allocation(agent_id)
        if row is not None:
            self.teardown.remove_network(agent_id, row.ip, row.tap_device, release=True)
        self.teardown.remove_vm_dir(agent_id)
        return True

    # ---- periodic orphan sweep ------------------------------------------------------------

    def start_periodic_sweep(self, interval_s: float | None = None) -> PeriodicSweep:
        """Start (or return the running) 15-minute orphan sweep for this scaler (non-reentrant)."""
        if self._sweeper is None:
            self._sweeper = PeriodicSweep(
                lambda: self.orphans.cleanup_orphans(), interval_s or 900.0, name=f"fc-sweep:{self.name}"
            )
        return self._sweeper.start()

    def stop_periodic_sweep(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
