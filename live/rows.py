"""Live rows of the pages that list agents, operations or scalers: which rows a page shows, and
the frames that keep them current. A row view filters with the page's own query and renders with
its own row partial, so a row cannot be on the page and missing from its pushes, or the other way
round. Groups, producers, frames, batching and counts: docs/live-streams.md ("Live rows").
"""

from __future__ import annotations

import hashlib
import json

from django.core.exceptions import ObjectDoesNotExist
from django.template.loader import render_to_string
from django.utils import timezone

from agents.listing import DEFAULT_SORT, LIST_PAGE_SIZE, MAX_PAGE, filter_agents, page_rows
from agents.models import Agent
from lib.query import BadParameter, whole_number
from operations.listing import PAGE_SIZE as OPERATIONS_PAGE_SIZE
from operations.listing import filter_operations
from scalers.capacity import Capacity, listed_scaler_capacities
from scalers.models import Scaler
from scalers.selftest import can_run_selftest

from .streams import StreamKey

ROW_BATCH_SECONDS = 1.0
"""Each page gets at most one frame of row changes per this many seconds, however many arrive."""

MAX_DIRTY = 5000
"""Changed ids a page collects between two frames; beyond that its next frame is a full sync."""

MAX_LIMIT = 500
"""Most rows a row view holds (``limit``)."""

AGENTS_GROUP = "rows.agents"
OPERATIONS_GROUP = "rows.operations"
SCALERS_GROUP = "rows.scalers"

AGENTS_PAGE = "dashboard/index.html"
OPERATIONS_PAGE = "operations/list.html"
SCALERS_PAGE = "scalers/list.html"


def agent_rows_group(agent_id: str) -> str:
    """``rows.agent.<agent_id>``: the row of one agent (its page). ValueError for a bad id."""
    StreamKey(agent_id, "events")  # validates the id
    return f"rows.agent.{agent_id}"


def scaler_rows_group(scaler_pk: int) -> str:
    """``rows.scaler.<pk>``: the agent rows of one scaler."""
    return f"rows.scaler.{int(scaler_pk)}"


def agent_groups(agent_id: str, scaler_pk: int) -> list[str]:
    """Every group a change of this agent's row goes to."""
    return [AGENTS_GROUP, scaler_rows_group(scaler_pk), agent_rows_group(agent_id)]


def server_time() -> str:
    """The console's clock (ISO 8601), sent with every frame: the browser counts ages on it."""
    return timezone.now().isoformat()


def _int(params, name: str, default: int, lo: int, hi: int) -> int:
    """``lib.query.whole_number`` with the row views' error (``LookupError``)."""
    try:
        return whole_number(name, params.get(name), lo, hi, default=default)
    except BadParameter as exc:
        raise LookupError(str(exc)) from None


class RowView:
    """One page's rows. ``noun``: the key of the ``rows.dirty`` notices it reads; ``perm``: what a
    viewer needs; ``groups``: where its notices come from. Both methods are synchronous (database
    reads) and return ``(frames, shown)``: the WebSocket messages and the row keys now on the page."""

    noun = ""
    perm = ""
    groups: list[str] = []
    #: The signed-in viewer (set by the consumer), for what a page shows per user.
    user = None

    def snapshot(self) -> tuple[list[str], set]:
        raise NotImplementedError

    def update(self, keys: set, shown: set) -> tuple[list[str], set]:
        raise NotImplementedError


class _PagedRows(RowView):
    """A page of a filtered list: a changed row that matches is shown (a new one only where
    :meth:`inserts_new`), a shown row that no longer matches is removed. With ``counted``, every
    frame ends with :meth:`count_html` of the rows matching the filters."""

    template = ""
    context_name = ""
    dom_prefix = ""
    counted = False

    def __init__(self, params, page_size: int):
        self.params = params
        self.page = _int(params, "page", 1, 1, 10_000)
        self.limit = _int(params, "limit", page_size, 1, MAX_LIMIT)
        self.count: int | None = None

    def queryset(self):
        raise NotImplementedError

    def key_field(self) -> str:
        return "pk"

    def _key(self, obj):
        return getattr(obj, self.key_field())

    def count_html(self, count: int) -> str:
        """The page's count elements for ``count`` matching rows, each with ``hx-swap-oob``
        (only where ``counted``)."""
        raise NotImplementedError

    def _render(self, objects, removed=(), sync=False) -> str:
        rows = render_to_string(
            self.template,
            {
                self.context_name: objects,
                "removed": [f"{self.dom_prefix}{key}" for key in removed],
                "sync": sync,
                "server_time": server_time(),
            },
        ).strip()
        if self.count is None:
            return rows
        # After the <tbody>: a template parses table content only as its first element.
        return f"{rows}\n{self.count_html(self.count)}"

    def page_objects(self, start: int, stop: int) -> list:
        """Rows ``start`` to ``stop`` (exclusive) of :meth:`queryset`."""
        return list(self.queryset()[start:stop])

    def snapshot(self):
        start = (self.page - 1) * self.limit
        objects = self.page_objects(start, start + self.limit)
        if self.counted:
            self.count = self.queryset().count()
        return [self._render(objects, sync=True)], {self._key(o) for o in objects}

    def inserts_new(self) -> bool:
        """Whether a row that matches and is not shown yet goes on the page (at the top, the
        oldest shown row dropping off the bottom): only on the first page of a newest-first list,
        so a later page never shifts under its reader."""
        return self.page == 1

    def update(self, keys, shown):
        matched = list(self.queryset().filter(**{f"{self.key_field()}__in": list(keys)}))
        if not self.inserts_new():
            matched = [o for o in matched if self._key(o) in shown]
        found = {self._key(o) for o in matched}
        removed = sorted(k for k in keys if k in shown and k not in found)
        recounted = False
        if self.counted and not all(k in shown and k in found for k in keys):
            # A row that was shown and still matches cannot change the count; any other may.
            count = self.queryset().count()
            recounted, self.count = count != self.count, count
        if not matched and not removed and not recounted:
            return [], shown
        return [self._render(matched, removed)], (shown - set(removed)) | found


class AgentRows(_PagedRows):
    """``ws/rows/agents/?state=&scaler=&label=&q=&sort=&page=&limit=``: the dashboard's live agents,
    ``/agents/`` and a scaler page's agents (``agents.listing.filter_agents``; ``limit`` defaults to
    its page size).
    With a scaler filter the view listens to that scaler's group only."""

    template = f"{AGENTS_PAGE}#agent_rows_oob"
    context_name = "agents"
    dom_prefix = "agent-"
    counted = True

    def __init__(self, params):
        super().__init__(params, LIST_PAGE_SIZE)
        self.noun, self.perm = "agents", "agents.view_agent"
        try:
            self.qs, self.filters = filter_agents(params)
        except ValueError as exc:
            raise LookupError(str(exc)) from None
        if self.filters["scaler"]:
            scaler = Scaler.objects.filter(name=self.filters["scaler"]).values_list("pk", flat=True).first()
            if scaler is None:
                raise LookupError(f"no scaler named {self.filters['scaler']!r}")
            self.groups = [scaler_rows_group(scaler)]
        else:
            self.groups = [AGENTS_GROUP]

    def queryset(self):
        return self.qs

    def page_objects(self, start, stop):
        return page_rows(self.qs, start, stop)

    def key_field(self):
        return "agent_id"

    def count_html(self, count):
        """``/agents/``'s ``#list-count`` (``agents/list.html#list_count``: "N agents · page P
        of L", L from ``limit`` and at most ``MAX_PAGE``) and the dashboard's or scaler page's
        ``#live-agents-count`` (``dashboard/index.html#live_agents_count``); a page has one."""
        last_page = min(max(1, -(-count // self.limit)), MAX_PAGE)
        listed = render_to_string(
            "agents/list.html#list_count",
            {"count": count, "page_number": self.page, "last_page": last_page, "oob": True},
        )
        live = render_to_string(
            f"{AGENTS_PAGE}#live_agents_count",
            {"count": count, "limit": self.limit, "scaler": self.filters["scaler"], "oob": True},
        )
        return f"{listed.strip()}\n{live.strip()}"

    def inserts_new(self) -> bool:
        """New agents go on top of the first page of a newest-first list only: in any other order
        their place is elsewhere, so such a page updates the rows it shows and gains none."""
        return super().inserts_new() and self.filters["sort"] == DEFAULT_SORT


def host_access_view(agent: Agent) -> dict:
    """What the agent page says about host access.

    ``entries``: the resolved list stored at spawn (None when not resolved yet); ``explicit``: the
    label set's explicit list was used (else the default list); ``label_set_entries`` /
    ``label_set_explicit``: what the label set says now; ``drift``: the two differ, so a host-access
    change is waiting to be applied to this agent.
    """
    ls = agent.label_set
    ls_entries = ls.host_access if ls is not None else None
    drift = False
    if ls is not None and agent.host_access is not None:
        if ls_entries is not None:
            drift = (not agent.host_access_explicit) or list(ls_entries) != list(agent.host_access)
        else:
            drift = agent.host_access_explicit
    return {
        "entries": agent.host_access,
        "explicit": agent.host_access_explicit,
        "label_set_entries": ls_entries,
        "label_set_explicit": ls_entries is not None,
        "drift": drift,
    }


def agent_page_version(agent: Agent) -> str:
    """A digest of what the agent page's parts beyond its row and Details depend on (its state,
    the host access it was given and its label set's): the page's header actions, its "Network
    isolation" panel (rules in force or removed, the self-test) and a console page's state. The
    page names the version it was rendered at in its row socket's URL (``v``), so a push, or the
    snapshot after a reconnect, re-renders those parts only when they changed."""
    ls = agent.label_set
    parts = [agent.state, agent.host_access, agent.host_access_explicit, ls.host_access if ls is not None else None]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


class AgentPage(RowView):
    """``ws/rows/agent/?id=<agent_id>&v=<version>``: an agent's page and its console page. Every frame
    holds the summary row, the Details panel and the console page's state; the "Network isolation"
    panel and, once the agent ended, the header's actions go when :func:`agent_page_version` differs
    from ``v`` or the last frame's. An active agent's header is never pushed (its forms carry the
    viewer's CSRF token). ``user``: the viewer. Design: docs/live-streams.md ("Live rows").
    """

    def __init__(self, params):
        self.noun, self.perm = "agents", "agents.view_agent"
        self.agent_id = params.get("id") or ""
        self.version = params.get("v") or ""
        try:
            self.groups = [agent_rows_group(self.agent_id)]
        except ValueError as exc:
            raise LookupError(str(exc)) from None
        if not Agent.objects.filter(agent_id=self.agent_id).exists():
            raise LookupError(f"no agent {self.agent_id!r}")

    def _frames(self, sync: bool) -> list[str]:
        try:
            agent = Agent.objects.select_related("scaler", "label_set").get(agent_id=self.agent_id)
        except ObjectDoesNotExist:
            return []
        row = render_to_string(
            f"{AGENTS_PAGE}#agent_rows_oob", {"agents": [agent], "sync": sync, "server_time": server_time()}
        )
        # A frame of its own: table content cannot share one with other elements safely.
        parts = [
            render_to_string("agents/detail.html#details", {"agent": agent, "oob": True}),
            render_to_string("agents/console.html#agent_state", {"agent": agent, "oob": True}),
        ]
        version = agent_page_version(agent)
        if version != self.version:
            self.version = version
            context = {
                "agent": agent,
                "host_access": host_access_view(agent),
                "can_selftest": self.user is not None and can_run_selftest(self.user),
                "oob": True,
            }
            parts.append(render_to_string("agents/detail.html#network", context))
            if agent.is_ended:
                parts.append(render_to_string("agents/detail.html#actions", context))
        return [row.strip(), "\n".join(p.strip() for p in parts)]

    def snapshot(self):
        return self._frames(sync=True), {self.agent_id}

    def update(self, keys, shown):
        if self.agent_id not in keys:
            return [], shown
        return self._frames(sync=False), shown


class OperationRows(_PagedRows):
    """``ws/rows/operations/?status=&kind=&scaler=&page=``: ``/operations/``
    (``operations.listing.filter_operations``)."""

    template = f"{OPERATIONS_PAGE}#op_rows_oob"
    context_name = "operations"
    dom_prefix = "operation-"

    def __init__(self, params):
        super().__init__(params, OPERATIONS_PAGE_SIZE)
        self.noun, self.perm, self.groups = "operations", "operations.view_operation", [OPERATIONS_GROUP]
        try:
            self.qs, self.filters = filter_operations(params)
        except ValueError as exc:
            raise LookupError(str(exc)) from None

    def queryset(self):
        return self.qs


class ScalerRows(RowView):
    """``ws/rows/scalers/``: ``/scalers/``, each scaler's capacity (changes with its agents)."""

    def __init__(self, params):
        self.noun, self.perm, self.groups = "scalers", "agents.view_agent", [SCALERS_GROUP]

    def _render(self, caps, removed=(), sync=False) -> str:
        return render_to_string(
            f"{SCALERS_PAGE}#scaler_rows_oob",
            {"caps": caps, "removed": [f"scaler-{k}" for k in removed], "sync": sync, "server_time": server_time()},
        ).strip()

    def snapshot(self):
        caps = listed_scaler_capacities()
        return [self._render(caps, sync=True)], _scaler_pks(caps)

    def update(self, keys, shown):
        caps = listed_scaler_capacities(keys)
        found = _scaler_pks(caps)
        removed = sorted(k for k in keys if k in shown and k not in found)
        return [self._render(caps, removed)], (shown - set(removed)) | found


VIEWS = {"agents": AgentRows, "agent": AgentPage, "operations": OperationRows, "scalers": ScalerRows}


def _scaler_pks(caps: list[Capacity]) -> set[int]:
    """The scaler pks of :func:`scalers.capacity.listed_scaler_capacities` rows (each is a scaler's)."""
    return {c.scaler.pk for c in caps if c.scaler is not None}


def row_view(name: str, params) -> RowView:
    """The row view ``name`` (a key of :data:`VIEWS`) for the page's query ``params`` (a mapping of
    strings). Synchronous (database reads). LookupError naming the problem for an unknown view,
    a bad ``page``/``limit``, an unknown agent or scaler."""
    view = VIEWS.get(name)
    if view is None:
        raise LookupError(f"unknown row view {name!r} (known: {', '.join(sorted(VIEWS))})")
    return view(params)
