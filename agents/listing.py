"""Which agents a list shows, in which order: the filters and sorts of ``/agents/``, shared by the
page and its live rows (``live.rows.AgentRows``), so a row on the page is a row of its pushes."""

from __future__ import annotations

import ipaddress

from django.db.models import F, Q

from lib.query import BadParameter, choice, whole_number
from lib.wording import json_text

from .choices import ACTIVE_STATES, AgentState
from .models import Agent

#: Rows per page of ``/agents/``.
LIST_PAGE_SIZE = 50

#: Deepest page ``/agents/`` serves: offset pagination reads every row before the page, so past
#: ``MAX_PAGE * LIST_PAGE_SIZE`` rows the list asks for narrower filters instead.
MAX_PAGE = 200

#: ``?sort=`` columns (``-<column>``: descending) and the fields they order by. Ties go by id, so
#: pages never overlap.
SORTS = {
    "created_at": "created_at",
    "last_heartbeat": "last_heartbeat",
    "agent_id": "agent_id",
    "state": "state",
    "scaler": "scaler__name",
}
#: The sort columns that may be NULL: a missing value (no heartbeat yet) counts as the oldest, last
#: newest-first and first oldest-first. The others are ordered without a NULLS clause, which
#: PostgreSQL would not match to their indexes (it does not infer it from NOT NULL).
NULLABLE_SORTS = {"last_heartbeat"}
DEFAULT_SORT = "-created_at"

STATE_FILTERS = [("active", "active"), ("all", "all states"), *[(s.value, s.value) for s in AgentState]]


def sort_order(sort: str) -> list:
    """The ``order_by`` arguments of a ``?sort=`` value (a key of :data:`SORTS`, ``-`` for
    descending; empty: :data:`DEFAULT_SORT`). BadParameter naming the value for any other."""
    column = sort.removeprefix("-")
    if column not in SORTS:
        raise BadParameter(
            "sort", f"must be one of {', '.join(SORTS)}, each optionally with '-', got {json_text(sort)}"
        )
    field, nullable = F(SORTS[column]), column in NULLABLE_SORTS
    if sort.startswith("-"):
        return [field.desc(nulls_last=True) if nullable else field.desc(), "-id"]
    return [field.asc(nulls_first=True) if nullable else field.asc(), "id"]


def page_rows(qs, start: int, stop: int) -> list[Agent]:
    """Rows ``start`` to ``stop`` (exclusive) of ``qs``, a :func:`filter_agents` queryset, in its
    order, with their scalers. The matching agents are sorted on their ids and sort keys alone and
    only the page's rows are read whole: a sort without an index then orders narrow rows, not every
    agent's whole row and its scaler's (several times the work at 10,000 agents, and on a deep page
    more than ``work_mem``). One query."""
    ids = qs.values("pk")[start:stop]
    return list(Agent.objects.select_related("scaler").filter(pk__in=ids).order_by(*qs.query.order_by))


def parse_labels(raw: str) -> list[str]:
    """The ``?label=`` filter: comma-separated labels, trimmed and lower-cased (labels are stored
    canonical), empty ones dropped; an agent must carry every one."""
    return [label.strip().lower() for label in raw.split(",") if label.strip()]


def page_number(raw) -> int:
    """The ``?page=`` of a list: 1 when absent, else a whole number within 1..:data:`MAX_PAGE`.
    BadParameter naming the value otherwise."""
    return whole_number("page", raw, 1, MAX_PAGE, default=1, hint=" (narrow the filters to reach further)")


#: Parameters of ``/agents/`` (and of its live rows), each taken once: ``state`` is one state (or
#: ``active`` / ``all``), ``label`` lists several labels with commas.
LIST_PARAMETERS = ("state", "scaler", "label", "q", "sort", "page")


def filter_agents(params) -> tuple:
    """Apply the list filters ``state`` (a state, ``active`` or ``all``; default active), ``scaler``,
    ``label`` (comma-separated, :func:`parse_labels`) and ``q`` (a substring of the agent id, managed
    id, bound job, an address or a label), ordered by ``sort`` (:func:`sort_order`). Returns
    ``(queryset, cleaned)``, the values applied. BadParameter naming the value for an unknown state or
    sort: a filter silently dropped shows a list the operator did not ask for.
    """
    sort = (params.get("sort") or "").strip() or DEFAULT_SORT
    order = sort_order(sort)
    qs = Agent.objects.select_related("scaler")
    state = params.get("state") or "active"
    if state == "active":
        qs = qs.filter(state__in=ACTIVE_STATES)
    elif state in AgentState.values:
        qs = qs.filter(state=state)
    elif state != "all":
        choice("state", state, [value for value, _ in STATE_FILTERS])
    scaler = (params.get("scaler") or "").strip()
    if scaler:
        qs = qs.filter(scaler__name=scaler)
    labels = parse_labels(params.get("label") or "")
    if labels:
        qs = qs.filter(labels__contains=labels)
    q = (params.get("q") or "").strip()[:200]
    if q:
        cond = (
            Q(agent_id__icontains=q)
            | Q(managed_id__icontains=q)
            | Q(bound_job_id__icontains=q)
            | Q(labels__contains=[q])
        )
        try:
            cond |= Q(ip=str(ipaddress.ip_address(q)))
        except ValueError:
            pass
        qs = qs.filter(cond)
    cleaned = {"state": state, "scaler": scaler, "label": ",".join(labels), "q": q, "sort": sort}
    return qs.order_by(*order), cleaned
