"""The live nav badge and "Needs attention" panel (ws/attention/, live.consumers.AttentionConsumer)
over the real Redis channel layer: a notice brings a frame within about a second, what no notice
announces arrives with the next poll, and nothing is sent while nothing changes."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from live import consumers
from live.attention import SharedAttention, read_and_render
from live.routing import websocket_urlpatterns
from operations.services import create_operation, reject_operation
from scalers.admission.ledger import release
from scalers.models import Scaler, ScaleRequest
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

COUNT = re.compile(r'id="attention-badge"[^>]*data-count="(\d+)"')


@pytest.fixture(autouse=True)
async def close_thread_connections():
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"].startswith("channels_redis.")
    yield
    from django.db import connections

    await database_sync_to_async(connections.close_all)()


@pytest.fixture(autouse=True)
def fresh_read(monkeypatch):
    """A process's shared read of its own: a read of the previous test must not serve this one."""
    monkeypatch.setattr(consumers, "SHARED", SharedAttention())


@pytest.fixture
def poll(monkeypatch):
    """Set the consumers' poll interval (seconds); by default so long that only notices count."""

    def set_poll(seconds: float) -> None:
        monkeypatch.setattr(consumers, "ATTENTION_POLL_SECONDS", seconds)

    set_poll(60)
    return set_poll


async def connect(path: str, user) -> tuple[WebsocketCommunicator, str]:
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = user
    connected, code = await comm.connect()
    assert connected, code
    return comm, await comm.receive_from(timeout=5)


def count(frame: str) -> int:
    (value,) = COUNT.findall(frame)
    return int(value)


async def test_the_badge_counts_up_on_a_planned_operation_and_down_on_its_rejection(users, config_file, poll):
    page, first = await connect("/ws/attention/?panel=1", users["viewer"])
    try:
        assert count(first) == 0 and 'hx-swap-oob="true"' in first and "Nothing needs you." in first
        started = time.monotonic()
        op = await database_sync_to_async(create_operation)("config-reload", {}, users["operator"])
        frame = await page.receive_from(timeout=5)
        assert time.monotonic() - started < 3  # the notice, not the (60 s) poll
        assert count(frame) == 1 and "1 operation awaits approval" in frame and f'href="/operations/{op.pk}/"' in frame
        await database_sync_to_async(reject_operation)(op, users["approver"])
        frame = await page.receive_from(timeout=5)
        assert count(frame) == 0 and "Nothing needs you." in frame
    finally:
        await page.disconnect()


async def test_without_the_panel_parameter_only_the_badge_is_sent(users, config_file, poll):
    page, first = await connect("/ws/attention/", users["viewer"])
    try:
        assert count(first) == 0 and "attention-items" not in first
        await database_sync_to_async(create_operation)("config-reload", {}, users["operator"])
        frame = await page.receive_from(timeout=5)
        assert count(frame) == 1 and "attention-items" not in frame
    finally:
        await page.disconnect()


async def test_what_no_notice_announces_arrives_with_the_poll_and_nothing_repeats(viewer, poll):
    poll(0.3)
    page, first = await connect("/ws/attention/?panel=1", viewer)
    try:
        assert count(first) == 0
        assert await page.receive_nothing(timeout=1.2)  # polled several times, nothing changed
        now = timezone.now()
        await database_sync_to_async(ScaleRequest.objects.create)(
            job_id="j", outcome="at-capacity", cap="maxAgents", scaler_name="c", first_requested_at=now, decided_at=now
        )
        frame = await page.receive_from(timeout=3)
        assert count(frame) == 1 and "1 job waiting on c: at capacity (maxAgents)" in frame
        assert await page.receive_nothing(timeout=1.2)
    finally:
        await page.disconnect()


async def test_a_job_waiting_at_capacity_stays_while_its_cap_frees_and_goes_once_admitted(viewer, poll):
    """The count follows the orchestrator, not capacity: a freed cap changes nothing on the panel
    (no flap); the job's next ask, admitted, takes it off within a poll."""

    def refused_at_capacity() -> str:
        holder = make_agent(make_scaler("c", max_agents=1), AgentState.RUNNING)
        now = timezone.now()
        ScaleRequest.objects.create(
            job_id="j", outcome="at-capacity", cap="maxAgents", scaler_name="c", first_requested_at=now, decided_at=now
        )
        return holder.agent_id

    def holder_ends(agent_id: str) -> None:
        Agent.objects.filter(agent_id=agent_id).update(state=AgentState.DESTROYED)
        release(agent_id, "destroyed")  # its reservation.released event is a notice

    def asked_again_and_admitted() -> None:
        make_agent(Scaler.objects.get(name="c"), AgentState.SPAWNING, bound_job_id="j")
        ScaleRequest.objects.filter(job_id="j").update(outcome="spawning", cap="", decided_at=timezone.now())

    poll(2)
    holder = await database_sync_to_async(refused_at_capacity)()
    page, first = await connect("/ws/attention/?panel=1", viewer)
    try:
        assert count(first) == 1 and "1 job waiting on c: at capacity (maxAgents)" in first
        await database_sync_to_async(holder_ends)(holder)
        assert await page.receive_nothing(timeout=3)  # re-read on the notice and a poll: nothing changed
        await database_sync_to_async(asked_again_and_admitted)()
        frame = await page.receive_from(timeout=5)
        assert count(frame) == 0 and "Nothing needs you." in frame
    finally:
        await page.disconnect()


async def test_a_user_without_the_view_permission_is_refused(users):
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/attention/")
    comm.scope["user"] = users["outsider"]
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_output(timeout=5))["code"] == 4403
    await comm.disconnect()


async def test_a_process_reads_at_most_once_per_interval_whatever_its_viewers_ask():
    reads = []

    def read(started):
        reads.append(1)
        return read_and_render(started)

    shared = SharedAttention(read, min_seconds=0.5)
    get = database_sync_to_async(shared.get)
    first = await get(time.monotonic())
    assert 'data-count="0"' in first.badge and len(reads) == 1
    assert await get(first.read_at) is first  # fresh enough: shared
    later = time.monotonic()
    stale = await get(later)  # fresher asked, but the last read is younger than the interval
    assert stale is first and stale.read_at < later and len(reads) == 1
    await asyncio.sleep(0.5)
    fresh = await get(later)
    assert fresh is not first and fresh.read_at >= later and len(reads) == 2


async def test_a_notice_after_the_shared_read_still_reaches_the_viewer(users, config_file, poll, monkeypatch):
    """Two pages; the second one's notice comes right after a read the first one made: it must
    not keep that older read."""
    monkeypatch.setattr(consumers, "SHARED", SharedAttention(min_seconds=2.0))
    one, _ = await connect("/ws/attention/", users["viewer"])
    two, first = await connect("/ws/attention/", users["viewer"])
    try:
        assert count(first) == 0
        await database_sync_to_async(create_operation)("config-reload", {}, users["operator"])
        frames = [await one.receive_from(timeout=6), await two.receive_from(timeout=6)]
        assert [count(f) for f in frames] == [1, 1]
    finally:
        await one.disconnect()
        await two.disconnect()


BANNER = re.compile(r'<div class="alert alert-warn" role="status" id="pause-banner" hx-swap-oob="true"( hidden)?>')


async def test_the_pause_banner_follows_a_pause_and_its_resume_without_a_reload(users, poll):
    """A page open while a scaler is paused and resumed shows the banner come and go (a resume that
    succeeded must not leave "Paused" on the page until a reload)."""
    from scalers.pauses import lift_pause, set_pause

    poll(0.5)
    scaler = await database_sync_to_async(make_scaler)("banner-ws")
    comm, first = await connect("/ws/attention/", users["viewer"])
    try:
        assert BANNER.search(first).group(1) == " hidden", first
        await database_sync_to_async(set_pause)(
            scaler=scaler, reason="disk swap", requested_by="op", approved_by="ap", operation=None
        )
        paused = await comm.receive_from(timeout=6)
        assert BANNER.search(paused).group(1) is None and "disk swap" in paused, paused
        await database_sync_to_async(lift_pause)(scaler=scaler)
        resumed = await comm.receive_from(timeout=6)
        assert BANNER.search(resumed).group(1) == " hidden" and "disk swap" not in resumed, resumed
    finally:
        await comm.disconnect()
