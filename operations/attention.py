"""What needs a person now: one summary for the dashboard's "Needs attention" panel, the nav
badge on every page and the ``kici_scaler_attention{kind}`` gauge. :func:`needs_attention` reads
it in a fixed number of queries whatever the number of rows; each kind and what counts in it:
docs/attention.md ("What counts"). Each :class:`Item` has one line for people and a link reversed
by URL name (the map is ``front.urls``), so nothing here imports the pages.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Count, Max, Min, Q
from django.urls import reverse
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from agents.choices import AgentState, EventType
from agents.liveness import WATCHED_STATES, current_mark
from agents.models import Agent, ScalerEvent
from scalers.admission.backoff import CONSISTENT_FAILURES
from scalers.holds import SOURCE_OPERATOR
from scalers.models import ScaleOutcome, Scaler
from scalers.waiting import waiting_requests

from .choices import OperationKind, OperationStatus
from .models import Finding, Operation

log = logging.getLogger(__name__)

#: The kinds, in the order the panel lists them, each with its name for people, one and many;
#: every one is a value of the gauge's ``kind`` label.
KIND_NAMES: dict[str, tuple[str, str]] = {
    "approval": ("awaiting approval", "awaiting approval"),
    "lost": ("lost agent", "lost agents"),
    "held": ("held agent", "held agents"),
    "waiting": ("waiting job", "waiting jobs"),
    "not_ready": ("scaler not ready", "scalers not ready"),
    "isolation": ("isolation repair", "isolation repairs"),
    "findings": ("orphan or drift found", "orphans and drift found"),
}
KINDS = tuple(KIND_NAMES)

#: Isolation repairs younger than this are shown.
RECENT_REPAIRS = timedelta(hours=1)
#: How the drift check's repair events begin (``scaler.network`` events).
ISOLATION_REPAIR_PREFIXES = ("isolation rules re-applied", "isolation base of table")
#: A spawn that waits longer than this for a slot is shown; a burst queued for seconds is the
#: ``maxConcurrentSpawns`` queue doing its work.
SLOT_WAIT_GRACE = timedelta(seconds=30)
#: Consecutive spawn failures (no registration since) that make a scaler "failing".
FAILING_AFTER = CONSISTENT_FAILURES
#: Operations linked one by one under the approval item.
MAX_OPERATION_LINKS = 5
#: Held agents linked one by one under their scaler's item.
MAX_HELD_LINKS = 5
#: Findings of one group described one by one in its item (the rest are counted).
MAX_FINDINGS_SHOWN = 3
#: What one finding of each detecting kind is called.
_FINDING_NOUNS: dict[str, tuple[str, str]] = {
    OperationKind.ORPHAN_CONTAINERS: ("orphan container", "orphan containers"),
    OperationKind.ORPHAN_VMS: ("orphan VM", "orphan VMs"),
    OperationKind.STALE_ISOLATION_RULES: ("stale isolation rule set", "stale isolation rule sets"),
}

_OUTCOME_TEXT: dict[str, str] = {
    ScaleOutcome.AT_CAPACITY: "at capacity",
    ScaleOutcome.EXCEEDS_CAP: "larger than a cap",
    ScaleOutcome.NO_BACKEND: "no matching label set",
    ScaleOutcome.SKIPPED: "skipped",
}


@dataclass(frozen=True)
class Item:
    """One thing that needs a person. ``count``: how many of ``kind`` it stands for; ``text``: one
    line; ``url``: where to look or act; ``since``: a time it concerns, shown as an age, and
    ``since_label`` which one (``oldest`` waiting, ``latest`` failure or repair, host ``checked``);
    ``links``: ``(label, url)`` of the single objects (approvals)."""

    kind: str
    count: int
    text: str
    url: str
    since: datetime | None = None
    since_label: str = "oldest"
    links: tuple[tuple[str, str], ...] = ()


@dataclass
class Attention:
    """The items, in :data:`KINDS` order, and the count per kind (every kind present, 0 included)."""

    items: list[Item] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def summary(self) -> str:
        """``2 awaiting approval, 1 lost agent``, or ``nothing needs you``."""
        parts = [f"{n} {KIND_NAMES[kind][n != 1]}" for kind, n in self.counts.items() if n]
        return ", ".join(parts) or "nothing needs you"

    def add(self, item: Item) -> None:
        self.items.append(item)
        self.counts[item.kind] += item.count


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _url(name: str, *args, **query) -> str:
    url = reverse(name, args=args)
    query = {k: v for k, v in query.items() if v}
    return f"{url}?{urlencode(query)}" if query else url


def _approvals(out: Attention, now: datetime) -> None:
    open_ops = Operation.objects.filter(status=OperationStatus.PLANNED, expires_at__gt=now)
    summary = open_ops.aggregate(n=Count("id"), oldest=Min("created_at"))
    if not summary["n"]:
        return
    shown = list(open_ops.order_by("created_at", "id").only("id", "kind", "scaler_name")[:MAX_OPERATION_LINKS])
    links = tuple(
        (f"#{op.pk} {op.get_kind_display()}" + (f" ({op.scaler_name})" if op.scaler_name else ""), _op_url(op.pk))
        for op in shown
    )
    n = summary["n"]
    out.add(
        Item(
            kind="approval",
            count=n,
            text=f"{_plural(n, 'operation')} {'awaits' if n == 1 else 'await'} approval; "
            "nothing runs until someone approves or rejects",
            url=_url("operations:list", status=OperationStatus.PLANNED),
            since=summary["oldest"],
            links=links,
        )
    )


def _op_url(pk: int) -> str:
    return reverse("operations:detail", args=[pk])


def _lost(out: Attention) -> None:
    rows = (
        Agent.objects.filter(state__in=WATCHED_STATES)
        .exclude(lost={})
        .only("agent_id", "state", "lost", "last_heartbeat", "scaler__name")
        .select_related("scaler")
    )
    by_scaler: dict[str, list] = defaultdict(list)
    for agent in rows:
        mark = current_mark(agent)
        if mark is not None:
            by_scaler[agent.scaler.name].append(mark)
    for name in sorted(by_scaler):
        marks = by_scaler[name]
        gone = sum(1 for m in marks if m.get("lost_by") == "sandbox")
        evidence = ", ".join(
            part
            for part in (
                f"{gone} sandbox gone" if gone else "",
                f"{len(marks) - gone} silent" if len(marks) > gone else "",
            )
            if part
        )
        out.add(
            Item(
                kind="lost",
                count=len(marks),
                text=f"{_plural(len(marks), 'lost agent')} on {name} ({evidence}); "
                "their slots stay held until a lost-agents operation releases them",
                url=_url("scaler_detail", name),
                since=min((t for t in (_parse(m.get("at")) for m in marks) if t is not None), default=None),
            )
        )


def _held(out: Attention) -> None:
    rows = (
        Agent.objects.filter(state=AgentState.HELD)
        .only("agent_id", "hold", "held_until", "scaler__name")
        .select_related("scaler")
        .order_by("scaler__name", "held_until", "agent_id")
    )
    by_scaler: dict[str, list[Agent]] = defaultdict(list)
    for agent in rows:
        by_scaler[agent.scaler.name].append(agent)
    for name, held in by_scaler.items():
        n = len(held)
        links = tuple(
            (f"{a.agent_id} ({_holder(a)}, until {_clock(a.held_until)})", _url("agent_detail", a.agent_id))
            for a in held[:MAX_HELD_LINKS]
        )
        out.add(
            Item(
                kind="held",
                count=n,
                text=f"{_plural(n, 'held agent')} on {name}: {'its sandbox' if n == 1 else 'their sandboxes'} "
                "kept for debugging and counted against its caps; release when done, or the sweeper "
                "reaps at the hold's end",
                url=_url("agent_list", state=AgentState.HELD, scaler=name),
                since=min((t for t in (_parse((a.hold or {}).get("since")) for a in held) if t), default=None),
                since_label="held",
                links=links,
            )
        )


def _holder(agent: Agent) -> str:
    """Who holds ``agent``: the operator who asked, or the label set's ``debugHold``."""
    hold = agent.hold or {}
    if hold.get("by") and hold.get("source") == SOURCE_OPERATOR:
        return f"held by {hold['by']}"
    return "debugHold.onFailure"


def _clock(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M UTC") if at else "?"


def _parse(value) -> datetime | None:
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


def _waiting(out: Attention, now: datetime) -> None:
    rows = list(
        waiting_requests(now)
        .values("scaler_name", "outcome", "cap", "cpus", "memory_bytes")
        .annotate(n=Count("id"), oldest=Min("first_requested_at"))
    )
    # Counted under the cap its last decision named, whatever capacity does meanwhile: a job the
    # orchestrator still asks about waits until it is admitted (then it leaves) or stops asking
    # (then its retry window ends it), so the count does not flap as slots free and refill.
    groups: dict[tuple[str, str, str], list] = {}
    for r in rows:
        cap = r["cap"]
        group = groups.setdefault((r["scaler_name"], r["outcome"], cap), [0, None])
        group[0] += r["n"]
        group[1] = r["oldest"] if group[1] is None else min(group[1], r["oldest"])
    for (scaler_name, outcome, cap), (n, oldest) in sorted(groups.items()):
        where = f"on {scaler_name}" if scaler_name else "by every scaler"
        why = _OUTCOME_TEXT.get(outcome, outcome) + (f" ({cap})" if cap else "")
        # At capacity, a retry is admitted once a slot frees; the other outcomes are refusals
        # that asking again cannot change until a person changes the config or the host.
        verb = "waiting" if outcome == ScaleOutcome.AT_CAPACITY else "refused"
        out.add(
            Item(
                kind="waiting",
                count=n,
                text=f"{_plural(n, 'job')} {verb} {where}: {why}",
                url=_url("why_waiting", scaler=scaler_name) if scaler_name else _url("why_waiting"),
                since=oldest,
            )
        )
    slots = (
        Agent.objects.filter(state=AgentState.SPAWNING, rq_job_id="", created_at__lt=now - SLOT_WAIT_GRACE)
        .values("scaler__name", "scaler__max_concurrent_spawns")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by("scaler__name")
    )
    for g in slots:
        name = g["scaler__name"]
        out.add(
            Item(
                kind="waiting",
                count=g["n"],
                text=f"{_plural(g['n'], 'admitted spawn')} on {name} waiting for a slot "
                f"(maxConcurrentSpawns = {g['scaler__max_concurrent_spawns']}) for over "
                f"{int(SLOT_WAIT_GRACE.total_seconds())}s",
                url=_url("scaler_detail", name),
                since=g["oldest"],
            )
        )


#: Per scaler: spawn failures since its last registration, and the latest (one index scan each).
_FAILING_SQL = """
SELECT s.name, f.n, f.last
FROM scalers_scaler s
CROSS JOIN LATERAL (
    SELECT count(*) AS n, max(e.created_at) AS last FROM agents_scalerevent e
    WHERE e.scaler_name = s.name AND e.type = %s AND e.created_at > coalesce(
        (SELECT max(r.created_at) FROM agents_scalerevent r WHERE r.scaler_name = s.name AND r.type = %s),
        '-infinity'::timestamptz)
) f
WHERE NOT s.retiring AND f.n >= %s
ORDER BY s.name
"""


def _not_ready(out: Attention) -> None:
    for name, error, checked in (
        Scaler.objects.filter(retiring=False)
        .exclude(host_error="")
        .order_by("name")
        .values_list("name", "host_error", "host_checked_at")
    ):
        out.add(
            Item(
                kind="not_ready",
                count=1,
                text=f"scaler {name}: host not ready, its spawns fail until fixed ({error.splitlines()[0]})",
                url=_url("scaler_detail", name),
                since=checked,
                since_label="checked",
            )
        )
    with connection.cursor() as cur:
        cur.execute(_FAILING_SQL, [str(EventType.FAILED), str(EventType.REGISTERED), FAILING_AFTER])
        failing = cur.fetchall()
    for name, n, last in failing:
        out.add(
            Item(
                kind="not_ready",
                count=1,
                text=f"scaler {name} is failing: {n} spawn failures in a row, none registered since",
                url=_url("event_list", type=EventType.FAILED, scaler=name),
                since=last,
                since_label="latest",
            )
        )


def _isolation(out: Attention, now: datetime) -> None:
    starts = Q()
    for prefix in ISOLATION_REPAIR_PREFIXES:
        starts |= Q(detail__startswith=prefix)
    groups = (
        ScalerEvent.objects.filter(starts, type=EventType.NETWORK, created_at__gte=now - RECENT_REPAIRS)
        .values("scaler_name")
        .annotate(n=Count("id"), last=Max("created_at"))
        .order_by("scaler_name")
    )
    minutes = int(RECENT_REPAIRS.total_seconds() // 60)
    for g in groups:
        name = g["scaler_name"]
        out.add(
            Item(
                kind="isolation",
                count=g["n"],
                text=f"isolation repaired {_plural(g['n'], 'time')} in the last {minutes} min"
                + (f" on {name}" if name else "")
                + ": something rewrites or removes the console's nft rules",
                url=_url("event_list", type=EventType.NETWORK, scaler=name),
                since=g["last"],
                since_label="latest",
            )
        )


def _finding_text(finding: Finding) -> str:
    """``<subject> (<why>; <state>)`` of one finding, from its evidence."""
    evidence = finding.evidence or {}
    why = evidence.get("why") or evidence.get("reason") or ""
    state = evidence.get("container_state") or evidence.get("state") or ""
    detail = "; ".join(str(part) for part in (why, state) if part)
    return f"{finding.subject} ({detail})" if detail else finding.subject


def _findings(out: Attention, now: datetime) -> None:
    open_plans = set(
        Operation.objects.filter(status=OperationStatus.PLANNED, expires_at__gt=now, scaler__isnull=False)
        .values_list("kind", "scaler_id")
        .distinct()
    )
    groups: dict[tuple[str, int], list[Finding]] = defaultdict(list)
    for finding in Finding.objects.select_related("scaler").order_by("kind", "scaler__name", "first_seen_at", "id"):
        if (finding.kind, finding.scaler_id) not in open_plans:
            groups[(finding.kind, finding.scaler_id)].append(finding)
    for found in groups.values():
        first = found[0]
        one, many = _FINDING_NOUNS.get(first.kind, ("finding", "findings"))
        shown = "; ".join(_finding_text(f) for f in found[:MAX_FINDINGS_SHOWN])
        more = len(found) - MAX_FINDINGS_SHOWN
        out.add(
            Item(
                kind="findings",
                count=len(found),
                text=f"{_plural(len(found), one, many)} found on {first.scaler.name}, nothing planned: {shown}"
                + (f"; and {more} more" if more > 0 else ""),
                url=_url("scaler_detail", first.scaler.name) + "#findings",
                since=min(f.first_seen_at for f in found),
                since_label="found",
            )
        )


def needs_attention(now: datetime | None = None) -> Attention:
    """What needs a person at ``now`` (default: the current time): the module docstring's kinds,
    in :data:`KINDS` order. Eleven queries, however many operations, agents, requests and events
    (docs/attention.md says when it is fewer or more).
    Raises what the database raises."""
    now = now or timezone.now()
    out = Attention()
    _approvals(out, now)
    _lost(out)
    _held(out)
    _waiting(out, now)
    _not_ready(out)
    _isolation(out, now)
    _findings(out, now)
    return out


class AttentionCollector:
    """``kici_scaler_attention{kind}`` at scrape time: :func:`needs_attention`'s count per kind
    (every kind, 0 included). Yields nothing when the database cannot be read (the scrape still
    answers; ``kici_scaler_metrics_database_up`` says why)."""

    def collect(self):
        try:
            counts = needs_attention().counts
        except Exception:  # a scrape must answer even without a database
            log.warning("metrics: attention read failed", exc_info=True)
            return
        gauge = GaugeMetricFamily(
            "kici_scaler_attention",
            "Things that need a person now, by kind (the dashboard's Needs attention).",
            labels=["kind"],
        )
        for kind in KINDS:
            gauge.add_metric([kind], counts[kind])
        yield gauge
