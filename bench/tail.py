"""Console tail throughput and memory: file → FileTail → ConsoleHub pump → Redis channel layer → viewer.

Prints:

1. ``burst``: 1,000,000 lines of 100 bytes already in the file, the pump paced and never
   skipping: lines/s delivered to a viewer through the Redis channel layer (nothing may be lost);
2. ``sustained``: another process appends 100-byte lines at a fixed rate for a few seconds, the
   console's own settings (skip ahead beyond 4 MiB of lag): lines/s delivered, bytes skipped;
3. ``flood``: a 1 GiB file with no newline at all, tailed through the same pipeline; peak RSS growth
   of this process (VmHWM after a reset, minus the RSS before) and the single truncated line.

Targets: >= 200,000 lines/s; RSS growth < 32 MiB. Runs ~30 s; files go to /tmp (named
``tail-bench-*``) and are deleted afterwards. Redis: ``REDIS_URL`` (default db 7), flushed of this
bench's keys only.

    .venv/bin/python bench/tail.py [--skip-flood] [--layer project|list]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from consolelog.tail import MAX_READ_BYTES, FileTail
from live.hub import ConsoleHub
from live.sources import MAX_LAG_BYTES
from live.streams import StreamKey
from live.transport import RedisTransport

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/7")
LINE = b"x" * 90  # + " %08d\n" = 100 bytes


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for row in f:
            if row.startswith(field + ":"):
                return int(row.split()[1])
    raise RuntimeError(field)


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


LAYER = "project"


def make_layer():
    """The channels_redis Pub/Sub layer the project configures (``--layer list``: RedisChannelLayer)."""
    if LAYER == "project":
        from channels_redis.pubsub import RedisPubSubChannelLayer

        db = REDIS_URL.rsplit("/", 1)[-1] if REDIS_URL.count("/") >= 3 else "0"
        return RedisPubSubChannelLayer(
            hosts=[{"address": REDIS_URL, "socket_timeout": None}], prefix=f"tailbench.db{db}."
        )
    from channels_redis.core import RedisChannelLayer

    return RedisChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": None}], capacity=1000, expiry=30)


async def make_hub(prefix: str):
    import redis.asyncio

    client = redis.asyncio.from_url(REDIS_URL)
    transport = RedisTransport(make_layer(), client, prefix=prefix)
    return ConsoleHub(transport, tick=1.0, batch_lines=int(os.environ.get("BENCH_BATCH_LINES", "1000"))), client


async def close_hub(hub, client, viewer, path: Path) -> None:
    """Unsubscribe the viewer, close the hub, its transport and the Redis client, remove the file."""
    await hub.unsubscribe(viewer)
    await hub.aclose()
    await hub.transport.aclose()
    await client.aclose()
    path.unlink()


def write_at_rate(path: str, rate: int, total: int) -> None:
    """Append ``total`` 100-byte lines at ``rate`` lines/s, a write every 20 ms (own process)."""
    step = max(1, rate // 50)
    written = 0
    t0 = time.perf_counter()
    with open(path, "ab", buffering=0) as f:
        while written < total:
            n = min(step, total - written)
            f.write(b"".join(LINE + b" %08d\n" % i for i in range(written, written + n)))
            written += n
            delay = t0 + written / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)


class Counter:
    """A viewer reader that only counts: delivered lines and viewer-side drops."""

    def __init__(self, viewer):
        self.viewer = viewer
        self.lines = 0
        self.viewer_dropped = 0
        self.markers = 0
        self.last_seq = 0
        self.task = asyncio.create_task(self.run())

    async def run(self):
        while True:
            rows, _ = await self.viewer.next_batch()
            for row in rows:
                if row.dropped:
                    self.viewer_dropped += row.dropped
                elif row.level == "dropped":
                    self.markers += 1
                else:
                    self.lines += 1
            if rows:
                self.last_seq = rows[-1].seq


def tail_source(path: Path, holder: dict, max_lag_bytes: int | None = MAX_LAG_BYTES):
    """The console's file source (paced FileTail), keeping the tail for the counters."""

    def open_source():
        tail = FileTail(path, poll_interval=0.1, pace=True, max_lag_bytes=max_lag_bytes)
        holder["tail"] = tail
        return tail.batches()

    return open_source


async def burst(tmp: Path, count: int) -> None:
    path = tmp / "tail-bench-burst.log"
    with open(path, "wb") as f:
        for start in range(0, count, 100_000):
            f.write(b"".join(LINE + b" %08d\n" % i for i in range(start, min(count, start + 100_000))))
    hub, client = await make_hub("tail-bench")
    holder: dict = {}
    key = StreamKey("bench-burst", "serial")
    t0 = time.perf_counter()
    c0 = time.process_time()
    viewer = await hub.subscribe(key, tail_source(path, holder, max_lag_bytes=None), flag_failures=True)
    counter = Counter(viewer)
    size = path.stat().st_size
    while True:
        await asyncio.sleep(0.02)
        tail = holder.get("tail")
        if tail and tail.offset >= size and not tail.queue and counter.lines + counter.viewer_dropped >= count:
            break
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    tail = holder["tail"]
    print(
        f"burst      this process used {cpu:.2f} CPU-s = {counter.lines / cpu:,.0f} lines per CPU-second; load "
        f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"burst      {count:>9,} lines in file: delivered {counter.lines:,} in {elapsed:.2f} s = "
        f"{counter.lines / elapsed:,.0f} lines/s file -> Redis channel layer -> viewer (paced, no skipping); "
        f"tail queue dropped {tail.queue.dropped:,}, viewer dropped {counter.viewer_dropped:,}"
    )
    counter.task.cancel()
    await close_hub(hub, client, viewer, path)


async def sustained(tmp: Path, rate: int, seconds: float) -> None:
    path = tmp / "tail-bench-sustained.log"
    path.write_bytes(b"")
    hub, client = await make_hub("tail-bench")
    holder: dict = {}
    key = StreamKey("bench-sustained", "serial")
    viewer = await hub.subscribe(key, tail_source(path, holder), flag_failures=True)
    counter = Counter(viewer)
    total = int(rate * seconds)
    writer = multiprocessing.get_context("spawn").Process(target=write_at_rate, args=(str(path), rate, total))
    t0 = time.perf_counter()
    writer.start()
    await asyncio.to_thread(writer.join)
    write_elapsed = time.perf_counter() - t0
    deadline = time.perf_counter() + 30
    tail = holder["tail"]
    size = path.stat().st_size
    last, last_change = -1, time.perf_counter()
    while time.perf_counter() < deadline:
        if counter.lines != last:
            last, last_change = counter.lines, time.perf_counter()
        elif tail.offset >= size and not tail.queue and time.perf_counter() - last_change > 0.5:
            break  # caught up and nothing more for 0.5 s
        await asyncio.sleep(0.01)
    elapsed = last_change - t0
    print(
        f"sustained  writer at {rate:,} lines/s for {write_elapsed:.1f} s ({total:,} lines): delivered "
        f"{counter.lines:,} "
        f"= {counter.lines / elapsed:,.0f} lines/s, caught up {elapsed - write_elapsed:.2f} s after the writer; "
        f"skipped {tail.skipped_bytes:,} bytes (~{tail.skipped_bytes // 100:,} lines) in {counter.markers} jumps, "
        f"tail queue dropped {tail.queue.dropped:,}, viewer dropped {counter.viewer_dropped:,}"
    )
    counter.task.cancel()
    await close_hub(hub, client, viewer, path)


async def flood(tmp: Path, gib: float) -> None:
    path = tmp / "tail-bench-flood.log"
    block = b"y" * MAX_READ_BYTES
    size = int(gib * (1 << 30)) // len(block) * len(block)  # whole blocks: the size the tail waits for
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    gen_s = time.perf_counter() - t0
    hub, client = await make_hub("tail-bench")
    holder: dict = {}
    key = StreamKey("bench-flood", "serial")
    # Warm everything up (connections, relay channel) before measuring.
    warm_path = tmp / "tail-bench-warm.log"
    warm_path.write_bytes(b"warm\n" * 1000)
    warm = await hub.subscribe(StreamKey("bench-warm", "serial"), tail_source(warm_path, {}))
    async with asyncio.timeout(10):
        while sum(1 for r in (await warm.next_batch())[0]) == 0:
            pass
    await hub.unsubscribe(warm)
    warm_path.unlink()

    before = status_kib("VmRSS")
    reset_peak_rss()
    t0 = time.perf_counter()
    # No skipping: every byte of the flood goes through the splitter (the console would skip).
    viewer = await hub.subscribe(key, tail_source(path, holder, max_lag_bytes=None), flag_failures=True)
    rows = []
    samples = []
    while True:
        await asyncio.sleep(0.05)
        samples.append(status_kib("VmRSS"))
        got, _ = viewer.buffer.pop_batch()
        rows += got
        tail = holder.get("tail")
        if tail and tail.offset >= size:
            await asyncio.sleep(0.2)
            rows += viewer.buffer.pop_batch()[0]
            break
    elapsed = time.perf_counter() - t0
    peak = status_kib("VmHWM")
    tail = holder["tail"]
    print(
        f"flood      {size / (1 << 30):.2f} GiB without a newline (generated in {gen_s:.1f} s): read in "
        f"{elapsed:.2f} s "
        f"({size / elapsed / (1 << 20):,.0f} MiB/s); RSS before {before / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, "
        f"growth {(peak - before) / 1024:.1f} MiB (max sampled {max(samples) / 1024:.1f} MiB); "
        f"lines out: {len(rows)} ({', '.join(f'{len(r.text):,} chars' for r in rows[:3])}); "
        f"largest partial held {tail.splitter.peak_partial:,} chars"
    )
    await close_hub(hub, client, viewer, path)


async def main(args) -> None:
    import redis.asyncio

    client = redis.asyncio.from_url(REDIS_URL)
    async for name in client.scan_iter("tail-bench:*"):
        await client.delete(name)
    await client.aclose()
    try:
        with tempfile.TemporaryDirectory(prefix="tail-bench-", dir="/tmp") as tmp:
            tmp = Path(tmp)
            await burst(tmp, args.lines)
            for rate in args.rates:
                await sustained(tmp, rate, args.seconds)
            if not args.skip_flood:
                await flood(tmp, args.flood_gib)
    finally:
        client = redis.asyncio.from_url(REDIS_URL)
        async for name in client.scan_iter("tail-bench:*"):
            await client.delete(name)
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rates", type=int, nargs="*", default=[200_000, 300_000])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--flood-gib", type=float, default=1.0)
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument(
        "--layer",
        choices=["project", "list"],
        default="project",
        help="project: Redis Pub/Sub layer; list: RedisChannelLayer",
    )
    args = parser.parse_args()
    LAYER = args.layer
    asyncio.run(main(args))
