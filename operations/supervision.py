"""The console's processes under supervisord (``make run``): ``KICI_SERVERS`` daphne processes on
the operator listeners, as many gateway processes on the agents' gateway and as many API processes
on the orchestrator's API listeners (``KICI_API_LISTEN``), ``KICI_WORKERS`` rq
workers and the scaler sweeper, each restarted when it exits, and an event listener that records
each unexpected exit (docs/recovery.md "Supervised processes", docs/serving.md).

:func:`supervisord_config` writes the configuration ``scripts/run.sh`` starts supervisord with
(``manage.py supervisor_config``); :func:`record_process_state` is what the listener
(``manage.py process_events``) does with one supervisord process-state event.
"""

from __future__ import annotations

import configparser
import io
import os
import sys
from pathlib import Path

from django.conf import settings
from django.db import transaction

from agents.choices import EventType
from agents.events import record_event
from scalers.metrics import SharedSeries, count

#: The supervised programs (supervisord group names), in start order; the stop runs the other way.
PROGRAMS = ("daphne", "gateway", "api", "worker", "sweeper")
PROCESS_RESTARTS = "kici_scaler_process_restarts_total"
#: On /metrics (registered by ``operations.apps``), at 0 for every program until its first exit.
PROCESS_RESTARTS_SERIES = SharedSeries(
    PROCESS_RESTARTS,
    "Unexpected exits of the console's processes under make run (each restarted or retried), by program.",
    ("program",),
    zeros=lambda known: ({"program": p} for p in PROGRAMS),
)
#: Seconds a process must stay up to count as started; one that exits sooner is retried after a
#: back-off of 1, 2, 3, ... seconds, and given up (FATAL) after STARTRETRIES such tries.
STARTSECS = 5
STARTRETRIES = 5
#: Seconds past the rq job timeout a worker (or the sweeper) is given to finish after SIGTERM
#: before it is killed: a job in progress finishes, as under the unsupervised make run.
STOP_MARGIN_SECONDS = 30
#: The process-state events the listener is sent: an exit of a RUNNING process (restarted at
#: once), one during its start (retried after the back-off) and the give-up.
LISTENED_EVENTS = ("PROCESS_STATE_EXITED", "PROCESS_STATE_BACKOFF", "PROCESS_STATE_FATAL")


#: Share of PostgreSQL's ``max_connections`` the server processes' pools may hold together; the
#: rest is for the workers, the sweeper, the commands, psql and other clients.
POOL_SHARE = 0.5
#: Bounds of one server process's pool: two covers a request and the admission decider; more than
#: eight would only queue more work on one process's single request thread.
POOL_MIN, POOL_MAX = 2, 8


def db_pool_size(max_connections: int, server_processes: int, others: int) -> int:
    """Connections each pooled server process may keep (``KICI_DB_POOL_SIZE``) so that all of
    them, ``others`` processes holding about two each (an rq worker and its work-horse) and the
    sweeper and event listener stay within
    :data:`POOL_SHARE` of PostgreSQL's ``max_connections``: at least :data:`POOL_MIN`, at most
    :data:`POOL_MAX`. ValueError naming ``max_connections`` when even the minimum does not fit."""
    budget = int(max_connections * POOL_SHARE) - 2 * others - 2
    size = min(POOL_MAX, budget // max(server_processes, 1))
    if size < POOL_MIN:
        raise ValueError(
            f"max_connections={max_connections}: too few for {server_processes} pooled server processes and "
            f"{others} others; raise it in postgresql.conf or lower KICI_SERVERS / KICI_WORKERS"
        )
    return size


def supervisord_config(
    *,
    root: Path,
    run_dir: Path,
    log_dir: Path,
    workers: int,
    servers: int,
    gateway: tuple[str, int] | None,
    pool_size: int,
    api: list[tuple[str, int]] | None = None,
) -> str:
    """The text of supervisord's configuration: the programs of :data:`PROGRAMS` run from ``root`` with
    this environment; ``servers`` daphne processes sharing the operator listeners and, with
    ``gateway`` (host, port), as many gateway processes, and with ``api`` ((host, port) each) as many
    API processes, each with a pool of ``pool_size`` database
    connections; logs in ``log_dir``, pid file and control socket (0700) in ``run_dir``
    (docs/recovery.md, "Supervised processes"). ValueError naming ``workers`` or ``servers`` when
    it is not a positive whole number.
    """
    for name, value in (("workers", workers), ("servers", servers), ("pool_size", pool_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not a positive whole number")
    python = sys.executable
    manage = f"{python} {root / 'manage.py'}"
    stopwait = max(int(q.get("DEFAULT_TIMEOUT", 180)) for q in settings.RQ_QUEUES.values()) + STOP_MARGIN_SECONDS
    sock = run_dir / "supervisor.sock"
    pooled = f'KICI_DB_POOL_SIZE="{pool_size}"'

    config = configparser.RawConfigParser()
    config["supervisord"] = {
        "nodaemon": "true",
        "logfile": str(log_dir / "supervisord.log"),
        "pidfile": str(run_dir / "supervisord.pid"),
        "childlogdir": str(log_dir),
        "directory": str(root),
    }
    if os.geteuid() == 0:
        config["supervisord"]["user"] = "root"  # stays root (the workers run nft, ip, docker)
    config["unix_http_server"] = {"file": str(sock), "chmod": "0700"}
    config["supervisorctl"] = {"serverurl": f"unix://{sock}"}
    config["rpcinterface:supervisor"] = {
        "supervisor.rpcinterface_factory": "supervisor.rpcinterface:make_main_rpcinterface"
    }
    common = {
        "directory": str(root),
        "autostart": "true",
        "autorestart": "true",
        "startsecs": str(STARTSECS),
        "startretries": str(STARTRETRIES),
        "stopsignal": "TERM",
        "redirect_stderr": "true",
        "stdout_logfile_maxbytes": "50MB",
        "stdout_logfile_backups": "5",
    }
    config["eventlistener:process_events"] = {
        "command": f"{manage} process_events",
        "events": ",".join(LISTENED_EVENTS),
        "directory": str(root),
        "autorestart": "true",
        "priority": "1",  # started first, stopped last: it sees every other program's exits
        "stderr_logfile": str(log_dir / "process_events.log"),
        "stdout_logfile": "NONE",  # its stdout is supervisord's event protocol
    }
    config["program:daphne"] = {
        **common,
        # Pages, WebSockets and the orchestrator's API; the first also serves IPv6 listeners.
        "command": f"{python} -m kici_site.operator_server --access-log {log_dir / 'access.log'}"
        " --process-num %(process_num)d",
        "process_name": "daphne-%(process_num)d",
        "numprocs": str(servers),
        "numprocs_start": "1",
        "environment": pooled,
        "priority": "10",
        "stopwaitsecs": "30",
        "stdout_logfile": str(log_dir / "daphne-%(process_num)d.log"),
    }
    # The machine-facing listeners (kici_site.gateway): the agent API alone, on the address agents
    # dial, and the orchestrator's API alone, on its own addresses.
    for program, addresses, flag in (("gateway", [gateway] if gateway else [], ""), ("api", api or [], " --api")):
        if not addresses:
            continue
        listen = " ".join(f"--listen {_address(host, port)}" for host, port in addresses)
        config[f"program:{program}"] = {
            **common,
            "command": f"{python} -m kici_site.gateway{flag} {listen}",
            "process_name": f"{program}-%(process_num)d",
            "numprocs": str(servers),
            "numprocs_start": "1",
            "environment": pooled,
            "priority": "10",
            "stopwaitsecs": "30",
            "stdout_logfile": str(log_dir / f"{program}-%(process_num)d.log"),
        }
    config["program:worker"] = {
        **common,
        # Spawns, teardowns and approved operations run in parallel, one per worker; the scheduler
        # (--with-scheduler) runs the registration watch.
        "command": f"{manage} rqworker default {settings.KICI_HOST_QUEUE} --with-scheduler "
        "--worker-class kici_site.worker.KiciWorker",
        "process_name": "worker-%(process_num)d",
        "numprocs": str(workers),
        "numprocs_start": "1",
        "priority": "20",
        "stopwaitsecs": str(stopwait),
        "killasgroup": "true",  # a SIGKILL after stopwaitsecs reaches the job's work-horse too
        "stdout_logfile": str(log_dir / "worker-%(process_num)d.log"),
    }
    config["program:sweeper"] = {
        **common,
        "command": f"{manage} scaler_sweeper",
        "priority": "30",
        "stopwaitsecs": str(stopwait),
        "stdout_logfile": str(log_dir / "sweeper.log"),
    }
    out = io.StringIO()
    config.write(out)
    return out.getvalue()


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def record_process_state(event: str, payload: dict[str, str]) -> None:
    """Record one supervisord process-state event (``event``: its ``eventname``; ``payload``: the
    event body's fields, ``processname``, ``groupname``, ``pid``, ``expected``, ...) as a console
    event and, for an exit, one more in ``kici_scaler_process_restarts_total{program}``. ValueError
    naming the event for one the listener is not subscribed to."""
    if event not in LISTENED_EVENTS:
        raise ValueError(f"eventname={event!r} is not one of {', '.join(LISTENED_EVENTS)}")
    name, program = payload.get("processname", "?"), payload.get("groupname", "?")
    details = {"program": program, "process": name, "from_state": payload.get("from_state", "")}
    with transaction.atomic():
        if event == "PROCESS_STATE_FATAL":
            record_event(
                None,
                EventType.PROCESS_GAVE_UP,
                f"{name} exited {STARTRETRIES + 1} times within {STARTSECS} s of its start: given up, "
                f"the other processes still run (var/log/; `supervisorctl -c var/run/supervisord.conf start {name}`)",
                details,
            )
            return
        if event == "PROCESS_STATE_EXITED":
            details |= {"pid": payload.get("pid", ""), "expected": payload.get("expected", "")}
            detail = f"{name} (pid {details['pid']}) exited; restarted (var/log/)"
        else:
            detail = f"{name} exited while starting; retried after a back-off (var/log/)"
        record_event(None, EventType.PROCESS_RESTARTED, detail, details)
        count(PROCESS_RESTARTS, {"program": program})
