"""An approver's shell into a container agent (live.shell, live.consumers.ShellConsumer), through
the whole ASGI stack with a real session cookie: who may open one, into which agent, its limits,
its audit records and its transcript."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import docker.errors
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client

from agents.archive import shell_transcript_path
from agents.choices import AgentState
from agents.models import Agent
from audit.models import AuditRecord
from live.consumers import CLOSE_NOT_FOUND, CLOSE_NOT_SHELLABLE, close_console_hub
from live.session import CLOSE_FORBIDDEN
from live.shell import ContainerShell
from scalers.models import Scaler
from tests.support.docker import run_script

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def hub():
    yield
    await close_console_hub()


def _user(name: str, *perms: str) -> Client:
    user = User.objects.create_user(name, password=f"pw-{name}")
    for perm in ("agents.view_agent", *perms):
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _agent(state: str = AgentState.RUNNING, scaler_type: str = "container", managed_id: str = "", **config) -> Agent:
    scaler, _ = Scaler.objects.get_or_create(
        name=f"shell-{scaler_type}", defaults={"type": scaler_type, "max_agents": 4, "config": config}
    )
    return Agent.objects.create(
        agent_id=f"scaler-{scaler_type}-5e11{uuid.uuid4().hex[:4]}", scaler=scaler, managed_id=managed_id, state=state
    )


async def _socket(client: Client, agent_id: str) -> WebsocketCommunicator:
    from kici_site.asgi import application

    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    comm = WebsocketCommunicator(
        application,
        f"/ws/agents/{agent_id}/shell/?cols=100&rows=30",
        headers=[(b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie), (b"host", b"127.0.0.1:8000")],
    )
    connected, _ = await comm.connect()
    assert connected
    return comm


async def _until_closed(comm: WebsocketCommunicator, within: float) -> tuple[bytes, list[dict], dict | None]:
    """Output bytes, JSON messages and the close message received within ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    output, messages = b"", []
    while (left := deadline - loop.time()) > 0:
        try:
            message = await comm.receive_output(timeout=left)
        except TimeoutError:
            break
        if message["type"] == "websocket.close":
            return output, messages, message
        if message.get("bytes"):
            output += message["bytes"]
        elif message.get("text"):
            messages.append(json.loads(message["text"]))
    return output, messages, None


async def _output_until(comm: WebsocketCommunicator, needle: bytes, within: float = 10) -> bytes:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    output = b""
    while needle not in output:
        left = deadline - loop.time()
        assert left > 0, f"{needle!r} not in the shell's output: {output[-500:]!r}"
        message = await comm.receive_output(timeout=left)
        assert message["type"] != "websocket.close", (message, output[-500:])
        output += message.get("bytes") or b""
    return output


@pytest.fixture
def no_exec(monkeypatch):
    """Record every exec the consumer would make (none may be made for a refusal)."""
    made: list[str] = []

    def record(cls, agent, cols, rows):
        made.append(agent.agent_id)
        raise AssertionError("no exec may be made")

    monkeypatch.setattr(ContainerShell, "open", classmethod(record))
    return made


@pytest.mark.parametrize(
    "perms, state, scaler_type, code, says",
    [
        (("operations.request_operation",), AgentState.RUNNING, "container", CLOSE_FORBIDDEN, "for approvers"),
        (("operations.approve_operation",), AgentState.DRAINING, "container", CLOSE_NOT_SHELLABLE, "is draining"),
        (("operations.approve_operation",), AgentState.DESTROYED, "container", CLOSE_NOT_SHELLABLE, "is destroyed"),
        (("operations.approve_operation",), AgentState.RUNNING, "firecracker", CLOSE_NOT_SHELLABLE, "container agent"),
    ],
    ids=["operator-not-approver", "draining", "destroyed", "firecracker"],
)
async def test_a_refused_shell_closes_with_its_reason_and_makes_no_exec(no_exec, perms, state, scaler_type, code, says):
    client = await database_sync_to_async(_user)("shell-user", *perms)
    agent = await database_sync_to_async(_agent)(state, scaler_type)
    comm = await _socket(client, agent.agent_id)
    _, messages, closed = await _until_closed(comm, 5)
    assert closed is not None and closed["code"] == code, closed
    assert says in closed["reason"] and says in messages[-1]["closed"], (closed, messages)
    assert no_exec == []
    assert not await database_sync_to_async(AuditRecord.objects.filter(action__startswith="shell.").exists)()
    await comm.disconnect()


async def test_an_unknown_agent_is_not_found(no_exec):
    client = await database_sync_to_async(_user)("shell-approver", "operations.approve_operation")
    comm = await _socket(client, "scaler-container-nosuch00")
    _, _, closed = await _until_closed(comm, 5)
    assert closed is not None and closed["code"] == CLOSE_NOT_FOUND
    assert no_exec == []
    await comm.disconnect()


# --- a real container on the private dockerd -----------------------------------------------------


@pytest.fixture
def container_agent(docker_client, agent_image):
    container = run_script(docker_client, agent_image, "sleep 300", "shell-ws")
    agent = _agent(AgentState.RUNNING, "container", managed_id=container.id)
    yield agent, container
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True)


@pytest.fixture
def approver():
    return _user("shell-approver", "operations.approve_operation")


def _records(agent_id: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(agent_ref=agent_id, action__startswith="shell.").order_by("at", "id"))


def _records_when_closed(agent_id: str, within: float = 10) -> list[AuditRecord]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        records = _records(agent_id)
        if any(r.action == "shell.closed" for r in records):
            return records
        time.sleep(0.1)
    return _records(agent_id)


def _processes(container) -> str:
    return container.exec_run(["ps"]).output.decode()


@pytest.mark.docker
async def test_a_shell_runs_a_command_and_its_transcript_outlives_a_closed_browser(container_agent, approver):
    agent, container = container_agent
    comm = await _socket(approver, agent.agent_id)
    opened = json.loads((await comm.receive_output(timeout=10))["text"])
    assert opened["opened"]["agent"] == agent.agent_id
    await comm.send_to(bytes_data=b"stty size; echo shell-$((6*7))-marker; sleep 444 &\r")
    output = await _output_until(comm, b"shell-42-marker")
    assert b"30 100" in output  # the page's terminal size reached the TTY
    assert b"kici-shell;pid" not in output  # the pid mark is the bridge's, not the page's
    await comm.send_to(bytes_data=b"sleep 445\r")
    await asyncio.sleep(0.3)
    await comm.disconnect(code=None)  # the browser just goes away (a close without a code)

    records = await database_sync_to_async(_records_when_closed)(agent.agent_id)
    assert [r.action for r in records] == ["shell.opened", "shell.closed"]
    assert all(r.actor == "shell-approver" and r.scaler_name == "shell-container" for r in records)
    closed = records[1].detail
    assert "the browser closed the shell" in closed and " in, " in closed and " out)" in closed, closed
    assert "(code" not in closed, closed
    transcript = shell_transcript_path(agent.agent_id).read_text(errors="replace")
    assert "opened by shell-approver" in transcript
    assert "[kici-shell input by shell-approver at " in transcript
    assert "] stty size; echo shell-$((6*7))-marker; sleep 444 &\n" in transcript  # the line typed
    assert "shell-42-marker" in transcript  # the output as shown
    assert "the browser closed the shell" in transcript.rsplit("===", 2)[-2]  # the footer
    # Docker leaves an exec running when its client goes; the bridge ends the session's processes.
    ps = await asyncio.to_thread(_processes, container)
    assert "sleep 444" not in ps and "sleep 445" not in ps, ps


@pytest.mark.docker
@pytest.mark.parametrize(
    "limit, says",
    [
        ("KICI_SHELL_MAX_SECONDS", "time limit: a shell lasts at most 2s"),
        ("KICI_SHELL_IDLE_SECONDS", "idle: no keystroke for 2s"),
    ],
)
async def test_a_session_ends_at_its_time_limits(container_agent, approver, settings, limit, says):
    agent, _ = container_agent
    setattr(settings, limit, 2)
    comm = await _socket(approver, agent.agent_id)
    started = time.monotonic()
    if limit == "KICI_SHELL_MAX_SECONDS":  # keystrokes do not keep it open
        for _ in range(5):
            await comm.send_to(bytes_data=b"\r")
            await asyncio.sleep(0.3)
    _, messages, closed = await _until_closed(comm, 8)
    assert closed is not None and closed["code"] == 1000, (closed, messages)
    assert messages[-1] == {"closed": says}
    assert 2 <= time.monotonic() - started < 6
    records = await database_sync_to_async(_records_when_closed)(agent.agent_id)
    assert records[-1].action == "shell.closed" and records[-1].detail.endswith(says)
    await comm.disconnect()


@pytest.mark.docker
async def test_a_session_ends_when_the_agent_leaves_running(container_agent, approver):
    agent, _ = container_agent
    comm = await _socket(approver, agent.agent_id)
    await comm.receive_output(timeout=10)  # opened
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(state=AgentState.DESTROYING)
    _, messages, closed = await _until_closed(comm, 8)
    assert closed is not None and closed["code"] == 1000
    assert messages[-1] == {"closed": "the agent left running/held: it is destroying"}
    await comm.disconnect()


@pytest.mark.docker
async def test_an_agent_torn_down_under_its_shell_is_why_the_shell_ended(container_agent, approver):
    """The teardown stops the container, which ends the exec before the watch's next look: the
    page and the record say the agent left, not that the shell exited."""
    agent, container = container_agent
    comm = await _socket(approver, agent.agent_id)
    await comm.receive_output(timeout=10)  # opened
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(state=AgentState.DESTROYING)
    await asyncio.to_thread(container.kill)
    _, messages, closed = await _until_closed(comm, 8)
    assert closed is not None and messages[-1] == {"closed": "the agent left running/held: it is destroying"}
    records = await database_sync_to_async(_records_when_closed)(agent.agent_id)
    assert records[-1].detail.endswith("the agent left running/held: it is destroying"), records[-1].detail
    await comm.disconnect()


@pytest.mark.docker
async def test_a_held_agent_takes_a_shell_and_exit_ends_it(container_agent, approver):
    agent, _ = container_agent
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(state=AgentState.HELD)
    comm = await _socket(approver, agent.agent_id)
    await comm.receive_output(timeout=10)  # opened
    await comm.send_to(bytes_data=b"exit\r")
    _, messages, closed = await _until_closed(comm, 8)
    assert closed is not None and messages[-1] == {"closed": "the shell exited"}
    await comm.disconnect()


async def test_a_shell_that_cannot_be_recorded_is_not_opened(monkeypatch):
    """The audit trail cannot be written: the exec is ended and the socket refused (no session
    without its records)."""
    closed: list[bool] = []

    class Exec:
        container_id = "c0ffee" * 10

        def close(self):
            closed.append(True)

    def broken_audit(*args, **kwargs):
        raise RuntimeError("the database is gone")

    monkeypatch.setattr(ContainerShell, "open", classmethod(lambda cls, agent, cols, rows: Exec()))
    monkeypatch.setattr("live.consumers.record_audit", broken_audit)
    client = await database_sync_to_async(_user)("shell-approver", "operations.approve_operation")
    agent = await database_sync_to_async(_agent)(AgentState.RUNNING, "container", managed_id="c0ffee")
    comm = await _socket(client, agent.agent_id)
    _, messages, close = await _until_closed(comm, 5)
    assert close is not None and close["code"] == CLOSE_NOT_SHELLABLE
    assert messages == [{"closed": "the shell could not be recorded: the database is gone"}]
    assert closed == [True]
    await comm.disconnect()
