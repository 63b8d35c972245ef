"""Live console and event WebSockets (live.consumers) over the real Redis channel layer."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Permission, User

from agents.models import Agent
from live.consumers import close_console_hub, get_console_hub
from live.routing import websocket_urlpatterns
from live.streams import StreamKey
from scalers.models import Scaler
from tests.support.docker import run_script

pytestmark = pytest.mark.django_db(transaction=True)

AGENT_ID = "scaler-firecracker-7a11c0de"


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.fixture(autouse=True)
async def clean_redis():
    """Each test starts and ends without console keys of the agents these tests use."""
    import redis.asyncio

    assert settings.CHANNEL_LAYERS["default"]["BACKEND"].startswith("channels_redis.")  # a Redis layer, not in-memory
    client = redis.asyncio.from_url(settings.REDIS_URL)

    async def clean():
        for agent_id in (AGENT_ID, "scaler-container-7a11c0de"):
            async for name in client.scan_iter(f"kici:console:{agent_id}:*"):
                await client.delete(name)

    await clean()
    yield
    await close_console_hub()
    await clean()
    await client.aclose()


def _make_world(tmp_path):
    scaler = Scaler.objects.create(name="tail-fc", type="firecracker", max_agents=4)
    logs = {"serial": str(tmp_path / "serial-console.log"), "vmm": str(tmp_path / "vmm.log")}
    Agent.objects.create(agent_id=AGENT_ID, scaler=scaler, backend_context={"console_logs": logs})
    viewer = User.objects.create_user("tail-viewer", password="pw-tail-viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_agent", content_type__app_label="agents"))
    outsider = User.objects.create_user("tail-outsider", password="pw-tail-outsider")
    return scaler, User.objects.get(pk=viewer.pk), outsider


@pytest.fixture
async def world(tmp_path):
    scaler, viewer, outsider = await database_sync_to_async(_make_world)(tmp_path)
    return {"serial": tmp_path / "serial-console.log", "viewer": viewer, "outsider": outsider, "scaler": scaler}


def communicator(path: str, user) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = user
    return comm


async def connect(path: str, user) -> WebsocketCommunicator:
    comm = communicator(path, user)
    connected, _ = await comm.connect()
    assert connected
    return comm


async def frames_until(comm, predicate, timeout: float = 10.0) -> list[str]:
    frames = []
    async with asyncio.timeout(timeout):
        while True:
            frames.append(await comm.receive_from(timeout=timeout))
            if predicate(frames):
                return frames


def rows(frames) -> list[list]:
    """Every row of the JSON console frames, in order."""
    return [row for frame in frames for row in json.loads(frame)["rows"]]


def seqs(frames) -> list[int]:
    """The line numbers of the lines (not the gap rows) in the frames."""
    return [row[0] for row in rows(frames) if row[3:4] != ["g"]]


def texts(frames) -> list[str]:
    return [row[2] for row in rows(frames)]


CONSOLE = f"/ws/agents/{AGENT_ID}/console/serial/"


async def test_a_late_joiner_gets_the_last_500_lines_then_live_lines(world):
    first = await connect(CONSOLE, world["viewer"])
    opening = await first.receive_from()
    assert json.loads(opening) == {"reset": True, "rows": []}
    append(world["serial"], b"".join(b"boot line %d\n" % i for i in range(1, 601)))
    await frames_until(first, lambda f: 600 in seqs(f))

    late = await connect(CONSOLE, world["viewer"])
    snapshot = await late.receive_from()
    assert json.loads(snapshot)["reset"] is True
    assert seqs([snapshot]) == list(range(101, 601))
    assert texts([snapshot])[-1] == "boot line 600"

    append(world["serial"], b"after the join\n")
    live = await frames_until(late, lambda f: 601 in seqs(f))
    assert json.loads(live[-1])["reset"] is False
    assert seqs(live) == [601]
    await first.disconnect()
    await late.disconnect()


async def test_a_new_pump_numbers_and_times_the_lines_as_the_last_one_did(world):
    append(world["serial"], b"before anyone watched\n")
    first = await connect(CONSOLE, world["viewer"])
    # Line 2 is written only once the pump has read line 1 as backlog: written sooner, the
    # pump's first read could take both as backlog, and line 2 would have no receive time.
    frames = await frames_until(first, lambda f: 1 in seqs(f))
    append(world["serial"], b"seen live\n")
    frames += await frames_until(first, lambda f: 2 in seqs(f))
    received = {row[0]: row[1] for row in rows(frames)}
    assert received[1] == 0 and received[2] > 0  # line 1 was there before the pump
    await first.disconnect()  # the last viewer: the pump stops

    again = await connect(CONSOLE, world["viewer"])
    frames = await frames_until(again, lambda f: 2 in seqs(f))
    assert {row[0]: (row[1], row[2]) for row in rows(frames)} == {
        1: (0, "before anyone watched"),
        2: (received[2], "seen live"),
    }
    await again.disconnect()


async def test_two_viewers_share_one_pump_and_the_last_disconnect_cancels_it(world):
    import redis.asyncio

    one = await connect(CONSOLE, world["viewer"])
    two = await connect(CONSOLE, world["viewer"])
    await one.receive_from()  # the snapshot: both are subscribed now
    await two.receive_from()
    hub = get_console_hub()
    key = StreamKey(AGENT_ID, "serial")
    pump = hub.pump_task(key)
    assert pump is not None and not pump.done()
    assert hub.pumps_started == 1

    append(world["serial"], b"shared line\n")
    for comm in (one, two):
        frames = await frames_until(comm, lambda f: 1 in seqs(f))
        assert texts(frames[-1:]) == ["shared line"]

    client = redis.asyncio.from_url(settings.REDIS_URL)
    owner = f"kici:console:{AGENT_ID}:serial:owner"
    assert await client.exists(owner)
    await one.disconnect()
    assert not pump.done()
    await two.disconnect()
    assert pump.done()
    assert hub.pump_task(key) is None
    assert not await client.exists(owner)  # the lock is released for the next first viewer
    await client.aclose()


async def test_a_slow_viewer_gets_a_drop_row_and_a_fast_one_loses_nothing(world):
    fast = await connect(CONSOLE, world["viewer"])
    slow = await connect(CONSOLE + "?flow=ack", world["viewer"])  # never acknowledges: stalls
    await fast.receive_from()
    await slow.receive_from()

    for block in range(10):
        append(world["serial"], b"".join(b"row %d\n" % i for i in range(block * 500 + 1, block * 500 + 501)))
        await asyncio.sleep(0.05)
    fast_frames = await frames_until(fast, lambda f: 5000 in seqs(f))
    assert seqs(fast_frames) == list(range(1, 5001))
    assert not [row for row in rows(fast_frames) if row[3:4] == ["g"]]

    await slow.send_to(text_data='{"ack": 1000}')  # catch up now
    slow_frames = []
    async with asyncio.timeout(10):
        while 5000 not in seqs(slow_frames):
            slow_frames.append(await slow.receive_from(timeout=5))
            await slow.send_to(text_data='{"ack": 1}')
    gaps = [row for row in rows(slow_frames) if row[3:4] == ["g"]]
    assert len(gaps) == 1 and re.fullmatch(r"… \d+ lines dropped", gaps[0][2])
    received = seqs(slow_frames)
    assert received == sorted(received) and received[-1] == 5000
    assert len(received) + gaps[0][4] == 5000  # every line is either shown or counted
    first_missing = gaps[0][0]  # the gap names the numbers it stands for, to load them back
    assert first_missing - 1 in received and first_missing + gaps[0][4] in received
    await fast.disconnect()
    await slow.disconnect()


async def test_serial_failure_lines_are_highlighted(world):
    comm = await connect(CONSOLE, world["viewer"])
    await comm.receive_from()
    append(world["serial"], b"fine\nKernel panic - not syncing: No working init found.\n")
    frames = await frames_until(comm, lambda f: 2 in seqs(f))
    kinds = {row[0]: row[3:] for row in rows(frames)}
    assert kinds == {1: [], 2: ["e"]}
    await comm.disconnect()


async def test_what_the_guest_writes_travels_as_text_in_json(world):
    # The page puts it on screen as text (textContent: tests/browser/test_console_flood.py).
    comm = await connect(CONSOLE, world["viewer"])
    await comm.receive_from()
    append(world["serial"], b'<script>alert(1)</script> "quoted" \\ \xe2\x9c\x93\n')
    frames = await frames_until(comm, lambda f: 1 in seqs(f))
    assert texts(frames) == ['<script>alert(1)</script> "quoted" \\ \u2713']
    await comm.disconnect()


async def expect_close(comm, code: int) -> None:
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_output(timeout=2)
    assert message == {"type": "websocket.close", "code": code}
    await comm.disconnect()


async def test_it_refuses_an_anonymous_user(world):
    await expect_close(communicator(CONSOLE, AnonymousUser()), 4403)
    await expect_close(communicator("/ws/events/", AnonymousUser()), 4403)


async def test_it_refuses_a_user_without_the_view_permission(world):
    await expect_close(communicator(CONSOLE, world["outsider"]), 4403)
    await expect_close(communicator(f"/ws/agents/{AGENT_ID}/events/", world["outsider"]), 4403)


async def test_it_refuses_an_unknown_agent_or_stream(world):
    await expect_close(communicator("/ws/agents/scaler-firecracker-00000000/console/serial/", world["viewer"]), 4404)
    await expect_close(communicator(f"/ws/agents/{AGENT_ID}/console/console/", world["viewer"]), 4404)


def _session_cookie(user) -> bytes:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def test_a_logged_in_session_gets_the_console_through_the_full_stack(world):
    from kici_site.asgi import application

    cookie = await database_sync_to_async(_session_cookie)(world["viewer"])
    comm = WebsocketCommunicator(
        application,
        CONSOLE,
        headers=[(b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie), (b"host", b"127.0.0.1:8000")],
    )
    connected, _ = await comm.connect()
    assert connected
    assert json.loads(await comm.receive_from()) == {"reset": True, "rows": []}
    await comm.disconnect()


async def test_the_full_stack_refuses_a_foreign_origin(world):
    from kici_site.asgi import application

    cookie = await database_sync_to_async(_session_cookie)(world["viewer"])
    comm = WebsocketCommunicator(
        application,
        CONSOLE,
        headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie), (b"host", b"127.0.0.1:8000")],
    )
    connected, _ = await comm.connect()
    assert not connected


# --- events ------------------------------------------------------------------------------------------


def _record(agent_id: str, detail: str):
    from agents.events import record_event

    agent = Agent.objects.select_related("scaler").get(agent_id=agent_id)
    return record_event(agent, "scaler.ready", detail).pk


async def test_published_events_reach_the_feed_and_the_agent_timeline(world):
    feed = await connect("/ws/events/", world["viewer"])
    timeline = await connect(f"/ws/agents/{AGENT_ID}/events/", world["viewer"])
    other = await connect("/ws/agents/scaler-firecracker-99999999/events/", world["viewer"])

    pk = await database_sync_to_async(_record)(AGENT_ID, "vm is up")
    for comm in (feed, timeline):
        frame = await comm.receive_from(timeout=5)
        assert f'id="event-{pk}"' in frame and "vm is up" in frame
    assert await other.receive_nothing(timeout=0.5)
    for comm in (feed, timeline, other):
        await comm.disconnect()


async def test_many_events_arrive_in_few_frames_and_in_order(world):
    from live.publish import apublish_message

    feed = await connect("/ws/events/", world["viewer"])
    for i in range(1, 201):
        await apublish_message({"type": "event.message", "event_id": i, "html": f"<p id=e{i}></p>"}, ["events.global"])
    frames = []
    async with asyncio.timeout(10):
        while "id=e200>" not in "".join(frames):
            frames.append(await feed.receive_from(timeout=5))
    ids = [int(n) for n in re.findall(r"id=e(\d+)>", "".join(frames))]
    assert ids == list(range(1, 201))
    assert len(frames) < 50  # batched, not one frame per event
    await feed.disconnect()


# --- several processes (two hubs with their own relay channel on the same Redis) -----------------


@pytest.fixture
async def two_processes():
    import redis.asyncio
    from channels.layers import get_channel_layer

    from live.hub import ConsoleHub
    from live.transport import RedisTransport

    hubs = []
    for _ in range(2):
        transport = RedisTransport(get_channel_layer(), redis.asyncio.from_url(settings.REDIS_URL), lock_ttl=1.5)
        hubs.append(ConsoleHub(transport, tick=0.2))
    yield hubs
    for hub in hubs:
        await hub.aclose()
        await hub.transport.aclose()
        await hub.transport.redis.aclose()


async def next_rows(viewer, timeout: float = 5.0):
    async with asyncio.timeout(timeout):
        return await viewer.next_batch()


async def test_viewers_in_two_processes_share_one_pump_which_stops_when_the_last_leaves(tmp_path, two_processes):
    from live.sources import file_source

    hub_a, hub_b = two_processes
    path = tmp_path / "serial-console.log"
    key = StreamKey(AGENT_ID, "serial")
    in_a = await hub_a.subscribe(key, file_source(path, poll_interval=0.02))
    in_b = await hub_b.subscribe(key, file_source(path, poll_interval=0.02))
    pump = hub_a.pump_task(key)
    assert pump is not None and hub_b.pump_task(key) is None  # the lock holder pumps for both

    append(path, b"to both\n")
    for viewer in (in_a, in_b):
        rows, _ = await next_rows(viewer)
        assert [(r.text, r.seq) for r in rows] == [("to both", 1)]

    await hub_a.unsubscribe(in_a)
    assert not pump.done()  # a viewer elsewhere still watches
    append(path, b"only b watches\n")
    rows, _ = await next_rows(in_b)
    assert [r.text for r in rows] == ["only b watches"]

    await hub_b.unsubscribe(in_b)
    async with asyncio.timeout(3):
        while not pump.done():
            await asyncio.sleep(0.02)


async def test_another_process_takes_over_the_pump_when_its_owner_dies(tmp_path, two_processes):
    from live.sources import file_source

    hub_a, hub_b = two_processes
    path = tmp_path / "serial-console.log"
    key = StreamKey(AGENT_ID, "serial")
    await hub_a.subscribe(key, file_source(path, poll_interval=0.02))
    in_b = await hub_b.subscribe(key, file_source(path, poll_interval=0.02))
    append(path, b"before the crash\n")
    rows, _ = await next_rows(in_b)
    assert [r.text for r in rows] == ["before the crash"]

    hub_a.transport.token = "crashed"  # its lock can be neither renewed nor released: a dead process
    await hub_a.aclose()
    async with asyncio.timeout(5):
        while hub_b.pump_task(key) is None:
            await asyncio.sleep(0.05)
    rows, reset = await next_rows(in_b)
    assert reset  # a new generation: the view is replaced, numbering starts again
    append(path, b"after the takeover\n")
    seen = [r.text for r in rows]
    async with asyncio.timeout(5):
        while "after the takeover" not in seen:
            more, _ = await in_b.next_batch()
            seen += [r.text for r in more]
    assert seen == ["before the crash", "after the takeover"]


# --- a container's console is its docker logs ------------------------------------------------------


def _container_agent(container_id: str):
    scaler = Scaler.objects.create(name="tail-ctr", type="container", max_agents=4)
    return Agent.objects.create(agent_id="scaler-container-7a11c0de", scaler=scaler, managed_id=container_id)


@pytest.mark.docker
async def test_a_container_console_streams_its_docker_logs(world, docker_client, agent_image):
    script = "echo hello from the container; echo '<b>bold</b>'; sleep 30"
    container = run_script(docker_client, agent_image, script, "tail-console")
    try:
        agent = await database_sync_to_async(_container_agent)(container.id)
        comm = await connect(f"/ws/agents/{agent.agent_id}/console/console/", world["viewer"])
        frames = await frames_until(comm, lambda f: 2 in seqs(f))
        assert texts(frames) == ["hello from the container", "<b>bold</b>"]
        await comm.disconnect()
    finally:
        container.remove(force=True)
