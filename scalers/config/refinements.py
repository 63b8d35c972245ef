"""Rules a field-level schema cannot express: per-type requirements and gate reachability of an
entry, and the rules across entries (names, machine-pool references, label-set overlaps), SPEC (a.6), (b)."""

from __future__ import annotations

from typing import Any

from scalers import labels as labelmod

from .entries import ScalerEntry
from .issues import SchemaIssue


def scaler_entry_issues(entry: ScalerEntry) -> list[SchemaIssue]:
    """Per-type requirements and gate reachability of one entry, SPEC (a.6).

    Paths are relative to the entry (``("labelSets", 0, "image")``). Messages are
    the reference texts.
    """
    issues: list[SchemaIssue] = []
    name = entry.name
    if entry.type == "event":
        if not entry.provisioning_targets:
            issues.append(
                SchemaIssue(
                    ("provisioningTargets",),
                    f"Event scaler \"{name}\" requires a non-empty 'provisioningTargets' array "
                    "(the workflow refs that receive its kici.scaler.scale-up events)",
                )
            )
    elif entry.type == "container":
        for i, ls in enumerate(entry.label_sets):
            if not ls.image:
                issues.append(
                    SchemaIssue(
                        ("labelSets", i, "image"),
                        f"Container scaler \"{name}\" label set [{i}] requires an 'image' field",
                    )
                )
    elif entry.type == "bare-metal":
        for i, ls in enumerate(entry.label_sets):
            if not ls.binary_path and not ls.image:
                issues.append(
                    SchemaIssue(
                        ("labelSets", i, "binaryPath"),
                        f"Bare-metal scaler \"{name}\" label set [{i}] requires a 'binaryPath' "
                        "(spawn a local agent process) or an 'image' (run the agent in a container)",
                    )
                )
    elif entry.type == "firecracker":
        for field_name, alias in (
            ("firecracker_path", "firecrackerPath"),
            ("jailer_path", "jailerPath"),
            ("kernel_path", "kernelPath"),
            ("uid", "uid"),
            ("gid", "gid"),
        ):
            value = getattr(entry, field_name)
            if value is None or value == "":
                issues.append(SchemaIssue((alias,), f"Firecracker scaler \"{name}\" requires a '{alias}' field"))
        for i, ls in enumerate(entry.label_sets):
            if not ls.rootfs_path:
                issues.append(
                    SchemaIssue(
                        ("labelSets", i, "rootfsPath"),
                        f"Firecracker scaler \"{name}\" label set [{i}] requires a 'rootfsPath' field",
                    )
                )
    for i, ls in enumerate(entry.label_sets):
        for gate_label in labelmod.unreachable_gate_labels(ls.labels, entry.mandatory_labels, entry.platform):
            issues.append(
                SchemaIssue(
                    ("labelSets", i, "labels"),
                    f'Scaler "{name}" gate label "{gate_label}" is missing from labelSets[{i}].labels — '
                    f'every job routed to this scaler must carry "{gate_label}", so this label set '
                    f'could never be selected; add "{gate_label}" to it or remove it from mandatoryLabels',
                )
            )
    return issues


def _cross_issues(
    scalers: list[tuple[int, ScalerEntry]],
    pool_names: list[Any],
    *,
    pools_known: bool,
) -> list[SchemaIssue]:
    """Top-level rules across entries: pool names unique, pool references defined,
    scaler names unique, no label set shared by two scalers. ``scalers`` pairs each
    parsed entry with its index in the document; ``pool_names`` are the raw names in
    order. With ``pools_known`` false (the pool list itself is invalid) references are
    not checked, to avoid reporting one mistake twice."""
    issues: list[SchemaIssue] = []
    seen_pools: set[Any] = set()
    for i, pool in enumerate(pool_names):
        if not isinstance(pool, str):
            continue
        if pool in seen_pools:
            issues.append(SchemaIssue(("machinePools", i, "name"), f'Duplicate machinePool name "{pool}".'))
        seen_pools.add(pool)
    if pools_known:
        for i, s in scalers:
            if s.machine_pool is not None and s.machine_pool not in seen_pools:
                issues.append(
                    SchemaIssue(
                        ("scalers", i, "machinePool"),
                        f'Scaler "{s.name}" references unknown machinePool "{s.machine_pool}". '
                        "Define it under top-level machinePools[].",
                    )
                )
    first_index: dict[str, int] = {}
    for i, s in scalers:
        if s.name in first_index:
            issues.append(
                SchemaIssue(
                    ("scalers", i, "name"),
                    f'Duplicate scaler name "{s.name}" (first defined at scalers[{first_index[s.name]}])',
                )
            )
        else:
            first_index[s.name] = i
    index_of = [i for i, _ in scalers]
    for overlap in labelmod.find_label_set_overlaps([s for _, s in scalers]):
        doc_index = index_of[overlap.scaler2_index]
        issues.append(
            SchemaIssue(("scalers", doc_index, "labelSets", overlap.label_set_index, "labels"), overlap.message)
        )
    return issues
