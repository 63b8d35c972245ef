"""Live progress of an operation over the Redis channel layer (ws/operations/<id>/)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings

from operations.choices import OperationStatus
from tests.support.operations import listening_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
async def close_thread_connections():
    """Close the DB connection the sync_to_async thread opened, so the test DB can be dropped."""
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


def _app():
    from live.routing import websocket_urlpatterns

    return URLRouter(websocket_urlpatterns)


async def _connect(op_pk, user):
    communicator = WebsocketCommunicator(_app(), f"/ws/operations/{op_pk}/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


def _plan(config_file, user):
    from operations.services import create_operation

    return create_operation("config-reload", {}, user)


async def test_a_viewer_gets_a_snapshot_then_live_progress_to_the_end(users, config_file):
    from operations.jobs import run_operation
    from operations.services import approve_operation

    op = await sync_to_async(_plan)(config_file, users["operator"])
    communicator, connected, _ = await _connect(op.pk, users["viewer"])
    try:
        assert connected
        snapshot = await communicator.receive_from(timeout=5)
        assert 'id="op-status"' in snapshot and 'hx-swap-oob="true"' in snapshot and 'data-status="planned"' in snapshot
        assert 'id="op-log"' in snapshot and '<tr id="target-' not in snapshot
        rows = await communicator.receive_from(timeout=5)
        assert rows.startswith('<tr id="target-') and "scaler:ops-reload" in rows and rows.count("<tr ") == 2

        def approve_and_run():
            with listening_worker(settings.KICI_HOST_QUEUE):
                approve_operation(op, users["approver"], enqueue=False)
            return run_operation(op.pk)

        result = await sync_to_async(approve_and_run)()
        assert "succeeded" in result
        seen = [await communicator.receive_from(timeout=5)]
        while not await communicator.receive_nothing(timeout=1):
            seen.append(await communicator.receive_from(timeout=5))
        assert 'data-status="succeeded"' in seen[-1]
        joined = "\n".join(seen)
        # each notice is rendered from the database when it arrives, so the run (already over) shows
        # as succeeded; what matters is that every change was pushed without a reload
        assert len(seen) >= 3
        assert 'data-outcome="done"' in joined, "the target row is pushed with its outcome"
        assert 'hx-swap-oob="beforeend:#op-log"' in joined or 'id="op-log"' in joined
        assert "finished: 2 done, 0 skipped, 0 failed" in joined
    finally:
        await communicator.disconnect()


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
async def test_a_socket_without_view_permission_is_closed(users, config_file, who):
    from django.contrib.auth.models import AnonymousUser

    op = await sync_to_async(_plan)(config_file, users["operator"])
    user = AnonymousUser() if who == "anonymous" else users["outsider"]
    communicator, connected, code = await _connect(op.pk, user)
    assert not connected and code == 4403
    await communicator.disconnect()


async def test_the_page_and_the_push_render_the_same_row(users, config_file):
    from django.test import Client

    from live.consumers import render_update

    op = await sync_to_async(_plan)(config_file, users["operator"])

    def page_row():
        client = Client()
        client.force_login(users["viewer"])
        html = client.get(f"/operations/{op.pk}/").content.decode()
        start = html.index('<tr id="target-')
        return html[start : html.index("</tr>", start)]

    page = await sync_to_async(page_row)()
    main, push = await sync_to_async(render_update)(op.pk, users["viewer"], keys=[op.plan[0]["key"]])
    assert push.startswith('<tr id="target-') and push.count("<tr ") == 1
    start = push.index('<tr id="target-')
    pushed = push[start : push.index("</tr>", start)]
    assert pushed.replace(' hx-swap-oob="true"', "") == page
    assert 'data-status="planned"' in main and "<tr id=" not in main and OperationStatus.PLANNED in main


async def test_a_late_notice_renders_only_its_own_log_lines(users, config_file):
    from live.consumers import render_update
    from operations.models import Operation

    op = await sync_to_async(_plan)(config_file, users["operator"])
    lines = [{"at": f"2026-01-01T00:00:0{i}+00:00", "level": "info", "message": f"line {i}"} for i in range(5)]
    await sync_to_async(Operation.objects.filter(pk=op.pk).update)(log=lines)
    # the notice for lines 3..4 is handled only after line 4 was written too
    (main,) = await sync_to_async(render_update)(op.pk, users["viewer"], keys=[], log_from=3, log_to=4)
    assert "line 3" in main and "line 4" not in main and 'id="op-log-3"' in main
    assert 'hx-swap-oob="beforeend:#op-log" data-upsert' in main and 'id="op-log-empty" hx-swap-oob="delete"' in main
    (status_only,) = await sync_to_async(render_update)(op.pk, users["viewer"], keys=[])
    assert "line " not in status_only
