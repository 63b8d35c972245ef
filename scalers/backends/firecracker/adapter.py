"""A ``type: firecracker`` scaler through the common backend protocol (``scalers.backends.base``):
builds the ``FirecrackerBackend`` from the scaler row and maps rows, spawn control and events onto
it. ``spawn`` returns once MMDS holds the token and hands the VM over; :meth:`boot_failure` is
the registration watch's look at it from disk. Details: ``docs/firecracker-adapter.md``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.db import transaction

from agents import tokens
from agents.choices import EventType
from agents.events import record_connecting, record_event
from agents.models import Agent
from consolelog.tail import Opener
from network import netlink
from network.ipalloc_db import DbIpAllocator
from network.nft import apply
from scalers.kici_orchestrator import kici_agent_target, token_context
from scalers.models import ConfigState

from ..base import BootFailure, SpawnAborted, SpawnControl, SpawnError, SpawnResult
from ..failure import AGENT_LOG_LINES, mark_spawn_failed
from ..isolation import IsolationTarget, host_services, resolve_kici_host_access
from ..kici_token import mint_spawn_kici_token, revoke_failed_spawn_kici_token, revoke_recorded_kici_token
from ..spawn_env import console_url, full_labels, kici_agent_pairs, spawn_limits
from . import jail, watch
from .backend import ABORT_REASON, FirecrackerBackend, FirecrackerCapacityError, FirecrackerSpawnError
from .bootwatch import boot_failure_from_disk, release_thread_db
from .cancel import CancelSignal
from .failure import read_failure_type
from .logs import vm_log_files
from .pidprobe import probe_vm_pid
from .settings import FirecrackerSettings
from .sweeps import default_tracked_provider
from .watch import POLL_SECONDS, serial_tail

log = logging.getLogger(__name__)

#: The guest init's serial line once its agent exited (``sandbox_agent/guest_init.sh``): the exit status.
AGENT_EXIT_LINE = re.compile(r"kici-init: agent exited \((\d+)\)")

#: Where the kernel keeps the id of the current boot (a fresh one after every reboot).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str:
    try:
        return Path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return ""


def provision_marker(s: FirecrackerSettings) -> Path:
    """``<chrootBaseDir>/.provisioned-<bridge>``: written once the host is provisioned for ``s``; it
    holds the settings' fingerprint and the boot id, so every worker process of this host skips
    the provisioning a sibling did in this boot for the same settings."""
    return Path(s.chroot_base_dir) / f".provisioned-{s.bridge_name}"


def _marker_text(s: FirecrackerSettings) -> str:
    fingerprint = hashlib.sha256(repr(s).encode()).hexdigest()
    return json.dumps({"settings": fingerprint, "boot": _boot_id()}, sort_keys=True)


class FirecrackerScalerBackend:
    """The ``Backend`` of one firecracker scaler (see ``docs/firecracker-adapter.md``).

    Options: ``netns`` (namespace of bridge/TAPs/table; default ``settings.KICI_FIRECRACKER_NETNS``),
    ``nft`` (an ``NftClient``), ``ip_allocator``, ``environ`` (source of ``KICI_AGENT_ENV_*``),
    ``log_sink``, ``tracked_provider``; any other keyword overrides a ``FirecrackerSettings`` field
    (``socket_wait_s``, ``destroy_wait_s``, ``exit_grace_s``). Raises ``ValueError`` naming the
    field for an invalid entry (``FirecrackerSettings.from_config``), ``TypeError`` for an unknown option.
    """

    type = "firecracker"
    spawns_on_local_host = True

    def __init__(
        self,
        scaler,
        *,
        netns: str | None = None,
        nft: Any = None,
        ip_allocator: Any = None,
        environ: Any = None,
        log_sink: Any = None,
        tracked_provider: Any = None,
        **overrides: Any,
    ):
        self.scaler = scaler
        self._overrides = dict(overrides)
        self.netns = netns if netns is not None else (getattr(django_settings, "KICI_FIRECRACKER_NETNS", None) or None)
        fs = self._settings(scaler)
        self.fc = FirecrackerBackend(
            fs, ip_allocator or DbIpAllocator(fs.cidr, fs.gateway), nft or apply.NftClient(fs.table, netns=self.netns),
            mint_token=self._mint_token, emit=self._emit, host_services=host_services(), log_sink=log_sink,
            environ=environ, tracked_provider=tracked_provider or default_tracked_provider,
            boot_over=watch.boot_over,
        )  # fmt: skip
        self._agents: dict[str, Any] = {}
        self._release_reasons: dict[str, str] = {}
        #: agent id -> (detail, captured serial lines) of the ``scaler.failed`` recorded here.
        self._failed_emitted: dict[str, tuple[str, list[str]]] = {}

    def _settings(self, scaler) -> FirecrackerSettings:
        entry = {**(scaler.config or {}), "name": scaler.name, "maxAgents": scaler.max_agents}
        extra = {"netns": self.netns} if self.netns else {}
        return FirecrackerSettings.from_config(entry, ConfigState.load().firecracker or {}, **extra, **self._overrides)

    def output_files(self) -> list[tuple[Path, Opener]]:
        """Every VM's serial console and VMM log under this scaler's ``chrootBaseDir``, opened
        through ``jail.open_vm_file``, for the output cap (``scalers.output_caps``)."""
        return [(path, jail.open_vm_file) for path in vm_log_files(self.fc.settings.chroot_base_dir)]

    def reload(self, scaler) -> None:
        """Replace the entry read at every spawn; VMs already tracked keep running."""
        self.scaler = scaler
        self.fc.reload(self._settings(scaler))

    # ---- callbacks handed to the Firecracker backend -------------------------------------------

    def _agent(self, agent_id: str):
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = Agent.objects.select_related("scaler").filter(agent_id=agent_id).first()
        return agent

    def _mint_token(self, agent_id: str, labels: list[str]) -> str | None:
        agent = self._agent(agent_id)
        return tokens.mint_registration_token(agent) if agent is not None else None

    def _emit(self, agent_id: str, type_: str, detail: str, payload: dict) -> None:
        agent = self._agent(agent_id)
        if agent is None:
            log.warning("event %s for unknown agent %s: %s", type_, agent_id, detail)
            return
        if type_ == EventType.CONNECTING:  # not once the VM's agent registered (it may beat the emit)
            record_connecting(agent, detail, payload or None)
            return
        if type_ != EventType.FAILED:
            record_event(agent, type_, detail, payload or None)
            return
        self._record_failure(agent, detail, payload)

    def _record_failure(self, agent, detail: str, payload: dict) -> None:
        """``scaler.failed`` + captured serial output; the agent failed (CAS from any state of
        ``SPAWN_FAILURE_ENDS``: the failed spawn's VM is removed, so an agent that registered while
        the spawn was finishing ends too); tokens revoked."""
        captured = serial_tail(self.fc.chroot_dir(agent.agent_id) / "serial-console.log")
        self._failed_emitted[agent.agent_id] = (detail, captured)
        full = detail + ("\n--- captured output ---\n" + "\n".join(captured) if captured else "")
        release_reason = self._release_reasons.get(agent.agent_id, "spawn-failed")
        with transaction.atomic():
            mark_spawn_failed(agent.pk, full)
            record_event(
                agent, EventType.FAILED, full, payload={**(payload or {}), "stage": "boot", "release": release_reason}
            )
        try:
            tokens.revoke_agent_tokens(agent)
        except Exception:  # the token dies with its TTL anyway
            log.warning("could not revoke the tokens of %s", agent.agent_id, exc_info=True)

    # ---- spawn ----------------------------------------------------------------------------------

    def ensure_host_ready(self, *, unless_provisioned: bool = False) -> bool:
        """Provision bridge, forwarding, table, egress and port isolation (``provision``); False when
        ``autoProvisionHost`` is off. Serialised between processes by ``<chrootBaseDir>/.provision-<bridge>.lock``
        (concurrent spawns in forked workers share the bridge probe). Raises what provisioning raises.

        On success the :func:`provision_marker` is written. ``unless_provisioned`` (a spawn) skips
        the work, under the same lock, when the marker matches these settings and this boot and
        the bridge is there (a reboot, a changed entry or a bridge deleted by hand provision again)."""
        s = self.fc.settings
        os.makedirs(s.chroot_base_dir, exist_ok=True)
        marker = provision_marker(s)
        with open(os.path.join(s.chroot_base_dir, f".provision-{s.bridge_name}.lock"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if unless_provisioned and self._provisioned(marker):
                return True
            marker.unlink(missing_ok=True)
            ready = self.fc.ensure_host_ready()
            marker.write_text(_marker_text(s))
        return ready

    def _provisioned(self, marker: Path) -> bool:
        s = self.fc.settings
        try:
            if marker.read_text() != _marker_text(s):
                return False
        except OSError:
            return False
        return not s.auto_provision_host or s.bridge_name in netlink.link_names(netns=s.netns)

    def isolation_target(self) -> IsolationTarget:
        """The VM bridge and each VM's rules from its row (its TAP is its port), for the drift check."""
        s = self.fc.settings

        def spec_for(agent):
            if not agent.ip:
                return None
            port = agent.bridge_port or (agent.backend_context or {}).get("tap") or None
            return self.fc.rule_spec(agent.ip, self._label_set(agent), agent.host_access or [], port)

        return IsolationTarget(self.fc.nft, [s.bridge_name], [s.subnet], spec_for)

    def _label_set(self, agent) -> dict:
        ls = agent.label_set
        entry = dict((ls.config if ls is not None else None) or {})
        policy = {
            k: v for k, v in dict(entry.get("networkPolicy") or {}).items() if k not in ("hostAccess", "host_access")
        }
        if ls is not None and ls.host_access is not None:  # the host-access editor's word wins
            policy["hostAccess"] = list(ls.host_access)
        entry["networkPolicy"] = policy
        return entry

    def _bridge_control(
        self, agent_id: str, control: SpawnControl, cancel: CancelSignal, stop: threading.Event
    ) -> None:
        try:
            while not stop.wait(POLL_SECONDS):
                if control.deadline is not None and time.time() >= control.deadline:
                    self._release_reasons[agent_id] = "spawn-timeout"
                    cancel.cancel(ABORT_REASON)
                    return
                why = control.cancelled()
                if why:
                    cancel.cancel(f"spawn cancelled: {why}")
                    return
        finally:
            release_thread_db()

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        """Boot the agent's VM and return once MMDS holds its token and the VM is handed over (from then on
        :meth:`boot_failure` watches it, from disk). Provisions the host first unless a process of this
        host already did for these settings in this boot; the deadline and ``control.cancelled`` reach
        the backend's ``CancelSignal`` (checked every 0.2 s). Raises ``SpawnAborted`` (deadline,
        cancelled) or ``SpawnError`` once everything created is removed (``event_recorded`` True when
        ``scaler.failed`` was already recorded). Design: docs/firecracker-adapter.md ("Lifetime of a spawn").
        """
        agent_id = agent.agent_id
        control.check("provisioning")
        try:
            self.ensure_host_ready(unless_provisioned=True)
        except Exception as exc:  # fail closed: no VM on an unprovisioned host
            raise SpawnError(f"host provisioning failed: {exc}", "provisioning") from exc
        kici = kici_agent_target(agent.label_set)
        minted: list[str] = []  # the orchestrator token id of a real KiCI agent, once minted
        kici_boot = self._kici_boot(agent, kici, minted) if kici is not None else {}
        self._agents[agent_id] = agent
        cancel, stop = CancelSignal(), threading.Event()
        watch.track(agent_id, self.fc)
        bridge = threading.Thread(
            target=self._bridge_control,
            args=(agent_id, control, cancel, stop),
            name=f"fc-control:{agent_id}",
            daemon=True,
        )
        bridge.start()
        try:
            vm = self.fc.spawn(
                agent_id, self._label_set(agent), spawn_limits(agent),
                kici.ws_url if kici is not None else console_url(agent.scaler),
                labels=full_labels(agent), cancel=cancel, **kici_boot,
            )  # fmt: skip
        except FirecrackerCapacityError as exc:
            self._forget(agent_id)
            raise SpawnError(exc.reason, "capacity") from exc
        except Exception as exc:  # FirecrackerSpawnError and anything before tracking
            self._forget(agent_id)
            if kici is not None and minted:
                revoke_failed_spawn_kici_token(kici, minted[0], agent_id)
            reason = exc.reason if isinstance(exc, FirecrackerSpawnError) else str(exc)
            captured = self._failed_emitted.get(agent_id, ("", []))[1]
            if cancel.is_set() and self._release_reasons.get(agent_id) == "spawn-timeout":
                err: Exception = SpawnAborted("deadline", "boot", reason)
            elif cancel.is_set() and (cancel.reason or "").startswith("spawn cancelled"):
                err = SpawnAborted("cancelled", "boot", reason)
            else:
                err = SpawnError(reason, "boot", captured)
            err.captured_output = captured  # type: ignore[attr-defined]
            err.event_recorded = agent_id in self._failed_emitted  # type: ignore[attr-defined]
            raise err from exc
        finally:
            stop.set()
            bridge.join(2)
        self.fc.hand_over(agent_id)
        self._forget(agent_id)
        policy = self._label_set(agent)["networkPolicy"]
        layout = vm.layout
        context = {
            "chroot": str(layout.chroot),
            "console_path": str(layout.serial_log),
            "vmm_log_path": str(layout.vmm_log),
            "console_logs": {"serial": str(layout.serial_log), "vmm": str(layout.vmm_log)},
            "tap": vm.tap,
            "mac": vm.mac,
            "bridge": self.fc.settings.bridge_name,
            "table": self.fc.settings.table,
            **(token_context(kici, minted[0]) if kici is not None and minted else {}),
        }
        if self.netns:
            context["host_netns"] = self.netns
        return SpawnResult(
            managed_id=agent_id, ip=vm.ip, bridge_port=vm.tap or "", host_access=list(vm.host_access),
            host_access_explicit="hostAccess" in policy, context=context,
        )  # fmt: skip

    def _forget(self, agent_id: str) -> None:
        watch.untrack(agent_id, self.fc)

    def _kici_boot(self, agent, kici, minted: list[str]) -> dict[str, Any]:
        """What a VM running the real KiCI agent of ``kici`` boots with, as ``FirecrackerBackend.spawn``
        keywords: its host access (``resolve_kici_host_access``: by default the orchestrator's port
        on the VM gateway, nothing else of the host) and an MMDS document that carries exactly the
        real agent's environment (``spawn_env.kici_agent_pairs``, steps run in the VM:
        ``KICI_EXECUTION_MODE=firecracker``) under the reference's keys (``jail.agent_env_mmds``),
        with a token the orchestrator mints once the VM answers; its id is appended to ``minted``."""
        gateway = self.fc.settings.gateway
        host_access, _explicit = resolve_kici_host_access(self._label_set(agent)["networkPolicy"], kici, gateway)

        def mmds() -> dict:
            token_id, token = mint_spawn_kici_token(agent, kici, "microVM")
            minted.append(token_id)
            return jail.agent_env_mmds(kici_agent_pairs(agent, token, execution_mode="firecracker"), gateway)

        return {"host_access": host_access, "mmds": mmds}

    # ---- registration -------------------------------------------------------------------------

    def mark_registered(self, agent) -> None:
        """The agent registered: its VM's exit is no longer a boot failure (in every instance of this process)."""
        agent_id = getattr(agent, "agent_id", agent)
        live = watch.live(agent_id)
        if live is not None:
            live.mark_registered(agent_id)
        self.fc.mark_registered(agent_id)

    def clear_mmds(self, agent) -> None:
        """``PUT /mmds`` with empty meta-data (the config.ack). Raises ``FirecrackerApiError``/``OSError``."""
        self.fc.clear_mmds(getattr(agent, "agent_id", agent))

    def boot_failure(self, agent) -> BootFailure | None:
        """The failed boot of a ``connecting`` agent: its VM process is gone (a guest that panicked
        exits). Detail and payload are the boot watcher's (``jailer exited during boot (code 0,
        firecracker pid P exited, <failureType>)``, ``failureType`` from the serial log), with the
        last serial lines. None while the VM runs."""
        chroot = self.fc.chroot_dir(agent.agent_id)
        found = boot_failure_from_disk(chroot)
        if found is None:
            return None
        detail, kind = found
        payload = {"reason": detail, "failureType": kind, "stage": "boot", "release": "spawn-failed"}
        return BootFailure(detail, serial_tail(chroot / "serial-console.log"), payload)

    def captured_output_for(self, agent) -> list[str]:
        """The last 50 serial-console lines of the agent's VM ([] when there is no log)."""
        return serial_tail(self.fc.chroot_dir(agent.agent_id) / "serial-console.log")

    def agent_log_lines(self, agent) -> list[str]:
        """The last :data:`~scalers.backends.failure.AGENT_LOG_LINES` serial-console lines of the
        agent's VM, where the guest's agent writes its log, for the follow of a real KiCI agent
        (``scalers.kici_agents``); [] when there is no log."""
        return serial_tail(self.fc.chroot_dir(agent.agent_id) / "serial-console.log", AGENT_LOG_LINES)

    def sandbox_exit(self, agent) -> str | None:
        """None while the agent's VM runs, else how its agent ended, for the follow of a real KiCI
        agent (``scalers.kici_agents``): ``exited with code N`` from the guest init's last
        ``kici-init: agent exited (N)`` serial line (the init resets the VM when its agent exits),
        ``stopped with its VM (firecracker pid P exited, <failure type>)`` without one, ``has no
        VM`` when its directory is gone. Reads the pid file and serial log only."""
        chroot = self.fc.chroot_dir(agent.agent_id)
        if not chroot.is_dir():
            return "has no VM"
        probe = probe_vm_pid(chroot)
        if probe.running:
            return None
        serial = chroot / "serial-console.log"
        for line in reversed(serial_tail(serial)):
            found = AGENT_EXIT_LINE.search(line)
            if found:
                return f"exited with code {found.group(1)}"
        return f"stopped with its VM (firecracker pid {probe.pid} exited, {read_failure_type(serial)})"

    def sandbox_registered(self, agent) -> None:
        """The real KiCI agent of ``agent`` registered with its orchestrator: its VM's exit is no
        longer a boot failure, and MMDS drops the token (``clear_mmds``, as the reference does on
        the agent's ``config.ack``, which only its orchestrator sees). Raises API errors."""
        self.mark_registered(agent)
        self.clear_mmds(agent)

    # ---- teardown and sweeps ------------------------------------------------------------------

    def destroy(self, agent, reason: str = "shutdown") -> None:
        """Ctrl-Alt-Del, wait, SIGKILL a confirmed VM, then rules, TAP, IP row, directory.

        Works from disk for a VM another process spawned; idempotent. A real KiCI agent's
        orchestrator token is revoked last. Raises ``RuntimeError`` when the VM directory is still
        there afterwards, ``OrchestratorError`` when the orchestrator cannot take the revocation
        (either way the caller keeps the reservation and retries)."""
        agent_id = agent.agent_id
        fc = watch.live(agent_id) or self.fc
        fc.destroy(agent_id)
        self._forget(agent_id)
        if self.fc.chroot_dir(agent_id).parent.exists():
            raise RuntimeError(f"the VM directory of {agent_id} is still present after destroy")
        revoke_recorded_kici_token(agent)

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-reclaim an untracked VM of this scaler; True when reclaimed."""
        if watch.live(agent_id) is not None:
            return False
        return self.fc.reap_unowned(agent_id)

    def plan_orphans(self) -> list:
        """The four orphan passes' targets now (``orphans.OrphanTarget``); changes nothing."""
        return self.fc.orphans.plan_orphans()

    def apply_orphans(self, plan) -> int:
        """Apply ``plan`` re-checking each target; returns sandboxes cleaned + rule sets deleted."""
        report = self.fc.orphans.apply_orphans(plan)
        return int(report.cleaned) + int(report.rules_deleted)

    def cleanup_orphans(self) -> int:
        """``apply_orphans(plan_orphans())``."""
        return self.apply_orphans(self.plan_orphans())

    # The pieces operation kinds use to show evidence and re-check targets one by one.
    def orphan_facts(self):
        return self.fc.orphans.orphan_facts()

    def orphan_recheck(self, target) -> str | None:
        return self.fc.orphans.orphan_recheck(target)

    def orphan_act(self, target) -> None:
        self.fc.orphans.orphan_act(target)

    def chroot_dir(self, agent_id: str):
        return self.fc.chroot_dir(agent_id)
