"""Label logic: canonical forms, auto-injected labels, gates, routing and overlaps; pure functions
over plain values (no Django, no database). The vocabulary (declared, enriched, gate) and the
module's sections: docs/configuration.md ("Labels")."""

from __future__ import annotations

import platform as _platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal, Protocol

# --------------------------------------------------------------------------- canonical forms

#: Prefix reserved for auto-injected labels. Compared case-insensitively.
RESERVED_PREFIX = "kici:"


def canonicalize_labels(labels: Iterable[str]) -> list[str]:
    """Trim and lower-case each label, keeping order and length (duplicates kept).

    ``canonicalize_labels([" Linux", "GPU", "gpu"]) == ["linux", "gpu", "gpu"]``.
    """
    return [str(label).strip().lower() for label in labels]


def normalize_label_set(labels: Iterable[str]) -> str:
    """Canonical key of a label set: lower-case, de-duplicate, sort, join with ``,``.

    ``normalize_label_set(["Docker", "linux", "linux"]) == "docker,linux"`` and
    ``normalize_label_set([]) == ""``. Labels are also trimmed, so the key agrees
    with :func:`canonicalize_labels`.
    """
    return ",".join(sorted({label.strip().lower() for label in labels}))


def is_reserved_label(label: str) -> bool:
    """True when ``label`` starts with the reserved ``kici:`` prefix (case-insensitive,
    after trimming)."""
    return label.strip().lower().startswith(RESERVED_PREFIX)


def dedupe(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in first-seen order."""
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


# --------------------------------------------------------------------------- roles


ROLE_BUILDER = "builder"
ROLE_INIT_RUNNER = "init-runner"
ROLE_ALL = "all"

JobKind = Literal["execution", "build", "init"]


def normalize_roles(roles: Sequence[str] | None) -> list[str] | None:
    """Normalise a scaler's ``roles``: absent ⇒ ``None`` (all roles);
    containing ``all`` ⇒ ``None``; ``[]`` ⇒ ``[]``; otherwise the list, de-duplicated
    in first-seen order. Unknown role names are the schema's job to refuse."""
    if roles is None:
        return None
    roles = list(roles)
    if ROLE_ALL in roles:
        return None
    return dedupe(roles)


def role_labels(roles: Sequence[str] | None) -> list[str]:
    """Role labels an agent of this scaler carries.

    ``None`` (all) ⇒ ``["kici:role:builder", "kici:role:init-runner"]``; ``[]`` ⇒ ``[]``;
    ``["builder"]`` ⇒ ``["kici:role:builder"]``. Order is always builder, init-runner.
    """
    roles = normalize_roles(roles)
    if roles is None:
        roles = [ROLE_BUILDER, ROLE_INIT_RUNNER]
    return [f"kici:role:{r}" for r in (ROLE_BUILDER, ROLE_INIT_RUNNER) if r in roles]


def roles_allow(roles: Sequence[str] | None, job_kind: JobKind) -> bool:
    """Whether a scaler with ``roles`` may serve a job of ``job_kind``.

    ``execution`` jobs are always allowed; ``build`` (``__build__``) needs the
    builder role, ``init`` (``__init__``) the init-runner role; ``None`` means all.
    Raises ``ValueError`` for an unknown ``job_kind``.
    """
    if job_kind == "execution":
        return True
    roles = normalize_roles(roles)
    if job_kind == "build":
        return roles is None or ROLE_BUILDER in roles
    if job_kind == "init":
        return roles is None or ROLE_INIT_RUNNER in roles
    raise ValueError(f"unknown job kind {job_kind!r}; expected execution, build or init")


# --------------------------------------------------------------------------- platforms


#: Plain (un-prefixed) labels that taint a label set when declared in it: a job must
#: name them to land there. Linux and x64 never taint.
PLAIN_TAINT_LABELS: frozenset[str] = frozenset({"windows", "win32", "macos", "darwin", "arm64", "aarch64", "arm"})


class PlatformLike(Protocol):
    @property
    def os(self) -> str: ...
    @property
    def arch(self) -> str: ...


def host_os() -> str:
    """This machine's OS in the config vocabulary: ``linux``, ``macos`` or ``windows``
    (other platforms are reported by their ``sys.platform`` name)."""
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform == "darwin":
        return "macos"
    if sys.platform in ("win32", "cygwin"):
        return "windows"
    return sys.platform


def host_arch() -> str:
    """This machine's CPU architecture in the config vocabulary: ``x64`` or ``arm64``
    (others are reported lower-cased as ``platform.machine()`` gives them)."""
    machine = _platform.machine().lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x64"
    if machine in ("aarch64", "arm64"):
        return "arm64"
    return machine


def os_arch_labels(os_name: str, arch: str) -> list[str]:
    """``kici:os:*`` / ``kici:arch:*`` labels for an OS and arch.

    linux ⇒ ``kici:os:linux``; macos/darwin ⇒ ``kici:os:macos``, ``kici:os:darwin``;
    windows/win32 ⇒ ``kici:os:windows``, ``kici:os:win32``; x64 ⇒ ``kici:arch:x64``,
    ``kici:arch:amd64``; arm64 ⇒ ``kici:arch:arm64``. Unknown values map to
    ``kici:os:<value>`` / ``kici:arch:<value>``.
    """
    os_name = os_name.lower()
    arch = arch.lower()
    if os_name in ("macos", "darwin"):
        out = ["kici:os:macos", "kici:os:darwin"]
    elif os_name in ("windows", "win32"):
        out = ["kici:os:windows", "kici:os:win32"]
    else:
        out = [f"kici:os:{os_name}"]
    if arch in ("x64", "amd64", "x86_64"):
        out += ["kici:arch:x64", "kici:arch:amd64"]
    elif arch in ("arm64", "aarch64"):
        out += ["kici:arch:arm64"]
    else:
        out += [f"kici:arch:{arch}"]
    return out


def declared_platform(config: Mapping | None) -> PlatformLike | None:
    """The ``platform: {os, arch}`` of a stored scaler entry (``Scaler.config``), None when it
    declares none (or only half of one)."""
    p = (config or {}).get("platform")
    if isinstance(p, Mapping) and p.get("os") and p.get("arch"):
        return SimpleNamespace(os=p["os"], arch=p["arch"])
    return None


def platform_to_taints(platform: PlatformLike | None) -> list[str]:
    """Taints of a declared ``platform``.

    Non-linux OS ⇒ the OS name (``macos`` / ``windows``); arm64 ⇒ ``arm64``.
    Linux/x64 and ``None`` ⇒ ``[]``.
    """
    if platform is None:
        return []
    out = []
    if platform.os != "linux":
        out.append(platform.os)
    if platform.arch == "arm64":
        out.append("arm64")
    return out


def plain_taints(labels: Iterable[str]) -> list[str]:
    """Plain taint tokens present in ``labels`` (lower-cased, first-seen order)."""
    out: list[str] = []
    for label in labels:
        label = label.strip().lower()
        if label in PLAIN_TAINT_LABELS and label not in out:
            out.append(label)
    return out


# --------------------------------------------------------------------------- gates and auto labels


def label_set_gate(
    labels: Iterable[str],
    mandatory_labels: Iterable[str] = (),
    platform: PlatformLike | None = None,
) -> list[str]:
    """The gate of one label set: labels a job must carry to be routed there.

    Gate = lower-cased ``mandatory_labels`` ∪ ``platform_to_taints(platform)`` ∪ plain
    taints present in this set's own ``labels`` (de-duplicated, in that order).
    """
    labels = list(labels)
    return dedupe([m.strip().lower() for m in mandatory_labels] + platform_to_taints(platform) + plain_taints(labels))


def unreachable_gate_labels(
    labels: Iterable[str],
    mandatory_labels: Iterable[str] = (),
    platform: PlatformLike | None = None,
) -> list[str]:
    """Gate labels a job could never satisfy on this label set.

    Reachable = the set's labels ∪ platform taints. In practice only a
    ``mandatoryLabels`` entry absent from the set is returned.
    """
    labels = [label.strip().lower() for label in labels]
    reachable = set(labels) | set(platform_to_taints(platform))
    return [g for g in label_set_gate(labels, mandatory_labels, platform) if g not in reachable]


def scaler_identity_labels(scaler_name: str, scaler_type: str) -> list[str]:
    """``[kici:agent:<type>, kici:scaler:<name lower-cased>]``: the two auto labels naming a scaler,
    carried by its enriched label sets and by its agents."""
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
    """Declared labels plus every auto label, for routing.

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
    """Labels an agent is spawned with (``KICI_LABELS``, the token's labels).

    Declared labels, ``kici:agent:<type>``, ``kici:scaler:<name>``, role labels, then
    the platform taint tokens last.
    Example (roles unset): ``linux,docker,kici:agent:container,kici:scaler:c,
    kici:role:builder,kici:role:init-runner``.
    """
    declared = [label.strip().lower() for label in labels]
    return dedupe(
        declared + scaler_identity_labels(scaler_name, scaler_type) + role_labels(roles) + platform_to_taints(platform)
    )


# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class RoutingEntry:
    """One routable scaler: its enriched label sets and the gate of each.

    ``label_sets[i]`` is the enriched label set ``i`` (a frozenset of lower-case
    labels); ``gates[i]`` its gate. ``declared`` keeps the declared labels per set.
    A ``gates`` tuple whose length differs from ``label_sets`` marks the scaler
    unroutable ("misaligned").
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

    ``scaler`` is a ``scalers.config.schema.ScalerEntry`` (or anything with ``name``, ``type``,
    ``roles``, ``platform``, ``mandatory_labels`` and ``label_sets[].labels``).
    ``os_name``/``arch`` default to this host's. OS/arch labels: declared
    ``platform`` wins; else bare-metal uses the host OS and arch; every other type
    runs ``linux`` on the host arch.
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
    """Routing entries for every non-retiring scaler, in config order.

    ``retiring`` names scalers that take no new work; they are left out.
    """
    retiring = set(retiring)
    return [routing_entry_for_scaler(s, os_name=os_name, arch=arch) for s in scalers if s.name not in retiring]


def find_backend_for_labels(
    job_labels: Iterable[str],
    entries: Sequence[RoutingEntry],
    exclude: Iterable[str] = (),
) -> BackendMatch | None:
    """Pick the scaler and label set for a job's ``runsOn`` labels, case-insensitively: for none, the
    first label set (config order) whose gate is empty; else the strictly smallest set (first seen
    wins ties) whose gate labels are all in the job's, whose enriched labels hold all the job's and
    none of ``exclude`` (a scaler whose ``gates`` and label sets differ in length is unroutable).
    Returns ``None`` when nothing matches (the caller answers ``no-backend``).
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


# --------------------------------------------------------------------------- overlaps


@dataclass(frozen=True)
class LabelSetOverlap:
    """Two different scalers declaring the same normalised label set.

    ``labels`` is the normalised key (``docker,linux``); ``scaler1`` declared it
    first, ``scaler2`` again. ``scaler2_index``/``label_set_index`` locate the second
    declaration in config order (for error paths; not part of equality).
    """

    labels: str
    scaler1: str
    scaler2: str
    scaler2_index: int = field(default=-1, compare=False)
    label_set_index: int = field(default=-1, compare=False)

    @property
    def message(self) -> str:
        """The error text shown for the overlap (kept word for word)."""
        return f'Label set [{self.labels}] overlaps between scalers "{self.scaler1}" and "{self.scaler2}"'


def find_label_set_overlaps(scalers: Iterable[Any]) -> list[LabelSetOverlap]:
    """Cross-scaler label-set overlaps.

    ``scalers`` yields ``(name, label_sets)`` pairs, where ``label_sets`` is an
    iterable of label lists, or objects with ``.name`` and ``.label_sets[].labels``
    (a ``ScalerEntry``). A normalised set declared by two *different* scaler names is
    an overlap ``LabelSetOverlap(labels, first_scaler, later_scaler)``; repeats inside
    one scaler are allowed. One overlap is reported per later declaration.
    """
    first_owner: dict[str, str] = {}
    overlaps: list[LabelSetOverlap] = []
    for scaler_index, scaler in enumerate(scalers):
        if isinstance(scaler, tuple):
            name, label_sets = scaler
            label_lists = [list(ls) for ls in label_sets]
        else:
            name = scaler.name
            label_lists = [list(ls.labels) for ls in scaler.label_sets]
        for ls_index, labels in enumerate(label_lists):
            key = normalize_label_set(labels)
            owner = first_owner.get(key)
            if owner is None:
                first_owner[key] = name
            elif owner != name:
                overlaps.append(LabelSetOverlap(key, owner, name, scaler_index, ls_index))
    return overlaps
