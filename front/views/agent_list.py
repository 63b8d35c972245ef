"""``/agents/``: every agent, filtered by state, scaler, labels and a search term, sorted by a
column, a page at a time; every choice is in the URL, so a link shows the same list."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.listing import (
    DEFAULT_SORT,
    LIST_PAGE_SIZE,
    LIST_PARAMETERS,
    MAX_PAGE,
    SORTS,
    STATE_FILTERS,
    filter_agents,
    page_number,
    page_rows,
)
from lib.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters
from scalers.models import Scaler

from .common import query_string, viewer_required

#: The first direction of a column when it is picked: times newest first, names A to Z.
FIRST_DESCENDING = {"created_at", "last_heartbeat"}


def sort_links(filters: dict, current: str) -> dict:
    """``{column: {"url", "dir"}}`` for the table's sortable headers: the URL of the list with
    ``filters`` sorted by that column (the other direction when it is ``current``), ``dir``
    "ascending" / "descending" for the current column (``aria-sort``), else empty."""
    links = {}
    for column in SORTS:
        if current.removeprefix("-") == column:
            direction = "descending" if current.startswith("-") else "ascending"
            target = column if current.startswith("-") else f"-{column}"
        else:
            direction = ""
            target = f"-{column}" if column in FIRST_DESCENDING else column
        links[column] = {"url": "?" + query_string(**{**filters, "sort": target}), "dir": direction}
    return links


@require_GET
@viewer_required
def agent_list(request):
    """``/agents/``: a page of agents (``agents.listing``: filters, ``sort``, ``page`` up to
    ``MAX_PAGE``); htmx requests get only the table. 400 naming the parameter and value for a bad
    filter, sort or page, an unknown parameter, or one given twice (each takes one value)."""
    try:
        check_parameters(request.GET, single=LIST_PARAMETERS)
        qs, cleaned = filter_agents(request.GET)
        number = page_number(request.GET.get("page"))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    paginator = Paginator(qs, LIST_PAGE_SIZE)
    page = paginator.get_page(number)
    start = (page.number - 1) * LIST_PAGE_SIZE
    last_page = min(paginator.num_pages, MAX_PAGE)
    filters = {**cleaned, "sort": "" if cleaned["sort"] == DEFAULT_SORT else cleaned["sort"]}
    ctx = {
        "nav": "agents",
        "page": page,
        "count": paginator.count,
        "page_number": page.number,
        "last_page": last_page,
        "capped": paginator.num_pages > MAX_PAGE,
        "has_next": page.number < last_page,
        "agents": page_rows(qs, start, start + LIST_PAGE_SIZE),
        "agent_limit": LIST_PAGE_SIZE,
        "filters": cleaned,
        "state_filters": STATE_FILTERS,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
        "query": query_string(**filters),
        "rows_query": query_string(**filters, page=page.number),
        "sort_links": sort_links(filters, cleaned["sort"]),
        "sort_param": filters["sort"],
        "empty_text": "No agent matches these filters.",
    }
    if wants_partial(request):
        return render(request, "agents/list.html#results", ctx)
    return render(request, "agents/list.html", ctx)
