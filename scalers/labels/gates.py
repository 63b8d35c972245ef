"""Gates (labels a job must carry to reach a label set) and the auto labels of enriched label sets and
spawned agents, SPEC (a.6), (b), (d)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .canonical import dedupe
from .platforms import PlatformLike, host_arch, host_os, os_arch_labels, plain_taints, platform_to_taints
from .roles import role_labels


def label_set_gate(
    labels: Iterable[str],
    mandatory_labels: Iterable[str] = (),
    platform: PlatformLike | None = None,
) -> list[str]:
    """The gate of one label set: labels a job must carry to be routed there.

    Gate = lower-cased ``mandatory_labels`` ∪ ``platform_to_taints(platform)`` ∪ plain
    taints present in this set's own ``labels`` (de-duplicated, in that order).
    Source: SPEC (b) per-label-set gate, SPEC (a.6) gate reachability.
    """
    labels = list(labels)
    return dedupe([m.strip().lower() for m in mandatory_labels] + platform_to_taints(platform) + plain_taints(labels))


def unreachable_gate_labels(
    labels: Iterable[str],
    mandatory_labels: Iterable[str] = (),
    platform: PlatformLike | None = None,
) -> list[str]:
    """Gate labels a job could never satisfy on this label set (SPEC a.6).

    Reachable = the set's labels ∪ platform taints. In practice only a
    ``mandatoryLabels`` entry absent from the set is returned.
    """
    labels = [label.strip().lower() for label in labels]
    reachable = set(labels) | set(platform_to_taints(platform))
    return [g for g in label_set_gate(labels, mandatory_labels, platform) if g not in reachable]


def scaler_identity_labels(scaler_name: str, scaler_type: str) -> list[str]:
    """``[kici:agent:<type>, kici:scaler:<name lower-cased>]``: the two auto labels naming a scaler,
    carried by its enriched label sets and by its agents (SPEC (b), (d))."""
    return [f"kici:agent:{scaler_type}", f"kici:scaler:{scaler_name.lower()}"]


def enrich_label_set(
    labels: Iterable[str],
    *,
    scaler_name: str,
    scaler_type: str,
    roles: Sequence[str] | None = None,
    platform: PlatformLike | None = None,
    os_name: str | None = None,
    arch: str | None = None,
) -> list[str]:
    """Declared labels plus every auto label, for routing (SPEC b "Enriched entries").

    Order: declared labels, os/arch labels, plain platform taints (only from a
    declared ``platform``), ``kici:agent:<type>``, ``kici:scaler:<name>``, role labels;
    duplicates dropped. OS/arch come from ``platform`` when declared; otherwise
    ``os_name``/``arch`` (callers pass the host's for bare-metal and ``linux`` plus
    the host arch for other types; see :func:`routing_entry_for_scaler`).
    """
    declared = [label.strip().lower() for label in labels]
    if platform is not None:
        os_name, arch = platform.os, platform.arch
    auto = os_arch_labels(os_name or host_os(), arch or host_arch())
    return dedupe(
        declared
        + auto
        + platform_to_taints(platform)
        + scaler_identity_labels(scaler_name, scaler_type)
        + role_labels(roles)
    )


def agent_labels(
    labels: Iterable[str],
    *,
    scaler_name: str,
    scaler_type: str,
    roles: Sequence[str] | None = None,
    platform: PlatformLike | None = None,
) -> list[str]:
    """Labels an agent is spawned with (``KICI_LABELS``, the token's labels), SPEC (d).

    Declared labels, ``kici:agent:<type>``, ``kici:scaler:<name>``, role labels, then
    the platform taint tokens (SPEC marks their position UNSURE; they go last).
    Example (roles unset): ``linux,docker,kici:agent:container,kici:scaler:c,
    kici:role:builder,kici:role:init-runner``.
    """
    declared = [label.strip().lower() for label in labels]
    return dedupe(
        declared + scaler_identity_labels(scaler_name, scaler_type) + role_labels(roles) + platform_to_taints(platform)
    )
