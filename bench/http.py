"""The console's serving tier beside a bare Django baseline, in one run, on loopback.

    .venv/bin/python bench/http.py [--seconds 5] [--concurrency 20] [--runs 3]
        [--database-url postgres://127.0.0.1:5432/kici_bench_http] [--redis-url redis://127.0.0.1:6379/13]

Creates the scratch database (dropped at the end), migrates it and writes three scalers straight
to it: ``full`` (one agent, at its cap of 1), ``open`` (a cap of 100,000) and ``burst`` (a cap of
50), one running agent with a session token, and starts, each on its own loopback port:

* the baseline: ``bench/baseline/bare_django.py`` (one view, one indexed query on the console's agent table,
  a persistent connection) under gunicorn, 2 sync workers;
* the console as ``make run`` serves it: 2 daphne processes (``kici_site.operator_server``) and 2
  gateway processes (``kici_site.gateway``), sharing their addresses; the gateway's per-source
  connection cap is lifted (every client here is 127.0.0.1, standing for many agents).

Then, per run, with ``ab`` (apache2-utils; keep-alive, ``--concurrency`` clients, ``--seconds``
each): the baseline's agent GET, the console's agent GET (``GET /api/v1/agents/<id>``), heartbeat
(on the gateway), ``/scale`` refused at capacity; with Python clients: ``/scale`` admitted then
released (pairs), and a burst of 400 concurrent ``/scale`` on ``burst`` (each its own connection,
opened at once), counting resets and over-admissions. Prints req/s, p50, p99 (ms) and errors per
path, the median of ``--runs`` runs, and the ratios to the baseline against the targets (agent GET
and heartbeat >= 0.8x, ``/scale`` refused >= 0.5x, burst: 0 resets, p99 < 1 s, 0 over-admitted).
Bounded: every load stops after ``--seconds``, the burst after 400 requests. Exits 1 when a target
is missed. Loopback only; no docker, nft or worker (admitted spawns wait in the scratch queue).
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
import json
import os
import re
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
        self.base, self.operator, self.gateway = free_port(), free_port(), free_port()

    def start(self) -> None:
        env = {**self.env, "KICI_OPERATOR_LISTEN": f"127.0.0.1:{self.operator}"}
        env["KICI_CONSOLE_URL"] = f"http://127.0.0.1:{self.gateway}"
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self._spawn(
            [str(gunicorn), "-w", "2", "-b", f"127.0.0.1:{self.base}", "--chdir", "bench/baseline"],
            env,
            "bare_django:application",
        )
        for _ in range(2):
            self._spawn([sys.executable, "-m", "kici_site.operator_server"], env)
            self._spawn(
                [sys.executable, "-m", "kici_site.gateway", "--listen", f"127.0.0.1:{self.gateway}"],
                {**env, "KICI_DB_POOL_SIZE": "4", "KICI_GATEWAY_CONNECTIONS_PER_SOURCE": "10000"},
            )
        deadline = time.monotonic() + 60
        for port in (self.base, self.operator, self.gateway):
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


def one_run(servers: Servers, agent_id: str, session: str, seconds: float, concurrency: int) -> dict[str, dict]:
    b, o, g = servers.base, servers.operator, servers.gateway
    return {
        "baseline agent GET": ab(f"http://127.0.0.1:{b}/api/v1/agents/{agent_id}", seconds, concurrency, TOKEN),
        "agent GET": ab(f"http://127.0.0.1:{o}/api/v1/agents/{agent_id}", seconds, concurrency, TOKEN),
        "heartbeat": ab(
            f"http://127.0.0.1:{g}/api/v1/agents/{agent_id}/heartbeat", seconds, concurrency, session, {"activeJobs": 0}
        ),
        "/scale refused": ab(
            f"http://127.0.0.1:{o}/api/v1/scale", seconds, concurrency, TOKEN, {"labels": ["bench", "full"]}
        ),
        "/scale admitted+released": admitted_and_released(o, seconds, concurrency),
        f"burst of {BURST} /scale": burst(o),
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
    b = median[f"burst of {BURST} /scale"]
    ok = b["resets"] == 0 and b["p99"] < 1000 and b["over"] == 0
    missed += not ok
    print(f"{'burst: 0 resets, p99 < 1 s, 0 over':<36} {'met' if ok else 'MISSED'}")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/kici_bench_http")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60 or not 1 <= args.concurrency <= 200 or not 1 <= args.runs <= 5:
        parser.error("--seconds 1..60, --concurrency 1..200, --runs 1..5")
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
            for n in range(args.runs):
                runs.append(one_run(servers, agent_id, session, args.seconds, args.concurrency))
                print(f"run {n + 1}: " + ", ".join(f"{p} {r['rps']:.0f}/s" for p, r in runs[-1].items()), flush=True)
        finally:
            servers.stop()
        return report(runs)


if __name__ == "__main__":
    sys.exit(main())
