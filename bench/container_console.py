"""What numbering a container's console costs: the first pump's count, a later pump, a page.

    REDIS_URL=redis://127.0.0.1:6379/<db> SECRET_KEY=x .venv/bin/python bench/container_console.py [LINES]

On the private test dockerd (``tests.support.docker``; the agent image is built with
``sandbox_agent/build_image.sh``) a container writes LINES stdout lines (default 150,000, about 80 bytes
each) and one stderr line every 7th; then ``live.sources.docker_log_source`` reads it twice (the
first counts from docker's kept log and leaves checkpoints, the second starts from one) and
``consolelog.dockerlogs.read_lines_before`` reads a page of 500 lines near the start. Prints the
seconds of each and checks both pumps numbered the backlog alike. Loopback only.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/ (bench/operations.py)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings_test")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402

from consolelog.dockerlogs import RedisCheckpoints, read_lines_before  # noqa: E402
from consolelog.tail import StampedLine  # noqa: E402
from live.sources import docker_log_source  # noqa: E402
from tests.support.docker import docker_client, ensure_private_dockerd  # noqa: E402


def main(lines: int) -> None:
    os.environ["DOCKER_HOST"] = ensure_private_dockerd()
    subprocess.run(["sh", "sandbox_agent/build_image.sh", "kici-agent:local"], check=True, capture_output=True)
    client = docker_client()
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    checkpoints = RedisCheckpoints(store, f"bench-{uuid.uuid4().hex[:6]}")
    total = lines + lines // 7
    script = (
        f"i=1; while [ $i -le {lines} ]; do echo out $i build step output with some payload to make it "
        "plausible; [ $((i % 7)) = 0 ] && echo err $i >&2; i=$((i+1)); done; echo end; sleep 120"
    )
    container = client.containers.run(
        "kici-agent:local", ["sh", "-c", script], detach=True, network_mode="none", labels={"kici.test": "bench"}
    )
    try:
        while b"end" not in container.logs(tail=1):
            time.sleep(0.3)
        container.reload()

        async def pump():
            got = []
            async for batch in docker_log_source(container, checkpoints):
                got.extend(line for line in batch if isinstance(line, StampedLine))
                if got[-1].text == "end":
                    return got

        started = time.monotonic()
        first = asyncio.run(pump())
        counted = time.monotonic() - started
        started = time.monotonic()
        second = asyncio.run(pump())
        again = time.monotonic() - started
        assert [(line.n, line.text) for line in first] == [(line.n, line.text) for line in second]
        assert first[-1].n == total + 1
        started = time.monotonic()
        page = read_lines_before(container, checkpoints, 1200, 500)
        paged = time.monotonic() - started
        assert page.first == 700 and len(page.lines) == 500
        size = sum(len(line) + 1 for line in first)  # of the backlog only: for scale
        print(
            f"{total + 1} lines: first pump {counted:.2f} s, later pump {again:.2f} s, "
            f"page of 500 near the start {paged:.3f} s ({store.zcard(checkpoints.marks)} checkpoints, "
            f"backlog {len(first)} lines, {size} bytes)"
        )
    finally:
        container.remove(force=True)
        store.delete(checkpoints.marks, checkpoints.top_key)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150_000)
