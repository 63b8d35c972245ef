"""Live rows of the list pages (ws/rows/<view>/, live.consumers.RowsConsumer) over the real Redis
channel layer: each page's group gets its own rows, and bursts are batched per page."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.heartbeats import push_heartbeat_row
from agents.models import Agent, ScalerEvent
from live.publish import apublish_rows, rows_notice
from live.routing import websocket_urlpatterns
from live.rows import AGENTS_GROUP, ROW_BATCH_SECONDS, AgentRows, agent_page_version
from operations.kinds.host_access_apply import record_rules_rewrite
from operations.services import create_operation
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ROW_ID = re.compile(r'<tr id="agent-([^"]+)"')


@pytest.fixture(autouse=True)
async def close_thread_connections():
    """A Redis layer (not in-memory) and, afterwards, no DB connection left by the worker threads."""
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"].startswith("channels_redis.")
    yield
    from django.db import connections

    await database_sync_to_async(connections.close_all)()


async def connect(path: str, user) -> tuple[WebsocketCommunicator, str]:
    """Connect and return the communicator with its first (data-sync) frame."""
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = user
    connected, code = await comm.connect()
    assert connected, code
    first = await comm.receive_from(timeout=5)
    return comm, first


async def frames_for(comm, seconds: float) -> list[str]:
    """Every frame that arrives within ``seconds``."""
    frames = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        # receive_nothing waits without cancelling the consumer (receive_from's timeout would)
        if await comm.receive_nothing(timeout=left, interval=0.02):
            break
        frames.append(await comm.receive_from())
    return frames


def rows(frames) -> list[str]:
    return [agent_id for frame in frames for agent_id in ROW_ID.findall(frame)]


def event(agent_id: str, type: str = EventType.READY, **changes) -> None:
    """Change the agent, record an event about it and wait until it was pushed."""
    if changes:
        Agent.objects.filter(agent_id=agent_id).update(**changes)
    record_event(Agent.objects.select_related("scaler").get(agent_id=agent_id), type, "changed")
    assert flush_events(5)


@database_sync_to_async
def two_scalers():
    a, b = make_scaler("rows-a"), make_scaler("rows-b")
    return a, b, make_agent(a, AgentState.RUNNING), make_agent(b, AgentState.RUNNING)


@pytest.fixture
def updates(monkeypatch):
    """The ids each AgentRows view was asked to render (what reached the page's group)."""
    seen: list[set] = []
    update = AgentRows.update

    def recording(self, keys, shown):
        seen.append(set(keys))
        return update(self, keys, shown)

    monkeypatch.setattr(AgentRows, "update", recording)
    return seen


async def test_a_scaler_page_gets_its_scalers_agents_only(viewer, updates):
    a, b, agent_a, agent_b = await two_scalers()
    page, first = await connect("/ws/rows/agents/?scaler=rows-a&state=active", viewer)
    try:
        assert "data-sync" in first and rows([first]) == [agent_a.agent_id]
        await database_sync_to_async(event)(agent_b.agent_id)
        await database_sync_to_async(event)(agent_a.agent_id, active_jobs=1)
        frame = await page.receive_from(timeout=5)
        assert rows([frame]) == [agent_a.agent_id] and "1 running" in frame
        assert 'hx-swap-oob="afterbegin:#agent-rows" data-upsert' in frame and "data-server-time=" in frame
        assert await page.receive_nothing(timeout=ROW_BATCH_SECONDS + 0.5)
        # the page's group (rows.scaler.<pk>) never carried the other scaler's agent
        assert updates == [{agent_a.agent_id}]
    finally:
        await page.disconnect()


async def test_a_filtered_list_gets_matching_rows_and_a_removal_for_rows_leaving_it(viewer):
    a, _, agent, _ = await two_scalers()
    live, _ = await connect("/ws/rows/agents/?state=active", viewer)
    failed, first_failed = await connect("/ws/rows/agents/?state=failed", viewer)
    try:
        assert rows([first_failed]) == []
        new = await database_sync_to_async(make_agent)(a, AgentState.SPAWNING)
        await database_sync_to_async(event)(new.agent_id, EventType.PROVISIONING)
        frame = await live.receive_from(timeout=5)
        assert rows([frame]) == [new.agent_id]  # a new agent appears
        await database_sync_to_async(event)(agent.agent_id, EventType.FAILED, state=AgentState.FAILED)
        frame = await live.receive_from(timeout=5)
        assert rows([frame]) == [] and f'data-remove="agent-{agent.agent_id}"' in frame
        # A count-only frame may come first: the view recounts on the new agent's event, and by
        # then the failed agent's row may be committed (its own event not yet handled).
        frames = [await failed.receive_from(timeout=5)]
        while not rows(frames) and len(frames) < 3:
            frames.append(await failed.receive_from(timeout=5))
        assert rows(frames) == [agent.agent_id] and not any("data-remove" in f for f in frames)
        assert await failed.receive_nothing(timeout=0.5)  # the new spawning agent never reached it
    finally:
        await live.disconnect()
        await failed.disconnect()


async def test_an_agent_page_gets_its_row_and_details_and_heartbeats(viewer):
    _, _, agent, other = await two_scalers()
    page, first = await connect(f"/ws/rows/agent/?id={agent.agent_id}", viewer)
    try:
        details = await page.receive_from(timeout=5)
        assert rows([first]) == [agent.agent_id] and 'id="agent-details" hx-swap-oob="true"' in details
        await database_sync_to_async(event)(other.agent_id)

        def heartbeat():
            Agent.objects.filter(pk=agent.pk).update(active_jobs=3)
            push_heartbeat_row(agent)
            assert flush_events(5)

        await database_sync_to_async(heartbeat)()
        frame, details = await page.receive_from(timeout=5), await page.receive_from(timeout=5)
        assert rows([frame]) == [agent.agent_id] and "3 running" in frame
        assert "<dt>Active jobs</dt><dd>3</dd>" in details
        # The page named no version: its network panel came once, with the first frame; a
        # heartbeat changes nothing it depends on.
        assert 'id="agent-network"' not in details and 'id="agent-actions"' not in details
        assert await page.receive_nothing(timeout=ROW_BATCH_SECONDS + 0.5)
    finally:
        await page.disconnect()


async def test_an_open_agent_page_and_list_show_the_agent_ended_once_it_is(viewer):
    _, _, agent, _ = await two_scalers()
    beat = timezone.now() - timedelta(seconds=12)
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(ip="172.30.0.8", last_heartbeat=beat)
    ticking = f'<time data-rel datetime="{beat.isoformat()}"'
    page, first = await connect(f"/ws/rows/agent/?id={agent.agent_id}", viewer)
    listed, _ = await connect("/ws/rows/agents/?state=all", viewer)
    try:
        details = await page.receive_from(timeout=5)
        assert ticking in first and '<td class="col-opt mono nowrap">172.30.0.8</td>' in first
        # A live agent's header status is the page's own connection indicator: never pushed.
        assert "<dt>Address</dt>" in details and 'id="agent-status"' not in details

        await database_sync_to_async(event)(
            agent.agent_id, EventType.DESTROYED, state=AgentState.DESTROYED, finished_at=timezone.now()
        )
        frame, details = await page.receive_from(timeout=5), await page.receive_from(timeout=5)
        for row in (frame, await listed.receive_from(timeout=5)):
            assert rows([row]) == [agent.agent_id] and 'data-state="destroyed"' in row
            assert ticking not in row and f'<time datetime="{beat.isoformat()}">' in row
            assert "172.30.0.8 (released)" in row
        assert ticking not in details and "<dt>Last address</dt>" in details
        actions = re.search(r'<div class="actions" id="agent-actions" hx-swap-oob="true">.*?</div>', details, re.S)
        assert actions and "data-live-status" not in details, "the header's actions, live status gone"
        status = re.search(r'<span id="agent-status"[^>]*>.*', actions.group(0))
        assert status and '<span class="badge st-destroyed">destroyed</span> ended <time' in status.group(0)
        assert "agent-drain" not in actions.group(0) and "agent-destroy" not in actions.group(0)
        network = re.search(
            r'<div class="panel-body" id="agent-network" hx-swap-oob="true">.*?selftest-result', details, re.S
        )
        assert network and "Rules in force" not in network.group(0) and "Isolation rules" in network.group(0)
        assert "<form hx-post" not in network.group(0) and "Run self-test</button>" in network.group(0)
    finally:
        await page.disconnect()
        await listed.disconnect()


async def test_a_host_access_rewrite_reaches_an_open_agent_page_and_a_reconnect_catches_up(viewer):
    _, _, agent, _ = await two_scalers()

    @database_sync_to_async
    def prepare():
        Agent.objects.filter(pk=agent.pk).update(ip="172.30.0.8", host_access=["172.30.0.1:53"])
        return agent_page_version(Agent.objects.select_related("label_set").get(pk=agent.pk))

    version = await prepare()
    page, _ = await connect(f"/ws/rows/agent/?id={agent.agent_id}&v={version}", viewer)
    try:
        details = await page.receive_from(timeout=5)
        assert 'id="agent-network"' not in details, "the page was rendered at this version"

        @database_sync_to_async
        def rewrite():
            record_rules_rewrite(agent, ["*:9000"], True, 41, "1 rule(s) added, 1 removed")
            assert flush_events(5)

        await rewrite()
        await page.receive_from(timeout=5)  # the row
        details = await page.receive_from(timeout=5)
        network = re.search(r'<div class="panel-body" id="agent-network" hx-swap-oob="true">.*', details, re.S)
        assert network and "<li>*:9000</li>" in network.group(0) and "Rules in force" in network.group(0)
        timeline = await database_sync_to_async(list)(
            ScalerEvent.objects.filter(agent__agent_id=agent.agent_id).values_list("type", "detail")
        )
        assert (
            EventType.NETWORK,
            "host access rewritten by operation #41: [*:9000] (1 rule(s) added, 1 removed)",
        ) in timeline
    finally:
        await page.disconnect()
    # A page that reconnects names the version it was rendered at: the snapshot catches it up.
    again, _ = await connect(f"/ws/rows/agent/?id={agent.agent_id}&v={version}", viewer)
    try:
        assert "<li>*:9000</li>" in await again.receive_from(timeout=5)
    finally:
        await again.disconnect()


async def test_a_heartbeat_storm_reaches_each_page_in_about_one_frame_a_second(viewer):
    @database_sync_to_async
    def world():
        scaler = make_scaler("rows-storm")
        Agent.objects.bulk_create(
            Agent(agent_id=f"scaler-container-{n:08x}", scaler=scaler, state=AgentState.RUNNING) for n in range(1000)
        )
        return scaler

    scaler = await world()
    ids = [f"scaler-container-{n:08x}" for n in range(1000)]
    page, first = await connect("/ws/rows/agents/?state=active&limit=500", viewer)
    other, _ = await connect("/ws/rows/agents/?state=failed", viewer)
    try:
        assert len(rows([first])) == 500
        started = time.monotonic()
        for _ in range(2):  # two heartbeats of each of the 1,000 agents, as fast as they come
            for agent_id in ids:
                await apublish_rows([(AGENTS_GROUP, rows_notice("agents", [agent_id]))])
        sent = time.monotonic() - started
        frames = await frames_for(page, sent + 3 * ROW_BATCH_SECONDS)
        assert set(rows(frames)) == set(ids)  # every row, the 500 shown and 500 new at the top
        assert len(frames) <= sent / ROW_BATCH_SECONDS + 3, (len(frames), sent)
        assert await other.receive_nothing(timeout=0.2)  # no running agent is a failed one
    finally:
        await page.disconnect()
        await other.disconnect()
    assert scaler.pk


async def test_the_operations_list_gets_a_new_operation(users, config_file):
    page, first = await connect("/ws/rows/operations/?status=planned", users["viewer"])
    try:
        assert "data-sync" in first
        op = await database_sync_to_async(create_operation)("config-reload", {}, users["operator"])
        frame = await page.receive_from(timeout=5)
        assert f'<tr id="operation-{op.pk}"' in frame and 'hx-swap-oob="afterbegin:#op-rows"' in frame
    finally:
        await page.disconnect()


async def test_the_scalers_list_follows_its_scalers_capacity(viewer):
    a, b, agent, _ = await two_scalers()
    page, first = await connect("/ws/rows/scalers/", viewer)
    try:
        assert f'<tr id="scaler-{a.pk}"' in first and f'<tr id="scaler-{b.pk}"' in first
        await database_sync_to_async(event)(agent.agent_id)
        frame = await page.receive_from(timeout=5)
        assert f'<tr id="scaler-{a.pk}"' in frame and f'<tr id="scaler-{b.pk}"' not in frame
    finally:
        await page.disconnect()


@pytest.mark.parametrize(
    ("path", "who", "code"),
    [
        ("/ws/rows/agents/", "anonymous", 4403),
        ("/ws/rows/agents/", "outsider", 4403),
        ("/ws/rows/operations/", "outsider", 4403),
        ("/ws/rows/nothing/", "viewer", 4404),
        ("/ws/rows/agents/?page=x", "viewer", 4404),
        ("/ws/rows/agents/?scaler=no-such-scaler", "viewer", 4404),
        ("/ws/rows/agent/?id=scaler-container-00000000", "viewer", 4404),
    ],
)
async def test_it_refuses_what_it_cannot_show(users, path, who, code):
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = AnonymousUser() if who == "anonymous" else users[who]
    connected, _ = await comm.connect()
    assert connected  # accepted, then closed with the code (the htmx ws extension does not retry it)
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": code}
    await comm.disconnect()


async def test_a_frame_is_rendered_once_per_batch_not_per_notice(viewer, updates):
    _, _, agent, _ = await two_scalers()
    page, _ = await connect("/ws/rows/agents/", viewer)
    try:
        for _ in range(50):
            await apublish_rows([(AGENTS_GROUP, rows_notice("agents", [agent.agent_id]))])
        await page.receive_from(timeout=5)
        await asyncio.sleep(ROW_BATCH_SECONDS + 0.3)
        assert updates == [{agent.agent_id}]
    finally:
        await page.disconnect()


LIST_COUNT = re.compile(r'<span id="list-count" hx-swap-oob="true">([^<]*)</span>')
LIVE_COUNT = re.compile(r'<span id="live-agents-count" class="small" hx-swap-oob="true">(.*?)</span>\s*$', re.S)


async def test_every_frame_counts_the_views_matching_rows_not_the_rows_it_draws(viewer):
    @database_sync_to_async
    def world():
        scaler = make_scaler("rows-count")
        return [make_agent(scaler, AgentState.RUNNING) for _ in range(5)]

    agents = await world()
    later, first = await connect("/ws/rows/agents/?state=active&limit=2&page=2", viewer)
    dashboard, first_dashboard = await connect("/ws/rows/agents/?state=active&limit=2", viewer)
    try:
        assert len(rows([first])) == 2 and LIST_COUNT.findall(first) == ["5 agents · page 2 of 3"]
        assert "the newest 2 of 5" in first_dashboard and "all 5 live agents →" in first_dashboard
        # A new agent belongs on the first page: the later page gains no row, only its count.
        new = await database_sync_to_async(make_agent)(agents[0].scaler, AgentState.SPAWNING)
        await database_sync_to_async(event)(new.agent_id, EventType.PROVISIONING)
        frame = await later.receive_from(timeout=5)
        assert rows([frame]) == [] and LIST_COUNT.findall(frame) == ["6 agents · page 2 of 3"]
        assert "all 6 live agents →" in LIVE_COUNT.search(await dashboard.receive_from(timeout=5)).group(1)
        # A heartbeat of a shown row: its frame still carries the count (not read again).
        shown = rows([first])[0]
        await apublish_rows([(AGENTS_GROUP, rows_notice("agents", [shown]))])
        frame = await later.receive_from(timeout=5)
        assert rows([frame]) == [shown] and LIST_COUNT.findall(frame) == ["6 agents · page 2 of 3"]
    finally:
        await later.disconnect()
        await dashboard.disconnect()
