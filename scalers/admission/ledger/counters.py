"""Metric counter rows (:class:`scalers.models.MetricCounter`): keys and increments."""

from __future__ import annotations

import json


def label_key(labels: dict) -> str:
    """Canonical ``k=v,k=v`` (sorted) rendering of a label dict, the counter row key."""
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def increment_counters(cursor, increments: dict[tuple[str, str], tuple[dict, float]]) -> None:
    """Add to :class:`scalers.models.MetricCounter` rows: ``{(name, label_key): (labels, amount)}``."""
    if not increments:
        return
    names, keys, labels, amounts = [], [], [], []
    for (name, key), (lab, amount) in increments.items():
        names.append(name)
        keys.append(key)
        labels.append(json.dumps(lab))
        amounts.append(float(amount))
    cursor.execute(
        "INSERT INTO scalers_metriccounter (name, label_key, labels, value) "
        "SELECT n, k, l::jsonb, v FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[]) AS u(n, k, l, v) "
        "ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value",
        [names, keys, labels, amounts],
    )


def add_to_counters(increments: dict[tuple[str, str], tuple[dict, float]]) -> None:
    """:func:`increment_counters` on the current connection (own statement, autocommit or not)."""
    from django.db import connection

    with connection.cursor() as cur:
        increment_counters(cur, increments)


def counter_increment(name: str, labels: dict, amount: float = 1.0) -> dict[tuple[str, str], tuple[dict, float]]:
    """One increment in the shape :func:`increment_counters` takes."""
    return {(name, label_key(labels)): (labels, amount)}
