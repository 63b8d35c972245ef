"""Admission and the reservation ledger (SPEC b, c, d draining/retirement; seed manager.d.ts,
scaler-state-store.d.ts).

Public API:

* ``request_scale(labels, job_id, resources=None, run_id="", exclude=(), warm=False) -> ScaleDecision``
* ``release(agent_id, reason) -> bool`` (idempotent), ``teardown_agent(agent, reason, ...)``,
  ``on_spawn_job_failure`` (rq ``on_failure`` of the spawn job), ``spawn_job_exception_handler``
* ``prune_stale_spawns()``, ``expire_unregistered_agents()``, ``reap_failed_spawn_jobs()``,
  ``retry_stuck_teardowns()``
* ``recover_state(instance_id=None, trigger="boot") -> ScalerStateRecovery``
* ``mark_draining(agent_id) -> int | None``, ``clear_draining(agent_id)``, ``retirement_sweep()``
* ``set_console_draining(bool)``; ``CAPACITY_FREED.subscribe(callback)`` (250 ms debounce)

Modules: ``caps`` (pure cap arithmetic), ``matching`` (routing view of the rows), ``warmfit``
(pure WP-14), ``backoff`` (pure), ``ledger`` (SQL), ``decide`` (one batch under the lock),
``queue`` (group commit), ``service`` (request_scale), ``release``, ``draining``, ``recovery``,
``validate``.
"""

from .decide import ScaleDecision, is_console_draining, set_console_draining
from .draining import clear_draining, drain_and_destroy, mark_draining, retirement_sweep
from .queue import AdmissionTimeout, shutdown_queue
from .recovery import ScalerStateRecovery, recover_state
from .release import (
    CAPACITY_FREED,
    expire_unregistered_agents,
    fail_spawn,
    on_spawn_job_failure,
    prune_stale_spawns,
    reap_failed_spawn_jobs,
    release,
    retry_stuck_teardowns,
    spawn_job_exception_handler,
    teardown_agent,
)
from .service import request_scale
from .validate import InvalidScaleRequest, validate_scale_request

__all__ = [
    "AdmissionTimeout",
    "CAPACITY_FREED",
    "InvalidScaleRequest",
    "ScaleDecision",
    "ScalerStateRecovery",
    "clear_draining",
    "drain_and_destroy",
    "expire_unregistered_agents",
    "fail_spawn",
    "is_console_draining",
    "mark_draining",
    "on_spawn_job_failure",
    "prune_stale_spawns",
    "reap_failed_spawn_jobs",
    "recover_state",
    "release",
    "request_scale",
    "retirement_sweep",
    "retry_stuck_teardowns",
    "set_console_draining",
    "shutdown_queue",
    "spawn_job_exception_handler",
    "teardown_agent",
    "validate_scale_request",
]
