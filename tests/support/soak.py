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

import requests
from django.db import connection, connections

from agents.choices import ACTIVE_STATES, TERMINAL_STATES, AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.backends.baremetal import _alive
from scalers.lifecycle import mark_draining
from scalers.models import Reservation, Scaler
from tests.support.scalers import make_scaler, set_global
from tests.support.servers import REPO, free_port

#: How a lifecycle ends, as the orchestrator (or the agent) makes it end:
#: ``job-complete`` (the job finished: POST job-complete), ``release`` (the orchestrator gave the
#: running agent up), ``crash`` (the agent process is killed with SIGKILL; the lost-agent sweep
#: ends it), ``lost`` (the orchestrator lost the job at once and releases the agent before or while
#: it registers) and ``drain`` (an operator drains it mid-job; the sweeper ends it once idle).
ENDINGS = ("job-complete", "release", "crash", "lost", "drain")

AGENT = REPO / "bench" / "agents" / "soak_agent.py"
LABELS = ["linux", "soak"]
RELEASE_REASON = "soak: job cancelled"
LOST_REASON = "soak: orchestrator lost the job"

#: Seconds a lifecycle may take to end after its ending was triggered (a crash waits for the
#: lost-agent sweep, every 5 s, and its operation's job).
END_TIMEOUT = {"crash": 60.0}
DEFAULT_END_TIMEOUT = 30.0
REGISTER_TIMEOUT = 30.0


def database_url(db: dict) -> str:
    """``postgres://`` URL of a Django database settings dict (loopback by default)."""
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes (``VmRSS``), None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Console:
    """A running soak console: its base URL, API token, scaler, control directory and processes."""

    url: str
    api_token: str
    scaler: Scaler
    control_dir: Path
    processes: dict[str, int] = field(default_factory=dict)  # name -> pid ("web", "worker-1", "sweeper")

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


@contextmanager
def run_console(
    workdir: Path, *, max_agents: int = 4, workers: int = 2, heartbeat_seconds: float = 1.0
) -> Iterator[Console]:
    """A real console on a free loopback port over Django's default database (already migrated),
    with one bare-metal process scaler ``soak-<hex>`` (``maxAgents`` = ``max_agents``) whose agents
    are :data:`AGENT`. Logs go to ``workdir``; the processes are stopped (SIGTERM, then SIGKILL)
    and any agent process left is killed when the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    control = workdir / "control"
    control.mkdir(exist_ok=True)
    wrapper = workdir / "soak-agent"
    wrapper.write_text(
        f"#!/bin/sh\nSOAK_CONTROL_DIR={control} SOAK_HEARTBEAT_SECONDS={heartbeat_seconds} "
        f"exec {sys.executable} {AGENT}\n"
    )
    wrapper.chmod(0o755)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_hex(16)
    host = f"soak-{secrets.token_hex(3)}"
    set_global(max_agents=max_agents * 10)
    scaler = make_scaler(
        f"soak-{secrets.token_hex(3)}",
        type="bare-metal",
        labels=LABELS,
        ls_config={"binaryPath": str(wrapper)},
        max_agents=max_agents,
        orchestrator_url=url,
    )
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "soak-only-not-secret",
        "DATABASE_URL": database_url(db),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "KICI_HOST_NAME": host,
        "KICI_API_TOKEN": token,
        "KICI_AGENT_LOG_DIR": str(workdir / "agents"),
        "KICI_NFT_TABLE": "kicisoak",
        "KICI_SWEEP_LOST_AGENTS_SECONDS": "5",
        "KICI_SWEEP_ORPHAN_CONTAINERS_SECONDS": "0",
        "KICI_SWEEP_ORPHAN_VMS_SECONDS": "0",
        "KICI_SWEEP_STALE_ISOLATION_RULES_SECONDS": "0",
        "LOG_LEVEL": "WARNING",
    }
    manage = [sys.executable, "manage.py"]
    procs: dict[str, subprocess.Popen] = {}
    with ExitStack() as stack:
        stack.callback(_kill_agent_processes, scaler)
        endpoint = f"tcp:port={port}:interface=127.0.0.1"
        web_env = {**env, "ALLOWED_HOSTS": "127.0.0.1", "KICI_OPERATOR_LISTEN": f"127.0.0.1:{port}"}
        procs["web"] = _start(
            [sys.executable, "-m", "daphne", "-e", endpoint, "kici_site.asgi:application"], web_env, workdir / "web.log"
        )
        stack.callback(_stop, procs["web"])
        queue = f"host:{host}"
        for i in range(1, workers + 1):
            argv = [
                *manage,
                "rqworker",
                queue,  # only the run's own queue: no job of another run or test reaches it
                "--with-scheduler",
                "--worker-class",
                "kici_site.worker.KiciWorker",
            ]
            procs[f"worker-{i}"] = _start(argv, env, workdir / f"worker-{i}.log")
            stack.callback(_stop, procs[f"worker-{i}"])
        procs["sweeper"] = _start(
            [*manage, "scaler_sweeper", "--interval", "1", "--no-warm-pools"], env, workdir / "sweeper.log"
        )
        stack.callback(_stop, procs["sweeper"])
        _wait_healthy(url, procs["web"], workdir / "web.log")
        yield Console(url, token, scaler, control, {name: proc.pid for name, proc in procs.items()})


def _wait_healthy(url: str, web: subprocess.Popen, log_path: Path, timeout: float = 30.0) -> None:
    """Wait until ``url``/healthz answers; RuntimeError with the log's tail when it does not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            requests.get(url + "/healthz", timeout=1)
            return
        except requests.ConnectionError:
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

    def problems(self) -> list[str]:
        out = [f"{lc.agent_id or lc.job_id} ({lc.ending}): {lc.problem}" for lc in self.lifecycles if lc.problem]
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
    }[ending]


def table_rows() -> dict[str, int]:
    """Exact row count of every table of the database (``public`` schema)."""
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
        tables = [row[0] for row in cur.fetchall()]
        counts = {}
        for table in tables:
            cur.execute(f'SELECT count(*) FROM "{table}"')  # noqa: S608 - names from pg_tables
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

    def post(self, path: str, body: dict) -> requests.Response:
        return self._session().post(self.console.url + path, json=body, timeout=30)

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
        """POST /scale until admitted: ``(agent id, time sent)``, or the reason it was not."""
        while True:
            sent = time.time()
            answer = self.post("/api/v1/scale", {"labels": LABELS, "jobId": job_id})
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
            answer = self._session().get(f"{self.console.url}/api/v1/agents/{agent_id}", timeout=30).json()
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
        state, reason = expected_end(lc.ending)
        if lc.final_state != state or not lc.reason.startswith(reason):
            lc.problem = f"ended {lc.final_state} ({lc.reason[:160]!r}), expected {state} ({reason!r}...)"


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


def find_leaks(scaler: Scaler) -> dict[str, list[str]]:
    """What is held without being used once every lifecycle ended:

    * ``reservations without an active agent``: a reservation whose agent ended (or is gone);
    * ``active agents``: agents still in an active state (nothing should be left running);
    * ``active agents without a sandbox``: of those, the ones whose process is gone;
    * ``orphan processes``: an ended agent whose process still runs.
    """
    leaks: dict[str, list[str]] = {
        "reservations without an active agent": [],
        "active agents": [],
        "active agents without a sandbox": [],
        "orphan processes": [],
    }
    for r in Reservation.objects.filter(scaler=scaler).select_related("agent"):
        if r.agent is None or r.agent.state not in ACTIVE_STATES:
            leaks["reservations without an active agent"].append(r.agent.agent_id if r.agent else f"#{r.pk}")
    for agent in Agent.objects.filter(scaler=scaler):
        ctx = agent.backend_context or {}
        alive = bool(ctx.get("pid")) and _alive(int(ctx["pid"]), ctx.get("start_time"))
        if agent.state in ACTIVE_STATES:
            leaks["active agents"].append(f"{agent.agent_id} {agent.state}")
            if not alive:
                leaks["active agents without a sandbox"].append(agent.agent_id)
        elif alive:
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
    console: Console, duration: float, concurrency: int, *, seed: int = 0, endings: tuple[str, ...] = ENDINGS
) -> Report:
    """Run lifecycles for ``duration`` seconds, ``concurrency`` at a time (more than the scaler's
    ``maxAgents`` pushes on the cap), then settle, find leaks and send one more job."""
    report = Report(max_agents=console.scaler.max_agents)
    report.rows_before = table_rows()
    report.rss_before = console.rss()
    orchestrator = Orchestrator(console, seed, endings)
    started = time.monotonic()
    until = started + duration
    results: list[Lifecycle] = []
    errors: list[str] = []

    def work() -> None:
        try:
            while time.monotonic() < until:
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
    threads = [threading.Thread(target=work, name=f"soak-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.seconds = time.monotonic() - started
    report.lifecycles = results + [Lifecycle("?", "?", problem=e) for e in errors]
    report.refused = orchestrator.refused
    report.max_slots = sampler.stop()
    settle(console.scaler)
    report.leaks = find_leaks(console.scaler)
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
    lines = [
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
    lines.append(f"new job after the soak: {report.new_job}")
    problems = report.problems()
    lines.append(f"problems: {len(problems)}")
    lines += [f"  {p}" for p in problems[:30]]
    return lines
