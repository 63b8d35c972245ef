"""Apply a validated ``scalers.yaml`` to the database, all or nothing.

Used by ``import_scalers`` and the config reload. Everything happens inside one transaction that
first locks the ``ConfigState`` singleton row, the same row admission locks to serialise its
decisions, so an admission sees either the old configuration or the new one, never a mix. Scalers
missing from the file retire (never deleted: their agents still count until torn down); a host
imports only its own scalers (docs/multi-host.md, "A scaler belongs to a host"); a console value
is kept over the file's and every change is recorded (docs/configuration.md).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.choices import ACTIVE_STATES, EventType
from agents.events import record_event
from audit.choices import AuditAction
from audit.records import record_audit

from .config.loader import ConfigInvalid, ConfigProblem
from .config.schema import LabelSet as LabelSetConfig
from .config.schema import ScalerEntry, ScalersConfig
from .config.warnings import ConfigWarning, config_warnings, entry_warnings
from .models import ConfigState, LabelSet, MachinePool, Reservation, Scaler, this_host

# Label-set rows are matched to config entries by their normalised labels, not by position,
# so that an agent's label_set keeps pointing at the same labels when the file is reordered.
# Rows are parked at these index offsets (pk added, so unique) while being renumbered, and
# retired rows stay parked, clear of the (scaler, index) unique constraint.
_PARKED_BASE = 1_000_000_000
_RETIRED_BASE = 1_500_000_000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigChange:
    """One configuration value an import changed.

    ``value``: its dotted name with the YAML key names (``scalers.alpha.maxAgents``,
    ``scalers.alpha.labelSets[alpha,linux].networkPolicy.hostAccess``, ``globalMaxAgents``);
    ``scaler``: the scaler it belongs to ("" for the global settings); ``old`` / ``new``: the
    values (JSON, None = unset). ``kept``: when the console's value stays in force over the file,
    that value (``in_force`` False: only the file's value changed).
    """

    scaler: str
    value: str
    old: Any
    new: Any
    in_force: bool = True
    kept: Any = None
    operation: int | None = None

    def describe(self, source: str) -> str:
        """One line for the event and the import summary."""
        if self.in_force:
            return f"{self.value}: {_shown(self.value, self.old)} → {_shown(self.value, self.new)} (import of {source})"
        by = f" (operation #{self.operation})" if self.operation else ""
        return (
            f"{self.value}: the file changed {_shown(self.value, self.old)} → {_shown(self.value, self.new)} "
            f"(import of {source}); the console's value {_shown(self.value, self.kept)}{by} stays in force"
        )


def _shown(value: str, item: Any) -> str:
    if item is None:
        return "(default)" if value.endswith(".hostAccess") else "(unset)"
    return json.dumps(item, ensure_ascii=False, separators=(", ", ": "))


def _flatten(data: dict, prefix: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{dotted name: leaf}`` of a nested dict (lists are leaves); names in ``skip`` left out."""
    out: dict[str, Any] = {}
    for key, item in (data or {}).items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if name in skip:
            continue
        if isinstance(item, dict):
            out.update(_flatten(item, name, skip))
        else:
            out[name] = item
    return out


def _value_changes(
    scaler: str, before: dict, after: dict, prefix: str, skip: tuple[str, ...] = ()
) -> list[ConfigChange]:
    old, new = _flatten(before, prefix, skip), _flatten(after, prefix, skip)
    return [
        ConfigChange(scaler, name, old.get(name), new.get(name))
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


@dataclass
class ImportSummary:
    """What :func:`apply_scalers_config` did, by scaler name (config order where possible):
    ``created``, ``changed`` (entry or label sets), ``resurrected`` (retiring, back in the file),
    ``unchanged``, ``retiring`` (newly, missing from the file); ``label_sets`` in the file and
    ``retired_label_sets`` newly retired; machine pools ``pools_removed`` (unreferenced) and
    ``pools_kept`` (still referenced by a retiring scaler or a reservation, so their cap holds);
    ``warnings``: every warning of the file (``scalers.config.warnings``), ``path: message``.
    """

    source: str
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    retiring: list[str] = field(default_factory=list)
    label_sets: int = 0
    retired_label_sets: int = 0
    pools_removed: list[str] = field(default_factory=list)
    pools_kept: list[str] = field(default_factory=list)
    changes: list[ConfigChange] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def names(items: list[str]) -> str:
            return ", ".join(items) if items else "none"

        lines = [
            f"Imported {self.source}: created {names(self.created)}; changed {names(self.changed)}; "
            f"resurrected {names(self.resurrected)}; retiring {names(self.retiring)}; "
            f"unchanged {len(self.unchanged)}; {self.label_sets} label sets"
        ]
        lines += [f"  changed {c.describe(self.source)}" for c in self.changes]
        lines += [f"  kept from the console: {line}" for line in self.overrides]
        lines += [f"  warning: {line}" for line in self.warnings]
        return "\n".join(lines)


def _scaler_fields(entry: ScalerEntry, pools: dict[str, MachinePool]) -> dict[str, Any]:
    cap = entry.resource_cap
    warm = entry.warm_pool
    return {
        "type": entry.type,
        "max_agents": entry.max_agents,
        "max_concurrent_spawns": entry.max_concurrent_spawns,
        "max_cpu": cap.max_cpu if cap else None,
        "max_memory_bytes": cap.max_memory_bytes if cap else None,
        "machine_pool_id": pools[entry.machine_pool].pk if entry.machine_pool else None,
        "mandatory_labels": list(entry.mandatory_labels),
        "roles": entry.roles,
        "orchestrator_url": entry.orchestrator_url or "",
        "warm_pool_enabled": bool(warm and warm.enabled),
        "warm_pool_size": warm.size if warm else 0,
        "warm_pool_idle_timeout_seconds": float(warm.idle_timeout_seconds) if warm else 300.0,
        "config": entry.to_raw(),
    }


def _label_set_fields(ls: LabelSetConfig) -> dict[str, Any]:
    policy = ls.network_policy
    return {
        "labels": list(ls.labels),
        "normalized": ls.normalized,
        "config": ls.model_dump(mode="json", by_alias=True, exclude_none=True),
        "host_access": list(policy.host_access) if policy and policy.host_access is not None else None,
    }


def _differs(obj: Any, fields: dict[str, Any]) -> bool:
    for name, value in fields.items():
        current = getattr(obj, name)
        if isinstance(current, float) or isinstance(value, float):
            if current is None or value is None:
                if current is not value:
                    return True
                continue
            if float(current) != float(value):
                return True
        elif current != value:
            return True
    return False


def _live_count(scaler: Scaler) -> int:
    agents = scaler.agents.filter(state__in=ACTIVE_STATES).count()
    return agents + Reservation.objects.filter(scaler=scaler).count()


def _sync_label_sets(scaler: Scaler, entries: list[LabelSetConfig], summary: ImportSummary) -> tuple[bool, int]:
    """Make ``scaler``'s label-set rows match ``entries``. Returns (changed, newly retired).

    A row whose host access was set in the console keeps it; its ``config`` still follows the
    file, so the file's value stays known. The values changed are added to ``summary.changes``
    (for an existing scaler: its list of label sets, and each matched row's values).
    """
    rows = list(LabelSet.objects.select_for_update().filter(scaler=scaler).order_by("retired", "index"))
    plan, claimed = _match_label_set_rows(rows, entries)
    if rows:
        _record_label_set_list_change(scaler, rows, plan, summary)
    _park_moving_label_sets(plan)
    newly_retired = _retire_unclaimed_label_sets(rows, claimed)
    changed = newly_retired > 0
    for index, row, fields in plan:
        if row is None:
            LabelSet.objects.create(scaler=scaler, index=index, retired=False, **fields)
            changed = True
        elif _update_label_set_row(scaler, index, row, fields, summary):
            changed = True
    return changed, newly_retired


_LabelSetPlan = list[tuple[int, LabelSet | None, dict[str, Any]]]


def _match_label_set_rows(rows: list[LabelSet], entries: list[LabelSetConfig]) -> tuple[_LabelSetPlan, set[int]]:
    """Pair each entry (by config index) with the first unclaimed row of the same normalised labels
    (None: a new row), so reordering the file keeps label-set identities. Returns the plan and the
    claimed row pks."""
    by_key: dict[str, list[LabelSet]] = {}
    for row in rows:
        by_key.setdefault(row.normalized, []).append(row)
    plan: _LabelSetPlan = []
    claimed: set[int] = set()
    for index, ls in enumerate(entries):
        fields = _label_set_fields(ls)
        candidates = [r for r in by_key.get(fields["normalized"], []) if r.pk not in claimed]
        chosen = candidates[0] if candidates else None
        if chosen is not None:
            claimed.add(chosen.pk)
        plan.append((index, chosen, fields))
    return plan, claimed


def _record_label_set_list_change(
    scaler: Scaler, rows: list[LabelSet], plan: _LabelSetPlan, summary: ImportSummary
) -> None:
    """Add the change of ``scaler``'s list of label sets (in force, in index order) to ``summary``."""
    before = [r.normalized for r in sorted(rows, key=lambda r: r.index) if not r.retired]
    after = [fields["normalized"] for _, _, fields in plan]
    if before != after:
        summary.changes.append(ConfigChange(scaler.name, f"scalers.{scaler.name}.labelSets", before, after))


def _park_moving_label_sets(plan: _LabelSetPlan) -> None:
    """Move every row whose index changes out of the way, so renumbering never collides on
    (scaler, index)."""
    for index, row, _ in plan:
        if row is not None and row.index != index:
            LabelSet.objects.filter(pk=row.pk).update(index=_PARKED_BASE + row.pk)


def _retire_unclaimed_label_sets(rows: list[LabelSet], claimed: set[int]) -> int:
    """Mark the rows no entry claimed retired (at an index of their own). Returns how many were
    not retired before."""
    newly_retired = 0
    for row in rows:
        if row.pk not in claimed:
            if not row.retired or row.index != _RETIRED_BASE + row.pk:
                LabelSet.objects.filter(pk=row.pk).update(retired=True, index=_RETIRED_BASE + row.pk)
            if not row.retired:
                newly_retired += 1
    return newly_retired


def _update_label_set_row(
    scaler: Scaler, index: int, row: LabelSet, fields: dict[str, Any], summary: ImportSummary
) -> bool:
    """Bring a matched row to its entry's ``fields`` at ``index`` (un-retiring it), keeping a
    console-set host access; adds the values changed to ``summary``. Returns whether it was written."""
    wanted = {**fields, "index": index, "retired": False}
    name = f"scalers.{scaler.name}.labelSets[{row.normalized}]"
    if not row.retired:
        summary.changes += _value_changes(
            scaler.name, row.config, fields["config"], name, skip=(f"{name}.networkPolicy.hostAccess",)
        )
    if row.host_access_override:
        wanted["host_access"] = row.host_access
        _record_kept_host_access(scaler, name, row, fields["host_access"], summary)
    elif row.host_access != fields["host_access"] and not row.retired:
        summary.changes.append(
            ConfigChange(scaler.name, f"{name}.networkPolicy.hostAccess", row.host_access, fields["host_access"])
        )
    if row.index != index or _differs(row, wanted):
        LabelSet.objects.filter(pk=row.pk).update(**wanted)
        return True
    return False


def _record_kept_host_access(
    scaler: Scaler, name: str, row: LabelSet, file_after: list[str] | None, summary: ImportSummary
) -> None:
    """For a row whose host access the console set: report a change of the file's value (not in
    force) and, when the file now disagrees with the console, the override kept."""
    file_before = row.file_host_access
    if file_before != file_after:
        summary.changes.append(
            ConfigChange(
                scaler.name,
                f"{name}.networkPolicy.hostAccess",
                file_before,
                file_after,
                in_force=False,
                kept=row.host_access,
                operation=row.host_access_override_operation,
            )
        )
    if file_after != row.host_access:
        summary.overrides.append(
            f"{name}.networkPolicy.hostAccess = {_shown('.hostAccess', row.host_access)} "
            f"(file: {_shown('.hostAccess', file_after)})"
        )


def apply_scalers_config(config: ScalersConfig, source: str) -> ImportSummary:
    """Write ``config`` to the database in one transaction and report what changed: this host's
    scalers, their label sets and machine pools, the global part, and an event per changed value
    (docs/configuration.md, "What an import writes"). Raises
    :class:`~scalers.config.loader.ConfigInvalid`, nothing written, when a scaler's ``type`` would
    change under live agents or reservations (retire it first) or its name is another host's in use.
    """
    now = timezone.now()
    summary = ImportSummary(source=source)
    host = this_host()
    with transaction.atomic():
        ConfigState.objects.get_or_create(pk=1)
        state = ConfigState.objects.select_for_update().get(pk=1)

        rows = {s.name: s for s in Scaler.objects.select_for_update().all()}
        existing = {name: row for name, row in rows.items() if row.host == host}
        if state.imported_at is not None:  # the first import changes nothing in force
            _record_global_changes(state, existing, config, summary)
        _claim_scaler_names(config, rows, existing, host, source)

        pools = _sync_machine_pools(config)
        new_warnings = _sync_scalers(config, existing, pools, summary)
        _retire_missing_scalers(config, existing, now, summary)
        _remove_unused_pools(config, pools, summary)
        _write_global_settings(state, config, source, now)
        summary.warnings = [f"{path}: {w.message}" for path, w in config_warnings(config)]
        _record_import_events(summary, new_warnings, source)
    return summary


def _record_global_changes(
    state: ConfigState, existing: dict[str, Scaler], config: ScalersConfig, summary: ImportSummary
) -> None:
    """Add the change of the list of this host's scalers and of every global value to ``summary``."""
    before = sorted(name for name, row in existing.items() if not row.retiring)
    after = sorted(entry.name for entry in config.scalers)
    if before != after:
        summary.changes.append(ConfigChange("", "scalers", before, after))
    summary.changes += _value_changes("", state.raw, config.to_raw(), "", skip=("scalers",))


def _claim_scaler_names(
    config: ScalersConfig, rows: dict[str, Scaler], existing: dict[str, Scaler], host: str, source: str
) -> None:
    """Check every entry's name and type against the rows before anything is written.

    A retired, empty scaler of another host with an entry's name moves to this host (added to
    ``existing``). Raises :class:`ConfigInvalid` naming every entry whose name another host still
    uses or whose type would change under live agents."""
    problems = []
    for i, entry in enumerate(config.scalers):
        other = rows.get(entry.name)
        if other is not None and other.host != host:
            problem = _foreign_name_problem(i, entry, other, host, source)
            if problem is not None:
                problems.append(problem)
                continue
            # Retired and empty on the other host: the row moves here.
            Scaler.objects.filter(pk=other.pk).update(host=host)
            other.host = host
            existing[entry.name] = other
        row = existing.get(entry.name)
        if row is not None and row.type != entry.type:
            problem = _type_change_problem(i, entry, row, source)
            if problem is not None:
                problems.append(problem)
    if problems:
        raise ConfigInvalid(problems)


def _foreign_name_problem(i: int, entry: ScalerEntry, other: Scaler, host: str, source: str) -> ConfigProblem | None:
    """The problem with entry ``i`` naming ``other``, a scaler of another host, or None when that
    scaler is retiring with no live agents (then its row may move to this host)."""
    live = _live_count(other)
    if other.retiring and not live:
        return None
    why = "it is in that host's file" if not other.retiring else f"it has {live} live agent(s)"
    return ConfigProblem(
        source,
        None,
        f"scalers.{i}.name",
        f'scaler "{entry.name}" belongs to host {other.host} ({why}); this host is '
        f"{host}: give it another name here, or remove it from {other.host}'s file and "
        "let it drain first",
    )


def _type_change_problem(i: int, entry: ScalerEntry, row: Scaler, source: str) -> ConfigProblem | None:
    """The problem with entry ``i`` changing ``row``'s backend type while it has live agents or
    reservations, or None when it has none."""
    live = _live_count(row)
    if not live:
        return None
    return ConfigProblem(
        source,
        None,
        f"scalers.{i}.type",
        f'backend type of scaler "{entry.name}" cannot change from {row.type} to '
        f"{entry.type} while it has {live} live agent(s) or reservation(s); remove it "
        "from the file, let it drain, then add it back with the new type",
    )


def _sync_machine_pools(config: ScalersConfig) -> dict[str, MachinePool]:
    """Create or update the file's machine pools. Returns every pool row by name (those no longer
    in the file too: :func:`_remove_unused_pools` decides about them)."""
    pools = {p.name: p for p in MachinePool.objects.select_for_update().all()}
    for pool in config.machine_pools:
        fields = {"max_cpu": pool.cap.max_cpu, "max_memory_bytes": pool.cap.max_memory_bytes}
        row = pools.get(pool.name)
        if row is None:
            pools[pool.name] = MachinePool.objects.create(name=pool.name, **fields)
        elif _differs(row, fields):
            MachinePool.objects.filter(pk=row.pk).update(**fields)
            for k, v in fields.items():
                setattr(row, k, v)
    return pools


def _sync_scalers(
    config: ScalersConfig, existing: dict[str, Scaler], pools: dict[str, MachinePool], summary: ImportSummary
) -> list[ConfigWarning]:
    """Create or update each entry's scaler and its label sets, in config order. Returns the
    warnings the scalers' previous entries did not already have."""
    new_warnings: list[ConfigWarning] = []
    for entry in config.scalers:
        fields = _scaler_fields(entry, pools)
        row = existing.get(entry.name)
        known = {w.message for w in entry_warnings(row.config)} if row is not None and not row.retiring else set()
        new_warnings += [w for w in entry_warnings(fields["config"]) if w.message not in known]
        if row is None:
            row = Scaler.objects.create(name=entry.name, retiring=False, **fields)
            _sync_label_sets(row, list(entry.label_sets), summary)
            summary.created.append(entry.name)
        else:
            _update_scaler(row, entry, fields, summary)
        summary.label_sets += len(entry.label_sets)
    return new_warnings


def _update_scaler(row: Scaler, entry: ScalerEntry, fields: dict[str, Any], summary: ImportSummary) -> None:
    """Bring an existing scaler row to ``fields`` (resurrecting it when retiring) and sync its
    label sets; files it under resurrected, changed or unchanged in ``summary``."""
    was_retiring = row.retiring
    scaler_changed = _differs(row, fields)
    if not was_retiring:
        summary.changes += _value_changes(
            entry.name,
            row.config,
            fields["config"],
            f"scalers.{entry.name}",
            skip=(f"scalers.{entry.name}.labelSets",),
        )
    if scaler_changed or was_retiring:
        for k, v in fields.items():
            setattr(row, k, v)
        row.retiring = False
        row.retiring_since = None
        row.save()
    sets_changed, retired = _sync_label_sets(row, list(entry.label_sets), summary)
    summary.retired_label_sets += retired
    if was_retiring:
        summary.resurrected.append(entry.name)
    elif scaler_changed or sets_changed:
        summary.changed.append(entry.name)
    else:
        summary.unchanged.append(entry.name)


def _retire_missing_scalers(
    config: ScalersConfig, existing: dict[str, Scaler], now: datetime, summary: ImportSummary
) -> None:
    """Mark this host's scalers missing from the file retiring (never deleted: their agents drain)."""
    in_file = {entry.name for entry in config.scalers}
    for name, row in sorted(existing.items()):
        if name not in in_file and not row.retiring:
            Scaler.objects.filter(pk=row.pk).update(retiring=True, retiring_since=now, updated_at=now)
            summary.retiring.append(name)


def _remove_unused_pools(config: ScalersConfig, pools: dict[str, MachinePool], summary: ImportSummary) -> None:
    """Delete the pools that left the file when nothing refers to them any more; keep (and report)
    those a scaler or reservation still references, so their cap holds."""
    wanted_pools = {p.name for p in config.machine_pools}
    for name, pool in sorted(pools.items()):
        if name in wanted_pools:
            continue
        referenced = (
            Scaler.objects.filter(machine_pool=pool).exists() or Reservation.objects.filter(machine_pool=pool).exists()
        )
        if referenced:
            summary.pools_kept.append(name)
        else:
            pool.delete()
            summary.pools_removed.append(name)


def _write_global_settings(state: ConfigState, config: ScalersConfig, source: str, now: datetime) -> None:
    """Save the installation-wide part of ``config`` (caps, defaults, firecracker block, raw) on
    the ``ConfigState`` row, stamped with ``source`` and ``now``."""
    cap = config.global_resource_cap
    state.global_max_agents = config.global_max_agents
    state.global_max_cpu = cap.max_cpu if cap else None
    state.global_max_memory_bytes = cap.max_memory_bytes if cap else None
    resources = config.default_resources
    state.defaults = resources.model_dump(mode="json", by_alias=True, exclude_none=True) if resources else {}
    state.firecracker = (
        config.firecracker.model_dump(mode="json", by_alias=True) if config.firecracker is not None else {}
    )
    state.source = source[:500]
    state.imported_at = now
    state.raw = config.to_raw()
    state.save()


def _record_import_events(summary: ImportSummary, new_warnings: list[ConfigWarning], source: str) -> None:
    """One ``config.warning`` event and log line per new warning, one ``config.changed`` or
    ``config.override_kept`` event per change in ``summary``, and an audit record per change in force."""
    for w in new_warnings:
        log.warning("%s (import of %s)", w.message, source)
        record_event(
            None,
            EventType.CONFIG_WARNING,
            f"{w.message} (import of {source})",
            {"value": f"scalers.{w.scaler}.{w.path}", "source": source},
            scaler_name=w.scaler,
        )
    for change in summary.changes:
        record_event(
            None,
            EventType.CONFIG_CHANGED if change.in_force else EventType.CONFIG_OVERRIDE_KEPT,
            change.describe(source),
            {
                "value": change.value,
                "old": change.old,
                "new": change.new,
                "source": source,
                **({} if change.in_force else {"kept": change.kept, "operation": change.operation}),
            },
            scaler_name=change.scaler,
        )
        if change.in_force:
            record_audit(AuditAction.CONFIG_CHANGED, scaler_name=change.scaler, detail=change.describe(source))
