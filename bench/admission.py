"""Admission throughput and latency beside pgbench, on the same database in the same run.

    .venv/bin/python bench/admission.py [--seconds 8] [--concurrency 1,20,200] [--processes 2]
                                        [--requesters async|threads] [--database-url postgres://...]

By default it starts a private PostgreSQL 15 (``initdb`` under /tmp, port 55432, fsync on,
``max_connections=400`` so pgbench can open 200 clients; the shared server allows 100), creates a
scratch database, migrates it, initialises pgbench's tables in it (``pgbench -i -s 10``), and for
each concurrency runs, back to back:

* ``pgbench -N -M prepared -j 2 -c C -T seconds`` (the single-row "simple update" script), and
* C requesters going through the group-commit queue (the spawn enqueue is stubbed: this
  measures decisions). By default they are coroutines on one event loop taking the ``/scale``
  view's path (``validate_scale_request``, ``scalers.admission.service.decide_async``), as the
  console's web process serves them; ``--requesters threads`` makes them threads calling
  ``tests.support.admission.request_scale`` (the tests' synchronous path). In
  rounds: every requester sends K
  requests; after each round the ledger is checked against every cap (global, per scaler,
  machine pool; counts, cpus, memory) and cleared (not timed). Each round sets new caps, so one
  untimed request first lets the decider rebuild its routing view (once per config change).

Then the same at the largest concurrency split over ``--processes`` processes (each with its own
decider queue and connection, contending for the admission lock as separate consoles do).

Prints decisions/s, p50/p99 latency (ms), the admitted share, over-admissions (must be 0) and
pgbench's tps and its own p99 latency (ms), and the ratio. Exits 1 on any over-admission. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 55432
DB = "kici_bench_adm"
GiB = 1024**3


# --------------------------------------------------------------------------- private PostgreSQL


class PrivatePostgres:
    """A throwaway PostgreSQL cluster owned by the ``postgres`` user, on a loopback port."""

    def __init__(self, port: int = PORT):
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="adm-bench-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"

    def _as_postgres(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=check, capture_output=True, text=True)

    def start(self) -> str:
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        opts = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=128MB "
            f"-c unix_socket_directories={self.dir} -c fsync=on -c synchronous_commit=on"
        )
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"
        )
        return f"postgres://postgres@127.0.0.1:{self.port}/{DB}"

    def stop(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def _psql(url_no_db: str, sql: str) -> None:
    subprocess.run(["psql", url_no_db, "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True, capture_output=True)


def prepare_database(url: str) -> None:
    base = url.rsplit("/", 1)[0] + "/postgres"
    _psql(base, f"DROP DATABASE IF EXISTS {DB}")
    _psql(base, f"CREATE DATABASE {DB}")
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-not-secret")}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(["pgbench", "-i", "-q", "-s", "10", url], check=True, capture_output=True)


def drop_database(url: str) -> None:
    base = url.rsplit("/", 1)[0] + "/postgres"
    _psql(base, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def pgbench(url: str, clients: int, seconds: int) -> tuple[float, float]:
    """pgbench's tps and its own p99 transaction latency (ms, from its per-transaction log)."""
    with tempfile.TemporaryDirectory(prefix="adm-bench-log-") as logs:
        out = subprocess.run(
            ["pgbench", "-N", "-M", "prepared", "-j", "2", "-c", str(clients), "-T", str(seconds), "-l"]
            + ["--log-prefix", f"{logs}/tx", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        # A log line: client, transaction number, latency (µs), script, epoch seconds, µs.
        lat = sorted(int(line.split()[2]) for f in Path(logs).iterdir() for line in f.read_text().splitlines())
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000 if lat else 0.0
    for line in out.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2]), p99
    raise RuntimeError(f"no tps in pgbench output:\n{out}")


# --------------------------------------------------------------------------- admission side


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import kici_site.asgi  # noqa: F401 - set the process up as the console's web process is
    import scalers.jobs as jobs

    jobs.enqueue_spawn = lambda agent, host="": None  # decisions only: no rq


SCALERS = ("s0", "s1", "s2", "s3")


def configure_round(rng: random.Random) -> None:
    """Caps for one round: ~25-45 % of a round's requests fit."""
    from django.db import connection

    from scalers.models import ConfigState, LabelSet, MachinePool, Scaler

    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM scalers_reservation; DELETE FROM agents_agent; DELETE FROM scalers_scalerequest; "
            "DELETE FROM scalers_labelset; DELETE FROM scalers_scaler; DELETE FROM scalers_machinepool"
        )
    cfg = ConfigState.load()
    cfg.global_max_agents = rng.randint(500, 900)
    cfg.global_max_cpu = rng.choice([None, float(rng.randint(400, 900))])
    cfg.global_max_memory_bytes = rng.choice([None, rng.randint(600, 1200) * GiB])
    cfg.defaults = {}
    cfg.save()
    pool = MachinePool.objects.create(
        name="box", max_cpu=float(rng.randint(150, 400)), max_memory_bytes=rng.randint(200, 600) * GiB
    )
    for i, name in enumerate(SCALERS):
        s = Scaler.objects.create(
            name=name,
            type="container",
            max_agents=rng.randint(100, 350),
            max_concurrent_spawns=100_000,
            max_cpu=rng.choice([None, float(rng.randint(100, 300))]),
            max_memory_bytes=rng.choice([None, rng.randint(100, 400) * GiB]),
            machine_pool=pool if i < 2 else None,
            config={"name": name},
        )
        LabelSet.objects.create(
            scaler=s,
            index=0,
            labels=["linux", name],
            normalized=f"linux,{name}",
            config={"labels": ["linux", name], "image": "a:1"},
        )


def warm_up(tag: str) -> None:
    """One untimed request (it routes nowhere: answered no-backend, nothing reserved), so the
    decider has rebuilt its routing view for the round's new config before the clock starts. A
    console pays that once per config change; the bench changes the config every round."""
    from tests.support.admission import request_scale

    request_scale(["bench-warm-up"], f"warm-up-{tag}", timeout=120)


def random_request(rng: random.Random) -> tuple[list[str], dict | None]:
    label = rng.choice(SCALERS + ("nowhere",)) if rng.random() < 0.05 else rng.choice(SCALERS)
    res = rng.choice([None, {"cpus": rng.choice([0.5, 1, 2])}, {"cpus": 1, "memory": f"{rng.randint(1, 3)}g"}])
    return ["linux", label], res


def check_round() -> int:
    """Return the number of cap violations in the ledger now (0 = no over-admission)."""
    from django.db import connection

    bad = 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT global_max_agents, global_max_cpu, global_max_memory_bytes FROM scalers_configstate WHERE id = 1"
        )
        gmax, gcpu, gmem = cur.fetchone()
        cur.execute("SELECT count(*), coalesce(sum(cpus), 0), coalesce(sum(memory_bytes), 0) FROM scalers_reservation")
        n, c, m = cur.fetchone()
        bad += n > gmax
        bad += gcpu is not None and c > gcpu + 1e-6
        bad += gmem is not None and m > gmem
        cur.execute(
            "SELECT s.max_agents, s.max_cpu, s.max_memory_bytes, count(r.id), coalesce(sum(r.cpus), 0), "
            "coalesce(sum(r.memory_bytes), 0) FROM scalers_scaler s LEFT JOIN scalers_reservation r ON "
            "r.scaler_id = s.id GROUP BY s.id"
        )
        for mx, mc, mm, n, c, m in cur.fetchall():
            bad += n > mx
            bad += mc is not None and c > mc + 1e-6
            bad += mm is not None and m > mm
        cur.execute(
            "SELECT p.max_cpu, p.max_memory_bytes, coalesce(sum(r.cpus), 0), coalesce(sum(r.memory_bytes), 0) "
            "FROM scalers_machinepool p LEFT JOIN scalers_reservation r ON r.machine_pool_id = p.id GROUP BY p.id"
        )
        for mc, mm, c, m in cur.fetchall():
            bad += mc is not None and c > mc + 1e-6
            bad += mm is not None and m > mm
        cur.execute(
            "SELECT count(*) FROM agents_agent a LEFT JOIN scalers_reservation r ON r.agent_id = a.id WHERE r.id "
            "IS NULL"
        )
        bad += cur.fetchone()[0]  # an agent without a reservation would be capacity nobody counts
    return int(bad)


def draw_requests(tag: str, requesters: int, per_requester: int) -> list[list[tuple[list[str], dict | None]]]:
    """Each requester's requests of a round, drawn before its clock starts (the requesters' random
    numbers are not the console's work): one random stream per requester, seeded by the tag."""
    return [
        [random_request(rng) for _ in range(per_requester)]
        for rng in (random.Random(f"{tag}-{i}") for i in range(requesters))
    ]


def run_requesters(
    threads: int, per_thread: int, tag: str, start: threading.Barrier | None = None
) -> tuple[list[float], dict, float]:
    """``threads`` requesters each send ``per_thread`` requests; returns latencies (s), action
    counts and the wall time from the common start to the last answer."""
    from django.db import connection

    from tests.support.admission import request_scale

    lat: list[list[float]] = [[] for _ in range(threads)]
    actions: list[dict] = [{} for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    drawn = draw_requests(tag, threads, per_thread)

    def body(i: int) -> None:
        try:
            barrier.wait()
            for k, (labels, res) in enumerate(drawn[i]):
                t0 = time.perf_counter()
                d = request_scale(labels, f"{tag}-{i}-{k}", resources=res, timeout=120)
                lat[i].append(time.perf_counter() - t0)
                actions[i][d.action] = actions[i].get(d.action, 0) + 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    ts = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    if start is not None:
        start.wait()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    total: dict = {}
    for a in actions:
        for k, v in a.items():
            total[k] = total.get(k, 0) + v
    return [x for sub in lat for x in sub], total, wall


def run_requesters_async(threads: int, per_thread: int, tag: str) -> tuple[list[float], dict, float]:
    """:func:`run_requesters` with ``threads`` coroutines on one event loop, each taking the
    ``/scale`` view's path from its JSON body on."""
    from django.db import connection

    from scalers.admission.service import decide_async
    from scalers.admission.validate import validate_scale_request
    from scalers.jobs import enqueue_spawn_or_fail
    from scalers.models import ScaleOutcome

    lat: list[float] = []
    actions: dict = {}

    drawn = draw_requests(tag, threads, per_thread)

    async def body(i: int, go: asyncio.Event) -> None:
        await go.wait()
        for k, (labels, res) in enumerate(drawn[i]):
            t0 = time.perf_counter()
            data = validate_scale_request({"labels": labels, "jobId": f"{tag}-{i}-{k}", "resources": res})
            d, agent = await decide_async(data, timeout=120)
            if d.action == ScaleOutcome.SPAWNING and agent is not None:
                d = enqueue_spawn_or_fail(d, agent)
            lat.append(time.perf_counter() - t0)
            actions[d.action] = actions.get(d.action, 0) + 1

    async def main() -> float:
        go = asyncio.Event()
        tasks = [asyncio.create_task(body(i, go)) for i in range(threads)]
        await asyncio.sleep(0)  # every requester waits at the start line
        t0 = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        return time.perf_counter() - t0

    wall = asyncio.run(main())
    connection.close()
    return lat, actions, wall


REQUESTERS = {"async": run_requesters_async, "threads": run_requesters}


def bench_admission(threads: int, seconds: float, seed: int, mode: str = "async") -> dict:
    rng = random.Random(seed)
    per_thread = max(1, 2400 // threads) if threads > 1 else 600
    lat_all: list[float] = []
    actions: dict = {}
    wall = 0.0
    violations = 0
    rounds = 0
    from scalers.admission.queue import get_queue

    q = get_queue()
    b0, d0 = q.batches, q.decided
    while wall < seconds or rounds < 2:
        configure_round(rng)
        warm_up(f"r{seed}-{rounds}")
        lat, acts, w = REQUESTERS[mode](threads, per_thread, f"r{seed}-{rounds}")
        violations += check_round()
        lat_all += lat
        wall += w
        rounds += 1
        for k, v in acts.items():
            actions[k] = actions.get(k, 0) + v
    out = _summary(lat_all, actions, wall, violations, rounds)
    out["avg_batch"] = (q.decided - d0) / max(1, q.batches - b0)
    return out


def _summary(lat: list[float], actions: dict, wall: float, violations: int, rounds: int) -> dict:
    lat = sorted(lat)
    n = len(lat)
    return {
        "decisions": n,
        "per_second": n / wall if wall else 0.0,
        "p50_ms": 1000 * lat[n // 2] if n else 0.0,
        "p99_ms": 1000 * lat[min(n - 1, int(n * 0.99))] if n else 0.0,
        "mean_ms": 1000 * statistics.fmean(lat) if n else 0.0,
        "admitted": actions.get("spawning", 0),
        "actions": actions,
        "violations": violations,
        "rounds": rounds,
    }


# --------------------------------------------------------------------------- several processes


def _child(url: str, threads: int, per_thread: int, rounds: int, index: int, barrier, out, mode: str) -> None:
    setup_django(url)
    lat_all: list[float] = []
    actions: dict = {}
    for r in range(rounds):
        barrier.wait()  # parent configured the round
        warm_up(f"p{index}-{r}")
        barrier.wait()  # every process warmed up: the clock starts
        lat, acts, _ = REQUESTERS[mode](threads, per_thread, f"p{index}-{r}")
        lat_all += lat
        for k, v in acts.items():
            actions[k] = actions.get(k, 0) + v
        barrier.wait()  # round done
    out.put((lat_all, actions))


def bench_processes(url: str, processes: int, threads: int, seconds: float, seed: int, mode: str) -> dict:
    ctx = mp.get_context("spawn")
    per_proc = threads // processes
    per_thread = max(1, 2400 // threads)
    rounds = max(2, int(seconds // 1.5))
    barrier = ctx.Barrier(processes + 1)
    out = ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(url, per_proc, per_thread, rounds, i, barrier, out, mode))
        for i in range(processes)
    ]
    for c in children:
        c.start()
    rng = random.Random(seed)
    wall = 0.0
    violations = 0
    for _ in range(rounds):
        configure_round(rng)
        barrier.wait()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        wall += time.perf_counter() - t0
        violations += check_round()
    lat_all: list[float] = []
    actions: dict = {}
    for _ in children:
        lat, acts = out.get(timeout=600)
        lat_all += lat
        for k, v in acts.items():
            actions[k] = actions.get(k, 0) + v
    for c in children:
        c.join(60)
    return _summary(lat_all, actions, wall, violations, rounds)


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement (default 8)")
    ap.add_argument("--concurrency", default="1,20,200", help="comma-separated requester counts")
    ap.add_argument("--processes", type=int, default=2, help="processes for the multi-process run (0 = skip)")
    ap.add_argument("--database-url", help=f"use this server instead of a private one (its database {DB} is replaced)")
    ap.add_argument(
        "--requesters",
        choices=sorted(REQUESTERS),
        default="async",
        help="coroutines on the /scale view's path (default) or threads calling request_scale",
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]

    pg = None
    if args.database_url:
        url = args.database_url.rsplit("/", 1)[0] + "/" + DB
    else:
        pg = PrivatePostgres()
        url = pg.start()
    try:
        prepare_database(url)
        setup_django(url)
        results = []
        load = os.getloadavg()[0]
        for c in levels:
            tps, tps_p99 = pgbench(url, c, int(max(3, args.seconds)))
            adm = bench_admission(c, args.seconds, seed=c, mode=args.requesters)
            results.append({"requesters": c, "processes": 1, "pgbench_tps": tps, "pgbench_p99_ms": tps_p99, **adm})
            print(f"  measured {c} requester(s)", file=sys.stderr, flush=True)
        if args.processes > 1 and levels:
            c = max(levels)
            tps, tps_p99 = pgbench(url, c, int(max(3, args.seconds)))
            from django.db import connection

            connection.close()
            adm = bench_processes(url, args.processes, c, args.seconds, seed=99, mode=args.requesters)
            results.append(
                {"requesters": c, "processes": args.processes, "pgbench_tps": tps, "pgbench_p99_ms": tps_p99, **adm}
            )
        from django.db import connection

        connection.close()
        from scalers.admission.queue import shutdown_queue

        shutdown_queue()
    finally:
        try:
            drop_database(url)
        except Exception:  # noqa: BLE001
            pass
        if pg is not None:
            pg.stop()

    print(
        f"\nAdmission ({args.requesters} requesters) vs pgbench -N on the same database (PostgreSQL 15, fsync on; "
        f"2 cores shared; load average at start {load:.1f})"
    )
    print(
        f"{'requesters':>10} {'procs':>5} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'avg batch':>9} "
        f"{'admitted':>9} "
        f"{'decisions':>9} {'pgbench tps':>12} {'pgb p99':>8} {'ratio':>6} {'over-admissions':>16}"
    )
    bad = 0
    for r in results:
        ratio = r["per_second"] / r["pgbench_tps"] if r["pgbench_tps"] else 0.0
        bad += r["violations"]
        batch = f"{r['avg_batch']:.1f}" if "avg_batch" in r else "-"
        print(
            f"{r['requesters']:>10} {r['processes']:>5} {r['per_second']:>12.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {batch:>9} "
            f"{r['admitted']:>9} {r['decisions']:>9} {r['pgbench_tps']:>12.0f} {r['pgbench_p99_ms']:>8.2f} "
            f"{ratio:>6.2f} {r['violations']:>16}"
        )
    print(f"\nover-admissions: {bad}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
