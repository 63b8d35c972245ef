"""The pages that list agents at fleet size: the dashboard and a scaler page show counts and a first
page of live agents, the agent list pages, sorts and filters in the URL, and none of them runs more
queries for a larger fleet."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.choices import AgentState
from agents.listing import LIST_PAGE_SIZE, MAX_PAGE
from agents.models import Agent
from front.views.dashboard import DASHBOARD_AGENT_LIMIT
from front.views.scalers import SCALER_AGENT_LIMIT
from live.rows import row_view
from operations.models import Operation
from scalers.labels import normalize_label_set
from scalers.models import ConfigState, LabelSet
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr id="agent-([^"]+)"')


def add_agents(scaler, n: int, state: str = AgentState.RUNNING, *, label_set=None, start: int = 0, **fields):
    """``n`` agents of ``scaler`` named ``<scaler>-<i>`` (``start`` ≤ i < ``start + n``); agent i
    was created i minutes ago, so a higher i is older. Returns them in that order."""
    label_set = label_set or scaler.label_sets.first()
    now = timezone.now()
    made = Agent.objects.bulk_create(
        Agent(
            agent_id=f"{scaler.name}-{i:04d}",
            scaler=scaler,
            label_set=label_set,
            state=state,
            labels=[*label_set.labels, f"kici:scaler:{scaler.name}"],
            **fields,
        )
        for i in range(start, start + n)
    )
    for i, agent in enumerate(made, start):
        agent.created_at = now - timedelta(minutes=i)
    Agent.objects.bulk_update(made, ["created_at"])
    return made


def rows(html: str) -> list[str]:
    return ROW.findall(html)


def names(prefix: str, numbers) -> list[str]:
    return [f"{prefix}-{i:04d}" for i in numbers]


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


@pytest.fixture
def fleet():
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10_000})
    return make_scaler("fleet-a", max_agents=1000), make_scaler("fleet-b", max_agents=1000)


def test_the_dashboard_lists_the_newest_live_agents_and_counts_the_rest(viewer_client, fleet):
    a, b = fleet
    add_agents(a, 20)
    add_agents(b, 20, AgentState.SPAWNING, start=100)
    add_agents(a, 5, AgentState.FAILED, start=200)
    html = viewer_client.get("/").content.decode()
    shown = rows(html)
    assert shown == [f"fleet-a-{i:04d}" for i in range(20)] + [
        f"fleet-b-{i:04d}" for i in range(100, 100 + DASHBOARD_AGENT_LIMIT - 20)
    ]
    assert f"the newest {DASHBOARD_AGENT_LIMIT} of 40" in html
    assert 'href="/agents/">all 40 live agents →' in html
    # The counts per scaler and state are on its capacity card.
    assert "20 spawning" in html and "20 running" in html


def test_a_retiring_scaler_has_a_card_only_while_it_has_live_agents(viewer_client, fleet):
    gone = make_scaler("fleet-gone", retiring=True)
    draining = make_scaler("fleet-draining", retiring=True)
    add_agents(gone, 2, AgentState.DESTROYED)
    add_agents(draining, 1, AgentState.DRAINING)
    html = viewer_client.get("/").content.decode()
    cards = re.findall(r'<div class="card" id="cap-scaler-(\d+)"', html)
    assert sorted(map(int, cards)) == sorted(s.pk for s in [*fleet, draining])
    assert gone.pk not in map(int, cards)


def test_the_scaler_page_lists_a_page_and_counts_per_label_set(viewer_client, fleet):
    a, _ = fleet
    second = LabelSet.objects.create(
        scaler=a, index=1, labels=["gpu"], normalized=normalize_label_set(["gpu"]), config={"image": "x"}
    )
    add_agents(a, 30)
    add_agents(a, 3, label_set=second, start=100)
    add_agents(a, 4, AgentState.DESTROYED, label_set=second, start=200)
    html = viewer_client.get("/scalers/fleet-a/").content.decode()
    assert rows(html) == [f"fleet-a-{i:04d}" for i in range(SCALER_AGENT_LIMIT)]
    assert f"the newest {SCALER_AGENT_LIMIT} of 33" in html
    assert 'href="/agents/?scaler=fleet-a">all 33 live agents →' in html
    live_counts = re.findall(r'<tr id="label-set-(\d)".*?<td class="num col-opt">(\d+)</td>', html, re.S)
    assert live_counts == [("0", "30"), ("1", "3")]


@pytest.mark.parametrize("url", ["/", "/agents/", "/scalers/fleet-a/", "/agents/?sort=-last_heartbeat&label=linux"])
def test_queries_do_not_grow_with_the_fleet(viewer_client, fleet, url):
    a, b = fleet
    add_agents(a, 10)
    add_agents(b, 5, AgentState.FAILED, start=100)
    viewer_client.get(url)  # sessions, permissions and content types cached as in steady use
    small = queries(viewer_client, url)
    add_agents(a, 120, start=1000, last_heartbeat=timezone.now())
    add_agents(b, 60, AgentState.DRAINING, start=2000)
    add_agents(b, 60, AgentState.FAILED, start=3000)
    assert queries(viewer_client, url) == small


def test_the_agent_list_pages_newest_first_and_links_the_next_page(viewer_client, fleet):
    a, _ = fleet
    add_agents(a, LIST_PAGE_SIZE + 7)
    first = viewer_client.get("/agents/").content.decode()
    assert rows(first) == names("fleet-a", range(LIST_PAGE_SIZE))
    assert f"{LIST_PAGE_SIZE + 7} agents · page 1 of 2" in first
    assert 'href="?state=active&amp;page=2"' in first and 'rel="prev"' not in first
    second = viewer_client.get("/agents/?page=2").content.decode()
    assert rows(second) == names("fleet-a", range(LIST_PAGE_SIZE, LIST_PAGE_SIZE + 7))
    assert 'href="?state=active&amp;page=1"' in second and 'rel="next"' not in second


def test_the_agent_list_sorts_by_a_column_in_the_url(viewer_client, fleet):
    a, b = fleet
    now = timezone.now()
    add_agents(b, 1, start=5)  # no heartbeat yet: counts as the oldest
    for i, agent in enumerate(add_agents(a, 3)):
        Agent.objects.filter(pk=agent.pk).update(last_heartbeat=now - timedelta(seconds=[30, 10, 20][i]))
    assert rows(viewer_client.get("/agents/?sort=-last_heartbeat").content.decode()) == [
        "fleet-a-0001",
        "fleet-a-0002",
        "fleet-a-0000",
        "fleet-b-0005",
    ]
    assert rows(viewer_client.get("/agents/?sort=last_heartbeat").content.decode()) == [
        "fleet-b-0005",
        "fleet-a-0000",
        "fleet-a-0002",
        "fleet-a-0001",
    ]
    html = viewer_client.get("/agents/?sort=-scaler").content.decode()
    assert rows(html) == ["fleet-b-0005", "fleet-a-0002", "fleet-a-0001", "fleet-a-0000"]  # ties: id, same way
    # the current column is marked, its link flips the direction; the filter form keeps the sort
    assert '<th class="col-opt" aria-sort="descending"><a href="?state=active&amp;sort=scaler"' in html
    assert '<a href="?state=active&amp;sort=-created_at" title="sort by age">' in html
    assert '<input type="hidden" name="sort" value="-scaler">' in html


def test_ties_go_by_id_so_pages_never_overlap(viewer_client, fleet):
    a, b = fleet
    add_agents(a, LIST_PAGE_SIZE)
    add_agents(b, LIST_PAGE_SIZE)
    Agent.objects.update(created_at=timezone.now())  # one value for every agent
    seen = []
    for page in (1, 2):
        seen += rows(viewer_client.get(f"/agents/?sort=-created_at&page={page}").content.decode())
    assert seen == list(Agent.objects.order_by("-id").values_list("agent_id", flat=True))
    seen = []
    for page in (1, 2):
        seen += rows(viewer_client.get(f"/agents/?sort=created_at&page={page}").content.decode())
    assert seen == list(Agent.objects.order_by("id").values_list("agent_id", flat=True))


@pytest.mark.parametrize("scaler", ["", "fleet-b"])
def test_the_heartbeat_sort_puts_silent_agents_oldest_and_ties_by_id_across_pages(viewer_client, fleet, scaler):
    """Sorted by heartbeat over two pages, with and without a filter: an agent never heard from
    counts as the oldest, agents heard at the same instant go by id in the sort's direction, so the
    pages neither overlap nor skip one, in both directions; each page's live rows are its rows."""
    a, b = fleet
    now = timezone.now().replace(microsecond=0)
    agents = add_agents(a, 40) + add_agents(b, LIST_PAGE_SIZE + 10, AgentState.DRAINING, start=100)  # 2 pages
    beats = [None, now, now - timedelta(seconds=5)]  # cycled: a third each, every third one tied
    for i, agent in enumerate(agents):
        agent.last_heartbeat = beats[i % 3]
    Agent.objects.bulk_update(agents, ["last_heartbeat"])
    add_agents(b, 2, AgentState.FAILED, start=900, last_heartbeat=now + timedelta(seconds=1))  # not active
    listed = [x for x in agents if not scaler or x.scaler.name == scaler]
    oldest_first = sorted(listed, key=lambda x: (x.last_heartbeat is not None, x.last_heartbeat or now, x.pk))
    expected = {"last_heartbeat": [x.agent_id for x in oldest_first]}
    expected["-last_heartbeat"] = expected["last_heartbeat"][::-1]
    for sort, order in expected.items():
        seen = []
        for page in (1, 2):
            params = {"state": "active", "scaler": scaler, "sort": sort, "page": str(page)}
            page_rows = rows(viewer_client.get("/agents/", params).content.decode())
            (frame,), _ = row_view("agents", params).snapshot()
            assert rows(frame) == page_rows
            seen += page_rows
        assert seen == order, sort


def test_the_agent_list_filters_by_labels_state_and_scaler(viewer_client, fleet):
    a, b = fleet
    gpu = LabelSet.objects.create(
        scaler=b, index=1, labels=["gpu", "linux"], normalized=normalize_label_set(["gpu", "linux"]), config={}
    )
    add_agents(a, 2)
    add_agents(b, 2, label_set=gpu, start=10)
    add_agents(b, 1, AgentState.FAILED, label_set=gpu, start=20)
    assert rows(viewer_client.get("/agents/?label=GPU").content.decode()) == names("fleet-b", [10, 11])
    assert rows(viewer_client.get("/agents/?label=linux,gpu&state=all").content.decode()) == names(
        "fleet-b", [10, 11, 20]
    )
    assert rows(viewer_client.get("/agents/?label=gpu,ctr").content.decode()) == []
    assert rows(viewer_client.get("/agents/?scaler=fleet-a&label=linux").content.decode()) == names("fleet-a", [0, 1])
    html = viewer_client.get("/agents/?label=+GPU+,,linux").content.decode()
    assert 'name="label" value="gpu,linux"' in html


@pytest.mark.parametrize(
    "query, message",
    [
        ("sort=labels", "sort: must be one of created_at, "),
        ("sort=labels", "each optionally with &#x27;-&#x27;, got &quot;labels&quot;"),
        ("sort=--created_at", "got &quot;--created_at&quot;"),
        ("page=x", f"page: must be a whole number within 1..{MAX_PAGE}, got &quot;x&quot;"),
        ("page=0", f"page: must be a whole number within 1..{MAX_PAGE}"),
        (
            f"page={MAX_PAGE + 1}",
            f"page: must be a whole number within 1..{MAX_PAGE} (narrow the filters to reach further), "
            f"got {MAX_PAGE + 1}",
        ),
        # One state at a time (``active`` is the several live ones): a second is refused, not dropped.
        ("state=running&state=failed", "state: takes one value, got 2: &quot;running&quot;, &quot;failed&quot;"),
        ("label=gpu&label=linux", "label: takes one value, got 2"),
        ("page=1&page=2", "page: takes one value, got 2"),
        ("status=running", "status: unknown parameter (accepted: state, scaler, label, q, sort, page)"),
    ],
)
def test_a_bad_sort_or_page_is_refused_naming_it(viewer_client, fleet, query, message):
    response = viewer_client.get(f"/agents/?{query}")
    assert response.status_code == 400
    assert message in response.content.decode()


def test_the_agent_list_stops_at_its_last_page_and_says_so(viewer_client, fleet, monkeypatch):
    monkeypatch.setattr("agents.listing.MAX_PAGE", 2)
    monkeypatch.setattr("front.views.agent_list.MAX_PAGE", 2)
    add_agents(fleet[0], 2 * LIST_PAGE_SIZE + 1)
    html = viewer_client.get("/agents/?page=2").content.decode()
    assert "page 2 of 2" in html and 'rel="next"' not in html
    assert "the list stops at page 2: narrow the filters" in html
    assert viewer_client.get("/agents/?page=3").status_code == 400


def test_live_rows_of_a_sorted_list_update_its_rows_and_insert_none(fleet):
    a, _ = fleet
    shown_agent, *_ = add_agents(a, 2)
    params = {"state": "active", "sort": "agent_id"}
    _, shown = row_view("agents", params).snapshot()
    assert shown == {"fleet-a-0000", "fleet-a-0001"}
    (new,) = add_agents(a, 1, start=100)
    frames, now_shown = row_view("agents", params).update({new.agent_id, shown_agent.agent_id}, shown)
    assert now_shown == shown
    assert f'id="agent-{shown_agent.agent_id}"' in frames[0] and new.agent_id not in frames[0]
    # newest first, the first page gains the new agent at the top
    frames, now_shown = row_view("agents", {"state": "active"}).update({new.agent_id}, shown)
    assert new.agent_id in now_shown and f'id="agent-{new.agent_id}"' in frames[0]


def test_live_rows_refuse_a_bad_sort(fleet):
    with pytest.raises(LookupError, match='sort: must be one of .*, got "x"$'):
        row_view("agents", {"sort": "x"})


def test_operators_get_a_bulk_form_and_a_checkbox_per_row(operator_client, viewer, fleet):
    add_agents(fleet[0], 2)
    html = operator_client.get("/agents/").content.decode()
    assert '<section class="panel selectable">' in html
    assert '<form id="bulk-agents" class="toolbar small" method="post" action="/operations/plan/" data-bulk>' in html
    assert 'name="kind" value="agent-drain"' in html and 'name="kind" value="agent-destroy"' in html
    for agent_id in names("fleet-a", [0, 1]):
        assert f'<input type="checkbox" name="agent" value="{agent_id}" form="bulk-agents"' in html
    # A viewer cannot request operations: no form, and the checkbox column stays hidden.
    viewer_client = Client()
    viewer_client.force_login(viewer)
    html = viewer_client.get("/agents/").content.decode()
    assert 'id="bulk-agents"' not in html and '<section class="panel">' in html


def test_the_bulk_form_plans_one_operation_over_every_selected_agent(operator_client, fleet):
    running = add_agents(fleet[0], 3)
    spawning = add_agents(fleet[0], 1, AgentState.SPAWNING, start=10)
    picked = [a.agent_id for a in [*running, *spawning]]
    response = operator_client.post("/operations/plan/", {"kind": "agent-drain", "agent": picked, "request": "1"})
    operation = Operation.objects.get()
    assert response.status_code == 302 and response.url == f"/operations/{operation.pk}/"
    assert operation.status == "planned" and operation.agent_ids == picked
    assert [t["subject"] for t in operation.plan] == picked[:3]
    assert [s["subject"] for s in operation.spared] == picked[3:]


def test_a_bulk_selection_over_two_scalers_is_refused(operator_client, fleet):
    a, b = fleet
    picked = [add_agents(a, 1)[0].agent_id, add_agents(b, 1, start=5)[0].agent_id]
    response = operator_client.post("/operations/plan/", {"kind": "agent-destroy", "agent": picked})
    assert response.status_code == 400
    assert "plan one operation per scaler" in response.content.decode()
