"""A container's console (consolelog.dockerlogs): lines numbered by their place in the container's
output, the same from every pump and from the lines endpoint, with docker's times."""

from __future__ import annotations

import asyncio
import contextlib
import time

import docker.errors
import pytest
import redis
from django.conf import settings

from agents.choices import AgentState
from agents.models import Agent
from consolelog.dockerlogs import CHECKPOINT_LINES, RedisCheckpoints, stamp_ns
from consolelog.tail import LineNumber
from live.consoles import console_source
from live.hub import ConsoleHub
from live.streams import StreamKey
from scalers.models import Scaler
from tests.support.docker import run_script

pytestmark = [pytest.mark.docker, pytest.mark.django_db]

AGENT_ID = "scaler-container-c0a50001"


@pytest.fixture
def checkpoints():
    client = redis.Redis.from_url(settings.REDIS_URL)
    marks = RedisCheckpoints(client, AGENT_ID)
    client.delete(marks.marks, marks.top_key)
    yield marks
    client.delete(marks.marks, marks.top_key)
    client.close()


@pytest.fixture
def run_container(docker_client, agent_image):
    started = []

    def run(script: str, wait_for: str, **kwargs):
        container = run_script(docker_client, agent_image, script, "ctr-console", **kwargs)
        started.append(container)
        for _ in range(200):
            if wait_for.encode() in container.logs(tail=5):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the container never wrote {wait_for!r}: {container.logs(tail=5)!r}")
        container.reload()
        scaler = Scaler.objects.create(name="ctr-console", type="container", max_agents=4)
        agent = Agent.objects.create(
            agent_id=AGENT_ID, scaler=scaler, managed_id=container.id, state=AgentState.RUNNING
        )
        return container, agent

    yield run
    for container in started:
        with contextlib.suppress(docker.errors.NotFound):  # removed by the test
            container.remove(force=True)


def pump_backlog(agent, until: int, last: str | None = None) -> list:
    """The lines one pump of the agent's console yields up to line ``until`` or the line ``last``
    (its backlog first)."""

    async def pump():
        source, _ = console_source(agent, "console")
        got = []
        async with asyncio.timeout(30):
            async for batch in source():
                assert isinstance(batch[0], LineNumber) and batch[0].number == batch[1].n
                got.extend(batch[1:])
                if got[-1].n >= until or got[-1].text == last:
                    return got
        return got

    return asyncio.run(pump())


def lines_page(client, agent, before: int, limit: int = 500) -> dict:
    response = client.get(f"/agents/{agent.agent_id}/console/console/lines", {"before": before, "limit": limit})
    assert response.status_code == 200, response.content
    return response.json()


WRITE_LINES = "i=1; while [ $i -le {n} ]; do echo line $i; i=$((i+1)); done; echo done; sleep 60"


def test_a_line_has_the_same_number_from_every_pump_and_from_the_lines_endpoint(
    run_container, checkpoints, viewer_client
):
    container, agent = run_container(WRITE_LINES.format(n=3000), "done")
    first = pump_backlog(agent, 3001)
    # Numbered by place in the container's output, not from the pump's start.
    assert [(line.n, line.text) for line in first] == [(n, f"line {n}") for n in range(2502, 3001)] + [(3001, "done")]
    assert checkpoints.latest().number == 3 * CHECKPOINT_LINES + 1 and checkpoints.top() == 3001
    again = pump_backlog(agent, 3001)  # a reload, another viewer, a console restart
    assert [(line.n, line.text, line.ms) for line in again] == [(line.n, line.text, line.ms) for line in first]
    # The lines endpoint numbers them as the pumps did, and with the same (docker's) times.
    page = lines_page(viewer_client, agent, before=3002, limit=100)
    assert page["first"] == 2902
    assert [row[:3] for row in page["rows"]] == [[line.n, line.ms, line.text] for line in first[-100:]]


def test_earlier_lines_of_a_container_load_from_its_docker_logs(run_container, checkpoints, viewer_client):
    container, agent = run_container(WRITE_LINES.format(n=3000), "done")
    backlog = pump_backlog(agent, 3001)
    page = lines_page(viewer_client, agent, before=backlog[0].n)
    assert page["first"] == 2002 and [row[2] for row in page["rows"]] == [f"line {n}" for n in range(2002, 2502)]
    page = lines_page(viewer_client, agent, before=1001, limit=1000)
    assert page["first"] == 1 and page["oldest"] == 1
    assert [row[:1] + row[2:3] for row in page["rows"]] == [[n, f"line {n}"] for n in range(1, 1001)]


def test_a_search_reads_the_whole_docker_log_with_the_consoles_numbers_and_times(
    run_container, checkpoints, viewer_client
):
    container, agent = run_container(WRITE_LINES.format(n=3000), "done")
    backlog = pump_backlog(agent, 3001)  # the page would hold these: lines 2502 to 3001
    url = f"/agents/{agent.agent_id}/console/console/search"
    data = viewer_client.get(url, {"q": "LINE 12"}).json()  # 12, 120..129, 1200..1299
    assert [hit[0] for hit in data["hits"]] == [12, *range(120, 130), *range(1200, 1300)]
    assert data["hits"][0][2:] == ["line 12", [[0, 7]]] and data["hits"][0][1] > 0  # docker's time
    assert data["first"] == 1 and data["last"] == 3001 and data["more"] == 0
    page = lines_page(viewer_client, agent, before=13, limit=1)
    assert data["hits"][0][:3] == page["rows"][0][:3]  # the lines endpoint's number, time and text
    assert viewer_client.get(url, {"q": "done"}).json()["hits"][0][0] == backlog[-1].n == 3001
    regex = viewer_client.get(url, {"q": r"^line 29\d9$", "regex": "1"}).json()
    assert [hit[0] for hit in regex["hits"]] == list(range(2909, 3000, 10))


def test_a_fresh_lines_endpoint_counts_as_the_first_pump_would(run_container, checkpoints, viewer_client):
    container, agent = run_container(WRITE_LINES.format(n=1500), "done")
    page = lines_page(viewer_client, agent, before=1300, limit=3)  # no pump ever ran: it counts
    assert [row[2] for row in page["rows"]] == ["line 1297", "line 1298", "line 1299"]
    assert [line.n for line in pump_backlog(agent, 1501)][:1] == [1002]


def test_stdout_and_stderr_interleave_in_time_order_with_dockers_times(run_container, checkpoints):
    script = (
        "for i in 1 2 3 4 5 6; do echo out $i; sleep 0.02; echo err $i >&2; sleep 0.02; done; "
        "head -c 20000 /dev/zero | tr '\\0' x; sleep 0.3; echo err inside >&2; sleep 0.3; echo y; echo end; sleep 60"
    )
    container, agent = run_container(script, "end")
    got = pump_backlog(agent, 15)
    expected = [f"{kind} {i}" for i in range(1, 7) for kind in ("out", "err")]
    # A stderr line written while a stdout line is open is numbered when it ends, never spliced.
    assert [(line.n, line.text) for line in got] == list(
        enumerate([*expected, "err inside", "x" * 20000 + "y", "end"], 1)
    )
    stamps = {}
    for raw in container.logs(timestamps=True, stdout=True, stderr=True).split(b"\n"):
        stamp, _, text = raw.partition(b" ")
        if not stamp:
            continue
        stamps.setdefault(text.decode(), stamp_ns(stamp) // 1_000_000)
    # Each line's time is docker's, in order; a long line's is that of its first part.
    assert [line.ms for line in got[:12]] == [stamps[text] for text in expected]
    assert [line.ms for line in got[:12]] == sorted(line.ms for line in got[:12])
    assert got[13].ms < got[12].ms < got[14].ms


def test_the_console_rows_carry_dockers_times(run_container, checkpoints):
    container, agent = run_container(WRITE_LINES.format(n=700), "done")
    backlog = pump_backlog(agent, 701)

    async def rows():
        hub = ConsoleHub()
        source, _ = console_source(agent, "console")
        viewer = await hub.subscribe(StreamKey(agent.agent_id, "console"), source)
        try:
            async with asyncio.timeout(20):
                got = list(viewer.snapshot)
                while not got or got[-1].seq < 701:
                    more, _ = await viewer.next_batch()
                    got += more
            return got
        finally:
            await hub.aclose()

    got = asyncio.run(rows())
    assert [(row.seq, row.text, round(row.ts * 1000)) for row in got] == [
        (line.n, line.text, line.ms) for line in backlog
    ]


def test_a_removed_containers_archive_keeps_the_numbers_of_its_console(
    run_container, checkpoints, docker_client, settings, tmp_path
):
    from agents.archive import archived_lines, archived_times
    from scalers.backends.container.backend import ContainerBackend

    settings.KICI_AGENT_LOG_DIR = str(tmp_path)
    script = (
        "i=1; while [ $i -le 4200 ]; do echo line $i; [ $i = 200 ] && sleep 3; i=$((i+1)); done; echo done; sleep 60"
    )
    small_log = {"type": "json-file", "config": {"max-size": "40k"}}
    container, agent = run_container(script, "line 200", log_config=small_log)
    assert pump_backlog(agent, 200)[-1].n == 200
    for _ in range(100):
        if b"done" in container.logs(tail=1):
            break
        time.sleep(0.1)
    # Docker rotated lines 1 to 200 away meanwhile: the next pump cannot know how many lines it
    # missed, so it numbers what docker holds after every number given, and the archive numbers
    # its lines as that pump did.
    assert int(container.logs().split(b"\n", 1)[0].split()[1]) > 1000  # docker no longer holds line 1
    backlog = pump_backlog(agent, 10**9, last="done")
    assert backlog[0].n > 200
    agent.state = AgentState.DESTROYING
    agent.save(update_fields=["state"])
    ContainerBackend(agent.scaler, docker=docker_client, network_isolation=False).destroy(agent)
    archived = archived_lines(agent.agent_id)
    assert archived.lines[-1] == "done" and archived.first + len(archived.lines) - 1 == backlog[-1].n
    assert [(archived.first + i, text) for i, text in enumerate(archived.lines)][-500:] == [
        (line.n, line.text) for line in backlog
    ]
    # Each line keeps docker's time, as its live console showed it.
    assert archived_times(agent.agent_id, backlog[0].n, backlog[-1].n + 1) == {line.n: line.ms for line in backlog}
