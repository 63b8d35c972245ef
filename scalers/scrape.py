"""``/metrics``: the Prometheus text exposition of ``scalers.metrics.REGISTRY``, with the series
kept in database rows read at scrape time (:class:`DatabaseCollector`). Every series of
:data:`SHARED` is on the first scrape, at 0 for the label values known then (this console's
scalers, caps, results); gauges of the current state are computed from the database.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from math import inf

from django.db import connection
from django.http import HttpResponse, HttpResponseNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from agents.choices import ACTIVE_STATES
from scalers.admission.caps import CAP_ORDER
from scalers.backends.isolation import nft_table_for
from scalers.choices import LOCAL_SCALER_TYPES, ScalerType
from scalers.metrics import (
    CONFIG_RELOADS,
    EXTERNAL_PROVISION_TIMEOUT,
    EXTERNAL_PROVISIONING_ACTIVE,
    HISTOGRAMS,
    ORCH_REFUSALS,
    PROVISION_STATES,
    REAP_BLOCKED,
    REAP_UNSEEN_PROVISIONS,
    REDISPATCH,
    REFUSALS,
    REGISTRY,
    REPAIRS,
    SCALE_DOWN_EMITTED,
    SCALE_UP_EMITTED,
    SPAWN_FAILURES,
    WARM_REAPED,
    WARM_SPAWNS,
    Known,
    SharedHistogram,
    SharedSeries,
    le_text,
)
from scalers.models import MetricCounter, Scaler
from scalers.warm_pool_config import pool_status

log = logging.getLogger(__name__)


def _no_zeros(known: Known) -> Iterable[dict]:
    return ()


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
_ROW_HISTOGRAM = {f"{h.name}{suffix}": h.name for h in HISTOGRAMS.values() for suffix in ("_bucket", "_sum")}


def register_series(series: SharedSeries) -> None:
    """Add a series another app owns (``operations`` registers its notices from its ``ready()``)."""
    SHARED[series.name] = series


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
            running += counts.get(le_text(bound), 0.0)
            buckets.append((le_text(bound), running))
        family.add_metric(list(key), buckets, sums[key])
    return family


REGISTRY.register(DatabaseCollector())


def metrics_view(request):
    """``GET /metrics``: the Prometheus text exposition of :data:`REGISTRY`."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
