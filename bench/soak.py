"""A day-long soak in miniature: many agent lifecycles through a real console; capacity must not leak.

    .venv/bin/python bench/soak.py [--backend process|container] [--duration 600] [--jobs 300]
                                   [--concurrency 6] [--max-agents 4] [--workers 2] [--fault-every 20]
                                   [--seed 1] [--database-url postgres://127.0.0.1:5432/kici_bench_soak]
                                   [--redis-url redis://127.0.0.1:6379/12] [--keep]

Creates (drops first) the scratch database of ``--database-url`` on that server and migrates it,
then runs a real console on loopback (daphne, ``--workers`` rq workers with the scheduler on this
run's own host queue in the ``--redis-url`` database, the scaler sweeper) with one bare-metal
process scaler of ``--max-agents`` agents (``tests/support/soak.py``). ``--concurrency``
orchestrator threads then run lifecycles for ``--duration`` seconds: ``/scale``, the agent
(``bench/agents/soak_agent.py``) registers and heartbeats, and the lifecycle ends in a random mix
of job-complete, release, agent crash (SIGKILL), orchestrator lost (released at once) and drain.

``--backend container`` (root): a day in the life with real container agents instead. The
console's scaler is a container scaler on the private test dockerd (``tests/support/docker.py``,
started when not running; the agent image ``kici-agent:local`` is built when missing) with
network isolation on in its own nft table ``kicisoakbench``; ``--jobs`` (default 300) lifecycles
scale, wait for ``running`` over the API, hold the job and post job-complete (one in four has its
container killed with ``docker kill`` instead), while every ``--fault-every`` seconds (default
20) a fault is injected in turn: SIGKILL of a worker in the middle of a spawn, a sweeper restart,
a console restart with agents running. ``--duration`` is then a ceiling (default 3600).

Prints: jobs served and mean/p95 of /scale -> running, the faults injected, lifecycles completed
by ending and final state, p50/p99 of /scale -> registered and of job-complete (and each other
ending) -> slot free, leaked slots (reservations without an active agent, active agents, valid
tokens of ended agents; processes: active agents without a sandbox, processes of ended agents;
containers: leftover containers and nft rules), row growth per table, the RSS of the web, worker
and sweeper processes at start and end, and whether a new job is admitted at the end. Exits 1 on
any leak or wrong ending. Loopback and the agent bridge only. ``--keep`` keeps the database and
the logs (under /tmp/kici-soak-*).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _psql(url: str, sql: str) -> None:
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True, capture_output=True)


def prepare_database(url: str) -> None:
    """Drop and create the database of ``url``, then migrate it."""
    base, name = url.rsplit("/", 1)
    _psql(base + "/postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _psql(base + "/postgres", f"CREATE DATABASE {name}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=os.environ, check=True)


def prepare_docker() -> str:
    """Start (or reuse) the private test dockerd and build the agent image on it; its DOCKER_HOST."""
    from tests.support.docker import ensure_private_dockerd

    docker_host = ensure_private_dockerd()
    subprocess.run(
        ["sh", str(ROOT / "sandbox_agent" / "build_image.sh"), "kici-agent:local"],
        env={**os.environ, "DOCKER_HOST": docker_host},
        check=True,
        capture_output=True,
    )
    return docker_host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("process", "container"), default="process")
    parser.add_argument(
        "--duration", type=float, help="seconds of lifecycles (default 600; container: a ceiling, 3600)"
    )
    parser.add_argument("--jobs", type=int, help="lifecycles to run (container backend; default 300)")
    parser.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults (container)")
    parser.add_argument("--concurrency", type=int, default=6, help="lifecycles in flight (default 6)")
    parser.add_argument("--max-agents", type=int, default=4, help="the scaler's maxAgents (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="rq workers (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default="postgres://127.0.0.1:5432/kici_bench_soak")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    args = parser.parse_args()
    container = args.backend == "container"
    if args.duration is None:
        args.duration = 3600.0 if container else 600.0
    if args.jobs is None and container:
        args.jobs = 300
    if args.jobs is not None and not container:
        parser.error("--jobs needs --backend container")
    for name in ("duration", "concurrency", "max_agents", "workers", "fault_every", *(("jobs",) if container else ())):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not args.database_url.startswith("postgres://127.0.0.1:"):
        parser.error(f"--database-url must be a loopback postgres:// URL, got {args.database_url!r}")
    if not args.redis_url.startswith("redis://127.0.0.1:"):
        parser.error(f"--redis-url must be a loopback redis:// URL, got {args.redis_url!r}")

    os.environ.update(
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        DJANGO_SETTINGS_MODULE="kici_site.settings",
        LOG_LEVEL="ERROR",
    )
    os.environ.setdefault("SECRET_KEY", "soak-only-not-secret")
    prepare_database(args.database_url)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from tests.support.soak import drive, run_console, summary

    docker_host = prepare_docker() if container else ""
    workdir = Path(tempfile.mkdtemp(prefix="kici-soak-"))
    try:
        with run_console(
            workdir,
            backend=args.backend,
            max_agents=args.max_agents,
            workers=args.workers,
            docker_host=docker_host,
            nft_table="kicisoakbench",
        ) as console:
            report = drive(
                console,
                args.duration,
                args.concurrency,
                seed=args.seed,
                jobs=args.jobs,
                fault_every=args.fault_every if container else None,
            )
        print("\n".join(summary(report)))
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept: database {args.database_url}, logs {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            base, name = args.database_url.rsplit("/", 1)
            _psql(base + "/postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
