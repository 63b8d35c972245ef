"""Capacity samples: what every scaler held against its caps, and how long its agents took from
``/scale`` to registration, once every ``KICI_CAPACITY_SAMPLE_SECONDS``; the scaler page charts
the last 1 h, 6 h, 24 h or 7 days of them (:data:`CHART_RANGES`, ``front.charts``).

The leading sweeper calls :func:`take_samples` every round; it writes one row per scaler (one bulk
insert) only once the interval has passed since the newest sample in the database, so a new leader
carries on the same cadence. :func:`prune_samples` deletes samples older than
:data:`SAMPLE_RETENTION` in batches.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Aggregate, Count, DateTimeField, F, FloatField, Func, Max, Value
from django.utils import timezone

from agents.models import Agent
from agents.retention import delete_in_batches

from .capacity import scaler_capacities
from .models import CapacitySample, Scaler

#: Samples older than this are pruned: the longest chart range and a day more for a look back.
SAMPLE_RETENTION = timedelta(days=8)
#: The ranges the scaler page charts (its ``?range=``), in the picker's order, and the default.
CHART_RANGES = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_CHART_RANGE = "24h"
#: The sample fields the charts read (a week of minute samples is 10,080 rows: only these load).
CHARTED_FIELDS = (
    "taken_at",
    "agents",
    "running",
    "cpus",
    "memory_bytes",
    "max_agents",
    "max_cpu",
    "max_memory_bytes",
    "latency_p50_seconds",
    "latency_p95_seconds",
)


class _Percentile(Aggregate):
    """PostgreSQL ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float):
        if not 0 <= fraction <= 1:
            raise ValueError(f"percentile fraction must be within [0, 1], got {fraction!r}")
        super().__init__(expression, fraction=float(fraction))


def _seconds_to_register():
    """Seconds from an agent's admission (its row's ``created_at``) to its registration."""
    return Func(
        F("registered_at") - F("created_at"),
        template="EXTRACT(EPOCH FROM %(expressions)s)::double precision",
        output_field=FloatField(),
    )


def _latencies(since: datetime, until: datetime) -> dict[int, dict]:
    """Per scaler pk: ``{"n", "p50", "p95"}`` of the agents spawned for a ``/scale`` (warm-pool
    agents have no request to answer) that registered in ``(since, until]``. One grouped query."""
    rows = (
        Agent.objects.filter(registered_at__gt=since, registered_at__lte=until, warm=False)
        .values("scaler_id")
        .annotate(
            n=Count("id"),
            p50=_Percentile(_seconds_to_register(), 0.5),
            p95=_Percentile(_seconds_to_register(), 0.95),
        )
        .order_by()
    )
    out: dict[int, dict] = {row["scaler_id"]: dict(row) for row in rows}
    return out


def take_samples(now: datetime | None = None) -> int:
    """Write one :class:`CapacitySample` per scaler when ``KICI_CAPACITY_SAMPLE_SECONDS`` have
    passed since the newest one (or there is none); returns the rows written (0 = not due)."""
    now = now or timezone.now()
    previous = CapacitySample.objects.aggregate(latest=Max("taken_at"))["latest"]
    interval = timedelta(seconds=settings.KICI_CAPACITY_SAMPLE_SECONDS)
    if previous is not None and now - previous < interval:
        return 0
    latency = _latencies(previous or now - interval, now)
    rows = []
    for cap in scaler_capacities(Scaler.objects.order_by("pk")):
        assert cap.scaler is not None and cap.max_agents is not None, "a scaler's capacity names it and its cap"
        lat = latency.get(cap.scaler.pk, {})
        rows.append(
            CapacitySample(
                scaler=cap.scaler,
                taken_at=now,
                agents=cap.reserved,
                running=cap.running,
                cpus=cap.cpus,
                memory_bytes=cap.memory_bytes,
                max_agents=cap.max_agents,
                max_cpu=cap.max_cpu,
                max_memory_bytes=cap.max_memory_bytes,
                registered=lat.get("n", 0),
                latency_p50_seconds=lat.get("p50"),
                latency_p95_seconds=lat.get("p95"),
            )
        )
    CapacitySample.objects.bulk_create(rows)
    return len(rows)


def prune_samples(now: datetime | None = None) -> int:
    """Delete samples older than :data:`SAMPLE_RETENTION` (batched as ``agents.retention``);
    returns the rows deleted."""
    cutoff = (now or timezone.now()) - SAMPLE_RETENTION
    return delete_in_batches(CapacitySample.objects.filter(taken_at__lt=cutoff).order_by("pk"))


#: Most rows :func:`recent_samples` returns: a longer window is read as per-bucket peaks.
CHART_ROWS = 1000


def chart_bucket_seconds(window: timedelta, sample_seconds: int) -> int:
    """The sample interval ``sample_seconds`` when ``window`` holds at most :data:`CHART_ROWS` samples,
    else the smallest multiple of it that brings them within (a week of minute samples: 11 min)."""
    return sample_seconds * max(1, math.ceil(window.total_seconds() / sample_seconds / CHART_ROWS))


def recent_samples(
    scaler: Scaler, window: timedelta, now: datetime | None = None, sample_seconds: int | None = None
) -> list[CapacitySample]:
    """The scaler's samples of the last ``window``, oldest first, in one query: as stored (only
    :data:`CHARTED_FIELDS`) while the window holds at most :data:`CHART_ROWS` of them, else one row
    per bucket of :func:`chart_bucket_seconds` (unsaved ``CapacitySample`` rows), each column the peak
    of its bucket and ``taken_at`` its last sample's time, as the charts thin points anyway
    (``front.charts``): PostgreSQL reduces a week to a thousand rows instead of sending 10,080."""
    now = now or timezone.now()
    every = sample_seconds or settings.KICI_CAPACITY_SAMPLE_SECONDS
    rows = CapacitySample.objects.filter(scaler=scaler, taken_at__gte=now - window)
    bucket = chart_bucket_seconds(window, every)
    if bucket == every:
        return list(rows.order_by("taken_at").only(*CHARTED_FIELDS))
    binned = Func(
        Value(timedelta(seconds=bucket)),
        F("taken_at"),
        Value(now - window),
        function="date_bin",
        output_field=DateTimeField(),
    )
    peaks = {name: Max(name) for name in CHARTED_FIELDS}
    grouped = rows.annotate(bucket=binned).values("bucket").annotate(**peaks).order_by("bucket")
    return [CapacitySample(scaler=scaler, **{k: v for k, v in row.items() if k != "bucket"}) for row in grouped]
