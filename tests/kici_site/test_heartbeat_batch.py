"""The gateway's batched heartbeats on the real server (``python -m kici_site.gateway``) with the
suite's PostgreSQL: beats queued while a statement is in flight are written by one statement, and
only those its checks pass; every other beat gets the Django view's own answer; the batcher comes
back after the database was away; a written beat's answer is the view's, byte for byte."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from agents.choices import AgentState
from agents.heartbeat_batch import APPLICATION_NAME
from agents.models import Agent, AgentToken
from agents.tokens import mint_session_token
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, run_gateway

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def db():
    from django.db import connection

    return connection.settings_dict


def _dsn(db: dict) -> str:
    return f"postgresql://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _running(scaler, count: int) -> list[tuple[str, str]]:
    """``count`` running agents of ``scaler`` with their session tokens."""
    out = []
    for _ in range(count):
        agent = make_agent(scaler, state=AgentState.RUNNING)
        out.append((agent.agent_id, mint_session_token(agent)))
    return out


def _request(
    agent_id: str,
    token: str,
    body: bytes = b'{"activeJobs": 2}',
    query: str = "",
    content_type: str = "application/json",
    authorization: str = "Bearer",
) -> bytes:
    return (
        f"POST /api/v1/agents/{agent_id}/heartbeat{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {authorization} {token}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _xmin(agent_id: str) -> str:
    """The transaction that last wrote the agent's row: one per statement (autocommit)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM agents_agent WHERE agent_id = %s", [agent_id])
        return cursor.fetchone()[0]


def _batcher_backends(dsn: str) -> list[tuple[int, str]]:
    """``(pid, last statement)`` of the batchers' connections to PostgreSQL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s", [APPLICATION_NAME]
        ).fetchall()


def test_a_batch_writes_only_the_beats_its_checks_pass_and_the_others_get_the_views_answers(db):
    scaler = make_scaler(max_agents=50)
    (blocker, blocker_token), *valid = _running(scaler, 4)
    (other, other_token), (expired, expired_token), (ended, ended_token), (bad, bad_token) = _running(scaler, 4)
    (plain, plain_token), (nul, nul_token), (basic, basic_token) = _running(scaler, 3)
    AgentToken.objects.filter(agent__agent_id=expired).update(expires_at=timezone.now() - timedelta(seconds=1))
    Agent.objects.filter(agent_id=ended).update(state=AgentState.DESTROYED)
    refused = {
        # another agent's token on this agent's URL
        other: (_request(other, valid[0][1]), 401, "agent-mismatch"),
        expired: (_request(expired, expired_token), 401, "expired"),
        ended: (_request(ended, ended_token), 410, "agent-finished"),
        bad: (_request(bad, bad_token, b'{"activeJobs": -1}'), 400, "invalid-request"),
        plain: (_request(plain, plain_token, content_type="text/plain"), 415, "unsupported-media-type"),
        nul: (_request(nul, nul_token, b'{"note": "\\u0000"}'), 400, "invalid-request"),
        basic: (_request(basic, basic_token, authorization="Basic"), 401, "missing-token"),
    }
    before = {agent_id: Agent.objects.get(agent_id=agent_id).last_heartbeat for agent_id in refused}
    port, operator = free_port(), free_port()
    dsn = _dsn(db)
    with run_gateway(db, f"127.0.0.1:{port}", operator_listen=f"127.0.0.1:{operator}"):
        with psycopg.connect(dsn) as lock:
            # The first beat's statement waits for this row: what arrives meanwhile is queued.
            lock.execute("SELECT 1 FROM agents_agent WHERE agent_id = %s FOR UPDATE", [blocker])
            first = socket.create_connection(("127.0.0.1", port), timeout=20)
            first.sendall(_request(blocker, blocker_token))
            deadline = time.monotonic() + 10
            while not any("unnest" in query for _, query in _batcher_backends(dsn)):
                assert time.monotonic() < deadline, "the first beat's statement never started"
                time.sleep(0.05)
            rest = {}
            for agent_id, token in valid:
                rest[agent_id] = socket.create_connection(("127.0.0.1", port), timeout=20)
                rest[agent_id].sendall(_request(agent_id, token))
            for agent_id, (request, _, _) in refused.items():
                rest[agent_id] = socket.create_connection(("127.0.0.1", port), timeout=20)
                rest[agent_id].sendall(request)
            time.sleep(1)  # read and queued by the gateway (within the batcher's lock timeout, 2 s)
            lock.rollback()
        assert _status_and_body(_answer(first))[0] == 200
        answers = {agent_id: _status_and_body(_answer(sock)) for agent_id, sock in rest.items()}
        for sock in [first, *rest.values()]:
            sock.close()
    for agent_id, (_, status, reason) in refused.items():
        answer = answers[agent_id]
        assert answer[0] == status and answer[1]["reason"] == reason, (agent_id, answer)
        assert Agent.objects.get(agent_id=agent_id).last_heartbeat == before[agent_id], f"{agent_id} was written"
    for agent_id, _ in valid:
        assert answers[agent_id] == (200, {"state": "running", "drain": False, "stop": False})
        assert Agent.objects.get(agent_id=agent_id).active_jobs == 2
    statements = {_xmin(agent_id) for agent_id, _ in valid}
    assert len(statements) == 1 and _xmin(blocker) not in statements, "the queued beats took several statements"


def test_concurrent_beats_of_many_agents_take_fewer_statements_than_beats(db):
    scaler = make_scaler(max_agents=500)
    fleet = _running(scaler, 200)
    port, operator = free_port(), free_port()
    every_agent_here = {"KICI_GATEWAY_CONNECTIONS_PER_SOURCE": "100"}  # all dial from 127.0.0.1
    with run_gateway(db, f"127.0.0.1:{port}", operator_listen=f"127.0.0.1:{operator}", extra_env=every_agent_here):

        def beat(agent: tuple[str, str]) -> int:
            with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
                sock.sendall(_request(*agent))
                return _status_and_body(_answer(sock))[0]

        with ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(beat, fleet))
    assert statuses == [200] * len(fleet)
    statements = len({_xmin(agent_id) for agent_id, _ in fleet})
    assert statements <= len(fleet) // 2, f"{len(fleet)} beats took {statements} statements"
    print(f"{len(fleet)} beats in {statements} statements")


class _Proxy:
    """A TCP relay to PostgreSQL on a loopback port that the test can cut (every connection
    dropped, new ones refused) and restore."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.accepting: threading.Thread | None = None
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.1)
        self.accepting = threading.Thread(target=self._accept, args=(self.listener,), daemon=True)
        self.accepting.start()

    def cut(self) -> None:
        listener, self.listener = self.listener, None
        assert listener is not None and self.accepting is not None, "cut twice"
        self.accepting.join()  # sees that it is no longer the listener within its timeout
        listener.close()  # closed only here, with no thread in its accept: new connections refused
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self.open = []

    def _accept(self, listener: socket.socket) -> None:
        while self.listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            server = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_the_batcher_reconnects_after_the_database_was_away(db):
    scaler = make_scaler(max_agents=10)
    ((agent_id, token),) = _running(scaler, 1)
    proxy = _Proxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    port, operator = free_port(), free_port()
    dsn = _dsn(db)

    def beat() -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_request(agent_id, token))
            return _status_and_body(_answer(sock))[0]

    behind_proxy = {**db, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
    try:
        with run_gateway(behind_proxy, f"127.0.0.1:{port}", operator_listen=f"127.0.0.1:{operator}"):
            assert beat() == 200
            ((first_pid, query),) = _batcher_backends(dsn)
            assert "unnest" in query
            proxy.cut()
            written = _xmin(agent_id)
            assert beat() != 200  # the view's answer: its pool has no connection either
            assert _xmin(agent_id) == written and _batcher_backends(dsn) == []
            proxy.restore()
            deadline = time.monotonic() + 30
            while True:
                status = beat()
                backends = _batcher_backends(dsn)
                if status == 200 and backends and backends[0][0] != first_pid:
                    break
                assert time.monotonic() < deadline, f"no batcher back: {status}, {backends}"
                time.sleep(0.5)
            assert _xmin(agent_id) != written and "unnest" in backends[0][1]
    finally:
        proxy.cut()


def test_a_written_beat_is_answered_as_the_view_answers_it(db):
    scaler = make_scaler(max_agents=10)
    ((agent_id, token),) = _running(scaler, 1)
    port, operator = free_port(), free_port()

    def beat(query: str) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(_request(agent_id, token, query=query))
            head, _, body = _answer(sock).partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    with run_gateway(db, f"127.0.0.1:{port}", operator_listen=f"127.0.0.1:{operator}"):
        for state in (AgentState.RUNNING, AgentState.DRAINING, AgentState.HELD, AgentState.DESTROYING):
            Agent.objects.filter(agent_id=agent_id).update(state=state)
            written = _xmin(agent_id)
            batched = beat("")
            assert _xmin(agent_id) != written
            # A query string takes the beat past the batch, to Django's view.
            assert beat("?via=view") == batched, state
            assert batched.startswith(b"HTTP/1.1 200 ")
            assert json.loads(batched.partition(b"\r\n\r\n")[2])["state"] == state
