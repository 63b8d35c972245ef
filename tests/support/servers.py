"""The console served for real in a test: Django's WSGI app on a thread, daphne (the operator's
ASGI server), the agents' gateway or the orchestrator's API processes (``kici_site.gateway``) in
subprocesses; and free loopback ports for them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def wsgi_server(host: str, port: int):
    """Serve the Django WSGI app threaded on ``host:port`` (the test's own bridge or loopback)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server(host, port, get_wsgi_application(), server_class=Server, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def run_daphne(
    db: dict, endpoints: list[str], *, operator_listen: str, extra_env: dict | None = None
) -> Iterator[None]:
    """A real daphne (the production ASGI server) on ``endpoints`` (twisted endpoint strings on
    loopback addresses), serving the database ``db`` (a Django settings dict), with
    ``KICI_OPERATOR_LISTEN`` set to ``operator_listen``. Waits until the first endpoint answers;
    stopped (SIGTERM, then SIGKILL) when the block ends. Raises RuntimeError with daphne's output
    when it does not answer within 30 s."""
    import os
    import subprocess
    import sys
    import time

    import requests

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": (
            f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        "ALLOWED_HOSTS": "127.0.0.1,localhost,127.0.0.2",
        "KICI_OPERATOR_LISTEN": operator_listen,
        "LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    args = [arg for endpoint in endpoints for arg in ("-e", endpoint)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", *args, "kici_site.asgi:application"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    first = dict(part.split("=", 1) for part in endpoints[0].split(":")[1:])
    url = f"http://{first['interface']}:{first['port']}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(url + "/healthz", timeout=1)
            break
        except (requests.ConnectionError, requests.Timeout):  # a loaded machine answers late
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"daphne did not start: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)
    try:
        yield
    finally:
        stop_process(proc)


@contextmanager
def operator_server(db: dict, port: int, extra_env: dict | None = None) -> Iterator[None]:
    """``python -m kici_site.operator_server`` (as make run starts it) on 127.0.0.1:``port``,
    serving the database ``db`` (``extra_env`` added to its environment); waits until the port
    accepts, stopped when the block ends. RuntimeError when it does not listen within 30 s."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "kici_site.operator_server"],
        cwd=REPO,
        env=server_env(db, f"127.0.0.1:{port}", extra_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the operator server did not start")
            time.sleep(0.2)
        yield
    finally:
        stop_process(proc)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def stop_process(proc) -> None:
    """Stop a server process: SIGTERM, then SIGKILL when it has not left within 10 s."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextmanager
def daphne_server(db: dict, api_token: str) -> Iterator[str]:
    """A real daphne on a free loopback port (the operator listener) serving the database ``db``;
    yields its base URL."""
    port = free_port()
    with run_daphne(
        db,
        [f"tcp:port={port}:interface=127.0.0.1"],
        operator_listen=f"127.0.0.1:{port}",
        extra_env={"KICI_API_TOKEN": api_token},
    ):
        yield f"http://127.0.0.1:{port}"


def server_env(db: dict, operator_listen: str, extra_env: dict | None = None) -> dict[str, str]:
    """The environment of a server process serving the database ``db`` (a Django settings dict)."""
    import os

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": (
            f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        "ALLOWED_HOSTS": "127.0.0.1,localhost,127.0.0.2",
        "KICI_OPERATOR_LISTEN": operator_listen,
        "LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }


@contextmanager
def run_gateway(
    db: dict,
    listen: str,
    *,
    operator_listen: str,
    processes: int = 1,
    extra_env: dict | None = None,
    api: bool = False,
) -> Iterator[list]:
    """``processes`` gateway processes (``python -m kici_site.gateway``, as make run starts them;
    with ``api`` the orchestrator's API processes, ``--api``) sharing ``listen`` (``host:port`` on
    loopback), serving the database ``db`` with a pool of 2.
    Yields their ``subprocess.Popen`` objects once the address answers; stopped (SIGTERM, then
    SIGKILL) when the block ends. RuntimeError with their output when none answers within 30 s."""
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    import requests

    env = server_env(db, operator_listen, {"KICI_DB_POOL_SIZE": "2", **(extra_env or {})})
    # Their output goes to a file: a pipe nobody reads fills up and stops a process that logs.
    log = tempfile.TemporaryFile()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kici_site.gateway", *(["--api"] if api else []), "--listen", listen],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        for _ in range(processes)
    ]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"http://{listen}/healthz", timeout=1)
                break
            except requests.ConnectionError:
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the gateway did not start: {log.read().decode()[-2000:]}") from None
                time.sleep(0.2)
        time.sleep(1)  # the other processes bind too
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            stop_process(proc)
        log.close()
