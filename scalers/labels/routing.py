"""Routing a job's ``runsOn`` labels to a scaler and label set, SPEC (b)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .gates import enrich_label_set, label_set_gate
from .platforms import host_arch, host_os


@dataclass(frozen=True)
class RoutingEntry:
    """One routable scaler: its enriched label sets and the gate of each.

    ``label_sets[i]`` is the enriched label set ``i`` (a frozenset of lower-case
    labels); ``gates[i]`` its gate. ``declared`` keeps the declared labels per set.
    A ``gates`` tuple whose length differs from ``label_sets`` marks the scaler
    unroutable (SPEC b step 3, "misaligned").
    """

    scaler_name: str
    scaler_type: str
    label_sets: tuple[frozenset[str], ...]
    gates: tuple[tuple[str, ...], ...]
    declared: tuple[tuple[str, ...], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class BackendMatch:
    """Result of :func:`find_backend_for_labels`: the scaler and label-set index."""

    scaler_name: str
    label_set_index: int


def routing_entry_for_scaler(
    scaler: Any,
    *,
    os_name: str | None = None,
    arch: str | None = None,
) -> RoutingEntry:
    """Build the :class:`RoutingEntry` of one scaler config entry.

    ``scaler`` is a ``scalers.config.ScalerEntry`` (or anything with ``name``, ``type``,
    ``roles``, ``platform``, ``mandatory_labels`` and ``label_sets[].labels``).
    ``os_name``/``arch`` default to this host's. OS/arch labels: declared
    ``platform`` wins; else bare-metal uses the host OS and arch; every other type
    runs ``linux`` on the host arch. SPEC (b).
    """
    os_name = os_name or host_os()
    arch = arch or host_arch()
    if scaler.type != "bare-metal":
        os_name = "linux"
    sets = []
    gates = []
    declared = []
    for ls in scaler.label_sets:
        labels = [label.strip().lower() for label in ls.labels]
        declared.append(tuple(labels))
        sets.append(
            frozenset(
                enrich_label_set(
                    labels,
                    scaler_name=scaler.name,
                    scaler_type=scaler.type,
                    roles=scaler.roles,
                    platform=scaler.platform,
                    os_name=os_name,
                    arch=arch,
                )
            )
        )
        gates.append(tuple(label_set_gate(labels, scaler.mandatory_labels, scaler.platform)))
    return RoutingEntry(
        scaler_name=scaler.name,
        scaler_type=scaler.type,
        label_sets=tuple(sets),
        gates=tuple(gates),
        declared=tuple(declared),
    )


def build_routing_entries(
    scalers: Iterable[Any],
    *,
    retiring: Iterable[str] = (),
    os_name: str | None = None,
    arch: str | None = None,
) -> list[RoutingEntry]:
    """Routing entries for every non-retiring scaler, in config order (SPEC b).

    ``retiring`` names scalers that take no new work (SPEC c.8); they are left out.
    """
    retiring = set(retiring)
    return [routing_entry_for_scaler(s, os_name=os_name, arch=arch) for s in scalers if s.name not in retiring]


def find_backend_for_labels(
    job_labels: Iterable[str],
    entries: Sequence[RoutingEntry],
    exclude: Iterable[str] = (),
) -> BackendMatch | None:
    """Pick the scaler and label set for a job's ``runsOn`` labels, SPEC (b).

    * Empty ``job_labels``: the first label set (config order) whose gate is empty.
    * Otherwise, over every entry and label set: skip a scaler whose ``gates`` length
      differs from its label sets (unroutable); skip a set unless every gate label is
      in the job labels; require job labels ⊆ the enriched set; skip a set containing
      any ``exclude`` label; keep the strictly smallest set (first seen wins ties).

    Matching is case-insensitive (everything lower-cased). Returns ``None`` when
    nothing matches (the caller answers ``no-backend``).
    """
    job = {label.strip().lower() for label in job_labels}
    excluded = {label.strip().lower() for label in exclude}
    if not job:
        for entry in entries:
            if len(entry.gates) != len(entry.label_sets):
                continue
            for index, gate in enumerate(entry.gates):
                if not gate:
                    return BackendMatch(entry.scaler_name, index)
        return None

    best: BackendMatch | None = None
    best_size = 0
    for entry in entries:
        if len(entry.gates) != len(entry.label_sets):
            continue
        for index, label_set in enumerate(entry.label_sets):
            gate = entry.gates[index]
            if any(g not in job for g in gate):
                continue
            if not job <= label_set:
                continue
            if excluded and not excluded.isdisjoint(label_set):
                continue
            if best is None or len(label_set) < best_size:
                best = BackendMatch(entry.scaler_name, index)
                best_size = len(label_set)
    return best
