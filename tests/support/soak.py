"""The soak's machinery, shared by ``bench/soak.py`` and ``tests/scalers/test_soak.py``.

:func:`run_console` starts a real console on loopback over one database: daphne (the production
ASGI server), rq workers on this run's host queue with the scheduler, and the scaler sweeper
(interval 1 s, lost-agent sweep every 5 s). Its one scaler is bare-metal in process mode; each
agent is ``bench/agents/soak_agent.py``, a host process that registers, heartbeats and plays its
job. :func:`drive` is the orchestrator: for ``duration`` seconds, ``concurrency`` threads each run
lifecycles (``/scale``, the registration, the job) and end each one in a random :data:`ENDINGS`;
then it waits for the console to settle, counts what leaked and checks that a new job is admitted.

Everything listens and dials on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import django_rq
import docker
import requests
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone
from rq import Worker

from agents.choices import ACTIVE_STATES, TERMINAL_STATES, AgentState, EventType
from agents.models import Agent, AgentToken, ScalerEvent
from agents.tokens import REGISTRATION_PREFIX
from network.nft.apply import NftClient
from scalers.backends.baremetal import _alive
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ensure_isolated_network
from scalers.leader import LEADER_LOCK_KEY, SESSION_PREFIX
from scalers.lifecycle import STUCK_TEARDOWN_SECONDS, mark_draining
from scalers.models import Reservation, Scaler
from tests.support.scalers import DEFAULT_LABEL_SET_ENTRY, make_scaler, set_global
from tests.support.servers import REPO, free_port

#: How a lifecycle ends, as the orchestrator (or the agent) makes it end:
#: ``job-complete`` (the job finished: POST job-complete), ``release`` (the orchestrator gave the
#: running agent up), ``crash`` (the agent process is killed with SIGKILL; the lost-agent sweep
#: ends it), ``lost`` (the orchestrator lost the job at once and releases the agent before or while
#: it registers) and ``drain`` (an operator drains it mid-job; the sweeper ends it once idle).
ENDINGS = ("job-complete", "release", "crash", "lost", "drain")

BACKENDS = ("process", "container")

#: The container soak's endings, drawn at random: mostly a job that completes, and ``docker-kill``
#: (the agent's container is killed with ``docker kill`` while it holds its job; the lost-agent
#: sweep ends it).
CONTAINER_ENDINGS = ("job-complete", "job-complete", "job-complete", "docker-kill")

#: Faults the container soak injects into the console, in turn, while lifecycles run:
#: ``worker-kill`` (SIGKILL of an rq worker, and of its work-horse, while it runs a spawn; a new
#: worker is started), ``sweeper-restart`` and ``console-restart`` (every console process stopped
#: and started again while agents run).
FAULTS = ("worker-kill", "sweeper-restart", "console-restart")

#: Registration-token lifetime of the container soak's console (seconds): a spawn whose worker was
#: killed before its agent registered is ended by the token expiry, not after the 300 s stale prune.
CONTAINER_TOKEN_TTL_SECONDS = 30

AGENT = REPO / "bench" / "agents" / "soak_agent.py"
LABELS = ["linux", "soak"]
RELEASE_REASON = "soak: job cancelled"
LOST_REASON = "soak: orchestrator lost the job"

#: Seconds a lifecycle may take to end after its ending was triggered (a crash waits for the
#: lost-agent sweep, every 5 s, and its operation's job). Any ending may meet a teardown whose
#: worker a fault killed: the sweeper retries it after STUCK_TEARDOWN_SECONDS, so every ending
#: gets that and a margin of a few sweeper rounds and one teardown.
END_TIMEOUT = {"crash": 60.0, "docker-kill": 60.0}
DEFAULT_END_TIMEOUT = STUCK_TEARDOWN_SECONDS + 20.0
#: Seconds from /scale to running; a console restart (or a spawn killed with its worker, ended by
#: the token expiry) may take part of it.
REGISTER_TIMEOUT = 90.0
#: Seconds an orchestrator call is retried while the console does not answer (a console restart).
API_RETRY_SECONDS = 90.0


def database_url(db: dict) -> str:
    """``postgres://`` URL of a Django database settings dict (loopback by default)."""
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def lock_holders() -> list[str]:
    """Instance ids whose sweeper session holds the leader lock on this database now
    (``scalers.leader``: the session's application name carries the instance id)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT substr(a.application_name, %s) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 1 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [len(SESSION_PREFIX) + 1, LEADER_LOCK_KEY >> 32, LEADER_LOCK_KEY & 0xFFFFFFFF],
        )
        return [row[0] for row in cur.fetchall()]


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes (``VmRSS``), None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Launcher:
    """Starts, stops and kills the console's processes by name (``web``, ``worker-<n>``,
    ``sweeper``), each with its log ``<workdir>/<name>.log`` (appended across restarts)."""

    def __init__(self, workdir: Path, env: dict, web_argv: list[str], web_env: dict, workers: int, queue: str):
        self.workdir, self.env, self.web_argv, self.web_env = workdir, env, web_argv, web_env
        manage = [sys.executable, "manage.py"]
        self.argv: dict[str, list[str]] = {"web": web_argv}
        for i in range(1, workers + 1):
            # only the run's own queue: no job of another run or test reaches it
            self.argv[f"worker-{i}"] = [
                *manage,
                "rqworker",
                queue,
                "--with-scheduler",
                "--worker-class",
                "kici_site.worker.KiciWorker",
            ]
        self.argv["sweeper"] = [*manage, "scaler_sweeper", "--interval", "1", "--no-warm-pools"]
        self.procs: dict[str, subprocess.Popen] = {}
        #: every process group started (one per process: ``start_new_session``), for stop_all
        self.groups: set[int] = set()
        self.web_url = ""

    def start(self, name: str) -> None:
        env = self.web_env if name == "web" else self.env
        self.procs[name] = _start(self.argv[name], env, self.workdir / f"{name}.log")
        self.groups.add(self.procs[name].pid)
        if name == "web" and self.web_url:
            _wait_healthy(self.web_url, self.procs["web"], self.workdir / "web.log")

    def stop(self, name: str) -> None:
        """SIGTERM (a worker finishes its job first), then SIGKILL after 15 s."""
        _stop(self.procs[name])

    def kill(self, name: str) -> None:
        """SIGKILL ``name``, first the work-horses it forked (each in its own process group), then
        its own group: a worker's scheduler child would otherwise outlive it, adopted by init."""
        pid = self.procs[name].pid
        for child in _children(pid):
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _kill_group(pid)
        self.procs[name].wait(5)

    def start_all(self) -> None:
        for name in self.argv:
            self.start(name)

    def stop_all(self) -> int:
        """Stop every process, then SIGKILL whatever is left in any group ever started (children
        of killed processes). Returns how many such leftovers there were."""
        for name in reversed(self.argv):
            if name in self.procs:
                self.stop(name)
        leftovers = [pid for pid in group_members(self.groups)]
        for group in self.groups:
            _kill_group(group)
        return len(leftovers)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def group_members(groups: set[int]) -> list[int]:
    """Pids of live processes whose process group is one of ``groups`` (zombies excluded)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) in groups:
            out.append(int(entry.name))
    return out


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from ``/proc/<pid>/stat``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


@dataclass
class Console:
    """A running soak console: its base URL (the orchestrator's, on loopback), API token, scaler,
    control directory, backend (``process`` or ``container``) and processes."""

    url: str
    api_token: str
    scaler: Scaler
    control_dir: Path
    launcher: Launcher
    backend: str = "process"
    docker_host: str = ""  # container backend: the daemon the agents run on
    nft_table: str = ""  # container backend: the console's nft table
    #: agents whose spawn job was killed with its worker: they may end before they ever ran
    spawn_victims: set[str] = field(default_factory=set)

    @property
    def processes(self) -> dict[str, int]:
        return self.launcher.pids()

    def rss(self) -> dict[str, int | None]:
        return {name: rss_bytes(pid) for name, pid in self.processes.items()}


def _start(argv: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _kill_agent_processes(scaler: Scaler) -> int:
    """SIGKILL the process group of every agent process of ``scaler`` still alive (the soak's
    own cleanup, after the figures are taken). Returns how many were killed."""
    killed = 0
    for ctx in Agent.objects.filter(scaler=scaler).values_list("backend_context", flat=True):
        pid = (ctx or {}).get("pid")
        if pid and _alive(int(pid), ctx.get("start_time")):
            try:
                os.killpg(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def docker_for(docker_host: str) -> docker.DockerClient:
    return docker.DockerClient(base_url=docker_host, version="auto", timeout=30)


def scaler_containers(docker_host: str, scaler: Scaler) -> list[dict]:
    """The kici-managed containers of ``scaler`` on the daemon (running or not)."""
    client = docker_for(docker_host)
    try:
        return client.api.containers(
            all=True, filters={"label": ["kici-managed=true", f"kici-scaler-name={scaler.name}"]}
        )
    finally:
        client.close()


def _remove_containers(docker_host: str, scaler: Scaler) -> None:
    """Force-remove what is left of ``scaler``'s containers (the soak's own cleanup)."""
    client = docker_for(docker_host)
    try:
        for c in scaler_containers(docker_host, scaler):
            client.api.remove_container(c["Id"], force=True)
    finally:
        client.close()


@contextmanager
def run_console(
    workdir: Path,
    *,
    backend: str = "process",
    max_agents: int = 4,
    workers: int = 2,
    heartbeat_seconds: float = 1.0,
    docker_host: str = "",
    nft_table: str = "kicisoak",
    agent_program: Path | None = None,
) -> Iterator[Console]:
    """A real console on a free loopback port over Django's default database (already migrated),
    with one scaler ``soak-<hex>`` (``maxAgents`` = ``max_agents``), run by ``workers`` rq workers
    and the sweeper. Logs go to ``workdir``; the processes are stopped (SIGTERM, then SIGKILL) and
    any agent left is killed when the block ends.

    ``backend="process"``: a bare-metal scaler in process mode whose agents are :data:`AGENT`, or
    the executable ``agent_program`` when given (its ``binaryPath``, run as it is).
    ``backend="container"``: a container scaler on the dockerd of ``docker_host`` (agent image
    ``kici-agent:local``, never pulled) with network isolation on in the nft table ``nft_table``
    (dropped at the end); daphne also listens on the agent gateway 172.30.0.1, where the agents
    reach it; registration tokens live 30 s, so a spawn killed with its worker is ended by the
    sweeper's token expiry. Raises ValueError for another backend or a container backend
    without ``docker_host``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "container" and not docker_host:
        raise ValueError("docker_host is required for the container backend")
    workdir.mkdir(parents=True, exist_ok=True)
    control = workdir / "control"
    control.mkdir(exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_hex(16)
    host = f"soak-{secrets.token_hex(3)}"
    set_global(max_agents=max_agents * 10)
    endpoints = [f"tcp:port={port}:interface=127.0.0.1"]
    extra_env: dict[str, str] = {}
    if backend == "process":
        wrapper = workdir / "soak-agent"
        wrapper.write_text(
            f"#!/bin/sh\nSOAK_CONTROL_DIR={control} SOAK_HEARTBEAT_SECONDS={heartbeat_seconds} "
            f"exec {sys.executable} {AGENT}\n"
        )
        wrapper.chmod(0o755)
        scaler = make_scaler(
            f"soak-{secrets.token_hex(3)}",
            type="bare-metal",
            labels=LABELS,
            ls_config={"binaryPath": str(agent_program or wrapper)},
            max_agents=max_agents,
            orchestrator_url=url,
            host=host,  # the console's: its workers and sweeper run the scaler
        )
    else:
        client = docker_for(docker_host)
        try:
            ensure_isolated_network(client)  # the bridge, and so the gateway address, exist from here on
        finally:
            client.close()
        agent_port = free_port(ISOLATED_NETWORK_GATEWAY)
        agent_url = f"http://{ISOLATED_NETWORK_GATEWAY}:{agent_port}"
        endpoints.append(f"tcp:port={agent_port}:interface={ISOLATED_NETWORK_GATEWAY}")
        scaler = make_scaler(
            f"soak-{secrets.token_hex(3)}",
            type="container",
            labels=LABELS,
            ls_config=DEFAULT_LABEL_SET_ENTRY,
            max_agents=max_agents,
            orchestrator_url=agent_url,
            host=host,  # the console's: its workers and sweeper run the scaler
        )
        extra_env = {
            "DOCKER_HOST": docker_host,
            "KICI_CONSOLE_URL": agent_url,
            "KICI_NETWORK_ISOLATION": "true",
            "KICI_AGENT_TOKEN_TTL_SECONDS": str(CONTAINER_TOKEN_TTL_SECONDS),
        }
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "soak-only-not-secret",
        "DATABASE_URL": database_url(db),
        "REDIS_URL": settings.REDIS_URL,  # the suite's (kici_site.settings_test), never a console's
        "KICI_HOST_NAME": host,
        "KICI_API_TOKEN": token,
        "KICI_AGENT_LOG_DIR": str(workdir / "agents"),
        "KICI_NFT_TABLE": nft_table,
        "KICI_SWEEP_LOST_AGENTS_SECONDS": "5",
        # The suite's heartbeat (kici_site.settings_test), not the production 30 s: drains and
        # stops reach the agents within seconds.
        "KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS": "5",
        "KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS": os.environ.get("KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS", "90"),
        "KICI_SWEEP_ORPHAN_CONTAINERS_SECONDS": "0",
        "KICI_SWEEP_ORPHAN_VMS_SECONDS": "0",
        "KICI_SWEEP_STALE_ISOLATION_RULES_SECONDS": "0",
        "LOG_LEVEL": "WARNING",
        **extra_env,
    }
    web_env = {
        **env,
        "ALLOWED_HOSTS": f"127.0.0.1,{ISOLATED_NETWORK_GATEWAY}",
        "KICI_OPERATOR_LISTEN": f"127.0.0.1:{port}",
    }
    web_argv = [
        sys.executable,
        "-m",
        "daphne",
        *(a for e in endpoints for a in ("-e", e)),
        "kici_site.asgi:application",
    ]
    launcher = Launcher(workdir, env, web_argv, web_env, workers, f"host:{host}")
    with ExitStack() as stack:
        if backend == "process":
            stack.callback(_kill_agent_processes, scaler)
        else:
            stack.callback(NftClient(nft_table).delete_table)
            stack.callback(_remove_containers, docker_host, scaler)
        stack.callback(launcher.stop_all)
        launcher.start_all()
        _wait_healthy(url, launcher.procs["web"], workdir / "web.log")
        launcher.web_url = url
        yield Console(url, token, scaler, control, launcher, backend, docker_host, nft_table)


def _wait_healthy(url: str, web: subprocess.Popen, log_path: Path, timeout: float = 30.0) -> None:
    """Wait until ``url``/healthz answers; RuntimeError with the log's tail when it does not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            requests.get(url + "/healthz", timeout=1)
            return
        except (requests.ConnectionError, requests.Timeout):  # a loaded machine answers late
            if web.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.2)


# --- the orchestrator ------------------------------------------------------------------------------


@dataclass
class Lifecycle:
    """One agent's life: its ending, its figures (seconds) and, when it went wrong, ``problem``."""

    ending: str
    job_id: str
    agent_id: str = ""
    registered_after: float | None = None  # /scale sent -> registeredAt
    freed_after: float | None = None  # ending triggered -> reservation released
    final_state: str = ""
    reason: str = ""
    problem: str = ""
    fault: str = ""  # the injected fault that ended it before it ran (its spawn killed), if any


@dataclass
class Report:
    """What :func:`drive` saw; :meth:`problems` lists every leak and wrong ending."""

    max_agents: int
    seconds: float = 0.0
    lifecycles: list[Lifecycle] = field(default_factory=list)
    refused: int = 0  # /scale answered at-capacity (retried)
    max_slots: int = 0  # most slots of the scaler occupied at one time (sampled)
    leaks: dict[str, list[str]] = field(default_factory=dict)
    rows_before: dict[str, int] = field(default_factory=dict)
    rows_after: dict[str, int] = field(default_factory=dict)
    rss_before: dict[str, int | None] = field(default_factory=dict)
    rss_after: dict[str, int | None] = field(default_factory=dict)
    new_job: str = ""  # the answer to a /scale sent once everything ended ("201" when admitted)
    faults: list[Fault] = field(default_factory=list)  # injected into the console (container soak)

    def problems(self) -> list[str]:
        out = [f"{lc.agent_id or lc.job_id} ({lc.ending}): {lc.problem}" for lc in self.lifecycles if lc.problem]
        out += [f"fault {f.kind}: {f.problem}" for f in self.faults if f.problem]
        out += [f"{kind}: {', '.join(items)}" for kind, items in self.leaks.items() if items]
        if self.max_slots > self.max_agents:
            out.append(f"maxAgents {self.max_agents} exceeded: {self.max_slots} slots occupied at once")
        if self.new_job != "201":
            out.append(f"a new job after the soak was not admitted: {self.new_job}")
        gone = [name for name, rss in self.rss_after.items() if rss is None]
        if gone:
            out.append(f"console processes died during the soak: {', '.join(gone)}")
        return out


def expected_end(ending: str) -> tuple[str, str]:
    """``(final state, reason prefix)`` a lifecycle ending in ``ending`` must end with; the reason is
    the ``agent.destroyed`` event's for a destroyed agent, the failure reason for a failed one."""
    return {
        "job-complete": (AgentState.DESTROYED, "job-complete"),
        "release": (AgentState.DESTROYED, f"released by the orchestrator: {RELEASE_REASON}"),
        "lost": (AgentState.DESTROYED, f"released by the orchestrator: {LOST_REASON}"),
        "crash": (AgentState.FAILED, "lost (process exited"),
        "drain": (AgentState.DESTROYED, "drained"),
        "docker-kill": (AgentState.FAILED, "lost ("),
    }[ending]


def table_rows() -> dict[str, int]:
    """Exact row count of every table of the database (``public`` schema)."""
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
        tables = [row[0] for row in cur.fetchall()]
        counts = {}
        for table in tables:
            cur.execute(f'SELECT count(*) FROM "{table}"')  # names from pg_tables
            counts[table] = cur.fetchone()[0]
    return counts


def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100, nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


class Orchestrator:
    """Drives lifecycles against ``console`` over its API (and, for drains and crashes, as the
    operator and the kernel would: ``mark_draining`` and SIGKILL)."""

    def __init__(self, console: Console, seed: int, endings: tuple[str, ...] = ENDINGS):
        self.console = console
        self.endings = endings
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.serial = 0
        self.refused = 0
        self.http = threading.local()

    def _session(self) -> requests.Session:
        if not hasattr(self.http, "session"):
            self.http.session = requests.Session()
            self.http.session.headers["Authorization"] = f"Bearer {self.console.api_token}"
        return self.http.session

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[requests.Response | None, bool]:
        """``method path`` on the console, retried for :data:`API_RETRY_SECONDS` while it does not
        answer (refused, reset, 502/503: a console restart). ``(answer, retried)``; the answer is
        None when the console never came back."""
        deadline = time.monotonic() + API_RETRY_SECONDS
        retried = False
        while True:
            try:
                answer = self._session().request(method, self.console.url + path, json=body, timeout=30)
                if answer.status_code not in (502, 503):
                    return answer, retried
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                return None, retried
            retried = True
            time.sleep(0.3)

    def post(self, path: str, body: dict) -> requests.Response:
        """POST, retried while the console restarts; a 4xx after a retry is the first try's
        effect (the call had reached the console), so it counts as done. Raises RuntimeError when
        the console never answers, HTTPError for an error answer."""
        answer, retried = self.call("POST", path, body)
        if answer is None:
            raise RuntimeError(f"POST {path}: the console did not answer for {API_RETRY_SECONDS:g} s")
        if not (retried and 400 <= answer.status_code < 500):
            answer.raise_for_status()
        return answer

    def _pick(self) -> tuple[str, str, float, float]:
        with self.lock:
            self.serial += 1
            return (
                self.rng.choice(self.endings),
                f"soak-job-{self.serial}-{secrets.token_hex(2)}",
                self.rng.uniform(0.1, 1.0),  # how long the job runs
                self.rng.uniform(0.0, 0.6),  # how soon a lost job is released
            )

    def scale(self, job_id: str, until: float) -> tuple[str, float] | str:
        """POST /scale until admitted: ``(agent id, time sent)``, or the reason it was not. A
        request the console may have taken without answering (it restarted) is looked up by its
        job id first, as an orchestrator would, so no admitted agent is left without its job."""
        while True:
            sent = time.time()
            answer, retried = self.call("POST", "/api/v1/scale", {"labels": LABELS, "jobId": job_id})
            if retried or answer is None:
                taken = Agent.objects.filter(scaler=self.console.scaler, bound_job_id=job_id).order_by("id").first()
                if taken is not None:
                    return taken.agent_id, sent
            if answer is None:
                return f"/scale: the console did not answer for {API_RETRY_SECONDS:g} s"
            if answer.status_code == 201:
                return answer.json()["agentId"], sent
            if answer.status_code != 409 or time.monotonic() > until:
                return f"/scale answered {answer.status_code}: {answer.text[:200]}"
            with self.lock:
                self.refused += 1
            time.sleep(0.2)

    def lifecycle(self, until: float) -> Lifecycle | None:
        """One lifecycle; None when the soak's time ran out before it was admitted."""
        ending, job_id, job_seconds, lost_after = self._pick()
        lc = Lifecycle(ending, job_id)
        admitted = self.scale(job_id, until)
        if isinstance(admitted, str):
            if time.monotonic() > until and "409" in admitted:
                return None
            lc.problem = admitted
            return lc
        lc.agent_id, sent = admitted
        if ending == "lost":
            time.sleep(lost_after)
            triggered = time.time()
            self.post(f"/api/v1/agents/{lc.agent_id}/release", {"reason": LOST_REASON}).raise_for_status()
        else:
            registered = self.wait_registered(lc.agent_id)
            if isinstance(registered, str) and lc.agent_id in self.console.spawn_victims:
                lc.fault = "spawn-killed"  # its spawn died with its worker (a kill or a restart): it may never run
                self.wait_end(lc, time.time())
                return lc
            if isinstance(registered, str):
                lc.problem = registered
                return lc
            lc.registered_after = registered - sent
            time.sleep(job_seconds)
            triggered = self.end(lc, ending)
        self.wait_end(lc, triggered)
        return lc

    def wait_registered(self, agent_id: str) -> float | str:
        """The agent's ``registeredAt`` (epoch seconds) once it runs, or what went wrong."""
        deadline = time.monotonic() + REGISTER_TIMEOUT
        state = "?"
        while time.monotonic() < deadline:
            answer, _ = self.call("GET", f"/api/v1/agents/{agent_id}")
            if answer is None:
                return f"the console did not answer for {API_RETRY_SECONDS:g} s"
            answer = answer.json()
            state = answer["state"]
            if state == AgentState.RUNNING and answer["registeredAt"]:
                return datetime.fromisoformat(answer["registeredAt"]).timestamp()
            if state in TERMINAL_STATES:
                reason = Agent.objects.filter(agent_id=agent_id).values_list("failure_reason", flat=True).first()
                return f"ended {state} before it ran: {reason or '?'}"
            time.sleep(0.05)
        return f"not running {REGISTER_TIMEOUT:g} s after /scale: {state}"

    def end(self, lc: Lifecycle, ending: str) -> float:
        """Trigger ``ending`` on a running agent; returns when (epoch seconds)."""
        done_file = self.console.control_dir / f"{lc.agent_id}.done"
        triggered = time.time()
        if ending == "job-complete":
            done_file.touch()
            self.post(f"/api/v1/agents/{lc.agent_id}/job-complete", {"jobId": lc.job_id}).raise_for_status()
        elif ending == "release":
            self.post(f"/api/v1/agents/{lc.agent_id}/release", {"reason": RELEASE_REASON}).raise_for_status()
        elif ending == "crash":
            pid = Agent.objects.get(agent_id=lc.agent_id).backend_context["pid"]
            os.killpg(int(pid), signal.SIGKILL)
        elif ending == "docker-kill":
            client = docker_for(self.console.docker_host)
            try:
                client.api.kill(Agent.objects.get(agent_id=lc.agent_id).managed_id)
            finally:
                client.close()
        elif ending == "drain":
            mark_draining(lc.agent_id)
            time.sleep(0.3)  # drained mid-job: the agent still reports its job
            triggered = time.time()
            done_file.touch()  # the job is over: the next heartbeat reports no active job
        return triggered

    def wait_end(self, lc: Lifecycle, triggered: float) -> None:
        """Wait until the agent ended and its reservation is gone; fill in how it ended."""
        timeout = END_TIMEOUT.get(lc.ending, DEFAULT_END_TIMEOUT)
        deadline = time.monotonic() + timeout
        while True:
            agent = Agent.objects.get(agent_id=lc.agent_id)
            reserved = Reservation.objects.filter(agent=agent).exists()
            if agent.state in TERMINAL_STATES and not reserved:
                break
            if time.monotonic() > deadline:
                lc.final_state = agent.state
                lc.problem = f"not ended {timeout:g} s after {lc.ending}: {agent.state}" + (
                    ", reservation held" if reserved else ""
                )
                return
            time.sleep(0.05)
        released = ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED).order_by("id").first()
        if released is not None:
            lc.freed_after = released.created_at.timestamp() - triggered
        lc.final_state = agent.state
        if agent.state == AgentState.FAILED:
            lc.reason = agent.failure_reason
        else:
            destroyed = ScalerEvent.objects.filter(agent=agent, type=EventType.DESTROYED).order_by("id").first()
            lc.reason = (destroyed.payload or {}).get("reason", "") if destroyed else ""
        state, reason = expected_end(lc.ending) if not lc.fault else (AgentState.FAILED, "")
        if lc.final_state != state or not lc.reason.startswith(reason):
            lc.problem = f"ended {lc.final_state} ({lc.reason[:160]!r}), expected {state} ({reason!r}...)"


@dataclass
class Fault:
    """One fault injected into the console: its kind (:data:`FAULTS`), when (seconds into the
    soak), what it hit, and ``problem`` when the console did not come back from it."""

    kind: str
    at: float
    detail: str = ""
    problem: str = ""


class FaultInjector(threading.Thread):
    """Injects :data:`FAULTS` in turn into the console of ``orchestrator``, one every ``every``
    seconds (the first after ``every``), until :meth:`stop`. ``rounds``: how many full turns of
    every kind were injected."""

    def __init__(self, console: Console, every: float, started: float):
        super().__init__(name="soak-faults", daemon=True)
        self.console, self.every, self.started = console, every, started
        self.faults: list[Fault] = []
        self.done = threading.Event()

    @property
    def rounds(self) -> int:
        injected = [f.kind for f in self.faults if f.detail and not f.problem]
        return min(injected.count(kind) for kind in FAULTS)

    def run(self) -> None:
        turn = 0
        try:
            while not self.done.wait(self.every):
                kind = FAULTS[turn % len(FAULTS)]
                fault = Fault(kind, time.monotonic() - self.started)
                try:
                    fault.detail = getattr(self, kind.replace("-", "_"))()
                except Exception as exc:  # noqa: BLE001 - reported as a problem of the soak
                    fault.problem = f"{type(exc).__name__}: {exc}"
                self.faults.append(fault)
                if fault.detail or fault.problem:
                    turn += 1  # a worker-kill that found no spawn in flight is tried again next time
        finally:
            connections.close_all()

    def stop(self) -> list[Fault]:
        self.done.set()
        self.join()
        return self.faults

    def worker_kill(self, timeout: float = 15.0) -> str:
        """SIGKILL the first worker seen running a spawn (and its work-horse), then start a new
        one in its place; "" when no spawn ran within ``timeout`` seconds."""
        launcher = self.console.launcher
        connection_ = django_rq.get_connection("default")  # every queue is on the one Redis
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done.is_set():
            ours = {pid: name for name, pid in launcher.pids().items() if name.startswith("worker-")}
            for worker in Worker.all(connection=connection_, serializer=settings.KICI_JOB_SERIALIZER):
                job = worker.get_current_job() if worker.pid in ours else None
                if job is None or job.func_name != "scalers.jobs.spawn_agent":
                    continue
                agent_id = Agent.objects.filter(pk=job.args[0]).values_list("agent_id", flat=True).first() or "?"
                self.console.spawn_victims.add(agent_id)
                name = ours[worker.pid]
                launcher.kill(name)
                launcher.start(name)
                return f"{name} (pid {worker.pid}) killed while spawning {agent_id}"
            time.sleep(0.02)
        return ""

    def sweeper_restart(self) -> str:
        launcher = self.console.launcher
        launcher.stop("sweeper")
        launcher.start("sweeper")
        return "sweeper stopped and started"

    def console_restart(self, timeout: float = 15.0) -> str:
        """Stop every console process and start them again, once an agent runs (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        running = 0
        while time.monotonic() < deadline and not self.done.is_set():
            running = Agent.objects.filter(scaler=self.console.scaler, state=AgentState.RUNNING).count()
            if running:
                break
            time.sleep(0.1)
        launcher = self.console.launcher
        # A spawn whose backend call is running dies with its worker and is dropped at recovery
        # ("a local spawn does not survive the process that ran it"): like a worker kill's victim.
        self.console.spawn_victims.update(
            Agent.objects.filter(scaler=self.console.scaler, state=AgentState.SPAWNING).values_list(
                "agent_id", flat=True
            )
        )
        t0 = time.monotonic()
        launcher.stop_all()
        launcher.start_all()
        return f"all processes restarted in {time.monotonic() - t0:.1f} s with {running} agents running"


class SlotSampler(threading.Thread):
    """Samples the scaler's occupied slots every ``interval`` seconds, as admission counts them:
    ``max(active agents, reservations)``, read in one statement (one snapshot). ``most``: the
    largest sample."""

    SQL = (
        "SELECT (SELECT count(*) FROM agents_agent WHERE scaler_id = %(s)s AND state = ANY(%(active)s)), "
        "(SELECT count(*) FROM scalers_reservation WHERE scaler_id = %(s)s)"
    )

    def __init__(self, scaler: Scaler, interval: float = 0.05):
        super().__init__(name="soak-slots", daemon=True)
        self.scaler, self.interval = scaler, interval
        self.most = 0
        self.done = threading.Event()

    def run(self) -> None:
        params = {"s": self.scaler.pk, "active": list(ACTIVE_STATES)}
        try:
            with connection.cursor() as cur:
                while not self.done.is_set():
                    cur.execute(self.SQL, params)
                    self.most = max(self.most, *cur.fetchone())
                    self.done.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.most


def find_leaks(console: Console) -> dict[str, list[str]]:
    """What is held without being used once every lifecycle ended:

    * ``reservations without an active agent``: a reservation whose agent ended (or is gone);
    * ``active agents``: agents still in an active state (nothing should be left running);
    * ``valid tokens of ended agents``: a registration token of an ended agent that is neither used
      nor expired (a sandbox could still register with it). Session tokens are not counted: an
      ended agent's session is kept on purpose, so its heartbeat is answered 410 ``stop``
      (``scalers.agent_api``);
    * process backend: ``active agents without a sandbox`` (of the active ones, those whose
      process is gone) and ``orphan processes`` (an ended agent whose process still runs);
    * container backend: ``leftover containers`` (the scaler's kici-managed containers on the
      daemon whose agent is not active) and ``leftover rules`` (addresses in the nft table that
      no active agent holds).
    """
    scaler = console.scaler
    leaks: dict[str, list[str]] = {
        "reservations without an active agent": [],
        "active agents": [],
        "valid tokens of ended agents": [],
    }
    for r in Reservation.objects.filter(scaler=scaler).select_related("agent"):
        if r.agent is None or r.agent.state not in ACTIVE_STATES:
            leaks["reservations without an active agent"].append(r.agent.agent_id if r.agent else f"#{r.pk}")
    valid = AgentToken.objects.filter(
        agent__scaler=scaler,
        agent__state__in=list(TERMINAL_STATES),
        prefix__startswith=REGISTRATION_PREFIX,
        used_at__isnull=True,
        expires_at__gt=timezone.now(),
    )
    leaks["valid tokens of ended agents"] = [f"{t.agent.agent_id} {t.prefix}" for t in valid.select_related("agent")]
    agents = list(Agent.objects.filter(scaler=scaler))
    active = {a.agent_id for a in agents if a.state in ACTIVE_STATES}
    leaks["active agents"] = [f"{a.agent_id} {a.state}" for a in agents if a.state in ACTIVE_STATES]
    if console.backend == "container":
        leaks["leftover containers"] = [
            f"{c['Labels'].get('kici-agent-id', '?')} {c['State']}"
            for c in scaler_containers(console.docker_host, scaler)
            if c["Labels"].get("kici-agent-id") not in active
        ]
        held = {a.ip for a in agents if a.state in ACTIVE_STATES and a.ip}
        leaks["leftover rules"] = [str(ip) for ip in NftClient(console.nft_table).list_agents() if str(ip) not in held]
        return leaks
    leaks["active agents without a sandbox"] = []
    leaks["orphan processes"] = []
    for agent in agents:
        ctx = agent.backend_context or {}
        alive = bool(ctx.get("pid")) and _alive(int(ctx["pid"]), ctx.get("start_time"))
        if agent.state in ACTIVE_STATES and not alive:
            leaks["active agents without a sandbox"].append(agent.agent_id)
        elif agent.state not in ACTIVE_STATES and alive:
            leaks["orphan processes"].append(f"{agent.agent_id} pid {ctx['pid']}")
    return leaks


def settle(scaler: Scaler, timeout: float = 30.0) -> None:
    """Wait until no agent of ``scaler`` is active and it holds no reservation (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).exists()
        if not active and not Reservation.objects.filter(scaler=scaler).exists():
            return
        time.sleep(0.2)


def drive(
    console: Console,
    duration: float,
    concurrency: int,
    *,
    seed: int = 0,
    endings: tuple[str, ...] | None = None,
    jobs: int | None = None,
    fault_every: float | None = None,
) -> Report:
    """Run lifecycles ``concurrency`` at a time (more than the scaler's ``maxAgents`` pushes on
    the cap) for ``duration`` seconds, or, with ``jobs``, until ``jobs`` lifecycles were started
    (``duration`` is then the ceiling); then settle, find leaks and send one more job.
    ``endings`` defaults to :data:`ENDINGS` (process backend) or :data:`CONTAINER_ENDINGS`.
    ``fault_every`` (seconds; container backend) injects :data:`FAULTS` in turn at that pace, and
    new lifecycles keep starting until each kind was injected once."""
    endings = endings or (CONTAINER_ENDINGS if console.backend == "container" else ENDINGS)
    report = Report(max_agents=console.scaler.max_agents)
    report.rows_before = table_rows()
    report.rss_before = console.rss()
    orchestrator = Orchestrator(console, seed, endings)
    started = time.monotonic()
    until = started + duration
    results: list[Lifecycle] = []
    errors: list[str] = []
    injector = FaultInjector(console, fault_every, started) if fault_every else None

    def more() -> bool:
        if time.monotonic() >= until:
            return False
        if injector is not None and injector.rounds < 1:
            return True
        return jobs is None or orchestrator.serial < jobs

    def work() -> None:
        try:
            while more():
                lc = orchestrator.lifecycle(until)
                if lc is not None:
                    with orchestrator.lock:
                        results.append(lc)
        except Exception as exc:  # noqa: BLE001 - reported as a problem of the soak
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    sampler = SlotSampler(console.scaler)
    sampler.start()
    if injector is not None:
        injector.start()
    threads = [threading.Thread(target=work, name=f"soak-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if injector is not None:
        report.faults = injector.stop()
    report.seconds = time.monotonic() - started
    report.lifecycles = results + [Lifecycle("?", "?", problem=e) for e in errors]
    report.refused = orchestrator.refused
    report.max_slots = sampler.stop()
    settle(console.scaler, timeout=90.0 if console.backend == "container" else 30.0)
    report.leaks = find_leaks(console)
    report.rss_after = console.rss()
    report.rows_after = table_rows()
    report.new_job = _new_job(orchestrator)
    return report


def _new_job(orchestrator: Orchestrator) -> str:
    """Send one more job once the soak is over: "201" when admitted (it is then released)."""
    answer = orchestrator.post("/api/v1/scale", {"labels": LABELS, "jobId": "soak-after"})
    if answer.status_code != 201:
        return f"{answer.status_code} {answer.text[:200]}"
    agent_id = answer.json()["agentId"]
    orchestrator.post(f"/api/v1/agents/{agent_id}/release", {"reason": "soak over"}).raise_for_status()
    settle(orchestrator.console.scaler)
    return "201"


def summary(report: Report) -> list[str]:
    """The report as printable lines."""
    done = [lc for lc in report.lifecycles if lc.ending != "?"]
    by_ending = Counter(lc.ending for lc in done)
    by_end = Counter(f"{lc.final_state}" for lc in done)
    registered = [lc.registered_after for lc in done if lc.registered_after is not None]
    completed = [lc.freed_after for lc in done if lc.ending == "job-complete" and lc.freed_after is not None]
    freed = {e: [lc.freed_after for lc in done if lc.ending == e and lc.freed_after is not None] for e in by_ending}

    def ms(values):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        return "n/a" if p50 is None else f"p50 {p50 * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms  (n={len(values)})"

    n = max(1, len(done))
    grown = {t: report.rows_after.get(t, 0) - c for t, c in report.rows_before.items()}
    grown = {t: g for t, g in sorted(grown.items(), key=lambda kv: -kv[1]) if g}
    mib = lambda b: "gone" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
    served = [lc for lc in done if lc.ending == "job-complete" and not lc.problem and not lc.fault]
    mean = sum(registered) / len(registered) if registered else None
    p95 = percentile(registered, 95)
    lines = [
        f"jobs served: {len(served)}; /scale -> running: "
        + ("n/a" if mean is None else f"mean {mean:.2f} s, p95 {p95:.2f} s (n={len(registered)})"),
        f"lifecycles completed: {len(done)} in {report.seconds:.0f} s "
        f"({', '.join(f'{e} {c}' for e, c in sorted(by_ending.items()))})",
        f"ended: {', '.join(f'{s} {c}' for s, c in sorted(by_end.items()))}; /scale refused at capacity "
        f"{report.refused} times; most slots occupied at once {report.max_slots} (maxAgents {report.max_agents})",
        f"{'/scale -> registered:':<30}{ms(registered)}",
        f"{'job-complete -> slot free:':<30}{ms(completed)}",
    ]
    lines += [f"{e + ' -> slot free:':<30}{ms(v)}" for e, v in sorted(freed.items()) if e != "job-complete"]
    lines += [
        f"{kind}: {len(items)}" + (f" ({', '.join(items[:5])})" if items else "")
        for kind, items in report.leaks.items()
    ]
    lines.append(
        "rows grown: " + (", ".join(f"{t} +{g} ({g / n:.1f}/lifecycle)" for t, g in list(grown.items())[:8]) or "none")
    )
    for name in report.rss_before:
        lines.append(f"RSS {name}: {mib(report.rss_before[name])} -> {mib(report.rss_after.get(name))}")
    if report.faults:
        injected = Counter(f.kind for f in report.faults if f.detail)
        victims = sum(1 for lc in done if lc.fault)
        lines.append(
            f"faults injected: {', '.join(f'{k} {injected[k]}' for k in FAULTS)}; "
            f"spawns killed before their agent ran: {victims}"
        )
        lines += [f"  {f.at:6.1f} s {f.kind}: {f.detail or f.problem or 'no spawn in flight'}" for f in report.faults]
    lines.append(f"new job after the soak: {report.new_job}")
    problems = report.problems()
    lines.append(f"problems: {len(problems)}")
    lines += [f"  {p}" for p in problems[:30]]
    return lines
