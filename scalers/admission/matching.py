"""The routing view of the database: enriched label sets of every non-retiring scaler.

Adapter between the ``Scaler``/``LabelSet`` rows and the pure :mod:`scalers.labels`
(``routing_entry_for_scaler``, ``find_backend_for_labels``). A :class:`World` is built once per
config version (see :func:`world_version_sql`) and shared by every batch until the config changes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from scalers import labels as labelmod
from scalers.choices import ScalerType
from scalers.resources import ResolvedResources, resolve_resources

from .caps import GlobalCaps, PoolCaps, ScalerCaps


@dataclass(frozen=True)
class LabelSetInfo:
    """One routable label set: row pk, config index, declared labels, enriched set and gate."""

    pk: int
    index: int
    declared: tuple[str, ...]
    enriched: frozenset[str]
    gate: tuple[str, ...]
    resources: Any  # the label set's ``resources`` as imported (dict) or None
    image: str | None = None
    agent_labels: tuple[str, ...] = ()  # labels its agents are spawned with
    #: A job bringing its own image may run here: a container scaler's label set, or a bare-metal
    #: one in container mode (``image`` and no ``binaryPath``), unless it runs the real KiCI agent
    #: (``kiciAgent``: its own image holds the agent).
    runs_job_images: bool = False
    #: ``kiciAgent.orchestratorUrl`` when its sandboxes run the real KiCI agent, else "": only such
    #: a label set, of that orchestrator, can start the agent of a KiCI scale-up event.
    kici_orchestrator_url: str = ""


@dataclass(frozen=True)
class ScalerInfo:
    """One scaler as admission needs it: caps, type, routing data and warm-pool settings."""

    pk: int
    name: str
    type: str
    caps: ScalerCaps
    retiring: bool
    roles: Any
    platform: Any
    label_sets: tuple[LabelSetInfo, ...]
    warm_pool_enabled: bool = False
    warm_pool_size: int = 0
    warm_pool_idle_timeout_seconds: float = 300.0
    config: dict = field(default_factory=dict, compare=False)
    #: Host tools the sweeper found missing (``scalers.backends.tools``): non-empty = not started.
    tools_missing: tuple[str, ...] = ()
    #: ``maxConcurrentSpawns``: backend calls of this scaler that may run at once.
    max_concurrent_spawns: int = 1
    #: ``Scaler.host``: the host owning its sandboxes ("" = the host that reads this).
    host: str = ""
    #: The pause holding it (``scalers.pauses.pause_json``): its own or its host's; None.
    pause: dict | None = field(default=None, compare=False)

    def label_set(self, pk: int) -> LabelSetInfo | None:
        for ls in self.label_sets:
            if ls.pk == pk:
                return ls
        return None


def not_started_reason(name: str, missing: list[str] | tuple[str, ...]) -> str:
    """The refusal and status text of a scaler whose host tools are missing (``missing``: one
    problem per tool, as ``scalers.backends.tools`` words them)."""
    return f"scaler {name} is not started: missing host tools: " + "; ".join(missing)


#: Distinct ``(labels, exclude)`` routes, and resolved resources, a :class:`World` remembers.
MAX_ROUTES = 4096


@dataclass
class World:
    """Everything routing and the caps read from config rows, for one config version."""

    version: str
    glob: GlobalCaps
    defaults: Any
    scalers: dict[int, ScalerInfo]
    pools: dict[int, PoolCaps]
    entries: list[labelmod.RoutingEntry]
    # entries[i] belongs to scaler _entry_scalers[i]; label-set position j -> LabelSetInfo
    _entry_scalers: list[ScalerInfo]
    #: Routes already found for this version: ``(job labels, exclude)`` -> match or None.
    _routes: dict = field(default_factory=dict, compare=False, repr=False)
    #: Resources already resolved for this version: ``(label set pk, job resources)`` -> resolved.
    _resolved: dict = field(default_factory=dict, compare=False, repr=False)

    def by_name(self, name: str) -> ScalerInfo | None:
        for s in self.scalers.values():
            if s.name == name:
                return s
        return None

    def match(self, job_labels, exclude=()) -> tuple[ScalerInfo, LabelSetInfo] | None:
        """Route a job with ``find_backend_for_labels``; ``None`` = no backend.

        Remembered per ``(job_labels, exclude)`` for the life of this World (one config
        version; at most :data:`MAX_ROUTES` distinct ones, then forgotten and found again): a
        route depends on nothing else."""
        key = (tuple(job_labels), tuple(exclude))
        try:
            return self._routes[key]
        except KeyError:
            pass
        route = self._route(job_labels, exclude)
        if len(self._routes) >= MAX_ROUTES:
            self._routes.clear()
        self._routes[key] = route
        return route

    def resolve(self, label_set: LabelSetInfo, job_resources: Any) -> ResolvedResources:
        """``resolve_resources`` of a job's (parsed) resources on ``label_set`` with this version's
        defaults. Remembered per ``(label set, job resources)`` like routes (jobs repeat a few
        shapes; an unhashable value is resolved each time). Raises ``ValueError`` as
        ``resolve_resources`` does (not remembered)."""
        key: tuple[int, Any] | None = (label_set.pk, job_resources)
        try:
            return self._resolved[key]
        except KeyError:
            pass
        except TypeError:  # unhashable: not remembered
            key = None
        resolved = resolve_resources(job_resources, label_set.resources, self.defaults)
        if key is not None:
            if len(self._resolved) >= MAX_ROUTES:
                self._resolved.clear()
            self._resolved[key] = resolved
        return resolved

    def _route(self, job_labels, exclude) -> tuple[ScalerInfo, LabelSetInfo] | None:
        found = labelmod.find_backend_for_labels(job_labels, self.entries, exclude)
        if found is None:
            return None
        for entry, info in zip(self.entries, self._entry_scalers, strict=True):
            if entry.scaler_name == found.scaler_name:
                return info, info.label_sets[found.label_set_index]
        return None  # pragma: no cover - entries and infos are built together


def build_world(
    version: str, config_row: dict, scaler_rows: list[dict], label_set_rows: list[dict], pool_rows: list[dict]
) -> World:
    """Assemble a :class:`World` from plain row dicts (pure; see :mod:`scalers.admission.ledger`).

    ``config_row``: ``global_max_agents``, ``global_max_cpu``, ``global_max_memory_bytes``,
    ``defaults``. Retiring scalers and retired label sets are kept in ``scalers`` (their
    reservations still count) but left out of routing.
    """
    by_scaler: dict[int, list[dict]] = {}
    for ls in label_set_rows:
        if not ls["retired"]:
            by_scaler.setdefault(ls["scaler_id"], []).append(ls)
    scalers: dict[int, ScalerInfo] = {}
    entries = []
    entry_scalers = []
    for row in scaler_rows:
        platform = labelmod.declared_platform(row["config"])
        mandatory = list(row["mandatory_labels"] or [])
        sets = sorted(by_scaler.get(row["id"], []), key=lambda r: r["index"])
        shim = SimpleNamespace(
            name=row["name"],
            type=row["type"],
            roles=row["roles"],
            platform=platform,
            mandatory_labels=mandatory,
            label_sets=[SimpleNamespace(labels=list(ls["labels"] or [])) for ls in sets],
        )
        entry = labelmod.routing_entry_for_scaler(shim)
        infos = tuple(
            LabelSetInfo(
                pk=ls["id"],
                index=ls["index"],
                declared=entry.declared[i],
                enriched=entry.label_sets[i],
                gate=tuple(entry.gates[i]),
                resources=(ls["config"] or {}).get("resources"),
                image=(ls["config"] or {}).get("image"),
                kici_orchestrator_url=str(((ls["config"] or {}).get("kiciAgent") or {}).get("orchestratorUrl") or ""),
                runs_job_images=not (ls["config"] or {}).get("kiciAgent")
                and (
                    row["type"] == ScalerType.CONTAINER
                    or (row["type"] == ScalerType.BARE_METAL and not (ls["config"] or {}).get("binaryPath"))
                ),
                agent_labels=tuple(
                    labelmod.agent_labels(
                        entry.declared[i],
                        scaler_name=row["name"],
                        scaler_type=row["type"],
                        roles=row["roles"],
                        platform=platform,
                    )
                ),
            )
            for i, ls in enumerate(sets)
        )
        info = ScalerInfo(
            pk=row["id"],
            name=row["name"],
            type=row["type"],
            caps=ScalerCaps(
                scaler_id=row["id"],
                max_agents=row["max_agents"],
                max_cpu=row["max_cpu"],
                max_memory_bytes=row["max_memory_bytes"],
                machine_pool_id=row["machine_pool_id"],
            ),
            retiring=row["retiring"],
            roles=row["roles"],
            platform=platform,
            label_sets=infos,
            warm_pool_enabled=row["warm_pool_enabled"],
            warm_pool_size=row["warm_pool_size"],
            warm_pool_idle_timeout_seconds=row["warm_pool_idle_timeout_seconds"],
            config=row["config"] or {},
            tools_missing=tuple(row.get("host_tools_missing") or ()),
            max_concurrent_spawns=row.get("max_concurrent_spawns", 1),
            host=row.get("host") or "",
            pause=row.get("pause"),
        )
        scalers[row["id"]] = info
        if not row["retiring"] and infos:
            entries.append(entry)
            entry_scalers.append(info)
    return World(
        version=version,
        glob=GlobalCaps(
            max_agents=config_row["global_max_agents"],
            max_cpu=config_row["global_max_cpu"],
            max_memory_bytes=config_row["global_max_memory_bytes"],
        ),
        defaults=config_row.get("defaults") or None,
        scalers=scalers,
        pools={
            p["id"]: PoolCaps(pool_id=p["id"], max_cpu=p["max_cpu"], max_memory_bytes=p["max_memory_bytes"])
            for p in pool_rows
        },
        entries=entries,
        _entry_scalers=entry_scalers,
    )


class WorldCache:
    """One :class:`World` per config version, shared by threads (rebuilt when the version changes)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._world: World | None = None

    def get(self, version: str) -> World | None:
        w = self._world
        return w if w is not None and w.version == version else None

    def put(self, world: World) -> None:
        with self._lock:
            self._world = world

    def clear(self) -> None:
        with self._lock:
            self._world = None


WORLD_CACHE = WorldCache()
