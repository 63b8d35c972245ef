"""Event fan-out latency: 1,000 events/s to 50 WebSocket clients through a real daphne on 127.0.0.1.

Sets up a throwaway database (``kici_bench_fanout``, dropped afterwards) and a user with
``agents.view_agent``, starts ``daphne kici_site.asgi:application`` on a free loopback port, opens
50 logged-in WebSocket clients on ``/ws/events/`` (a minimal RFC 6455 client; Origin checked by the
server), then publishes ``event.message`` group messages (each carrying its send time) at 1,000/s
for ``--seconds`` (default 8) through the Redis channel layer, exactly as ``live.publish
.apublish_message`` does for ``publish_event``. Prints events delivered per client, drop rows, and
p50 / p95 / p99 / max delivery latency (publish → parsed by the client). Target: p95 <
250 ms. Redis: ``REDIS_URL`` (default db 7). Bounded: about ``--seconds`` + 20 s (migrations).

    .venv/bin/python bench/fanout.py [--clients 50] [--rate 1000] [--seconds 8] [--layer project|list]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "kici_bench_fanout"
PROFILE = os.environ.get("BENCH_PROFILE_DAPHNE")  # a path: profile daphne with cProfile into it
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/7")
STAMP_RE = re.compile(rb'data-bench="(\d+) ([0-9.]+)"')
ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "kici_site.settings",
    "SECRET_KEY": "bench-only-not-secret-fanout-0123456789abcdef",
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": REDIS_URL,
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "KICI_OPERATOR_LISTEN": "127.0.0.1:*",  # the consoles are operator pages, on any port of this bench
    "LOG_LEVEL": "WARNING",
}


# --- database, user, session ----------------------------------------------------------------------


def admin_sql(sql: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(sql)


def prepare_site() -> str:
    """Create and migrate the bench database; return a session cookie of a permitted user."""
    admin_sql(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
    admin_sql(f'CREATE DATABASE "{DB_NAME}"')
    os.environ.update(ENV)
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    user = User.objects.create_user("bench-viewer", password="bench-viewer-pw")
    user.user_permissions.add(Permission.objects.get(codename="view_agent", content_type__app_label="agents"))
    client = Client()
    client.force_login(user)
    from django.db import connections

    connections.close_all()
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(port: int) -> subprocess.Popen:
    prefix = (
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "cProfile", "-o", PROFILE]
        if PROFILE
        else [str(ROOT / ".venv" / "bin" / "python")]
    )
    return subprocess.Popen(
        [
            *prefix,
            str(ROOT / ".venv" / "bin" / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "kici_site.asgi:application",
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=open("/tmp/tail-bench-daphne.log", "wb"),
        start_new_session=True,
    )


async def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"daphne did not listen on 127.0.0.1:{port}; see /tmp/tail-bench-daphne.log")


# --- a minimal WebSocket client (RFC 6455, text frames) --------------------------------------------


class WsClient:
    def __init__(self):
        self.latencies: list[float] = []
        self.events = 0
        self.drop_rows = 0
        self.frames = 0
        self.seen: set[int] = set()

    async def connect(self, port: int, path: str, cookie: str) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
            f"Cookie: {cookie}\r\n\r\n"
        )
        self.writer.write(request.encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"handshake refused: {head[:80]!r}")

    async def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        header = bytes([0x80 | opcode])
        n = len(payload)
        header += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(header + mask + masked)
        await self.writer.drain()

    async def run(self) -> None:
        buffer = b""
        while True:
            b1, b2 = await self.reader.readexactly(2)
            opcode, n = b1 & 0x0F, b2 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(n)
            if opcode == 9:
                await self._send(10, payload)
                continue
            if opcode == 8:
                return
            buffer += payload
            if not b1 & 0x80:
                continue
            now = time.time()
            self.frames += 1
            for match in STAMP_RE.finditer(buffer):
                self.seen.add(int(match.group(1)))
                self.latencies.append(now - float(match.group(2)))
            self.events = len(self.seen)
            self.drop_rows += buffer.count(b"events dropped")
            buffer = b""

    def close(self) -> None:
        self.writer.close()


# --- the run -------------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu() -> float:
    out = subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True).stdout.split()
    return sum(proc_cpu(int(pid)) for pid in out)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def publish(rate: int, seconds: float) -> int:
    from channels.layers import get_channel_layer

    from live.publish import EVENTS_GLOBAL_GROUP, apublish_message

    layer = get_channel_layer()
    total = int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(total):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        html = (
            f'<tbody hx-swap-oob="afterbegin:#event-rows"><tr id="event-{i}" data-bench="{i} '
            f'{time.time():.6f}"><td>scaler.ready</td></tr></tbody>'
        )
        await apublish_message(
            {"type": "event.message", "event_id": i, "agent_ref": "", "html": html}, [EVENTS_GLOBAL_GROUP], layer
        )
    return total


async def main(args) -> None:
    cookie = await asyncio.to_thread(prepare_site)
    port = free_port()
    daphne = start_daphne(port)
    clients: list[WsClient] = []
    tasks = []
    try:
        await wait_port(port)
        for _ in range(args.clients):
            client = WsClient()
            await client.connect(port, "/ws/events/", cookie)
            clients.append(client)
            tasks.append(asyncio.create_task(client.run()))
        await asyncio.sleep(1.0)  # every consumer has joined its group
        daphne_cpu0, bench_cpu0, redis_cpu0 = proc_cpu(daphne.pid), time.process_time(), redis_cpu()
        t0 = time.perf_counter()
        total = await publish(args.rate, args.seconds)
        publish_s = time.perf_counter() - t0
        deadline = time.monotonic() + 10
        progress, last_change = -1, time.monotonic()
        while time.monotonic() < deadline and any(c.events < total for c in clients):
            seen = sum(c.events for c in clients)
            if seen != progress:
                progress, last_change = seen, time.monotonic()
            elif time.monotonic() - last_change > 2:
                break  # the rest was dropped (and shown as drop rows)
            await asyncio.sleep(0.1)
        latencies = [x for c in clients for x in c.latencies]
        delivered = [c.events for c in clients]
        print(
            f"fanout     {args.clients} clients, {total:,} events published at {total / publish_s:,.0f}/s over "
            f"{publish_s:.1f} s "
            f"(target {args.rate:,}/s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        print(
            f"delivered  per client min {min(delivered):,} / median {int(statistics.median(delivered)):,} of "
            f"{total:,}; "
            f"drop rows {sum(c.drop_rows for c in clients)}; frames per client median "
            f"{int(statistics.median(c.frames for c in clients))}"
        )
        print(
            f"cpu        daphne {proc_cpu(daphne.pid) - daphne_cpu0:.2f} s, this bench process "
            f"{time.process_time() - bench_cpu0:.2f} s, "
            f"redis-server {redis_cpu() - redis_cpu0:.2f} s during the run"
        )
        if latencies:
            print(
                f"latency    p50 {percentile(latencies, 0.50) * 1000:.1f} ms, p95 "
                f"{percentile(latencies, 0.95) * 1000:.1f} ms, "
                f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms over "
                f"{len(latencies):,} deliveries"
            )
    finally:
        for task in tasks:
            task.cancel()
        for client in clients:
            client.close()
        os.killpg(daphne.pid, signal.SIGINT)
        try:
            daphne.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(daphne.pid, signal.SIGKILL)
            daphne.wait()
        from django.db import connections

        connections.close_all()
        admin_sql(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--layer",
        choices=["project", "list"],
        default="project",
        help="project: the settings' layer (Redis Pub/Sub); list: channels_redis RedisChannelLayer "
        "(bench/settings/list_layer.py)",
    )
    args = parser.parse_args()
    if args.layer == "list":
        ENV["DJANGO_SETTINGS_MODULE"] = "bench.settings.list_layer"
    asyncio.run(main(args))
