"""The console's Prometheus series and how they are written; ``scalers.scrape`` serves them on
``/metrics`` (the series, their labels and example alerting rules: ``docs/metrics.md``).

Values several console processes produce are kept in :class:`scalers.models.MetricCounter` rows,
written in the same transaction as the work (:func:`count`, :func:`set_gauge`, :func:`observe`,
:func:`add_to_counters`) and read at scrape time, so any process serves them and they survive
restarts. The in-process counters of :data:`REGISTRY` count what only this process sees.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from math import inf

from django.db import connection
from prometheus_client import CollectorRegistry, Counter, Histogram

from agents.choices import AgentState
from scalers.choices import SpawnStep
from scalers.models import MetricCounter

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=False)

CAP_LOCK_FAILURES = Counter(
    "kici_orch_scaler_cap_lock_failures",
    "Admission batches that could not take the cap lock (contended: lock timeout; unreachable: database error).",
    ["reason"],
    registry=REGISTRY,
)
ADOPTION_LOOKUP_FAILURES = Counter(
    "kici_orch_scaler_adoption_lookup_failures",
    "Agent registrations refused because the database lookup of their token failed (in-process).",
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "kici_scaler_admission_batch_size",
    "Requests decided per admission transaction (group commit).",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
    registry=REGISTRY,
)

REFUSALS = "kici_scaler_spawn_refusals_total"
ORCH_REFUSALS = "kici_orch_scaler_spawn_refusals_total"
WARM_SPAWNS = "kici_orch_scaler_warm_pool_spawns_total"
WARM_REAPED = "kici_orch_scaler_warm_pool_reaped_total"
SPAWN_FAILURES = "kici_orch_scaler_spawn_failures_total"
REPAIRS = "kici_scaler_isolation_repairs_total"
SCALE_UP_EMITTED = "kici_orch_scaler_scale_up_emitted_total"
SCALE_DOWN_EMITTED = "kici_orch_scaler_scale_down_emitted_total"
EXTERNAL_PROVISION_TIMEOUT = "kici_orch_scaler_external_provision_timeout_total"
EXTERNAL_PROVISIONING_ACTIVE = "kici_orch_scaler_external_provisioning_active"
REAP_UNSEEN_PROVISIONS = "kici_orch_scaler_reap_unseen_provisions"
REAP_BLOCKED = "kici_orch_scaler_reap_blocked"
REDISPATCH = "kici_orch_scaler_redispatch_total"
CONFIG_RELOADS = "kici_orch_scaler_config_reloads_total"
SCALE_TO_REGISTERED = "kici_scaler_scale_to_registered_seconds"
SPAWN_DURATION = "kici_scaler_spawn_duration_seconds"
SPAWN_STEP = "kici_scaler_spawn_step_seconds"
#: States of an event provision asked for and not yet given back.
PROVISION_STATES = (AgentState.SPAWNING, AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)


@dataclass(frozen=True)
class Known:
    """What the zero-valued label sets are made of: this console's scalers as (name, type, table)."""

    scalers: list[tuple[str, str, str]]

    def names(self, *types: str) -> list[str]:
        return [name for name, kind, _ in self.scalers if not types or kind in types]


def _unlabelled(known: Known) -> Iterable[dict]:
    return ({},)


@dataclass(frozen=True)
class SharedSeries:
    """A counter (or a gauge) kept in MetricCounter rows. ``zeros`` gives the label sets shown at
    0 before their first write; a label with an open set of values (a reason text) gives none."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    gauge: bool = False
    zeros: Callable[[Known], Iterable[dict]] = _unlabelled


@dataclass(frozen=True)
class SharedHistogram:
    """A histogram kept in MetricCounter rows: ``<name>_bucket`` rows count the observations per
    bucket (not cumulated; ``le`` is the bucket's upper bound, ``+Inf`` the last), ``<name>_sum``
    rows add up the observed values. ``labels`` label every row; one zero series per scaler."""

    name: str
    help: str
    buckets: tuple[float, ...]
    labels: tuple[str, ...] = ("scaler",)
    zeros: Callable[[Known], Iterable[dict]] = field(default=lambda known: ({"scaler": n} for n in known.names()))


HISTOGRAMS: dict[str, SharedHistogram] = {
    h.name: h
    for h in (
        SharedHistogram(
            SCALE_TO_REGISTERED,
            "Seconds from an agent's admission to its registration, by scaler.",
            (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
        ),
        SharedHistogram(
            SPAWN_DURATION,
            "Seconds of the backend's spawn call (create, rules, start), by scaler and result (spawned, failed).",
            (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            labels=("scaler", "result"),
            zeros=lambda known: ({"scaler": n, "result": "spawned"} for n in known.names()),
        ),
        SharedHistogram(
            SPAWN_STEP,
            "Seconds of each step of a spawn, from admission to running (scalers.spawn_trace), by scaler and step.",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            labels=("scaler", "step"),
            zeros=lambda known: ({"scaler": n, "step": step.value} for n in known.names() for step in SpawnStep),
        ),
    )
}


def count(name: str, labels: dict, amount: float = 1.0) -> None:
    """Add ``amount`` to the shared counter ``name{labels}`` (on the current connection, so inside
    a transaction it commits or rolls back with the work)."""
    add_to_counters(counter_increment(name, labels, amount))


def set_gauge(name: str, value: float, labels: dict | None = None) -> None:
    """Set the shared gauge ``name{labels}`` (a gauge of :data:`SHARED`) to ``value``."""
    labels = labels or {}
    MetricCounter.objects.update_or_create(
        name=name, label_key=label_key(labels), defaults={"labels": labels, "value": float(value)}
    )


def histogram_increments(name: str, labels: dict, value: float) -> dict:
    """The counter increments of one observation of ``value`` in the histogram ``name`` (one of
    :data:`HISTOGRAMS`), for :func:`add_to_counters`."""
    hist = HISTOGRAMS[name]
    le = next((b for b in hist.buckets if value <= b), inf)
    increments = counter_increment(f"{name}_bucket", {**labels, "le": le_text(le)})
    increments |= counter_increment(f"{name}_sum", labels, float(value))
    return increments


def observe(name: str, labels: dict, value: float) -> None:
    """Record one observation of ``value`` in the shared histogram ``name`` (on the current
    connection, with the work)."""
    add_to_counters(histogram_increments(name, labels, value))


def le_text(bound: float) -> str:
    """The ``le`` label of a histogram bucket's upper ``bound`` (``+Inf`` for the last)."""
    return "+Inf" if bound == inf else repr(float(bound))


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
    with connection.cursor() as cur:
        increment_counters(cur, increments)


def counter_increment(name: str, labels: dict, amount: float = 1.0) -> dict[tuple[str, str], tuple[dict, float]]:
    """One increment in the shape :func:`increment_counters` takes."""
    return {(name, label_key(labels)): (labels, amount)}
