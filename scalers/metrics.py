"""Prometheus metrics on ``/metrics``; the series, their labels and example alerting rules are
listed in ``docs/metrics.md``.

Values several console processes produce are kept in :class:`scalers.models.MetricCounter` rows,
written in the same transaction as the work (:func:`count`, :func:`set_gauge`, :func:`observe`)
and read at scrape time, so any process serves them and they survive restarts. Every series of
:data:`SHARED` is on the first scrape, at 0 for the label values known then (this console's
scalers, caps, results); gauges of the current state are computed from the database.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from math import inf

from django.db import connection
from django.http import HttpResponse, HttpResponseNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from agents.choices import ACTIVE_STATES, AgentState
from scalers.admission.caps import CAP_ORDER
from scalers.admission.ledger import add_to_counters, counter_increment, label_key
from scalers.backends.isolation import nft_table_for
from scalers.choices import LOCAL_SCALER_TYPES, ScalerType, SpawnStep
from scalers.models import MetricCounter, Scaler
from scalers.warm_pool_config import pool_status

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


def _no_zeros(known: Known) -> Iterable[dict]:
    return ()


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


def _per_scaler(*types: str) -> Callable[[Known], Iterable[dict]]:
    return lambda known: ({"scaler": name} for name in known.names(*types))


SHARED: dict[str, SharedSeries] = {
    s.name: s
    for s in (
        SharedSeries(
            REFUSALS,
            "Spawn requests refused, by scaler and the cap that refused.",
            ("scaler", "cap"),
            zeros=lambda known: ({"scaler": n, "cap": str(c)} for n in known.names() for c in CAP_ORDER),
        ),
        SharedSeries(ORCH_REFUSALS, "Spawn refusals on count and resource caps (machine-pool caps left out)."),
        SharedSeries(WARM_SPAWNS, "Warm spawns admitted, by scaler.", ("scaler",), zeros=_per_scaler()),
        SharedSeries(WARM_REAPED, "Idle warm agents destroyed, by scaler.", ("scaler",), zeros=_per_scaler()),
        SharedSeries(
            SPAWN_FAILURES,
            "scaler.failed events, by backend (scaler type) and whether a job was bound.",
            ("backend", "bound"),
            zeros=lambda known: (
                {"backend": kind, "bound": bound}
                for kind in sorted({kind for _, kind, _ in known.scalers})
                for bound in ("false", "true")
            ),
        ),
        SharedSeries(
            REPAIRS,
            "Isolation rules re-applied by the drift check, by nft table and kind (base, agent).",
            ("table", "kind"),
            zeros=lambda known: (
                {"table": table, "kind": kind}
                for table in sorted({t for _, k, t in known.scalers if k in LOCAL_SCALER_TYPES})
                for kind in ("agent", "base")
            ),
        ),
        SharedSeries(
            SCALE_UP_EMITTED,
            "kici.scaler.scale-up events emitted by event scalers, by scaler.",
            ("scaler",),
            zeros=_per_scaler(ScalerType.EVENT),
        ),
        SharedSeries(
            SCALE_DOWN_EMITTED,
            "kici.scaler.scale-down events emitted by event scalers, by scaler and reason.",
            ("scaler", "reason"),
            zeros=_no_zeros,
        ),
        SharedSeries(
            EXTERNAL_PROVISION_TIMEOUT,
            "Event-scaler provisions torn down for spawn-timeout (agent never registered).",
            ("scaler",),
            zeros=_per_scaler(ScalerType.EVENT),
        ),
        SharedSeries(
            REDISPATCH,
            "Jobs refused for capacity before and admitted on a later request, by trigger.",
            ("trigger",),
            zeros=lambda known: ({"trigger": "sweep"},),
        ),
        SharedSeries(
            CONFIG_RELOADS,
            "Scaler config reload operations, by result (attempted, success, failed).",
            ("result",),
            zeros=lambda known: ({"result": r} for r in ("attempted", "failed", "success")),
        ),
        SharedSeries(
            REAP_UNSEEN_PROVISIONS,
            "Event-scaler provisions unseen for at least the flap grace at the last reap sweep.",
            gauge=True,
        ),
        SharedSeries(
            REAP_BLOCKED,
            "1 while the event-provision reaper stands down (no peer console connected), else 0.",
            gauge=True,
        ),
    )
}
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
_ROW_HISTOGRAM = {f"{h.name}{suffix}": h.name for h in HISTOGRAMS.values() for suffix in ("_bucket", "_sum")}


def register_series(series: SharedSeries) -> None:
    """Add a series another app owns (``operations`` registers its notices from its ``ready()``)."""
    SHARED[series.name] = series


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
    :data:`HISTOGRAMS`), for :func:`scalers.admission.ledger.add_to_counters`."""
    hist = HISTOGRAMS[name]
    le = next((b for b in hist.buckets if value <= b), inf)
    increments = counter_increment(f"{name}_bucket", {**labels, "le": _le_text(le)})
    increments |= counter_increment(f"{name}_sum", labels, float(value))
    return increments


def observe(name: str, labels: dict, value: float) -> None:
    """Record one observation of ``value`` in the shared histogram ``name`` (on the current
    connection, with the work)."""
    add_to_counters(histogram_increments(name, labels, value))


def _le_text(bound: float) -> str:
    return "+Inf" if bound == inf else repr(float(bound))


class DatabaseCollector:
    """Reads counters, histograms and gauges from the database at scrape time."""

    def collect(self):
        try:
            yield from self._collect()
            up = 1
        except Exception:  # a scrape must answer even without a database
            log.warning("metrics: database read failed", exc_info=True)
            up = 0
        g = GaugeMetricFamily("kici_scaler_metrics_database_up", "1 when /metrics could read the database.")
        g.add_metric([], up)
        yield g

    def _collect(self):
        scalers = Scaler.objects.order_by("name").only("name", "type", "config")
        known = Known([(s.name, s.type, nft_table_for(s)) for s in scalers])
        values: dict[str, dict[tuple, float]] = defaultdict(dict)
        histogram_rows: dict[str, list[tuple[dict, float]]] = defaultdict(list)
        for name, labels, value in MetricCounter.objects.order_by("name", "label_key").values_list(
            "name", "labels", "value"
        ):
            if name in _ROW_HISTOGRAM:
                histogram_rows[name].append((labels, value))
            elif name in SHARED and sorted(labels) == sorted(SHARED[name].labels):
                values[name][tuple(str(labels[k]) for k in SHARED[name].labels)] = value
            # a row of an unknown name or label set is skipped rather than break the scrape
        for series in SHARED.values():
            seen = values[series.name]
            for labels in series.zeros(known):
                seen.setdefault(tuple(str(labels[k]) for k in series.labels), 0.0)
            family_type = GaugeMetricFamily if series.gauge else CounterMetricFamily
            family = family_type(series.name, series.help, labels=list(series.labels))
            for key in sorted(seen):
                family.add_metric(list(key), seen[key])
            yield family
        for hist in HISTOGRAMS.values():
            yield _histogram_family(hist, known, histogram_rows)
        yield from self._usage()
        yield from self._warm_pools()

    def _usage(self):
        cpus = GaugeMetricFamily("kici_orch_scaler_cpus_used", "CPUs reserved.", labels=["scaler", "scaler_type"])
        mem = GaugeMetricFamily(
            "kici_orch_scaler_memory_bytes_used", "Memory reserved (bytes).", labels=["scaler", "scaler_type"]
        )
        res = GaugeMetricFamily("kici_scaler_reservations", "Reservation rows held.", labels=["scaler"])
        agents = GaugeMetricFamily("kici_scaler_agents", "Active agents by state.", labels=["scaler", "state"])
        with connection.cursor() as cur:
            cur.execute(
                "SELECT s.name, s.type, count(r.id), coalesce(sum(r.cpus), 0), coalesce(sum(r.memory_bytes), 0) "
                "FROM scalers_scaler s LEFT JOIN scalers_reservation r ON r.scaler_id = s.id "
                "GROUP BY s.id ORDER BY s.name"
            )
            total_c, total_m = 0.0, 0
            for name, kind, n, c, m in cur.fetchall():
                cpus.add_metric([name, kind], float(c))
                mem.add_metric([name, kind], int(m))
                res.add_metric([name], n)
                total_c += float(c)
                total_m += int(m)
            cpus.add_metric(["__global__", "__global__"], total_c)
            mem.add_metric(["__global__", "__global__"], total_m)
            cur.execute(
                "SELECT s.name, a.state, count(*) FROM agents_agent a JOIN scalers_scaler s ON s.id = a.scaler_id "
                "WHERE a.state = ANY(%s) GROUP BY s.name, a.state ORDER BY 1, 2",
                [[str(x) for x in ACTIVE_STATES]],
            )
            for name, state, n in cur.fetchall():
                agents.add_metric([name, state], n)
            lost = GaugeMetricFamily(
                "kici_scaler_lost_agents",
                "Running or draining agents marked lost, by evidence.",
                labels=["scaler", "lost_by"],
            )
            cur.execute(
                "SELECT s.name, a.lost->>'lost_by', count(*) "
                "FROM agents_agent a JOIN scalers_scaler s ON s.id = a.scaler_id "
                "WHERE a.state IN ('running', 'draining') AND a.lost <> '{}'::jsonb GROUP BY 1, 2 ORDER BY 1, 2"
            )
            for name, lost_by, n in cur.fetchall():
                lost.add_metric([name, lost_by or "unknown"], n)
            provisioning = GaugeMetricFamily(
                EXTERNAL_PROVISIONING_ACTIVE,
                "Event-scaler agents spawning, connecting, running or draining (provisions in flight), by scaler.",
                labels=["scaler"],
            )
            cur.execute(
                "SELECT s.name, count(a.id) FROM scalers_scaler s LEFT JOIN agents_agent a "
                "ON a.scaler_id = s.id AND a.state = ANY(%s) WHERE s.type = %s GROUP BY s.name ORDER BY 1",
                [[str(state) for state in PROVISION_STATES], str(ScalerType.EVENT)],
            )
            for name, n in cur.fetchall():
                provisioning.add_metric([name], n)
        yield from (cpus, mem, res, agents, lost, provisioning)

    def _warm_pools(self):
        target = GaugeMetricFamily(
            "kici_orch_scaler_warm_pool_target", "Warm pool target size.", labels=["scaler", "label_set"]
        )
        ready = GaugeMetricFamily(
            "kici_orch_scaler_warm_pool_ready", "Idle warm agents ready.", labels=["scaler", "label_set"]
        )
        flight = GaugeMetricFamily(
            "kici_orch_scaler_warm_pool_in_flight", "Warm agents spawning.", labels=["scaler", "label_set"]
        )
        for p in pool_status():
            target.add_metric([p.scaler, p.label_set], p.target)
            ready.add_metric([p.scaler, p.label_set], p.ready)
            flight.add_metric([p.scaler, p.label_set], p.in_flight)
        yield from (target, ready, flight)


def _histogram_family(
    hist: SharedHistogram, known: Known, rows: dict[str, list[tuple[dict, float]]]
) -> HistogramMetricFamily:
    """``hist`` from its per-bucket and sum rows: cumulative buckets per label set, zeros first."""
    per_bucket: dict[tuple, dict[str, float]] = defaultdict(dict)
    sums: dict[tuple, float] = {}
    for labels in hist.zeros(known):
        sums[tuple(str(labels[k]) for k in hist.labels)] = 0.0
    for labels, value in rows.get(f"{hist.name}_bucket", ()):
        key = tuple(str(labels.get(k, "")) for k in hist.labels)
        per_bucket[key][str(labels.get("le"))] = value
        sums.setdefault(key, 0.0)
    for labels, value in rows.get(f"{hist.name}_sum", ()):
        sums[tuple(str(labels.get(k, "")) for k in hist.labels)] = value
    family = HistogramMetricFamily(hist.name, hist.help, labels=list(hist.labels))
    for key in sorted(sums):
        counts, running, buckets = per_bucket.get(key, {}), 0.0, []
        for bound in (*hist.buckets, inf):
            running += counts.get(_le_text(bound), 0.0)
            buckets.append((_le_text(bound), running))
        family.add_metric(list(key), buckets, sums[key])
    return family


REGISTRY.register(DatabaseCollector())


def metrics_view(request):
    """``GET /metrics``: the Prometheus text exposition of :data:`REGISTRY`."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
