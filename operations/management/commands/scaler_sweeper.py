"""``python manage.py scaler_sweeper [--once] [--interval SECONDS]``: the long-running sweeper.

At start it recovers this instance's rows (``recover_state``, trigger ``boot``); then every
``--interval`` seconds it seeks the leadership (``scalers.leader``), recovering again on gaining
it, and runs its units of work: this host's on every host's sweeper, the global ones on the leader
only, the lead checked again before each (which units, and why each runs where:
docs/multi-host.md, "What each sweeper runs"). Every sweep only *plans* operations. SIGTERM /
SIGINT stop it after the current unit of work and release the lead.
"""

from __future__ import annotations

import logging
import signal
import time
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection
from django.utils import timezone

from agents.retention import delete_in_batches, prune_old_records
from audit.models import AuditRecord
from operations import sweeps
from operations.findings import detect_findings
from scalers.backends import factory
from scalers.backends.tools import check_host_tools
from scalers.choices import ScalerType
from scalers.drift import check_isolation_drift
from scalers.jobs import start_all_waiting_spawns
from scalers.kici_agents import resume_follows
from scalers.leader import Leadership, host_lock_key
from scalers.lifecycle import (
    drain_idle_agents,
    expire_unregistered_agents,
    prune_stale_spawns,
    reap_expired_holds,
    reap_failed_spawn_jobs,
    retirement_sweep,
    retry_stuck_teardowns,
)
from scalers.models import RecoveryReport, Scaler, ScaleRequest
from scalers.output_caps import cap_agent_outputs
from scalers.provision_reaper import ProvisionReaper
from scalers.recovery import recover_state
from scalers.samples import prune_samples, take_samples
from scalers.warm_pools import WARM_POOLS, start_warm_pools

log = logging.getLogger("scalers.sweeper")

RECOVERY_REPORTS_KEPT = 200


class Command(BaseCommand):
    help = "Recover on boot and lead the scaler sweeps (stale prune, token TTL, retirement, warm pools)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one round and exit (tests, cron)")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between rounds (default 5)")
        parser.add_argument("--no-warm-pools", action="store_true", help="do not start the warm pools")

    def on_signal(self, signum, frame):
        log.info("scaler sweeper: %s received, stopping", signal.Signals(signum).name)
        self.shutdown = True

    def handle(self, *args, once: bool = False, interval: float = 5.0, no_warm_pools: bool = False, **options):
        if interval <= 0:
            from django.core.management.base import CommandError

            raise CommandError(f"--interval must be positive, got {interval}")
        self.shutdown = False
        self.warm = not no_warm_pools
        self.booted = False
        self.instance_id = settings.KICI_INSTANCE_ID
        self.hosts_ready: set[tuple[int, object]] = set()
        self.leadership = Leadership()
        self.host_lock = Leadership(
            host_lock_key(settings.KICI_HOST_NAME), what=f"the sweeps of host {settings.KICI_HOST_NAME}"
        )
        self.reaper = ProvisionReaper(self.instance_id)
        self.leading = False
        if not once:
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
        try:
            while not self.shutdown:
                self.tick()
                if once:
                    break
                deadline = time.monotonic() + interval
                while not self.shutdown and time.monotonic() < deadline:
                    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        finally:
            self.leadership.release()
            self.host_lock.release()
            connection.close()

    # One round ---------------------------------------------------------------------------------

    def tick(self) -> bool:
        """One round; True when any unit of work did something."""
        leader, became = self.leadership.poll()
        if self.leading and not leader:
            self._run(self.reaper.stand_down)
        self.leading = leader
        did = False
        if not self.booted:
            self.booted = True
            did |= self._run(lambda: recover_state(self.instance_id, trigger="boot") is not None)
        elif became:
            did |= self._run(lambda: recover_state(self.instance_id, trigger="leader-change") is not None)
        for unit in self.host_units() if self.host_lock.poll()[0] else ():
            if self.shutdown:
                return did
            did |= self._run(unit)
        if not self.leading:
            return did
        for unit in self.global_units():
            if self.shutdown or not self._still_leading():
                break
            did |= self._run(unit)
        return did

    def host_units(self) -> tuple:
        """The units of this host's scalers: every host's sweeper runs them (module doc)."""
        return (
            self.handle_host_readiness,
            self.handle_isolation_drift,
            self.handle_output_caps,
            self.handle_stale_spawns,
            self.handle_kici_follows,
            self.handle_token_expiry,
            self.handle_failed_spawn_jobs,
            self.handle_stuck_teardowns,
            self.handle_drains,
            self.handle_expired_holds,
            self.handle_retirement,
            self.handle_warm_pool_idle,
            self.handle_findings,
            self.handle_host_operation_sweeps,
        )

    def global_units(self) -> tuple:
        """The installation's units: only the leading sweeper runs them (module doc)."""
        return (
            self.handle_waiting_spawns,
            self.handle_provision_reap,
            self.handle_warm_pools,
            self.handle_operation_sweeps,
            self.handle_capacity_samples,
            self.handle_old_records,
        )

    def _still_leading(self) -> bool:
        """Re-check the lead before each unit: a lock session lost mid-round (ended by the server,
        the network) means another host may lead now, and the rest of this round would double
        its work. A lost lead stands the reaper down like a lost poll at the start of a round."""
        if self.leadership.poll()[0]:
            return True
        self.leading = False
        self._run(self.reaper.stand_down)
        return False

    def _run(self, unit) -> bool:
        try:
            return bool(unit())
        except Exception:  # one failing unit must not stop the others
            log.exception("scaler sweeper: %s failed", getattr(unit, "__name__", unit))
            return False
        finally:
            close_old_connections()

    # Units of work -----------------------------------------------------------------------------

    def handle_host_readiness(self) -> bool:
        """Every round, for every scaler of this host: check the host tools it needs (a scaler short of one
        is not started, and starts once they appear), then ``ensure_host_ready`` for each not yet readied
        in this version; a failure only degrades that scaler (``Scaler.host_error``, retried next round).
        Design: docs/multi-host.md ("What each sweeper runs").
        """
        did = False
        for scaler in Scaler.objects.on_this_host().filter(retiring=False).exclude(type=ScalerType.EVENT):
            key = (scaler.pk, scaler.updated_at)
            check = check_host_tools(scaler)
            did |= check.changed
            if check.missing:
                self.hosts_ready.discard(key)
                continue
            if key in self.hosts_ready:
                continue
            try:
                factory.get_backend(scaler).ensure_host_ready()
            except Exception as exc:  # noqa: BLE001 - per-scaler degradation
                log.warning("scaler %s: host not ready (spawns will fail until fixed): %s", scaler.name, exc)
                error = f"{type(exc).__name__}: {exc}"[:2000]
                Scaler.objects.filter(pk=scaler.pk).update(host_error=error, host_checked_at=timezone.now())
                continue
            # update() leaves updated_at alone, so the key of this version stays valid.
            Scaler.objects.filter(pk=scaler.pk).update(host_error="", host_checked_at=timezone.now())
            self.hosts_ready.add(key)
            did = True
        return did

    def handle_isolation_drift(self) -> bool:
        """Rules in the kernel against the active agents; what is missing is re-applied (``scalers.drift``)."""
        return bool(check_isolation_drift())

    def handle_output_caps(self) -> bool:
        """Agent output files on this host held to ``KICI_AGENT_OUTPUT_CAP_BYTES`` (``scalers.output_caps``)."""
        return cap_agent_outputs(settings.KICI_AGENT_OUTPUT_CAP_BYTES) > 0

    def handle_stale_spawns(self) -> bool:
        return prune_stale_spawns() > 0

    def handle_kici_follows(self) -> bool:
        return resume_follows() > 0

    def handle_waiting_spawns(self) -> bool:
        """Start admitted spawns waiting for a spawn slot that nobody handed them (a backend call
        lost with its worker, an agent ended while its job was queued)."""
        return start_all_waiting_spawns() > 0

    def handle_token_expiry(self) -> bool:
        return expire_unregistered_agents() > 0

    def handle_failed_spawn_jobs(self) -> bool:
        return reap_failed_spawn_jobs() > 0

    def handle_stuck_teardowns(self) -> bool:
        return retry_stuck_teardowns() > 0

    def handle_drains(self) -> bool:
        return drain_idle_agents() > 0

    def handle_expired_holds(self) -> bool:
        """Held agents past their ``held_until``: their kept sandboxes torn down (``scalers.holds``)."""
        return reap_expired_holds() > 0

    def handle_provision_reap(self) -> bool:
        """The event-provision reaper, when its interval is due: True when it tore something down."""
        result = self.reaper.tick()
        return bool(result and result.condemned)

    def handle_retirement(self) -> bool:
        return retirement_sweep()

    def handle_warm_pool_idle(self) -> bool:
        """The warm pools' idle check of this host's agents, on a host that does not lead (the
        leader's :meth:`handle_warm_pools` ticks both halves)."""
        if not self.warm or self.leading:
            return False
        if not WARM_POOLS.started:
            start_warm_pools(deficits=False)
            return True
        return WARM_POOLS.tick(deficits=False)

    def handle_warm_pools(self) -> bool:
        """The leader's warm-pool tick: its host's idle check and the deficit pass of every pool."""
        if not self.warm:
            return False
        if not WARM_POOLS.started:
            start_warm_pools()
            return True
        return WARM_POOLS.tick()

    def handle_findings(self) -> bool:
        """Every round: the orphan and drift detections of this host's scalers, kept as findings
        for the pages (``operations.findings``); they plan, store and notify nothing."""
        return detect_findings()

    def handle_host_operation_sweeps(self) -> bool:
        """The sweeps planned from this host's runtime (orphan containers and VMs, stale rules, lost
        agents by sandbox, retirement), for this host's scalers: they only *plan* operations;
        nothing is reaped until an approver (or an explicit auto-approve policy) says so."""
        return bool(sweeps.run_periodic_sweeps(timezone.now(), global_scopes=False))

    def handle_operation_sweeps(self) -> bool:
        """The global sweeps (stale reservations, lost agents by heartbeat), plan expiry and the
        check of lost runs; plans only, like the host's."""
        return bool(sweeps.run_periodic_sweeps(timezone.now(), host_scopes=False))

    def handle_capacity_samples(self) -> bool:
        """One capacity sample per scaler when the sample interval has passed (``scalers.samples``)."""
        return take_samples() > 0

    def handle_old_records(self) -> bool:
        """Retention: old scale requests, audit records (``KICI_AUDIT_RETENTION_DAYS``) and recovery
        reports here, agents, events and tokens in ``agents.retention``, capacity samples in
        ``scalers.samples`` (batched; what one round leaves, the next takes)."""
        now = timezone.now()
        cutoff = now - timedelta(hours=settings.KICI_REQUEST_RETENTION_HOURS)
        n = ScaleRequest.objects.filter(decided_at__lt=cutoff).delete()[0]
        audit_cutoff = now - timedelta(days=settings.KICI_AUDIT_RETENTION_DAYS)
        n += delete_in_batches(AuditRecord.objects.filter(at__lt=audit_cutoff))
        n += sum(prune_old_records(now).values())
        n += prune_samples(now)
        keep = list(RecoveryReport.objects.values_list("pk", flat=True)[:RECOVERY_REPORTS_KEPT])
        if len(keep) == RECOVERY_REPORTS_KEPT:
            n += RecoveryReport.objects.exclude(pk__in=keep).delete()[0]
        return n > 0
