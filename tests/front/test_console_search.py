"""``/agents/<id>/console/<stream>/search``: a search of the agent's whole kept output, not only
the lines a page loaded: a live VM's serial file (cuts counted), a finished agent's archive (with
the times kept beside it), hit limits, regular expressions with a bounded cost, bad input."""

from __future__ import annotations

import os

import pytest
import redis
from django.conf import settings
from django.test import Client

import consolelog.search
from agents.archive import write_archive
from agents.choices import AgentState
from agents.models import Agent
from consolelog.cap import cap_file
from live.streams import StreamKey
from live.transport import stream_key_name, times_member
from scalers.models import Scaler
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db

LINES = 50_000


@pytest.fixture
def vm_agent(db, tmp_path):
    vm = Scaler.objects.create(name="search-fc", type="firecracker", max_agents=2)
    serial = tmp_path / "serial-console.log"
    serial.write_bytes(b"".join(b"boot line %d of the guest\n\n" % n for n in range(1, LINES + 1)))
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-5ea4c400",
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


@pytest.fixture(autouse=True)
def _log_dir(settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "agents")


def url(agent, stream="serial") -> str:
    return f"/agents/{agent.agent_id}/console/{stream}/search"


def test_it_finds_any_line_of_the_whole_file_with_its_number_and_time(viewer_client, vm_agent, times_key):
    client, name = times_key
    score, member = times_member({"seq": 12_340, "texts": ["x"] * 10, "born": 0, "ts": 1_800_000_000.5})
    client.zadd(name, {member: score})  # lines 12340..12349 were received live at that time
    data = viewer_client.get(url(vm_agent), {"q": "LINE 12345 "}).json()  # case-insensitive by default
    assert data["hits"] == [[12_345, 1_800_000_000_500, "boot line 12345 of the guest", [[5, 16]]]]
    assert data["more"] == 0 and data["first"] == 1 and data["last"] == LINES and data["scanned"] == LINES
    assert data["stopped"] is False
    # Line 1, which no page loaded: the search reads the file, not what a viewer holds.
    assert viewer_client.get(url(vm_agent), {"q": "line 1 of"}).json()["hits"][0][:3] == [
        1,
        0,
        "boot line 1 of the guest",
    ]
    assert viewer_client.get(url(vm_agent), {"q": "LINE 12345 ", "case": "1"}).json()["hits"] == []


def test_hits_are_limited_and_the_rest_counted_and_paged(viewer_client, vm_agent):
    data = viewer_client.get(url(vm_agent), {"q": "line 4999", "limit": 5}).json()  # 4999, 49990..49999
    assert [hit[0] for hit in data["hits"]] == [4999, 49_990, 49_991, 49_992, 49_993]
    assert data["more"] == 6
    after = viewer_client.get(url(vm_agent), {"q": "line 4999", "limit": 5, "after": 49_993}).json()
    assert [hit[0] for hit in after["hits"]] == [49_994, 49_995, 49_996, 49_997, 49_998] and after["more"] == 1
    default = viewer_client.get(url(vm_agent), {"q": "boot"}).json()
    assert len(default["hits"]) == 200 and default["more"] == LINES - 200


def test_the_numbers_hold_after_the_file_is_cut(viewer_client, vm_agent):
    fd = os.open(vm_agent.serial, os.O_RDWR)
    try:
        assert cap_file(fd, os.fstat(fd).st_size // 2) > 0
    finally:
        os.close(fd)
    data = viewer_client.get(url(vm_agent), {"q": "line 49000 "}).json()
    assert [hit[0] for hit in data["hits"]] == [49_000]
    assert data["first"] > 1 and data["last"] == LINES  # the cut lines are gone, counted
    assert viewer_client.get(url(vm_agent), {"q": "line 12 of"}).json()["hits"] == []


def test_a_regular_expression_is_matched_and_its_matches_marked(viewer_client, vm_agent):
    data = viewer_client.get(url(vm_agent), {"q": r"line 4{4}\d\b", "regex": "1"}).json()
    assert [hit[0] for hit in data["hits"]] == list(range(44_440, 44_450))
    assert data["hits"][0][2:] == ["boot line 44440 of the guest", [[5, 15]]]


def test_a_long_line_is_cut_around_its_first_match(viewer_client, vm_agent):
    with open(vm_agent.serial, "ab") as out:
        out.write(b"x" * 5000 + b" NEEDLE " + b"y" * 5000 + b"\n")
    [hit] = viewer_client.get(url(vm_agent), {"q": "needle"}).json()["hits"]
    assert hit[0] == LINES + 1
    text, [[start, end]] = hit[2], hit[3]
    assert text.startswith("…x") and text.endswith("y…") and len(text) == 242
    assert text[start:end] == "NEEDLE"


@pytest.mark.parametrize(
    "query, message",
    [
        ({}, "q: is required"),
        ({"q": "x" * 201}, "q: at most 200 characters, got 201"),
        ({"q": "(unclosed", "regex": "1"}, "q: not a valid regular expression: missing ), unterminated subpattern"),
        ({"q": "(a+)+b", "regex": "1"}, "q: a repeat inside a repeat"),
        ({"q": r"(a)\1", "regex": "1"}, "q: a backreference is not allowed"),
        ({"q": "a(?=b)", "regex": "1"}, "q: a lookahead or lookbehind is not allowed"),
        ({"q": "a*", "regex": "1"}, "matches an empty text"),
        ({"q": "a?" * 9 + "b", "regex": "1"}, "q: at most 8 repeats"),
        ({"q": "x", "regex": "yes"}, 'regex: must be one of 0, 1, got "yes"'),
        ({"q": "x", "case": "2"}, 'case: must be one of 0, 1, got "2"'),
        ({"q": "x", "limit": "0"}, "limit: must be a whole number within 1..1000, got 0"),
        ({"q": "x", "after": "-1"}, "after: must be a whole number within 0..9007199254740991, got -1"),
        ({"q": "x", "before": "5"}, "before: unknown parameter (accepted: q, regex, case, after, limit)"),
        ({"q": ["x", "y"]}, 'q: takes one value, got 2: "x", "y"'),
    ],
)
def test_it_refuses_bad_input_naming_the_field(viewer_client, vm_agent, query, message):
    response = viewer_client.get(url(vm_agent), query)
    assert response.status_code == 400 and message in response.json()["error"]


def test_a_search_past_its_time_budget_answers_what_it_found_and_where_it_stopped(viewer_client, vm_agent, monkeypatch):
    monkeypatch.setattr("front.views.console.SEARCH_SECONDS", 0.0)
    data = viewer_client.get(url(vm_agent), {"q": "line 1"}).json()
    assert data["stopped"] is True and data["last"] == data["scanned"] == consolelog.search.CHECK_EVERY
    assert [hit[0] for hit in data["hits"]][:3] == [1, 10, 11] and data["hits"][-1][0] <= data["last"]


def test_a_regular_expression_that_runs_too_long_on_one_line_is_stopped(viewer_client, vm_agent, monkeypatch):
    monkeypatch.setattr(consolelog.search, "KILL_GRACE_SECONDS", 0.5)
    monkeypatch.setattr("front.views.console.SEARCH_SECONDS", 0.5)
    with open(vm_agent.serial, "ab") as out:
        out.write(b"a" * 60_000 + b"\n")  # .*.*.*b has to try every split of it: far beyond a second
    response = viewer_client.get(url(vm_agent), {"q": "a.*a.*a.*b", "regex": "1"})
    assert response.status_code == 400
    assert "q: the regular expression 'a.*a.*a.*b' took more than 0.5 s over one line" in response.json()["error"]


def test_a_finished_agents_archive_is_searched_with_its_kept_times(viewer_client):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    output = "".join(f"archived {i}\n" for i in range(1001, 3001)).encode()
    write_archive(agent.agent_id, output, lines_before=1000, times=[(1001, 1000, 1_700_000_000_000), (2001, 1000, 0)])
    data = viewer_client.get(url(agent, "console"), {"q": "archived 1042"}).json()
    assert data["hits"] == [[1042, 1_700_000_000_000, "archived 1042", [[0, 13]]]]
    assert data["first"] == 1001 and data["last"] == 3000
    assert viewer_client.get(url(agent, "console"), {"q": "archived 2042"}).json()["hits"][0][1] == 0
    # The finished page's lines carry them too.
    rows = viewer_client.get(f"/agents/{agent.agent_id}/console/console/lines", {"before": 1003}).json()["rows"]
    assert rows == [[1001, 1_700_000_000_000, "archived 1001"], [1002, 1_700_000_000_000, "archived 1002"]]


def test_it_has_nothing_for_a_stream_without_output(viewer_client, vm_agent):
    process = make_agent(make_scaler("b", type="bare-metal"), state=AgentState.RUNNING, ip="172.30.0.4")
    response = viewer_client.get(url(process, "console"), {"q": "x"})
    assert response.status_code == 404 and "has no output to read" in response.json()["error"]
    assert viewer_client.get(url(vm_agent, "vmm"), {"q": "x"}).status_code == 404  # not written yet
    assert viewer_client.get(url(vm_agent, "bogus"), {"q": "x"}).status_code == 404
    gone = make_agent(make_scaler("c2"), state=AgentState.DESTROYED, reserve=False)
    response = viewer_client.get(url(gone, "console"), {"q": "x"})
    assert response.status_code == 404 and "none of its output was kept" in response.json()["error"]


def test_it_needs_the_view_permission(outsider_client, vm_agent):
    assert Client().get(url(vm_agent), {"q": "x"}).status_code == 302  # to the login page
    assert outsider_client.get(url(vm_agent), {"q": "x"}).status_code == 403
