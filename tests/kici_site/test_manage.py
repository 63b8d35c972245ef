"""``manage.py`` waits for the live pushes of what a command recorded before the process exits."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from agents.models import ScalerEvent
from live.publish import EVENTS_GLOBAL_GROUP
from tests.support.soak import database_url

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = (
    "from agents.events import record_event; from agents.choices import EventType; "
    "record_event(None, EventType.FAILED, 'pushed before exit', scaler_name='manage-test')"
)


async def latest_event_id() -> int:
    return await sync_to_async(lambda: ScalerEvent.objects.get(detail="pushed before exit").pk)()


async def test_an_event_a_command_records_reaches_open_pages_before_the_process_exits():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(EVENTS_GLOBAL_GROUP, channel)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings",
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "manage.py", "shell", "-c", RECORD, cwd=ROOT, env=env, stderr=subprocess.PIPE
        )
        _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
        assert b"could not publish" not in stderr, stderr.decode()
        message = await asyncio.wait_for(layer.receive(channel), 10)
        assert message["type"] == "event.message" and message["event_id"] == await latest_event_id()
    finally:
        await layer.group_discard(EVENTS_GLOBAL_GROUP, channel)
