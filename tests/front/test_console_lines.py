"""``/agents/<id>/console/<stream>/lines``: earlier console lines read back from the agent's file."""

from __future__ import annotations

import os

import pytest
import redis
from django.conf import settings
from django.test import Client

from agents.choices import AgentState
from agents.models import Agent
from consolelog.cap import cap_file
from live.streams import StreamKey
from live.transport import stream_key_name, times_member
from scalers.models import Scaler
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


@pytest.fixture
def vm_agent(db, tmp_path):
    vm = Scaler.objects.create(name="lines-fc", type="firecracker", max_agents=2)
    serial = tmp_path / "serial-console.log"
    serial.write_bytes(b"".join(b"line %d\n\n" % n for n in range(1, 3001)) + b"Kernel panic - not syncing\n")
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-11e5b0f0",
        scaler=vm,
        state=AgentState.RUNNING,
        backend_context={"console_logs": {"serial": str(serial), "vmm": str(tmp_path / "vmm.log")}},
    )
    agent.serial = serial
    return agent


@pytest.fixture
def times_key(vm_agent):
    client = redis.Redis.from_url(settings.REDIS_URL)
    name = stream_key_name(StreamKey(vm_agent.agent_id, "serial"), "times")
    client.delete(name)
    yield client, name
    client.delete(name)
    client.close()


def url(agent, stream="serial") -> str:
    return f"/agents/{agent.agent_id}/console/{stream}/lines"


def test_it_returns_the_page_of_lines_below_a_number_with_their_receive_times(viewer_client, vm_agent, times_key):
    client, name = times_key
    score, member = times_member({"seq": 2990, "texts": ["x"] * 12, "born": 2, "ts": 1_800_000_000.25})
    client.zadd(name, {member: score})  # lines 2992..3001 were received live at that time
    data = viewer_client.get(url(vm_agent), {"before": 3002, "limit": 20}).json()
    assert data["oldest"] == 1 and data["first"] == 2982
    assert [row[0] for row in data["rows"]] == list(range(2982, 3002))
    assert all(row[2] == f"line {row[0]}" for row in data["rows"][:-1])
    assert data["rows"][-1] == [3001, 1_800_000_000_250, "Kernel panic - not syncing", "e"]
    assert [row[1] for row in data["rows"]] == [0] * 10 + [1_800_000_000_250] * 10
    page = viewer_client.get(url(vm_agent), {"before": 11}).json()  # limit: 500 by default
    assert page["first"] == 1 and [row[2] for row in page["rows"]] == [f"line {n}" for n in range(1, 11)]


def test_the_numbers_hold_after_the_file_is_cut(viewer_client, vm_agent, times_key):
    fd = os.open(vm_agent.serial, os.O_RDWR)
    try:
        assert cap_file(fd, os.fstat(fd).st_size // 2) > 0
    finally:
        os.close(fd)
    data = viewer_client.get(url(vm_agent), {"before": 3001, "limit": 5}).json()
    assert [row[2] for row in data["rows"]] == [f"line {n}" for n in range(2996, 3001)]
    oldest = data["oldest"]
    assert oldest > 1000
    gone = viewer_client.get(url(vm_agent), {"before": oldest, "limit": 5}).json()
    assert gone == {"oldest": oldest, "first": oldest, "rows": []}


@pytest.mark.parametrize(
    "query, message",
    [
        ({}, "before: is required (a whole number within 1..9007199254740991)"),
        ({"before": "x"}, 'before: must be a whole number within 1..9007199254740991, got "x"'),
        ({"before": "0"}, "before: must be a whole number within 1..9007199254740991, got 0"),
        ({"before": "-1"}, "before: must be a whole number within 1..9007199254740991, got -1"),
        (
            {"before": "99999999999999999999"},
            "before: must be a whole number within 1..9007199254740991, got 99999999999999999999",
        ),
        ({"before": "10", "limit": "1001"}, "limit: must be a whole number within 1..1000, got 1001"),
        ({"before": ["10", "20"]}, 'before: takes one value, got 2: "10", "20"'),
        ({"before": "10", "after": "5"}, "after: unknown parameter (accepted: before, limit)"),
    ],
)
def test_it_refuses_a_bad_parameter_naming_it(viewer_client, vm_agent, query, message):
    response = viewer_client.get(url(vm_agent), query)
    assert response.status_code == 400 and message in response.json()["error"]


def test_it_has_nothing_for_a_stream_without_output_or_a_missing_file_or_stream(viewer_client, vm_agent, tmp_path):
    process = make_agent(make_scaler("b", type="bare-metal"), state=AgentState.RUNNING, ip="172.30.0.4")
    response = viewer_client.get(url(process, "console"), {"before": 10})
    assert response.status_code == 404 and "has no output to read" in response.json()["error"]
    assert viewer_client.get(url(vm_agent, "vmm"), {"before": 10}).status_code == 404  # not written yet
    assert viewer_client.get(url(vm_agent, "bogus"), {"before": 10}).status_code == 404


def test_it_needs_the_view_permission(outsider_client, vm_agent):
    assert Client().get(url(vm_agent), {"before": 10}).status_code == 302  # to the login page
    assert outsider_client.get(url(vm_agent), {"before": 10}).status_code == 403
