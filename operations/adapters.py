"""The calls operation kinds make into the other apps, in one place.

Each function names the API it stands for and the module that owns it: ``agents`` (registry),
``scalers.backends`` (backends, runtimes, isolation), ``scalers.admission`` (release, draining,
teardown), ``scalers.config`` and ``scalers.importing`` (configuration), ``network.nft`` and
``network.host_access`` (rules). Keeping them here means a kind reads as its rule, and an API that
changes shape is adapted once.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

log = logging.getLogger(__name__)


# --- registry (agents) --------------------------------------------------------------------------


def is_registered(agent) -> bool:
    """Whether an agent row says its agent registered and is still live (SPEC d "isRegistered")."""
    from agents.choices import AgentState

    return (
        agent is not None
        and agent.registered_at is not None
        and agent.state in (AgentState.RUNNING, AgentState.DRAINING)
    )


def age_seconds(since: datetime | None, now: datetime | None = None) -> int | None:
    if since is None:
        return None
    return max(0, int(((now or timezone.now()) - since).total_seconds()))


# --- backends (ctr, fc) -------------------------------------------------------------------------


def get_backend(scaler, **options):
    """``scalers.backends.base.get_backend(scaler)`` (ctr); a container backend's nft client runs in
    :data:`NFT_NETNS` when that is set."""
    from scalers.backends.base import get_backend as factory

    if NFT_NETNS and scaler.type == "container" and "nft" not in options:
        from scalers.backends.isolation import nft_table_for

        options["nft"] = nft_client(nft_table_for(scaler))
    if scaler.type == "firecracker":
        if NFT_NETNS:
            options.setdefault("netns", NFT_NETNS)
        try:
            backend = factory(scaler, **options)
        except (ImportError, TypeError):  # a build whose factory cannot yet build from a scaler row
            return firecracker_backend(scaler)
        return backend if hasattr(backend, "orphan_facts") else firecracker_backend(scaler)
    return factory(scaler, **options)


def firecracker_backend(scaler):
    """Fallback when ``get_backend`` gives no orphan API: a ``FirecrackerBackend`` for a firecracker
    Scaler row, its settings from the scaler entry and
    the top-level ``firecracker`` block (SPEC a.6, a.9), the database allocator, the configured nft
    table; in :data:`NFT_NETNS` when set. For sweeps and operations only (it tracks no VM itself:
    live VMs are the active agent rows and the running chroot pids)."""
    from scalers.backends.base import get_backend as factory  # the firecracker adapter (fcint)

    return factory(scaler, netns=NFT_NETNS) if NFT_NETNS else factory(scaler)


def list_kici_containers(scaler) -> list[dict] | None:
    """Every ``kici-managed=true`` container summary on ``scaler``'s runtime (any scaler, any console),
    or None when the runtime cannot be listed (``scalers.backends.sandboxes.list_kici_containers``)."""
    from scalers.backends.sandboxes import list_kici_containers as list_containers

    return list_containers(scaler)


def release(agent_id: str, reason: str) -> Any:
    """``scalers.admission.release(agent_id, reason)`` (adm; idempotent)."""
    from scalers.admission.release import release as admission_release

    return admission_release(agent_id, reason)


def mark_draining(agent_id: str) -> int | None:
    """``scalers.admission.mark_draining(agent_id)`` → active-job count, None when not tracked (adm)."""
    from scalers.admission.draining import mark_draining as admission_mark_draining

    return admission_mark_draining(agent_id)


def clear_draining(agent_id: str) -> None:
    """``scalers.admission.clear_draining(agent_id)`` (adm): undo a drain whose teardown did not happen."""
    from scalers.admission.draining import clear_draining as admission_clear_draining

    admission_clear_draining(agent_id)


def teardown_agent(agent, reason: str) -> bool:
    """``scalers.admission.teardown_agent(agent, reason)`` (adm): destroy the sandbox through its
    backend, mark the agent destroyed, release its reservation. False when the destroy failed (the
    agent stays ``destroying`` with its reservation; adm's sweeper retries) or it was released already."""
    from scalers.admission.release import teardown_agent as admission_teardown

    return admission_teardown(agent, reason, destroy_reason="shutdown")


def teardown_lost_agent(
    agent_pk: int, state: str, last_heartbeat, *, reason: str, failure_reason: str
) -> tuple[str, str]:
    """Release one lost agent (``operations.kinds.lost_agents``) → ``(TargetOutcome, detail)``.

    A compare-and-swap moves the row from ``state`` with exactly ``last_heartbeat`` (a datetime or
    None, as planned) to ``destroying``; a row that heartbeated or changed state since is left alone
    (``skipped``, saying what it is now). Then ``scalers.admission.teardown_agent`` with
    ``final_state=failed`` and destroy reason ``heartbeat-timeout``: the backend removes the sandbox
    remains, the agent ends ``failed`` with ``failure_reason``, the reservation is released. A
    destroy that raises leaves the agent ``destroying`` with its reservation (``failed``; adm's
    sweeper retries the teardown).
    """
    from agents.choices import AgentState
    from agents.models import Agent
    from scalers.admission.release import teardown_agent as admission_teardown

    from .choices import TargetOutcome

    now = timezone.now()
    moved = Agent.objects.filter(pk=agent_pk, state=state, last_heartbeat=last_heartbeat).update(
        state=AgentState.DESTROYING, updated_at=now
    )
    if not moved:
        row = Agent.objects.filter(pk=agent_pk).values("state", "last_heartbeat").first()
        if row is None:
            return TargetOutcome.SKIPPED, "the agent row is gone"
        if row["last_heartbeat"] != last_heartbeat:
            return (
                TargetOutcome.SKIPPED,
                f"it heartbeated since the re-check (last heartbeat {row['last_heartbeat']}): not lost",
            )
        return TargetOutcome.SKIPPED, f"it is {row['state']} now, no longer {state}"
    agent = Agent.objects.select_related("scaler").get(pk=agent_pk)
    released = admission_teardown(
        agent, reason, final_state=AgentState.FAILED, failure_reason=failure_reason, destroy_reason="heartbeat-timeout"
    )
    agent.refresh_from_db()
    if agent.state != AgentState.FAILED:
        return (
            TargetOutcome.FAILED,
            f"the backend could not remove its remains; the agent stays {agent.state} with its reservation and the sweeper retries",
        )
    return TargetOutcome.DONE, "remains removed, agent failed, " + (
        "reservation released" if released else "it held no reservation"
    )


def teardown_retired_scaler(scaler, reason: str) -> str:
    """Tear down one empty retiring scaler as adm's ``retirement_sweep`` does for all of them (SPEC
    c.8): the backend's optional ``teardown()``, then a ``ScalerTeardown`` row. Refuses (ValueError)
    when the scaler is not retiring or still holds an active agent or a reservation."""
    from agents.choices import ACTIVE_STATES
    from scalers.models import Reservation, Scaler, ScalerTeardown

    scaler = Scaler.objects.get(pk=scaler.pk)
    if not scaler.retiring:
        raise ValueError(f"scaler {scaler.name!r} is not retiring")
    if scaler.agents.filter(state__in=ACTIVE_STATES).exists() or Reservation.objects.filter(scaler=scaler).exists():
        raise ValueError(f"scaler {scaler.name!r} still holds agents or reservations")
    detail = reason
    try:
        hook = getattr(get_backend(scaler), "teardown", None)
        if callable(hook):
            hook()
            detail += "; backend teardown ran"
    except Exception as exc:  # noqa: BLE001 - recorded; the scaler is empty either way
        detail += f"; backend teardown failed: {exc}"
    row, created = ScalerTeardown.objects.get_or_create(scaler=scaler, defaults={"detail": detail})
    return detail if created else f"already torn down at {row.torn_down_at:%Y-%m-%d %H:%M:%S}"


# --- config (cfg) -------------------------------------------------------------------------------


def config_paths(params: dict) -> tuple[str | None, str | None]:
    path = params.get("config_path") or settings.KICI_SCALER_CONFIG_PATH
    drop_in = params.get("config_dir") or settings.KICI_SCALER_CONFIG_DIR
    return path, drop_in


def load_config(path: str, drop_in_dir: str | None):
    """``scalers.config.loader.load_scalers_config`` (cfg); raises ``ConfigInvalid`` with every problem."""
    from scalers.config.loader import load_scalers_config

    return load_scalers_config(path, drop_in_dir)


def apply_config(config, source: str):
    """``scalers.importing.apply_scalers_config`` (cfg): one transaction; returns its ImportSummary."""
    from scalers.importing import apply_scalers_config

    return apply_scalers_config(config, source)


# --- network (net) ------------------------------------------------------------------------------


#: Network namespace the nft commands (and Firecracker links) of operations run in; None = the host's
#: own. Tests set it to a namespace they created, so no rule or link of theirs lands on the host.
NFT_NETNS: str | None = None


def nft_client(table: str):
    """``network.nft.apply.NftClient(table)`` (net), in :data:`NFT_NETNS` when set."""
    from network.nft.apply import NftClient

    return NftClient(table, netns=NFT_NETNS) if NFT_NETNS else NftClient(table)


def isolation_target(scaler) -> tuple[str, str, str] | None:
    """``(table, gateway, subnet)`` of the isolation rules of ``scaler``'s agents, or None when the
    console writes none (event scalers: the machines are someone else's).

    Container and bare-metal agents sit on ``kici-agent-net`` (172.30.0.0/16, gateway 172.30.0.1) in
    the scaler's ``nftTable`` else ``KICI_NFT_TABLE``; Firecracker VMs on the ``firecracker`` block's
    cidr/gateway/table (SPEC a.9).
    """
    from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_SUBNET
    from scalers.backends.isolation import nft_table_for

    if scaler.type in ("container", "bare-metal"):
        return nft_table_for(scaler), ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_SUBNET
    if scaler.type == "firecracker":
        import ipaddress

        from scalers.backends.firecracker.settings import NETWORK_DEFAULTS
        from scalers.models import ConfigState

        net = {**NETWORK_DEFAULTS, **(ConfigState.load().firecracker or {})}
        return str(net["table"]), str(net["gateway"]), str(ipaddress.ip_network(str(net["cidr"]), strict=False))
    return None


def orchestrator_url_for(scaler) -> str:
    """The URL agents of ``scaler`` dial back: its ``orchestratorUrl``, else ``KICI_CONSOLE_URL`` (SPEC d)."""
    return scaler.orchestrator_url or settings.KICI_CONSOLE_URL


def resolve_host_access(host_access: list[str] | None, scaler, gateway: str) -> list[str]:
    """The host access in force for an agent whose label set says ``host_access`` (None = default),
    SPEC g.3 (net ``resolve_agent_host_access`` with the console's host services)."""
    from network.host_access import resolve_agent_host_access, storage_host_access_entries

    return resolve_agent_host_access(
        {"hostAccess": host_access} if host_access is not None else None,
        orchestrator_url_for(scaler),
        gateway,
        storage_host_access_entries(getattr(settings, "KICI_STORAGE_URL", None)),
    )
