"""Helpers for the admission tests: scaler rows written straight to the database, threads that
each use their own database connection, and the admission queue shut down after each test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import pytest
from django.db import connection

from scalers.labels import normalize_label_set
from scalers.models import ConfigState, LabelSet, MachinePool, Scaler


@pytest.fixture(autouse=True)
def _stop_admission_queue():
    """Every test starts and ends without a decider thread (it holds a DB connection)."""
    from scalers.admission.matching import WORLD_CACHE
    from scalers.admission.queue import shutdown_queue

    WORLD_CACHE.clear()
    yield
    shutdown_queue()
    WORLD_CACHE.clear()


def set_global(
    max_agents: int = 50, cpu: float | None = None, memory: int | None = None, defaults: dict | None = None
) -> ConfigState:
    cfg = ConfigState.load()
    cfg.global_max_agents = max_agents
    cfg.global_max_cpu = cpu
    cfg.global_max_memory_bytes = memory
    cfg.defaults = defaults or {}
    cfg.save()
    return cfg


def make_pool(name: str, cpu: float | None = None, memory: int | None = None) -> MachinePool:
    return MachinePool.objects.create(name=name, max_cpu=cpu, max_memory_bytes=memory)


def make_scaler(
    name: str = "c",
    type: str = "container",
    max_agents: int = 5,
    label_sets: Iterable[Iterable[str]] = (("linux", "docker"),),
    *,
    max_concurrent_spawns: int = 1000,
    cpu: float | None = None,
    memory: int | None = None,
    pool: MachinePool | None = None,
    retiring: bool = False,
    warm_size: int | None = None,
    warm_idle_timeout: float = 300,
    label_set_config: dict | None = None,
    mandatory: Iterable[str] = (),
    roles=None,
    config: dict | None = None,
) -> Scaler:
    scaler = Scaler.objects.create(
        name=name,
        type=type,
        max_agents=max_agents,
        max_concurrent_spawns=max_concurrent_spawns,
        max_cpu=cpu,
        max_memory_bytes=memory,
        machine_pool=pool,
        retiring=retiring,
        mandatory_labels=list(mandatory),
        roles=roles,
        warm_pool_enabled=warm_size is not None,
        warm_pool_size=warm_size or 0,
        warm_pool_idle_timeout_seconds=warm_idle_timeout,
        config=config or {"name": name, "type": type},
    )
    for i, labels in enumerate(label_sets):
        labels = [x.lower() for x in labels]
        LabelSet.objects.create(
            scaler=scaler,
            index=i,
            labels=labels,
            normalized=normalize_label_set(labels),
            config={"labels": labels, "image": "a:1", **(label_set_config or {})},
        )
    return scaler


def run_threads(n: int, target: Callable[[int], object]) -> list:
    """Run ``target(i)`` in ``n`` threads started together; each closes its own DB connection.
    Returns the results in order; an exception in a thread is returned in its slot."""
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def daphne_server(transactional_db, settings):
    """A real daphne (the production ASGI server) on a free loopback port, serving this test's
    database; yields its base URL. Stopped (SIGTERM, then SIGKILL) at teardown."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests

    db = connection.settings_dict
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "KICI_API_TOKEN": settings.KICI_API_TOKEN or "",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "kici_site.asgi:application"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(url + "/metrics", timeout=1)
            break
        except requests.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"daphne did not start: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
