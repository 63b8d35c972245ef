"""What the pages that list agents cost at fleet size: server time, bytes and queries.

    .venv/bin/python bench/pages.py [--agents 10000] [--database-url postgres://127.0.0.1:5432/kici_bench_pages]
                                    [--keep]

Creates the scratch database (dropped at the end unless --keep), migrates it, creates four scalers
and, with ``bulk_create``, first a tenth of ``--agents`` agents, then the rest (about two thirds of
them active, spread over the scalers, with labels, addresses, jobs and heartbeats), and renders
through the Django test client, as a signed-in operator, the dashboard (``/``), the agent list
(``/agents/``: its default view, sorted newest heartbeat first, and page 100 of every agent oldest
heartbeat first) and the page of a scaler (``/scalers/<name>/``).

For each page it prints the median server time of 5 renders (ms, after one warm-up), the body size
(KiB) and the number of SQL queries at both fleet sizes, then the targets met or MISSED: < 50 ms,
< 150 KiB, and the same query count at both sizes (queries independent of the fleet). Exits 1 when
a target is missed. Touches only the scratch database; no docker, nft or network.
"""

# ruff: noqa: E402
from __future__ import annotations

import sys

# Run as a script, this folder would come first on the path and its http.py would shadow the
# standard library's http package (Django imports http.cookies): the folder goes last instead.
BENCH = sys.path.pop(0)
sys.path.append(BENCH)

import argparse
import logging
import statistics
import time
from pathlib import Path

from scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent

TIME_TARGET_MS = 50
SIZE_TARGET_KIB = 150
RENDERS = 5
SCALERS = 4


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--database-url", default="postgres://127.0.0.1:5432/kici_bench_pages")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.agents < 10:
        parser.error(f"--agents must be at least 10, got {args.agents}")

    sys.path.insert(0, str(ROOT))
    with scratch_database(args.database_url, keep=args.keep):
        return run(args.agents)


#: State of agent ``i`` (cycled): about two thirds active, most of them running.
STATE_CYCLE = (
    ["running"] * 9 + ["spawning", "connecting", "draining", "destroying"] + ["destroyed"] * 5 + ["failed"] * 2
)


def make_agents(scalers: list, start: int, stop: int) -> None:
    """Agents ``start``..``stop - 1``, round-robin over ``scalers``, written with ``bulk_create``."""
    from datetime import timedelta

    from django.db import connection
    from django.db.models import Max
    from django.utils import timezone

    from agents.models import Agent

    now = timezone.now()
    before = Agent.objects.aggregate(last=Max("id"))["last"] or 0
    batch = []
    for i in range(start, stop):
        scaler = scalers[i % len(scalers)]
        state = STATE_CYCLE[i % len(STATE_CYCLE)]
        batch.append(
            Agent(
                agent_id=f"{scaler.name}-{i:08x}",
                scaler=scaler,
                label_set=scaler.bench_label_set,
                state=state,
                labels=["linux", "container", f"pool-{i % 7}", f"kici:scaler={scaler.name}"],
                managed_id=f"{i:064x}",
                ip=f"172.30.{(i // 250) % 250}.{i % 250 + 2}",
                bound_job_id=f"job-{i}" if i % 3 else "",
                active_jobs=1 if state == "running" and i % 2 else 0,
                last_heartbeat=now - timedelta(seconds=i % 60) if state in ("running", "draining") else None,
                finished_at=now if state in ("destroyed", "failed") else None,
                failure_reason="spawn failed: image missing" if state == "failed" else "",
            )
        )
    Agent.objects.bulk_create(batch, batch_size=2000)
    with connection.cursor() as cur:  # spread ages: created_at is auto_now_add
        cur.execute("UPDATE agents_agent SET created_at = now() - (id * interval '7 seconds') WHERE id > %s", [before])


def measure(client, url: str) -> tuple[float, int, int]:
    """``(median ms of RENDERS renders, body bytes, queries of one render)`` of ``url``."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}")
    times = []
    for _ in range(RENDERS):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append(1000 * (time.perf_counter() - t0))
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    return statistics.median(times), len(response.content), len(queries)


def run(n: int) -> int:
    import django

    django.setup()
    logging.getLogger("axes").setLevel(logging.WARNING)  # one login line per run is noise here
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    call_command("migrate", verbosity=0)

    from agents.models import Agent, ScalerEvent
    from scalers.labels import normalize_label_set
    from scalers.models import ConfigState, LabelSet, Scaler

    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 2 * n})
    scalers = []
    for k in range(SCALERS):
        scaler = Scaler.objects.create(name=f"bench-{k}", type="container", max_agents=n)
        scaler.bench_label_set = LabelSet.objects.create(
            scaler=scaler,
            index=0,
            labels=["container", "linux"],
            normalized=normalize_label_set(["container", "linux"]),
            config={"labels": ["container", "linux"], "image": "kici-agent:local"},
        )
        scalers.append(scaler)
    ScalerEvent.objects.bulk_create(
        ScalerEvent(agent_ref=f"bench-{i % SCALERS}-{i:08x}", scaler_name=f"bench-{i % SCALERS}", type="scaler.ready")
        for i in range(200)
    )
    user = User.objects.create_user("bench-operator")
    user.groups.add(Group.objects.get(name="operators"))
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    pages = {
        "dashboard": "/",
        "agent list": "/agents/",
        "by heartbeat": "/agents/?sort=-last_heartbeat",
        "deep page": "/agents/?state=all&sort=last_heartbeat&page=100",
        "scaler page": f"/scalers/{scalers[0].name}/",
    }

    small = n // 10
    make_agents(scalers, 0, small)
    small_queries = {label: measure(client, url)[2] for label, url in pages.items()}
    make_agents(scalers, small, n)
    with connection.cursor() as cur:  # the planner's statistics, as autovacuum keeps them
        cur.execute("ANALYZE agents_agent")
    active = Agent.objects.active().count()
    print(f"agents: {n} ({active} active) over {SCALERS} scalers; queries also counted at {small} agents")

    missed = 0
    for label, url in pages.items():
        ms, size, queries = measure(client, url)
        kib = size / 1024
        misses = []
        if ms >= TIME_TARGET_MS:
            misses.append(f"time >= {TIME_TARGET_MS} ms")
        if kib >= SIZE_TARGET_KIB:
            misses.append(f"size >= {SIZE_TARGET_KIB} KiB")
        if queries != small_queries[label]:
            misses.append("queries grow with the fleet")
        missed += bool(misses)
        verdict = "MISSED: " + ", ".join(misses) if misses else "met"
        print(
            f"{label:12} {url:48} {ms:6.1f} ms {kib:7.1f} KiB "
            f"{queries:3d} queries ({small_queries[label]} at {small} agents)  {verdict}"
        )
    print(f"targets: < {TIME_TARGET_MS} ms, < {SIZE_TARGET_KIB} KiB, queries independent of N: ", end="")
    print("all met" if not missed else f"MISSED on {missed} page(s)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
