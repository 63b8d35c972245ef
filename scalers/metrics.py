"""Prometheus metrics on ``/metrics``.

Values that several console processes produce (refusals, warm-pool spawns and reaps) are kept
in :class:`scalers.models.MetricCounter` rows, incremented in the same transaction as the work,
and read at scrape time, so any process can serve ``/metrics`` and the numbers survive restarts.
Gauges (usage, warm pools) are computed from the database at scrape time too.

Exported:

* ``kici_scaler_spawn_refusals_total{scaler,cap}``: every refusal by cap (this console's own).
* ``kici_orch_scaler_spawn_refusals_total`` (a gauge despite the name, kept so existing dashboards work):
  count and resource-cap refusals, machine-pool ones left out.
* ``kici_orch_scaler_cpus_used`` / ``kici_orch_scaler_memory_bytes_used`` ``{scaler, scalerType}``
  with a ``__global__`` rollup.
* ``kici_orch_scaler_warm_pool_target`` / ``_ready`` / ``_in_flight`` ``{scaler, labelSet}``;
  ``kici_orch_scaler_warm_pool_spawns_total`` / ``_reaped_total`` ``{scaler}``.
* ``kici_orch_scaler_spawn_failures_total{backend, bound}``: ``scaler.failed`` events, counted by a
  trigger on the event table as each is stored (``scalers/migrations/0015``), so pruning old
  events never lowers it.
* ``kici_orch_scaler_cap_lock_failures_total{reason}``: in-process (contended / unreachable).
* ``kici_orch_scaler_adoption_lookup_failures_total``: in-process; registrations answered 503
  because the database could not be asked (``scalers.agent_api.register``).
* ``kici_scaler_lost_agents{scaler, lostBy}``: running/draining agents the last lost-agents sweep
  marked lost (``sandbox`` or ``heartbeat`` evidence; ``agents.liveness``), not yet released.
* ``kici_scaler_isolation_repairs_total{table, kind}``: the drift check's repairs (``scalers.drift``).
* ``kici_scaler_notices_total{event, result}``: approval notices sent (``operations.notify``).
* ``kici_scaler_reservations{scaler}``, ``kici_scaler_agents{scaler, state}``,
  ``kici_scaler_admission_batch_size`` (in-process histogram).
* ``kici_scaler_attention{kind}``: what needs a person, by kind; its collector is
  ``operations.attention.AttentionCollector`` (it reads operations), registered on
  :data:`REGISTRY` by ``operations.apps``.

Event scalers (names as the reference orchestrator's):

* ``kici_orch_scaler_scale_up_emitted_total{scaler}``, ``kici_orch_scaler_scale_down_emitted_total
  {scaler, reason}``: events every target accepted (``scalers.backends.event``).
* ``kici_orch_scaler_external_provision_timeout_total{scaler}``: provisions the reaper tore down
  because their agent never registered (``spawn-timeout`` verdict).
* ``kici_orch_scaler_external_provisioning_active{scaler}``: event-scaler agents spawning,
  connecting, running or draining (a provision asked for and not yet given back), computed at
  scrape.
* ``kici_orch_scaler_reap_unseen_provisions``: provisions unseen for at least the flap grace at
  the reaper's last sweep; ``kici_orch_scaler_reap_blocked``: 1 while the reaper stands down
  (``scalers.provision_reaper``). Both are written by the leading sweeper, read here.
* ``kici_orch_scaler_redispatch_total{trigger}``: jobs refused for capacity earlier and admitted
  on a later request (``trigger`` = ``sweep``: the orchestrator's retry, see ``scalers.api``).
* ``kici_orch_scaler_config_reloads_total{result}``: ``attempted`` / ``success`` / ``failed``
  (the config-reload operation).

Counters and the two reaper gauges live in :class:`scalers.models.MetricCounter` rows, written
with :func:`count` and :func:`set_gauge`, so whichever process does the work (rq worker,
sweeper, daphne) the scrape of any process sees it.
"""

from __future__ import annotations

import logging

from django.db import connection
from django.http import HttpResponse, HttpResponseNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agents.choices import ACTIVE_STATES, AgentState
from scalers.admission.ledger import add_to_counters, counter_increment, label_key
from scalers.choices import ScalerType
from scalers.models import MetricCounter
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

SCALE_UP_EMITTED = "kici_orch_scaler_scale_up_emitted_total"
SCALE_DOWN_EMITTED = "kici_orch_scaler_scale_down_emitted_total"
EXTERNAL_PROVISION_TIMEOUT = "kici_orch_scaler_external_provision_timeout_total"
EXTERNAL_PROVISIONING_ACTIVE = "kici_orch_scaler_external_provisioning_active"
REAP_UNSEEN_PROVISIONS = "kici_orch_scaler_reap_unseen_provisions"
#: States of an event provision asked for and not yet given back.
PROVISION_STATES = (AgentState.SPAWNING, AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)
REAP_BLOCKED = "kici_orch_scaler_reap_blocked"
REDISPATCH = "kici_orch_scaler_redispatch_total"
SPAWN_FAILURES = "kici_orch_scaler_spawn_failures_total"
CONFIG_RELOADS = "kici_orch_scaler_config_reloads_total"

_HELP = {
    "kici_scaler_isolation_repairs_total": "Isolation rules re-applied by the drift check (kind: base, agent).",
    "kici_scaler_notices_total": "Approval notices to KICI_NOTIFY_URL (event; result: sent, failed, skipped).",
    "kici_scaler_spawn_refusals_total": "Spawn requests refused, by scaler and the cap that refused.",
    "kici_orch_scaler_warm_pool_spawns_total": "Warm spawns admitted, by scaler.",
    "kici_orch_scaler_warm_pool_reaped_total": "Idle warm agents destroyed, by scaler.",
    SCALE_UP_EMITTED: "kici.scaler.scale-up events emitted by event scalers, by scaler.",
    SCALE_DOWN_EMITTED: "kici.scaler.scale-down events emitted by event scalers, by scaler and reason.",
    EXTERNAL_PROVISION_TIMEOUT: "Event-scaler provisions torn down for spawn-timeout (agent never registered).",
    SPAWN_FAILURES: "scaler.failed events, by backend and whether a job was bound.",
    REDISPATCH: "Jobs refused for capacity before and admitted on a later request, by trigger.",
    CONFIG_RELOADS: "Scaler config reload operations, by result (attempted, success, failed).",
    REAP_UNSEEN_PROVISIONS: "Event-scaler provisions unseen for at least the flap grace at the last reap sweep.",
    REAP_BLOCKED: "1 while the event-provision reaper stands down (no peer console connected), else 0.",
}
#: Rows of these names are gauges (set, not added to); they read 0 until first written.
GAUGE_ROWS = (REAP_UNSEEN_PROVISIONS, REAP_BLOCKED)
ORCH_REFUSAL_GAUGE = "kici_orch_scaler_spawn_refusals_total"


def count(name: str, labels: dict, amount: float = 1.0) -> None:
    """Add ``amount`` to the shared counter ``name{labels}`` (on the current connection, so inside
    a transaction it commits or rolls back with the work)."""
    add_to_counters(counter_increment(name, labels, amount))


def set_gauge(name: str, value: float, labels: dict | None = None) -> None:
    """Set the shared gauge ``name{labels}`` (one of :data:`GAUGE_ROWS`) to ``value``."""
    labels = labels or {}
    MetricCounter.objects.update_or_create(
        name=name, label_key=label_key(labels), defaults={"labels": labels, "value": float(value)}
    )


class DatabaseCollector:
    """Reads counters and gauges from the database at scrape time."""

    def collect(self):
        try:
            yield from self._collect()
            up = 1
        except Exception:  # noqa: BLE001 - a scrape must answer even without a database
            log.warning("metrics: database read failed", exc_info=True)
            up = 0
        g = GaugeMetricFamily("kici_scaler_metrics_database_up", "1 when /metrics could read the database.")
        g.add_metric([], up)
        yield g

    def _collect(self):
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        label_names: dict[str, list[str]] = {}
        rows = list(MetricCounter.objects.order_by("name", "label_key").values_list("name", "labels", "value"))
        for name, labels, value in rows:
            names = sorted(labels)
            if name not in families:
                if name in GAUGE_ROWS:
                    families[name] = GaugeMetricFamily(name, _HELP[name], labels=names)
                elif name == ORCH_REFUSAL_GAUGE:
                    families[name] = GaugeMetricFamily(
                        name, "Spawn refusals on count and resource caps (unlabelled gauge)."
                    )
                else:
                    families[name] = CounterMetricFamily(name, _HELP.get(name, name), labels=names)
                label_names[name] = names
            if label_names[name] != names:
                continue  # a row written with another label set: skip rather than break the scrape
            families[name].add_metric([str(labels[k]) for k in names], value)
        if ORCH_REFUSAL_GAUGE not in families:
            g = GaugeMetricFamily(ORCH_REFUSAL_GAUGE, "Spawn refusals on count and resource caps (unlabelled gauge).")
            g.add_metric([], 0)
            families[ORCH_REFUSAL_GAUGE] = g
        for name in GAUGE_ROWS:
            if name not in families:
                g = GaugeMetricFamily(name, _HELP[name])
                g.add_metric([], 0)
                families[name] = g
        yield from families.values()
        yield from self._usage()
        yield from self._warm_pools()

    def _usage(self):
        cpus = GaugeMetricFamily("kici_orch_scaler_cpus_used", "CPUs reserved.", labels=["scaler", "scalerType"])
        mem = GaugeMetricFamily(
            "kici_orch_scaler_memory_bytes_used", "Memory reserved (bytes).", labels=["scaler", "scalerType"]
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
                labels=["scaler", "lostBy"],
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
            "kici_orch_scaler_warm_pool_target", "Warm pool target size.", labels=["scaler", "labelSet"]
        )
        ready = GaugeMetricFamily(
            "kici_orch_scaler_warm_pool_ready", "Idle warm agents ready.", labels=["scaler", "labelSet"]
        )
        flight = GaugeMetricFamily(
            "kici_orch_scaler_warm_pool_in_flight", "Warm agents spawning.", labels=["scaler", "labelSet"]
        )
        for p in pool_status():
            target.add_metric([p.scaler, p.label_set], p.target)
            ready.add_metric([p.scaler, p.label_set], p.ready)
            flight.add_metric([p.scaler, p.label_set], p.in_flight)
        yield from (target, ready, flight)


REGISTRY.register(DatabaseCollector())


def metrics_view(request):
    """``GET /metrics``: the Prometheus text exposition of :data:`REGISTRY`."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
