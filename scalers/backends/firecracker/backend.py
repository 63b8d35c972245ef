"""The Firecracker scaler backend: spawn, abandon, destroy, reap (seed firecracker-backend.d.ts; SPEC h).

Threads, not asyncio: a spawn runs in an rq worker. Per VM the backend keeps a :class:`FirecrackerVm`
in memory; the jailer watcher and the log forwarder are daemon threads of the process that called
``spawn``, so that process must outlive the VM's boot (a long-lived worker, not a forked work-horse).
Everything a *different* process needs (destroy, reap, orphan sweeps) is re-derived from disk (the
chroot and its pid file) and the ``ip_allocations`` rows.
"""

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
from network import netlink
from network.host_access import resolve_agent_host_access
from network.nft.spec import AgentSpec

from ..holders import address_lock
from . import jail, provision
from .api import FirecrackerApi
from .bootwatch import BootWatchMixin, release_thread_db
from .cancel import CancelSignal
from .logs import LogForwarder, LogSink
from .settings import FirecrackerSettings
from .sweeps import SweepMixin, default_tracked_provider
from .teardown import TeardownMixin

log = logging.getLogger(__name__)

ABORT_REASON = "spawn aborted (deadline or shutdown)"

Emit = Callable[[str, str, str, dict], None]


class FirecrackerSpawnError(RuntimeError):
    """A spawn that did not produce a VM; ``reason`` is the ``scaler.failed`` detail."""

    def __init__(self, agent_id: str, reason: str, failure_type: str = "unknown"):
        self.agent_id, self.reason, self.failure_type = agent_id, reason, failure_type
        super().__init__(f"firecracker spawn of {agent_id} failed: {reason}")


class FirecrackerCapacityError(FirecrackerSpawnError):
    """The scaler already runs ``maxAgents`` VMs."""


class _Aborted(Exception):
    pass


@dataclass
class FirecrackerVm:
    """One VM this process tracks (seed ``FirecrackerManagedAgent``); ``host_access`` is the resolved list."""

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
    from agents.models import Agent

    Agent.objects.filter(agent_id=agent_id).update(host_access=host_access)


class FirecrackerBackend(BootWatchMixin, TeardownMixin, SweepMixin):
    """One Firecracker scaler on this host.

    ``settings``: :class:`FirecrackerSettings`. ``ip_allocator``: ``network.ipalloc_db.DbIpAllocator``
    (``allocate(vm_id, scaler_name)``, ``release(vm_id)``, ``allocations(scaler_name=None)``). ``nft``: ``network.nft.apply.NftClient`` on the
    configured table. ``mint_token(agent_id, labels) -> str | None``. ``emit(agent_id, type,
    detail, payload)``: lifecycle events (``scaler.failed`` payload ``{"reason", "failureType"}``).
    ``host_services``: extra default ``hostAccess`` entries (SPEC g.2). ``log_sink(agent_id,
    source, record)``. ``store_host_access(agent_id, entries)``: persists the resolved list on the
    agent record (default: ``agents.Agent.host_access``). ``environ``: source of ``KICI_AGENT_ENV_*``.
    ``tracked_provider(scaler_name)``: ids other processes are spawning or running (default: active
    ``agents.Agent`` rows); orphan sweeps treat them as live.
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
    ):
        self.settings = settings
        self.name = settings.name
        self.ip_allocator = ip_allocator
        self.nft = nft
        self.mint_token = mint_token
        self._emit_cb = emit
        self.host_services = list(host_services)
        self.log_sink = log_sink
        self.store_host_access = store_host_access
        self.environ = os.environ if environ is None else environ
        self._lock = threading.RLock()
        self._vms: dict[str, FirecrackerVm] = {}
        self.tracked_provider = tracked_provider
        self._sweeper = None

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

    def _emit(self, agent_id: str, type_: str, detail: str, payload: dict | None = None) -> None:
        if self._emit_cb is None:
            return
        try:
            self._emit_cb(agent_id, type_, detail, payload or {})
        except Exception:  # noqa: BLE001 - an event sink must not break a spawn or a cleanup
            log.warning("event emitter failed for %s %s", agent_id, type_, exc_info=True)

    def rule_spec(self, ip: str, label_set: Mapping, host_access: Sequence[str]) -> AgentSpec:
        """The isolation rules of one VM: ``saddr`` = its IP, gateway accepted, policy from the label set."""
        policy = dict(label_set.get("networkPolicy") or {})
        return AgentSpec.build(
            address=ip, gateway=self.settings.gateway, allowlist=list(policy.get("allowlist") or []),
            deny_all=bool(policy.get("denyAll", False)), host_access=list(host_access),
        )  # fmt: skip

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
    ) -> FirecrackerVm:
        """Boot one VM (SPEC h spawn sequence) and return its record once MMDS holds the bootstrap data.

        ``label_set``: the label-set entry (camelCase: ``labels``, ``rootfsPath``, ``kernelPath``,
        ``overlayDriveSizeMib``, ``vcpuCount``, ``memSizeMib``, ``env``, ``networkPolicy``,
        ``backpressureMode``). ``limits``: effective limits (``cpus``, ``memory_bytes``) or None.
        ``labels``: the full agent labels (default: the set's). ``cancel``: fired by the caller's
        deadline or shutdown; ``timeout_s``: arms such a deadline here. Any failure emits one
        ``scaler.failed``, removes everything created, and raises :class:`FirecrackerSpawnError`.
        """
        s = self.settings
        cancel = cancel or CancelSignal()
        label_set = dict(label_set)
        with self._lock:
            if agent_id in self._vms:
                raise ValueError(f"agent {agent_id} is already tracked by scaler {self.name}")
            if len(self._vms) >= s.max_agents:
                raise FirecrackerCapacityError(agent_id, f"scaler {self.name} is at maxAgents ({s.max_agents})")
            layout = jail.ChrootLayout.for_agent(s.chroot_base_dir, agent_id)
            host_access = resolve_agent_host_access(
                label_set.get("networkPolicy"), orchestrator_url, s.gateway, self.host_services
            )
            vm = FirecrackerVm(
                agent_id=agent_id, labels=list(labels or label_set.get("labels") or []), label_set=label_set,
                host_access=host_access, layout=layout, cancel=cancel,
            )  # fmt: skip
            self._vms[agent_id] = vm

        def on_cancel() -> None:
            self.abandon_spawn(agent_id, cancel.reason or ABORT_REASON)
            release_thread_db()

        unlisten = cancel.add_callback(on_cancel)
        timer = cancel.cancel_after(timeout_s, ABORT_REASON) if timeout_s else None
        try:
            if self.store_host_access is not None:
                self.store_host_access(agent_id, host_access)
            self._boot(vm, limits, orchestrator_url)
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
                or (None if isinstance(e, _Aborted) else self._boot_exit_reason(vm))
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

    def _boot(self, vm: FirecrackerVm, limits: Any, orchestrator_url: str) -> None:
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
        with address_lock(vm.ip):  # not between a teardown's holder check and its delete
            self.nft.apply_agent(self.rule_spec(vm.ip, ls, vm.host_access))
        self._check(vm)
        vcpus, mib = jail.resolve_vm_shape(limits, ls, s.scaler_shape())
        config = jail.build_vm_config(
            ip=vm.ip, gateway=s.gateway, netmask=s.netmask, mac=vm.mac, tap=vm.tap, vcpus=vcpus, mem_mib=mib
        )
        jail.prepare_chroot(
            base=s.chroot_base_dir, agent_id=aid, rootfs_path=ls.get("rootfsPath") or "",
            kernel_path=ls.get("kernelPath") or s.kernel_path,
            overlay_mib=int(ls.get("overlayDriveSizeMib") or jail.DEFAULT_OVERLAY_MIB),
            config=config, uid=s.uid, gid=s.gid, require_sudo=s.require_sudo,
        )  # fmt: skip
        self._check(vm)
        self._emit(aid, EventType.PROVISIONING, "booting microVM")
        vm.jailer = self._launch_jailer(vm)
        vm.logs = LogForwarder(aid, vm.layout.serial_log, vm.layout.vmm_log, self.log_sink).start()
        threading.Thread(target=self._watch_boot, args=(vm,), name=f"fc-watch:{aid}", daemon=True).start()
        self._wait_for_socket(vm)
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
        with open(vm.layout.serial_log, "ab") as serial:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=serial, stderr=serial, start_new_session=True, close_fds=True
            )

    def _wait_for_socket(self, vm: FirecrackerVm) -> None:
        s = self.settings
        api = FirecrackerApi(str(vm.layout.socket), vm.cancel, timeout=1.0)
        deadline = time.monotonic() + s.socket_wait_s
        while True:
            if s.require_sudo:
                subprocess.run(
                    jail.sudo_wrap(["chmod", "-R", "go+rX", str(vm.layout.chroot)], True), capture_output=True
                )
            if api.is_ready():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Firecracker API socket not ready within {s.socket_wait_s:g}s for agent {vm.agent_id}"
                )
            if vm.cancel.wait(0.1):
                raise _Aborted()

    def mark_registered(self, agent_id: str) -> None:
        """The agent registered: its VM has booted, so a later exit is no longer a boot failure."""
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is not None:
                vm.registered = True

    def clear_mmds(self, agent_id: str) -> None:
        """``PUT /mmds`` with empty meta-data, after the agent's config.ack (SPEC d). Raises API errors."""
        FirecrackerApi(str(jail.api_socket_path(self.chroot_dir(agent_id))), timeout=5).clear_mmds()

    def ensure_host_ready(self) -> bool:
        """Provision bridge, baseline and isolation when autoProvisionHost is set (see ``provision``)."""
        return provision.ensure_host_ready(self)
