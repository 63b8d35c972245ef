"""The console's serving tier beside a bare Django baseline, in one run, on loopback.

    .venv/bin/python bench/http.py [--seconds 5] [--concurrency 20] [--runs 3]
        [--fleet 5000,10000] [--fleet-only]
        [--database-url postgres://127.0.0.1:5432/kici_bench_http] [--redis-url redis://127.0.0.1:6379/13]

Creates the scratch database (dropped at the end), migrates it and writes three scalers straight
to it: ``full`` (one agent, at its cap of 1), ``open`` (a cap of 100,000) and ``burst`` (a cap of
50), one running agent with a session token, and starts, each on its own loopback port:

* the baseline: ``bench/baseline/bare_django.py`` (one view, one indexed query on the console's agent table,
  a persistent connection) under gunicorn, 2 sync workers;
* the console as ``make run`` serves it: 2 daphne processes (``kici_site.operator_server``) on the
  operator listener, 2 gateway processes (``kici_site.gateway``) on the agents' gateway and 2 API
  processes (``kici_site.gateway --api``) on the orchestrator's API listener (``KICI_API_LISTEN``),
  sharing their addresses, each with a pool of 4 database connections; the gateway's per-source
  connection cap is lifted (every client here is 127.0.0.1, standing for many agents).

Then, per run, with ``ab`` (apache2-utils; keep-alive, ``--concurrency`` clients, ``--seconds``
each): the baseline's agent GET, the console's agent GET (``GET /api/v1/agents/<id>``) on the API
listener and, for comparison, on the operator listener (daphne), heartbeat (on the gateway),
``/scale`` refused at capacity (409, on the API listener); with Python clients, on the API
listener: ``/scale`` admitted then released (pairs), and a burst of 400 concurrent ``/scale`` on
``burst`` (each its own connection, opened at once), counting resets and over-admissions. Prints
req/s, p50, p99 (ms) and errors per path, the median of ``--runs`` runs, and the ratios to the
baseline against the targets (agent GET and heartbeat >= 0.8x, ``/scale`` refused >= 0.5x,
burst: 0 resets, p99 < 1 s, 0 over-admitted).

Then a simulated fleet (N agents heartbeating at the console's interval while an operator page
loads every second): for each ``--fleet`` size, in order, that many running agents of ``open``
with session tokens are written in bulk, and an asyncio client gives each a kept-alive connection
to the gateway on which it beats once per ``KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS``, spread evenly
over the interval, while the agents page (``/agents/``, signed in) loads once a second on the
operator listener. Two intervals per size, the second measured; growth stops at the first size
that misses heartbeat p99 < 100 ms or page < 300 ms. Prints the largest N held (target 10,000).

Bounded: every load stops after ``--seconds``, the burst after 400 requests, each fleet size
after two intervals (``--fleet-only`` skips the paths: each part stays within about two minutes).
Exits 1 when a target is missed. Loopback only; no docker, nft or worker (admitted spawns wait in
the scratch queue).
"""

# ruff: noqa: E402
from __future__ import annotations

import sys

# This file is named http.py: run as a script, its folder would shadow the standard library's
# http package (http.client, used here and by everything below). Its folder goes last instead.
BENCH = sys.path.pop(0)
sys.path.append(BENCH)

import argparse
import asyncio
import gc
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

from scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-http-token"
BURST, BURST_CAP = 400, 50
#: The fleet's targets: heartbeat p99 and the agents page's worst load (ms), and the fleet to hold.
FLEET_BEAT_P99_MS, FLEET_PAGE_MS, FLEET_TARGET = 100, 300, 10_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup() -> tuple[str, str]:
    """Migrate and write the scalers and agents; returns (agent id, its session token)."""
    import django

    django.setup()
    from django.core.management import call_command

    from agents.models import Agent
    from agents.tokens import mint_session_token
    from scalers.labels import normalize_label_set
    from scalers.models import ConfigState, LabelSet, Reservation, Scaler

    call_command("migrate", verbosity=0)
    cfg = ConfigState.load()
    cfg.global_max_agents = 1_000_000
    cfg.save()
    scalers = {}
    for name, cap in (("full", 1), ("open", 100_000), ("burst", BURST_CAP)):
        scaler = Scaler.objects.create(name=name, type="container", max_agents=cap, config={})
        labels = ["bench", name]
        entry = {"labels": labels, "image": "kici-agent:local", "imagePullPolicy": "Never"}
        ls = LabelSet.objects.create(
            scaler=scaler, index=0, labels=labels, normalized=normalize_label_set(labels), config=entry
        )
        scalers[name] = (scaler, ls)
    scaler, ls = scalers["full"]
    agent = Agent.objects.create(
        agent_id="bench-full-0001", scaler=scaler, label_set=ls, state="running", labels=["bench", "full"]
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=1 << 30, owner_instance="bench")
    return agent.agent_id, mint_session_token(agent)


class Servers:
    """The baseline and the console's processes, stopped together."""

    def __init__(self, env: dict[str, str]):
        self.env, self.procs, self.log = env, [], tempfile.TemporaryFile()
        self.base, self.operator, self.gateway, self.api = free_port(), free_port(), free_port(), free_port()

    def start(self) -> None:
        env = {**self.env, "KICI_OPERATOR_LISTEN": f"127.0.0.1:{self.operator}"}
        env["KICI_CONSOLE_URL"] = f"http://127.0.0.1:{self.gateway}"
        env["KICI_API_LISTEN"] = f"127.0.0.1:{self.api}"
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self._spawn(
            [str(gunicorn), "-w", "2", "-b", f"127.0.0.1:{self.base}", "--chdir", "bench/baseline"],
            env,
            "bare_django:application",
        )
        for _ in range(2):
            self._spawn([sys.executable, "-m", "kici_site.operator_server"], {**env, "KICI_DB_POOL_SIZE": "4"})
            self._spawn(
                [sys.executable, "-m", "kici_site.gateway", "--listen", f"127.0.0.1:{self.gateway}"],
                {**env, "KICI_DB_POOL_SIZE": "4", "KICI_GATEWAY_CONNECTIONS_PER_SOURCE": "10000"},
            )
            self._spawn(
                [sys.executable, "-m", "kici_site.gateway", "--api", "--listen", f"127.0.0.1:{self.api}"],
                {**env, "KICI_DB_POOL_SIZE": "4"},
            )
        deadline = time.monotonic() + 60
        for port in (self.base, self.operator, self.gateway, self.api):
            while not _answers(port):
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                    self.log.seek(0)
                    raise SystemExit(f"a server did not start:\n{self.log.read().decode()[-3000:]}")
                time.sleep(0.3)
        time.sleep(2)  # the second process of each binds too

    def _spawn(self, argv: list[str], env: dict[str, str], *tail: str) -> None:
        self.procs.append(
            subprocess.Popen(
                [*argv, *tail], cwd=ROOT, env=env, stdout=self.log, stderr=self.log, start_new_session=True
            )
        )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    try:
        conn = HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/api/v1/agents/nobody")
        conn.getresponse().read()
        return True
    except OSError:
        return False


def ab(url: str, seconds: float, concurrency: int, token: str, body: dict | None = None) -> dict:
    """``ab`` keep-alive load on ``url``: req/s, p50/p99 ms, errors (connect, receive, exceptions)."""
    cmd = ["ab", "-q", "-k", "-c", str(concurrency), "-t", str(seconds), "-n", "1000000", "-s", "10"]
    cmd += ["-H", f"Authorization: Bearer {token}"]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        if body is not None:
            json.dump(body, f)
            f.flush()
            cmd += ["-p", f.name, "-T", "application/json"]
        done = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=seconds + 60)
    out = done.stdout
    if "Requests per second" not in out:
        print(f"ab {url}: {(done.stderr or out)[-400:]}", file=sys.stderr)

    def number(pattern: str) -> float:
        m = re.search(pattern, out)
        return float(m.group(1)) if m else float("nan")

    errors = sum(int(n) for n in re.findall(r"(?:Connect|Receive|Exceptions): (\d+)", out))
    return {
        "rps": number(r"Requests per second:\s+([\d.]+)"),
        "p50": number(r"\n\s+50%\s+(\d+)"),
        "p99": number(r"\n\s+99%\s+(\d+)"),
        "errors": errors,
    }


def _post(conn: HTTPConnection, path: str, body: dict) -> tuple[int, dict]:
    conn.request(
        "POST", path, json.dumps(body), {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    )
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


def admitted_and_released(port: int, seconds: float, concurrency: int) -> dict:
    """Clients each admitting a job on ``open`` then releasing its agent, for ``seconds``."""
    latencies, errors, end = [], [0], time.monotonic() + seconds
    lock = threading.Lock()

    def client(n: int) -> None:
        conn, i = HTTPConnection("127.0.0.1", port, timeout=10), 0
        while time.monotonic() < end:
            i += 1
            start = time.monotonic()
            try:
                status, answer = _post(conn, "/api/v1/scale", {"labels": ["bench", "open"], "jobId": f"adm-{n}-{i}"})
                agent = answer.get("agentId") or (answer.get("agent") or {}).get("agentId")
                if status >= 300 or not agent:
                    raise ValueError(f"scale {status}: {answer}")
                status, answer = _post(conn, f"/api/v1/agents/{agent}/release", {"reason": "bench"})
                if status >= 300:
                    raise ValueError(f"release {status}: {answer}")
                with lock:
                    latencies.append(time.monotonic() - start)
            except (OSError, ValueError):
                with lock:
                    errors[0] += 1
                conn.close()
                conn = HTTPConnection("127.0.0.1", port, timeout=10)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(concurrency)]
    started = time.monotonic()
    [t.start() for t in threads]
    [t.join(seconds + 30) for t in threads]
    return _summary(latencies, errors[0], time.monotonic() - started)


def _summary(latencies: list[float], errors: int, elapsed: float) -> dict:
    ordered = sorted(latencies) or [float("nan")]
    return {
        "rps": len(latencies) / elapsed,
        "p50": 1000 * ordered[len(ordered) // 2],
        "p99": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "errors": errors,
    }


async def _one_scale(port: int, n: int) -> tuple[float, int | None, str]:
    body = json.dumps({"labels": ["bench", "burst"], "jobId": f"burst-{n}-{time.monotonic_ns()}"}).encode()
    head = (
        f"POST /api/v1/scale HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    start = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(head + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None
        return time.monotonic() - start, status, "" if status else "no answer"
    except ConnectionResetError:
        return time.monotonic() - start, None, "reset"
    except (OSError, TimeoutError) as exc:
        return time.monotonic() - start, None, type(exc).__name__


def burst(port: int) -> dict:
    """BURST concurrent ``/scale`` on ``burst`` (cap BURST_CAP), each its own connection."""
    from agents.models import Agent

    before = Agent.objects.filter(scaler__name="burst").exclude(state__in=["failed", "destroyed"]).count()

    async def run():
        return await asyncio.gather(*[_one_scale(port, n) for n in range(BURST)])

    started = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - started
    held = Agent.objects.filter(scaler__name="burst").exclude(state__in=["failed", "destroyed"]).count()
    out = _summary([t for t, s, _ in results if s], sum(1 for _, s, _ in results if not s), elapsed)
    out["resets"] = sum(1 for _, _, e in results if e == "reset")
    out["over"] = max(0, held - BURST_CAP) if held > before else 0
    return out


def fleet_agents(count: int, start: int) -> list[tuple[str, str]]:
    """``count`` more running agents of ``open``, each with a session token, written in bulk
    (numbered from ``start``); returns their (agent id, session token)."""
    from datetime import timedelta

    from django.utils import timezone

    from agents.models import Agent, AgentToken
    from agents.tokens import SESSION_PREFIX, SESSION_TTL_SECONDS, hash_token
    from scalers.models import LabelSet, Scaler

    scaler = Scaler.objects.get(name="open")
    label_set = LabelSet.objects.get(scaler=scaler)
    now = timezone.now()
    agents = Agent.objects.bulk_create(
        [
            Agent(
                agent_id=f"fleet-{n:06d}",
                scaler=scaler,
                label_set=label_set,
                state="running",
                labels=["bench", "open"],
                registered_at=now,
                last_heartbeat=now,
            )
            for n in range(start, start + count)
        ],
        batch_size=2000,
    )
    sessions = [f"{SESSION_PREFIX}fleet-{agent.agent_id}-{os.urandom(8).hex()}" for agent in agents]
    expires = now + timedelta(seconds=SESSION_TTL_SECONDS)
    AgentToken.objects.bulk_create(
        [
            AgentToken(agent=agent, token_hash=hash_token(raw), prefix=raw[:12], expires_at=expires)
            for agent, raw in zip(agents, sessions, strict=True)
        ],
        batch_size=2000,
    )
    return [(agent.agent_id, raw) for agent, raw in zip(agents, sessions, strict=True)]


class _Keepalive:
    """One HTTP/1.1 keep-alive connection of a simulated client, opened on first use."""

    def __init__(self, port: int):
        self.port, self.reader, self.writer = port, None, None

    async def request(self, head: str, body: bytes = b"") -> int:
        """Send one request (``head`` without the blank line) and read its answer; its status."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(f"{head}\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readuntil(b"\r\n")
        length = 0
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {status_line!r}")
        return int(parts[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def _fleet_step(servers: Servers, fleet: list[tuple[str, str]], interval: float, cookie: str) -> dict:
    """Two heartbeat intervals of ``fleet``: in each, every agent beats once at its own offset
    (on a kept-alive connection, opened on its first beat) while the agents page loads once a
    second on the operator listener. The first interval, in which the connections open, is not
    counted; the second is the steady state measured: heartbeat and page latencies (ms),
    failures (any answer but 200)."""
    beats: list[float] = []
    pages: list[float] = []
    failures = [0]
    lead = 1.0  # seconds for the client to set every agent going before the first beat
    measured = time.monotonic() + lead + interval  # the second interval starts here

    async def agent(n: int, agent_id: str, session: str) -> None:
        link = _Keepalive(servers.gateway)
        body = b'{"activeJobs": 0}'
        head = (
            f"POST /api/v1/agents/{agent_id}/heartbeat HTTP/1.1\r\nAuthorization: Bearer {session}\r\n"
            "Content-Type: application/json"
        )
        for beat in range(2):
            await asyncio.sleep(
                max(0.0, measured - interval * (1 - beat) + interval * n / len(fleet) - time.monotonic())
            )
            sent = time.monotonic()
            try:
                status = await asyncio.wait_for(link.request(head, body), 10)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                status = 0
                link.close()
                print(f"heartbeat of {agent_id}: {exc!r}", file=sys.stderr)
            if beat:
                beats.append(time.monotonic() - sent)
                failures[0] += status != 200
        link.close()

    async def operator() -> None:
        link = _Keepalive(servers.operator)
        await asyncio.sleep(max(0.0, measured - time.monotonic()))
        while time.monotonic() - measured < interval:
            sent = time.monotonic()
            try:
                status = await asyncio.wait_for(link.request(f"GET /agents/ HTTP/1.1\r\nCookie: {cookie}"), 10)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                status = 0
                link.close()
            pages.append(time.monotonic() - sent)
            if status != 200:
                failures[0] += 1
                print(f"agents page: status {status}", file=sys.stderr)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - sent)))
        link.close()

    await asyncio.gather(operator(), *(agent(n, a, s) for n, (a, s) in enumerate(fleet)))
    beats.sort()
    pages.sort()
    return {
        "agents": len(fleet),
        "beats/s": len(beats) / interval,
        "beat p50": 1000 * beats[len(beats) // 2],
        "beat p99": 1000 * beats[int(len(beats) * 0.99)],
        "page p99": 1000 * pages[min(len(pages) - 1, int(len(pages) * 0.99))],
        "failures": failures[0],
    }


def fleet(servers: Servers, steps: list[int]) -> list[dict]:
    """The simulated fleet: agents registered in bulk, heartbeating at the console's interval
    (``KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS``), grown through ``steps`` (two intervals each, the
    second measured) until a step misses heartbeat p99 < 100 ms or page < 300 ms. One dict per
    step run."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench-operator", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    interval = float(settings.KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS)
    agents: list[tuple[str, str]] = []
    results = []
    for size in steps:
        agents += fleet_agents(size - len(agents), len(agents))
        # The client's own pauses would count as the console's: no collection while it measures.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            result = asyncio.run(_fleet_step(servers, agents, interval, cookie))
        finally:
            gc.enable()
            gc.unfreeze()
        result["held"] = result["beat p99"] < FLEET_BEAT_P99_MS and result["page p99"] < FLEET_PAGE_MS
        result["held"] = result["held"] and not result["failures"]
        results.append(result)
        print(
            f"fleet {size}: {result['beats/s']:.0f} beats/s, beat p50 {result['beat p50']:.0f} ms, "
            f"p99 {result['beat p99']:.0f} ms, page p99 {result['page p99']:.0f} ms, "
            f"{result['failures']} failed: {'held' if result['held'] else 'NOT held'}",
            flush=True,
        )
        if not result["held"]:
            break
    return results


def one_run(servers: Servers, agent_id: str, session: str, seconds: float, concurrency: int) -> dict[str, dict]:
    b, o, g, a = servers.base, servers.operator, servers.gateway, servers.api
    return {
        "baseline agent GET": ab(f"http://127.0.0.1:{b}/api/v1/agents/{agent_id}", seconds, concurrency, TOKEN),
        "agent GET": ab(f"http://127.0.0.1:{a}/api/v1/agents/{agent_id}", seconds, concurrency, TOKEN),
        "agent GET (daphne)": ab(f"http://127.0.0.1:{o}/api/v1/agents/{agent_id}", seconds, concurrency, TOKEN),
        "heartbeat": ab(
            f"http://127.0.0.1:{g}/api/v1/agents/{agent_id}/heartbeat", seconds, concurrency, session, {"activeJobs": 0}
        ),
        "/scale refused": ab(
            f"http://127.0.0.1:{a}/api/v1/scale",
            seconds,
            concurrency,
            TOKEN,
            {"labels": ["bench", "full"], "jobId": "bench-refused"},  # 409 at-capacity, every time
        ),
        "/scale admitted+released": admitted_and_released(a, seconds, concurrency),
        f"burst of {BURST} /scale": burst(a),
    }


def report(runs: list[dict[str, dict]]) -> int:
    median = {path: {k: statistics.median(r[path][k] for r in runs) for k in runs[0][path]} for path in runs[0]}
    print(f"\nmedian of {len(runs)} run(s), loopback, a shared 2-core machine (noisy)")
    print(f"{'path':<28}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for path, m in median.items():
        extra = f"  resets {m['resets']:.0f}, over-admitted {m['over']:.0f}" if "resets" in m else ""
        print(f"{path:<28}{m['rps']:>10.0f}{m['p50']:>9.0f}{m['p99']:>9.0f}{m['errors']:>8.0f}{extra}")
    base = median["baseline agent GET"]["rps"]
    checks = [
        ("agent GET >= 0.8x baseline", median["agent GET"]["rps"] / base, 0.8),
        ("heartbeat >= 0.8x baseline", median["heartbeat"]["rps"] / base, 0.8),
        ("/scale refused >= 0.5x baseline", median["/scale refused"]["rps"] / base, 0.5),
    ]
    missed = 0
    for name, ratio, target in checks:
        ok = ratio >= target
        missed += not ok
        print(f"{name:<36} {ratio:5.2f}x  {'met' if ok else 'MISSED'}")
    daphne = median["agent GET (daphne)"]["rps"] / base
    print(f"{'agent GET on the operator listener':<36} {daphne:5.2f}x  (daphne, for comparison)")
    for path in ("agent GET", "agent GET (daphne)", "heartbeat", "/scale refused"):
        ratios = ", ".join(f"{r[path]['rps'] / r['baseline agent GET']['rps']:.2f}" for r in runs)
        print(f"  {path} per run: {ratios}")
    b = median[f"burst of {BURST} /scale"]
    ok = b["resets"] == 0 and b["p99"] < 1000 and b["over"] == 0
    missed += not ok
    print(f"{'burst: 0 resets, p99 < 1 s, 0 over':<36} {'met' if ok else 'MISSED'}")
    return 1 if missed else 0


def fleet_report(steps: list[dict]) -> int:
    """Print the largest fleet held; 1 when it is under :data:`FLEET_TARGET`."""
    held = max((step["agents"] for step in steps if step["held"]), default=0)
    ok = held >= FLEET_TARGET
    print(
        f"simulated fleet: {held} agents held (heartbeat p99 < {FLEET_BEAT_P99_MS} ms, page < {FLEET_PAGE_MS} ms)"
        f"  >= {FLEET_TARGET}: {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/kici_bench_http")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument(
        "--fleet",
        default="5000,10000",
        help="the simulated fleet's sizes, grown in this order (two heartbeat intervals each); '' for none",
    )
    parser.add_argument("--fleet-only", action="store_true", help="the simulated fleet alone, no path loads")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60 or not 1 <= args.concurrency <= 200 or not 1 <= args.runs <= 5:
        parser.error("--seconds 1..60, --concurrency 1..200, --runs 1..5")
    try:
        steps = [int(size) for size in args.fleet.split(",") if size.strip()]
    except ValueError:
        parser.error(f"--fleet={args.fleet!r}: sizes are whole numbers separated by commas")
    # Each simulated agent keeps a connection: the client holds one descriptor per agent.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if steps != sorted(steps) or any(not 1 <= size <= hard - 1000 for size in steps):
        parser.error(f"--fleet={args.fleet!r}: ascending sizes from 1 to {hard - 1000} (the open-file limit)")
    os.environ["REDIS_URL"] = args.redis_url
    os.environ["KICI_API_TOKEN"] = TOKEN
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    sys.path.insert(1, str(ROOT))
    with scratch_database(args.database_url):
        agent_id, session = setup()
        servers = Servers({**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings"})
        try:
            servers.start()
            runs = []
            for n in range(0 if args.fleet_only else args.runs):
                runs.append(one_run(servers, agent_id, session, args.seconds, args.concurrency))
                print(f"run {n + 1}: " + ", ".join(f"{p} {r['rps']:.0f}/s" for p, r in runs[-1].items()), flush=True)
            fleet_steps = fleet(servers, steps) if steps else []
        finally:
            servers.stop()
        missed = report(runs) if runs else 0
        return max(missed, fleet_report(fleet_steps)) if steps else missed


if __name__ == "__main__":
    sys.exit(main())
