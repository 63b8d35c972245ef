"""Live sockets end with their session and permission (live.session), through the whole ASGI
stack with a real session cookie, over the real Redis channel layer."""

from __future__ import annotations

import asyncio

import pytest
from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.contrib.sessions.models import Session
from django.test import Client

from live.consumers import close_console_hub
from live.session import CLOSE_FORBIDDEN, CLOSE_SIGNED_OUT, SESSION_CHECK_SECONDS, SessionBound

pytestmark = pytest.mark.django_db(transaction=True)

ROUTES = ["/ws/events/", "/ws/attention/", "/ws/rows/agents/"]


@pytest.fixture(autouse=True)
async def hub():
    yield
    await close_console_hub()


def _viewer(name: str) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}")
    group, _ = Group.objects.get_or_create(name="viewers-session-test")
    group.permissions.add(Permission.objects.get(codename="view_agent", content_type__app_label="agents"))
    user.groups.add(group)
    return user


def _signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


async def open_socket(client: Client, path: str) -> WebsocketCommunicator:
    from kici_site.asgi import application

    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    comm = WebsocketCommunicator(
        application,
        path,
        headers=[(b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie), (b"host", b"127.0.0.1:8000")],
    )
    connected, _ = await comm.connect()
    assert connected, path
    return comm


async def stays_open(comm: WebsocketCommunicator, seconds: float) -> bool:
    """Whether the socket is still open after ``seconds`` (frames meanwhile are skipped). Unlike
    ``receive_output`` with a timeout, this leaves the application running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        while not comm.output_queue.empty():
            if comm.output_queue.get_nowait()["type"] == "websocket.close":
                return False
        if comm.future.done():
            return False
        await asyncio.sleep(0.05)
    return True


async def close_code(comm: WebsocketCommunicator, within: float) -> int | None:
    """The code the socket is closed with within ``within`` seconds (frames before it are
    skipped); None when it stays open (the application is then cancelled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return None
        try:
            message = await comm.receive_output(timeout=left)
        except TimeoutError:
            return None
        if message["type"] == "websocket.close":
            return message.get("code")


@pytest.fixture
async def two_sessions():
    alice = await database_sync_to_async(_viewer)("session-alice")
    bob = await database_sync_to_async(_viewer)("session-bob")
    return {
        "alice": (alice, await database_sync_to_async(_signed_in)(alice)),
        "bob": (bob, await database_sync_to_async(_signed_in)(bob)),
    }


@pytest.mark.parametrize("path", ROUTES)
async def test_signing_out_closes_that_sessions_sockets_at_once_and_no_other(two_sessions, path):
    _, alice = two_sessions["alice"]
    _, bob = two_sessions["bob"]
    mine, theirs = await open_socket(alice, path), await open_socket(bob, path)
    await database_sync_to_async(alice.logout)()
    # Well before the periodic re-check: the sign-out itself tells the socket.
    assert await close_code(mine, SESSION_CHECK_SECONDS / 2) == CLOSE_SIGNED_OUT
    assert await stays_open(theirs, 0.5)
    await theirs.disconnect()


@pytest.fixture
def fast_checks(monkeypatch):
    monkeypatch.setattr("live.session.SESSION_CHECK_SECONDS", 0.2)


def _expire(client: Client) -> None:
    from datetime import timedelta

    from django.utils import timezone

    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() - timedelta(seconds=1))


def _deactivate(user: User) -> None:
    User.objects.filter(pk=user.pk).update(is_active=False)


def _leave_group(user: User) -> None:
    user.groups.clear()


def _change_password(user: User) -> None:
    user.set_password("another-password")
    user.save()


@pytest.mark.parametrize(
    "change, code",
    [
        (_expire, CLOSE_SIGNED_OUT),
        (_deactivate, CLOSE_SIGNED_OUT),
        (_change_password, CLOSE_SIGNED_OUT),
        (_leave_group, CLOSE_FORBIDDEN),
    ],
    ids=["session-expired", "user-deactivated", "password-changed", "permission-removed"],
)
async def test_the_periodic_check_closes_a_socket_whose_right_ended(two_sessions, fast_checks, change, code):
    user, client = two_sessions["alice"]
    _, bob = two_sessions["bob"]
    sockets = [await open_socket(client, path) for path in ROUTES]
    other = await open_socket(bob, "/ws/events/")
    assert await stays_open(sockets[0], 0.6)  # open while nothing changed
    await database_sync_to_async(change)(client if change is _expire else user)
    for comm in sockets:
        assert await close_code(comm, 3) == code
    assert await stays_open(other, 0.5)
    await other.disconnect()


async def test_a_frame_or_close_racing_the_browsers_leaving_is_dropped_not_raised():
    """daphne raises autobahn's Disconnected for a frame sent as the browser leaves (a snapshot sent
    after a quick navigation); every consumer drops it instead of logging an application error."""

    async def gone(message):
        raise Disconnected("Attempt to send on a closed protocol")

    consumer = SessionBound()
    consumer.base_send = gone
    await consumer.send(text_data="late frame")
    await consumer.send(bytes_data=b"late bytes")
    await consumer.close(code=1000)
