"""The console's own Redis as `make run` starts it (scripts/lib.sh start_private_redis): only its
user, with its password, reaches it; redis-py, django-rq, rq and channels-redis all take its URL
(unix://...?db=&password=), and the password form of a shared TCP Redis (docs/multi-host.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from channels_redis.pubsub import RedisPubSubChannelLayer
from django_rq.connection_utils import get_redis_connection
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from tests.support.root import require_root

ROOT = Path(__file__).resolve().parents[2]


def double(n: int) -> int:
    return 2 * n


def _make_run_redis(checkout: Path) -> subprocess.CompletedProcess:
    """What `make run` does for its Redis (scripts/lib.sh load_env, ensure_console_redis) in
    ``checkout``, a scratch copy holding only scripts/lib.sh; prints the REDIS_URL it exports."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        ["bash", "-c", '. "$1/scripts/lib.sh" && load_env && ensure_console_redis && echo "$REDIS_URL"', "_",
         str(checkout)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def console_redis():
    """``(directory, password, url)`` of the Redis `make run` starts, in a scratch checkout whose
    parents anyone may traverse (so only var/run/redis/'s own mode guards it)."""
    checkout = Path(tempfile.mkdtemp(prefix="kici-redis-test-"))
    checkout.chmod(0o755)
    (checkout / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lib.sh", checkout / "scripts" / "lib.sh")
    directory = checkout / "var" / "run" / "redis"
    try:
        started = _make_run_redis(checkout)
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip().splitlines()[-1]
        password = url.rpartition("password=")[2]
        assert url == f"unix://{directory}/redis.sock?db=0&password={password}" and len(password) == 48
        assert (checkout / "var" / "env").read_text() == f"export REDIS_URL='{url}'\n"
        assert stat.S_IMODE((checkout / "var" / "env").stat().st_mode) == 0o600
        yield directory, password, url
    finally:
        with contextlib.suppress(redis.RedisError, NameError):
            redis.Redis.from_url(url).shutdown(nosave=True)
        shutil.rmtree(checkout, ignore_errors=True)


def test_a_restart_reuses_the_consoles_redis_and_its_password(console_redis):
    directory, _, url = console_redis
    checkout = directory.parents[2]
    redis.Redis.from_url(url).set("kept", "1")
    again = _make_run_redis(checkout)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == url and "starting" not in again.stdout
    assert redis.Redis.from_url(url).get("kept") == b"1", "the running Redis was reused"
    redis.Redis.from_url(url).shutdown(nosave=True)
    restarted = _make_run_redis(checkout)  # the Redis a stopped make run took down: started again, same URL
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.strip().splitlines()[-1] == url and "starting the console's Redis" in restarted.stdout
    assert (checkout / "var" / "env").read_text().count("REDIS_URL") == 1


@pytest.fixture
def tcp_redis():
    """A Redis with a password on a free loopback port: a shared Redis of several hosts in miniature."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = secrets.token_hex(16)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password, "--save", "",
         "--appendonly", "no", "--dir", tempfile.gettempdir()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://:{password}@127.0.0.1:{port}/3"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the TCP Redis did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.root
def test_another_local_user_cannot_reach_the_consoles_redis(console_redis):
    require_root()
    directory, password, url = console_redis
    sock = str(directory / "redis.sock")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "redis.conf").stat().st_mode) == 0o600
    assert redis.Redis.from_url(url).config_get("port") == {"port": "0"}, "no TCP port"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(unix_socket_path=sock).ping()  # root without the password

    # nobody, even knowing the password, cannot open the socket's directory
    denied = _as_nobody("env", f"REDISCLI_AUTH={password}", "redis-cli", "-s", sock, "ping")
    assert "PONG" not in denied.stdout and "Permission denied" in denied.stdout + denied.stderr

    # with the directory opened up, the password still refuses nobody's commands
    directory.chmod(0o755)
    os.chmod(sock, 0o777)
    refused = _as_nobody("redis-cli", "-s", sock, "lpush", "rq:queue:default", "x")
    assert "NOAUTH" in refused.stdout + refused.stderr
    assert redis.Redis.from_url(url).llen("rq:queue:default") == 0


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_every_client_takes_the_url_with_its_password(kind, request):
    url = request.getfixturevalue("console_redis")[2] if kind == "unix" else request.getfixturevalue("tcp_redis")
    assert redis.Redis.from_url(url).ping()
    # django-rq's connection from RQ_QUEUES' "URL", a JSON queue and a real rq worker on it
    connection = get_redis_connection({"URL": url})
    queue = Queue(f"url-{kind}", connection=connection, serializer=JSONSerializer)
    job = queue.enqueue(double, 21)
    SimpleWorker([queue], connection=connection, serializer=JSONSerializer).work(burst=True)
    assert job.return_value(refresh=True) == 42

    async def round_trip():
        layer = RedisPubSubChannelLayer(hosts=[{"address": url, "socket_timeout": None}], prefix="url-test.")
        try:
            channel = await layer.new_channel()
            await layer.group_add("g", channel)
            await layer.group_send("g", {"type": "x.y", "n": 1})
            return await asyncio.wait_for(layer.receive(channel), 10)
        finally:
            await layer.flush()

    assert asyncio.run(round_trip()) == {"type": "x.y", "n": 1}


@pytest.mark.root
def test_the_suites_own_redis_refuses_another_local_user():
    """`make test` runs the suite on a Redis of its own (scripts/lib.sh ensure_suite_redis) that
    refuses a client without its password, kept where only root reads it: another local user
    cannot queue jobs for the suite's workers, which run as root."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from tests.support.root import IN_CI

    require_root()
    parts = urlsplit(settings.REDIS_URL)
    if not parts.password:
        if IN_CI:
            pytest.fail(f"CI runs the suite on the password-protected Redis of make test, not {parts.hostname}")
        pytest.skip("this run's Redis has no password (a plain pytest, not make test)")
    where = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    refused = _as_nobody("redis-cli", *where, "rpush", "rq:queue:default", "x")
    assert "NOAUTH" in refused.stdout + refused.stderr, refused
    unread = _as_nobody("cat", str(ROOT / "var" / "run" / "test-redis" / "password"))
    assert unread.returncode != 0 and "Permission denied" in unread.stderr, unread
