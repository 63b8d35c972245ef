"""What the kinds that act through a scaler's backend share: the backend itself, the owner their
evidence names, and the acting loop of the reaping kinds (orphan containers, orphan VMs, stale
isolation rules), where each approved target is handed, with the object its plan kept for it, to
the backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings

from network.nft.apply import NftClient
from scalers.backends.factory import get_backend
from scalers.backends.isolation import nft_table_for
from scalers.backends.ownership import INSTANCE_LABEL
from scalers.choices import ScalerType

from ..choices import TargetOutcome
from .base import Plan, Run, Scope, Target


def backend_for(scaler):
    """``get_backend(scaler)``, its nft commands (and a Firecracker scaler's links) in the network
    namespace ``settings.KICI_NFT_NETNS`` when that is set (tests: no rule lands on the host)."""
    netns = settings.KICI_NFT_NETNS
    if netns and scaler.type == ScalerType.CONTAINER:
        return get_backend(scaler, nft=NftClient(nft_table_for(scaler), netns=netns))
    if netns and scaler.type == ScalerType.FIRECRACKER:
        return get_backend(scaler, netns=netns)
    return get_backend(scaler)


def owner_instance(agent, labels: Mapping[str, str] | None) -> str | None:
    """The console instance a sandbox belongs to, for its evidence: its agent row's, else the
    sandbox's own ``kici-instance-id`` (a container's labels, a VM's owner file), since an orphan
    often has no row; None when neither says."""
    return (agent.owner_instance if agent else "") or (labels or {}).get(INSTANCE_LABEL) or None


def act_on_planned(
    run: Run,
    scope: Scope,
    plan: Plan,
    targets: list[Target],
    attempt: Callable[[Any, Any, Target], tuple[TargetOutcome, str]],
) -> None:
    """For each target, ``attempt(backend, planned, target)`` with the backend of ``scope.scaler``
    (:func:`backend_for`, built once) and ``planned`` = ``plan.context[target.key]``; it returns the
    ``(outcome, detail)`` to report. An exception from it is reported ``failed`` as
    ``<Type>: <message>`` and the next target still runs."""
    backend = backend_for(scope.scaler)
    for target in targets:
        planned = plan.context[target.key]
        try:
            outcome, detail = attempt(backend, planned, target)
        except Exception as exc:  # noqa: BLE001 - one target failing does not stop the others
            run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
            continue
        run.report(target.key, outcome, detail)
