"""``make run``'s processes under supervisord (``operations/supervision.py``), started as
``scripts/run.sh`` starts them (``manage.py supervisor_config``, then supervisord in its own session)
against the suite's database and Redis, daphne on a free loopback port, the agents' gateway on
another, the orchestrator's API on a third, one rq worker: a process killed is restarted without
stopping the others, recorded as an event and on /metrics; one that keeps dying is given up,
visibly; SIGTERM to supervisord stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import xmlrpc.client
from pathlib import Path

import pytest
import requests
from django.core.management import CommandError, call_command
from rq import Worker
from supervisor.xmlrpc import SupervisorTransport

from agents.choices import EventType
from agents.models import ScalerEvent
from operations.supervision import PROCESS_RESTARTS, STARTRETRIES
from tests.support.servers import REPO, free_port

RPC_TIMEOUT = 30  # seconds


class Console:
    """A supervised console: its base URL, supervisord's process and its XML-RPC interface."""

    def __init__(self, url: str, proc: subprocess.Popen, sock: Path, log_dir: Path, env: dict[str, str]):
        self.url, self.proc, self.sock, self.log_dir, self.env = url, proc, sock, log_dir, env

    @property
    def rpc(self):
        """A new XML-RPC client on supervisord's socket (one whose request failed is not reusable)."""
        transport = SupervisorTransport(None, None, f"unix://{self.sock}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def info(self, name: str) -> dict:
        return self.rpc.supervisor.getProcessInfo(name)

    def pids(self) -> dict[str, int]:
        return {f"{p['group']}:{p['name']}": p["pid"] for p in self.rpc.supervisor.getAllProcessInfo()}

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.log_dir.glob("*.log")))


def _wait(predicate, timeout: float, what: str, console: Console | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s" + (f"\n{console.logs()}" if console else ""))


def _answers(url: str) -> bool:
    """Whether daphne answers /healthz (200, or 503 "degraded": no dockerd is reachable here)."""
    try:
        response = requests.get(url + "/healthz", timeout=5)
    except requests.ConnectionError:
        return False
    return response.status_code in (200, 503) and "checks" in response.json()


def _gateway_answers(url: str) -> bool:
    """Whether the gateway answers (the agent API's 404 for anything else)."""
    try:
        return requests.get(url + "/healthz", timeout=5).status_code == 404
    except requests.ConnectionError:
        return False


def _children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def console(transactional_db, tmp_path):
    from django.db import connection

    db = connection.settings_dict
    port, gateway, api = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": (
            f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "KICI_OPERATOR_LISTEN": f"127.0.0.1:{port}",
        "KICI_CONSOLE_URL": f"http://127.0.0.1:{gateway}",
        "KICI_API_LISTEN": f"127.0.0.1:{api}",
        "LOG_LEVEL": "WARNING",
    }
    run_dir, log_dir = tmp_path / "run", tmp_path / "log"
    run_dir.mkdir()
    log_dir.mkdir()
    conf = run_dir / "supervisord.conf"
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run(
        [*manage, "supervisor_config", "--workers", "1", "--servers", "1", "--gateway", f"127.0.0.1:{gateway}"]
        + ["--api", f"127.0.0.1:{api}", "--out", str(conf), "--log-dir", str(log_dir)],
        env=env,
        check=True,
        timeout=60,
    )
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("supervisord")), "-c", str(conf)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    c = Console(f"http://127.0.0.1:{port}", proc, run_dir / "supervisor.sock", log_dir, env)
    c.gateway_url = f"http://127.0.0.1:{gateway}"
    c.api_url = f"http://127.0.0.1:{api}"
    try:

        def all_running():
            try:
                return all(p["statename"] == "RUNNING" for p in c.rpc.supervisor.getAllProcessInfo())
            except (OSError, xmlrpc.client.Fault):
                return False

        _wait(all_running, RPC_TIMEOUT, "every program RUNNING", c)
        _wait(lambda: _answers(c.url), RPC_TIMEOUT, "daphne answering /healthz", c)
        _wait(lambda: _gateway_answers(c.gateway_url), RPC_TIMEOUT, "the gateway answering", c)
        _wait(lambda: _answers(c.api_url), RPC_TIMEOUT, "the API processes answering /healthz", c)
        yield c
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


class HealthWatch:
    """Asks /healthz every 0.1 s on a thread until stopped; counts the times daphne did not answer."""

    def __init__(self, url: str):
        self.url, self.asked, self.failed = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.1):
            self.asked += 1
            if not _answers(self.url):
                self.failed += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def _events(type: str, process: str) -> list[ScalerEvent]:
    return list(ScalerEvent.objects.filter(type=type, agent=None, scaler_name="", payload__process=process))


def _restarts(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line.startswith(PROCESS_RESTARTS + "{"):
            labels, value = line.rsplit(" ", 1)
            values[labels.split('program="', 1)[1].split('"', 1)[0]] = float(value)
    return values


def test_a_killed_worker_is_back_within_seconds_and_the_rest_kept_running(console):
    from django_rq import get_connection

    worker = console.info("worker:worker-1")
    others = {name: pid for name, pid in console.pids().items() if name != "worker:worker-1"}
    assert _restarts(console.url) == {"api": 0.0, "daphne": 0.0, "gateway": 0.0, "sweeper": 0.0, "worker": 0.0}
    children = _children(worker["pid"])
    assert children, "the worker forks its scheduler"
    with HealthWatch(console.url) as health:
        os.kill(worker["pid"], signal.SIGKILL)

        def new_worker_registered():
            info = console.info("worker:worker-1")
            if info["statename"] != "RUNNING" or info["pid"] in (0, worker["pid"]):
                return None
            pids = {w.pid for w in Worker.all(connection=get_connection("default"))}
            return info["pid"] if info["pid"] in pids else None

        new_pid = _wait(new_worker_registered, 20, "a new rq worker registered", console)
        time.sleep(1)  # daphne keeps answering past the restart too
    assert new_pid != worker["pid"] and _alive(new_pid)
    # The killed worker's own children (its scheduler) died with it: none is left running old code.
    _wait(lambda: not any(_alive(pid) for pid in children), 10, f"the killed worker's children {children} gone")
    assert health.asked >= 10 and health.failed == 0
    assert {name: pid for name, pid in console.pids().items() if name != "worker:worker-1"} == others
    assert all(_alive(pid) for pid in others.values())

    events = _wait(lambda: _events(EventType.PROCESS_RESTARTED, "worker-1"), 10, "the restart event", console)
    assert len(events) == 1
    assert events[0].payload["program"] == "worker" and events[0].payload["pid"] == str(worker["pid"])
    assert f"worker-1 (pid {worker['pid']}) exited; restarted" in events[0].detail
    assert _restarts(console.url) == {"api": 0.0, "daphne": 0.0, "gateway": 0.0, "sweeper": 0.0, "worker": 1.0}


def test_a_process_that_keeps_dying_at_start_is_given_up_visibly_and_the_rest_still_run(console):
    others = {name: pid for name, pid in console.pids().items() if name != "sweeper:sweeper"}
    killed: set[int] = set()

    def kill_each_new_sweeper():
        info = console.info("sweeper:sweeper")
        if info["statename"] == "FATAL":
            return True
        if info["pid"] and info["pid"] not in killed:
            killed.add(info["pid"])
            os.kill(info["pid"], signal.SIGKILL)
        return False

    _wait(kill_each_new_sweeper, 90, "the sweeper given up", console)
    assert len(killed) == STARTRETRIES + 2  # the running one, then every start
    gave_up = _wait(lambda: _events(EventType.PROCESS_GAVE_UP, "sweeper"), 10, "the give-up event", console)
    assert len(gave_up) == 1 and "given up" in gave_up[0].detail
    _wait(lambda: _restarts(console.url)["sweeper"] == len(killed), 10, "every exit counted", console)
    assert console.pids() == {**others, "sweeper:sweeper": 0}
    assert all(console.info(name)["statename"] == "RUNNING" for name in others)
    assert all(_alive(pid) for pid in others.values())
    assert _answers(console.url)


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def test_sigterm_to_supervisord_stops_every_process(console):
    pids = console.pids()
    assert set(pids) == {
        "daphne:daphne-1",
        "gateway:gateway-1",
        "api:api-1",
        "worker:worker-1",
        "sweeper:sweeper",
        "process_events:process_events",
    }
    assert all(_alive(pid) for pid in pids.values())
    # Each process has the environment it was started in (run.sh's: var/env, REDIS_URL, ...),
    # plus supervisord's SUPERVISOR_* names and, for the servers, their database pool's size.
    for name, pid in pids.items():
        own = {k: v for k, v in _environ(pid).items() if not k.startswith("SUPERVISOR_")}
        pool = own.pop("KICI_DB_POOL_SIZE", None)
        assert own == console.env
        assert (pool is not None and 2 <= int(pool) <= 8) == name.startswith(("gateway:", "daphne:", "api:"))
    console.proc.send_signal(signal.SIGTERM)
    assert console.proc.wait(60) == 0
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    assert not _answers(console.url) and not _answers(console.api_url)


def test_the_configuration_refuses_a_worker_count_below_one(tmp_path):
    with pytest.raises(CommandError, match=r"workers=0 is not a positive whole number"):
        call_command(
            "supervisor_config", "--workers", "0", "--out", str(tmp_path / "s.conf"), "--log-dir", str(tmp_path)
        )
    with pytest.raises(CommandError, match=r"servers=0 is not a positive whole number"):
        call_command(
            "supervisor_config",
            *("--workers", "1", "--servers", "0", "--out", str(tmp_path / "s.conf"), "--log-dir", str(tmp_path)),
        )
    assert not (tmp_path / "s.conf").exists()


def test_each_server_pools_a_share_of_max_connections_that_leaves_room_for_the_rest():
    from operations.supervision import POOL_MAX, POOL_MIN, db_pool_size

    # The shared server here: 100 connections, 2 gateway and 2 daphne processes, 2 workers.
    size = db_pool_size(100, 4, 2)
    assert POOL_MIN <= size <= POOL_MAX and 4 * size + 2 * 2 + 2 <= 50
    assert db_pool_size(1000, 2, 2) == POOL_MAX
    with pytest.raises(ValueError, match=r"max_connections=20: too few for 8 pooled server processes and 4 others"):
        db_pool_size(20, 8, 4)


def test_the_servers_run_as_several_processes_each_with_its_pool(tmp_path, settings):
    from operations.supervision import supervisord_config

    text = supervisord_config(
        root=REPO, run_dir=tmp_path, log_dir=tmp_path, workers=2, servers=3, gateway=("172.30.0.1", 8000), pool_size=4
    )
    import configparser

    config = configparser.RawConfigParser()
    config.read_string(text)
    assert config["program:daphne"]["numprocs"] == config["program:gateway"]["numprocs"] == "3"
    assert config["program:gateway"]["environment"] == 'KICI_DB_POOL_SIZE="4"'
    assert config["program:daphne"]["environment"] == 'KICI_DB_POOL_SIZE="4"'
    assert config["program:gateway"]["command"].endswith("-m kici_site.gateway --listen 172.30.0.1:8000")
    assert "-m kici_site.operator_server" in config["program:daphne"]["command"]
    assert "environment" not in config["program:worker"]  # forked work-horses: no pool
    no_gateway = supervisord_config(
        root=REPO, run_dir=tmp_path, log_dir=tmp_path, workers=1, servers=1, gateway=None, pool_size=2
    )
    assert "program:gateway" not in no_gateway and "program:api" not in no_gateway
