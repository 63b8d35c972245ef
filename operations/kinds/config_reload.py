"""Reload ``scalers.yaml``: validate, show the diff, commit on approval (plan → validate → commit).
The plan is the real import run in a transaction that is rolled back, so preview and commit cannot
disagree; every target carries the sha256 of the files read (``atomic``). Only the configured
files are read: the operation takes no path. Design: docs/operations.md ("config-reload").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.conf import settings
from django.db import transaction

from lib.wording import listed
from scalers.config.loader import ConfigInvalid, load_scalers_config
from scalers.importing import ImportSummary, apply_scalers_config
from scalers.metrics import CONFIG_RELOADS, count
from scalers.models import ConfigState, LabelSet, Scaler

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, PlanRefused, Scope, ScopeInvalid, Spared, Target

_SCALER_FIELDS = (
    "type",
    "max_agents",
    "max_concurrent_spawns",
    "max_cpu",
    "max_memory_bytes",
    "machine_pool_id",
    "mandatory_labels",
    "roles",
    "orchestrator_url",
    "warm_pool_enabled",
    "warm_pool_size",
    "warm_pool_idle_timeout_seconds",
    "config",
    "retiring",
)
_GLOBAL_FIELDS = ("global_max_agents", "global_max_cpu", "global_max_memory_bytes", "defaults", "firecracker")


class _DryRun(Exception):
    pass


def config_paths() -> tuple[str, str | None]:
    """The configured config file and drop-in directory (None: none). Raises ScopeInvalid naming
    ``KICI_SCALER_CONFIG_PATH`` when no config file is configured."""
    path = settings.KICI_SCALER_CONFIG_PATH
    if not path:
        raise ScopeInvalid("KICI_SCALER_CONFIG_PATH", "no config file: the variable is unset")
    return path, settings.KICI_SCALER_CONFIG_DIR


def files_digest(path: str, drop_in_dir: str | None) -> tuple[str, list[str]]:
    """sha256 over the main file and the drop-in ``*.yaml``/``*.yml`` files (names and bytes)."""
    files = [path]
    if drop_in_dir and Path(drop_in_dir).is_dir():
        files += sorted(str(p) for p in Path(drop_in_dir).iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode() + b"\0")
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.hexdigest(), files


def _snapshot():
    state = ConfigState.load()
    scalers = {s.name: {f: getattr(s, f) for f in _SCALER_FIELDS} for s in Scaler.objects.all()}
    sets: dict[str, list[str]] = {}
    for ls in LabelSet.objects.filter(retired=False).select_related("scaler").order_by("index"):
        sets.setdefault(ls.scaler.name, []).append(
            ls.normalized + (f" hostAccess={listed(ls.host_access)}" if ls.host_access is not None else "")
        )
    return {f: getattr(state, f) for f in _GLOBAL_FIELDS}, scalers, sets


def _dry_run(config, source: str, path: str) -> tuple[ImportSummary, tuple, tuple]:
    """Run the real import in a transaction that is rolled back. Returns its summary and the
    :func:`_snapshot` before and after it. Raises :class:`PlanRefused` when it refuses the file."""
    before = _snapshot()
    try:
        with transaction.atomic():
            summary = apply_scalers_config(config, source)
            after = _snapshot()
            raise _DryRun
    except _DryRun:
        pass
    except ConfigInvalid as exc:
        raise PlanRefused(f"{path} cannot be applied; nothing was planned", [str(p) for p in exc.problems]) from None
    return summary, before, after


def _scaler_targets(summary: ImportSummary, before: tuple, after: tuple, base: dict) -> list[Target]:
    """One target per scaler created, updated (its changed fields and label sets), resurrected or
    marked retiring, in that order; ``before``/``after``: the :func:`_snapshot` around the import."""
    _, scalers_before, sets_before = before
    _, scalers_after, sets_after = after
    targets = [
        Target(
            f"scaler:{name}",
            "create scaler",
            name,
            {**base, "type": scalers_after[name]["type"], "label_sets": sets_after.get(name, [])},
        )
        for name in summary.created
    ]
    for name in summary.changed:
        fields_before, fields_after = scalers_before.get(name, {}), scalers_after.get(name, {})
        evidence = {**base, "fields": [f for f in _SCALER_FIELDS if fields_before.get(f) != fields_after.get(f)]}
        if sets_before.get(name) != sets_after.get(name):
            evidence["label_sets_before"] = sets_before.get(name, [])
            evidence["label_sets_after"] = sets_after.get(name, [])
        targets.append(Target(f"scaler:{name}", "update scaler", name, evidence))
    targets += [
        Target(f"scaler:{name}", "resurrect retiring scaler", name, {**base, "label_sets": sets_after.get(name, [])})
        for name in summary.resurrected
    ]
    targets += [
        Target(
            f"scaler:{name}",
            "mark retiring (stops admitting, drains, then torn down)",
            name,
            {**base, "type": scalers_before[name]["type"]},
        )
        for name in summary.retiring
    ]
    return targets


def _globals_target(globals_before: dict, globals_after: dict, base: dict) -> Target:
    """The target updating the global settings: the fields that change and their new values."""
    fields = [f for f in _GLOBAL_FIELDS if globals_before[f] != globals_after[f]]
    return Target(
        "config:globals",
        "update global settings",
        "globals",
        {**base, "fields": fields, **{f"{f}_after": globals_after[f] for f in fields}},
    )


def _import_notes(summary: ImportSummary, source: str) -> list[str]:
    """Notes for the preview: file values changed under a console value, the console values kept
    over the file, and machine pools kept although they left the file."""
    notes = [change.describe(source) for change in summary.changes if not change.in_force]
    notes += [f"kept from the console over the file: {line}" for line in summary.overrides]
    notes += [
        f"machine pool {name} left the file but is kept: a retiring scaler or a reservation still uses it"
        for name in summary.pools_kept
    ]
    return notes


class ConfigReload(Kind):
    name = OperationKind.CONFIG_RELOAD
    atomic = True

    def validate_scope(self, scope: Scope) -> None:
        config_paths()

    def plan(self, scope: Scope) -> Plan:
        path, drop_in = config_paths()
        digest, files = files_digest(path, drop_in)
        try:
            config = load_scalers_config(path, drop_in)
        except ConfigInvalid as exc:
            raise PlanRefused(f"{path} is invalid; nothing was planned", [str(p) for p in exc.problems]) from None
        source = path if not drop_in else f"{path} + {drop_in}"
        summary, before, after = _dry_run(config, source, path)

        result = Plan(context={"config": config, "source": source})
        result.notes.append(f"read {', '.join(files)} (sha256 {digest[:12]}…)")
        base = {"config_sha256": digest}
        result.targets += _scaler_targets(summary, before, after, base)
        result.targets += [Target(f"pool:{name}", "delete machine pool", name, base) for name in summary.pools_removed]
        if before[0] != after[0]:
            result.targets.append(_globals_target(before[0], after[0], base))
        result.spared += [Spared(f"scaler:{name}", name, "unchanged") for name in summary.unchanged]
        result.notes += _import_notes(summary, source)
        return result

    def act(self, run, scope, plan, targets) -> None:
        """Commit the previewed config; counted in ``kici_orch_scaler_config_reloads_total`` as
        ``attempted``, then ``success`` or ``failed`` (the error is raised on)."""
        count(CONFIG_RELOADS, {"result": "attempted"})
        try:
            summary = apply_scalers_config(plan.context["config"], plan.context["source"])
        except Exception:
            count(CONFIG_RELOADS, {"result": "failed"})
            raise
        count(CONFIG_RELOADS, {"result": "success"})
        run.log(str(summary))
        for target in targets:
            run.report(target.key, TargetOutcome.DONE, "applied")
