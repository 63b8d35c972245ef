"""The suite's fixtures, registered once: users in each role and their clients, the rq worker, the
admission queue's shutdown, the private dockerd, network namespaces, Firecracker environments and a
real daphne. Helpers that are not fixtures live in tests/support/."""

from __future__ import annotations

import os

import pytest

from tests.support.root import IN_CI, require_root


def pytest_sessionfinish(session, exitstatus):
    """Drop the tests' default nft table (settings_test.KICI_NFT_TABLE) and their agents' kept
    output (settings_test.KICI_AGENT_LOG_DIR), so nothing of the run outlives it."""
    import shutil

    from django.conf import settings

    if os.geteuid() == 0 and shutil.which("nft") and settings.configured:
        from tests.support.nft import drop_tables

        drop_tables(settings.KICI_NFT_TABLE)
    if settings.configured and "kici-test-agents-" in str(getattr(settings, "KICI_AGENT_LOG_DIR", "")):
        shutil.rmtree(settings.KICI_AGENT_LOG_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a private dockerd ``docker`` (so ``-m "not docker"`` never
    starts one), and run the browser tests last: Playwright's sync API leaves an event loop
    running in the main thread for the rest of the session, which breaks async tests after it."""
    for item in items:
        if {"dockerd", "prod_dockerd"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
    items.sort(key=lambda item: "tests/browser/" in item.nodeid.replace("\\", "/"))


# --- users in the role groups (operations.roles) and their clients ---------------------------------

#: user name suffix -> role group (created by the data migration); the outsider is in none.
ROLES = {
    "viewer": "viewers",
    "operator": "operators",
    "approver": "approvers",
    "approver2": "approvers",
    "outsider": None,
}


@pytest.fixture
def users(db):
    """``{"viewer", "operator", "approver", "approver2", "outsider"}`` -> users ``ops-<name>`` in the
    role groups (the outsider is in none). Password ``pw-<name>``."""
    from django.contrib.auth.models import Group, User

    made = {}
    for name, group in ROLES.items():
        user = User.objects.create_user(f"ops-{name}", password=f"pw-{name}")
        if group:
            user.groups.add(Group.objects.get(name=group))
        made[name] = User.objects.get(pk=user.pk)  # fresh: no cached permissions
    return made


@pytest.fixture
def viewer(users):
    return users["viewer"]


@pytest.fixture
def operator(users):
    return users["operator"]


@pytest.fixture
def approver(users):
    return users["approver"]


@pytest.fixture
def outsider(users):
    return users["outsider"]


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def approver_client(client, approver):
    client.force_login(approver)
    return client


@pytest.fixture
def outsider_client(client, outsider):
    client.force_login(outsider)
    return client


@pytest.fixture
def csrf_client():
    """A test client that enforces CSRF like a browser-facing server does."""
    from django.test import Client

    return Client(enforce_csrf_checks=True)


# --- rq and admission ----------------------------------------------------------------------------


@pytest.fixture
def empty_queues():
    """Every configured rq queue starts empty (the suite's own Redis database is shared by its
    tests); modules that count or run queued jobs use it with ``pytest.mark.usefixtures``."""
    import django_rq
    from django.conf import settings

    for name in settings.RQ_QUEUES:
        django_rq.get_queue(name).empty()


@pytest.fixture
def run_rq_jobs():
    """Run every queued rq job with a burst-mode SimpleWorker (no fork: shares the test's DB safely);
    ``queue_names`` may name another host's queue (``host:<name>``)."""
    from django.conf import settings
    from rq import SimpleWorker

    from scalers.hosts import queue_named

    def run(*queue_names: str) -> int:
        names = queue_names or tuple(settings.RQ_QUEUES)
        queues = [queue_named(n) for n in names]
        worker = SimpleWorker(queues, connection=queues[0].connection, serializer=settings.KICI_JOB_SERIALIZER)
        worker.work(burst=True)
        return worker.successful_job_count if hasattr(worker, "successful_job_count") else 0

    return run


@pytest.fixture
def drive_rq():
    """``drive(done, timeout=20.0, *queue_names)``: run ONE burst-mode SimpleWorker with the rq
    scheduler over and over (every 0.1 s) until ``done()`` is true or ``timeout`` s passed; returns
    ``done()``. Scheduled jobs (the registration watch) run when due, as under
    ``rqworker --with-scheduler``; jobs run one at a time, as on a host queue with one worker."""
    import time

    import django_rq
    from django.conf import settings
    from rq import SimpleWorker

    def drive(done, timeout: float = 20.0, *queue_names: str) -> bool:
        names = queue_names or (settings.KICI_HOST_QUEUE,)
        queues = [django_rq.get_queue(n) for n in names]
        deadline = time.monotonic() + timeout
        while True:
            SimpleWorker(queues, connection=queues[0].connection, serializer=settings.KICI_JOB_SERIALIZER).work(
                burst=True, with_scheduler=True
            )
            if done():
                return True
            if time.monotonic() >= deadline:
                return bool(done())
            time.sleep(0.1)

    return drive


@pytest.fixture
def stop_admission_queue():
    """The test starts and ends without a decider thread (it holds a DB connection) and with an
    empty world cache. Modules that admit use it with ``pytest.mark.usefixtures``."""
    from scalers.admission.matching import WORLD_CACHE
    from scalers.admission.queue import shutdown_queue

    WORLD_CACHE.clear()
    yield
    shutdown_queue()
    WORLD_CACHE.clear()


@pytest.fixture
def no_enqueue(monkeypatch):
    """Admission admits, but hands no spawn to the rq job: the agents stay as admission wrote them."""
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)


@pytest.fixture
def config_file(tmp_path, settings):
    """A valid scalers.yaml with one container scaler ``ops-reload``, made the configured file
    (``KICI_SCALER_CONFIG_PATH``, no drop-ins); returns its path."""
    from tests.support.operations import write_config

    settings.KICI_SCALER_CONFIG_PATH = write_config(tmp_path / "scalers.yaml", "ops-reload")
    settings.KICI_SCALER_CONFIG_DIR = None
    return settings.KICI_SCALER_CONFIG_PATH


@pytest.fixture
def daphne_server(transactional_db, settings):
    """A real daphne (the production ASGI server) on a free loopback port, serving this test's
    database; yields its base URL."""
    from django.db import connection

    from tests.support.servers import daphne_server as serve

    with serve(connection.settings_dict, settings.KICI_API_TOKEN or "") as url:
        yield url


# --- private dockerd (tests/support/docker.py) ---------------------------------------------------


@pytest.fixture(scope="session")
def dockerd():
    """``DOCKER_HOST`` URL of the private test dockerd, started (or reused) for this session.

    Fails (never skips) in CI when the daemon cannot start; skips elsewhere.
    """
    from tests.support.docker import DockerdUnavailable, ensure_private_dockerd

    try:
        return ensure_private_dockerd()
    except DockerdUnavailable as exc:
        if IN_CI:
            pytest.fail(f"the private test dockerd could not start: {exc}")
        pytest.skip(f"private dockerd unavailable: {exc}")


@pytest.fixture
def docker_client(dockerd, settings):
    """A docker SDK client on the private dockerd; ``settings.DOCKER_HOST`` points at it too."""
    from tests.support.docker import docker_client as make_client

    settings.DOCKER_HOST = dockerd
    client = make_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def agent_image(dockerd):
    """Build (or reuse) the agent image ``kici-agent:local`` (sandbox_agent/build_image.sh) on the private dockerd."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "sandbox_agent" / "build_image.sh"
    env = {**os.environ, "DOCKER_HOST": dockerd}
    proc = subprocess.run(["sh", str(script), "kici-agent:local"], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"sandbox_agent/build_image.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return "kici-agent:local"


@pytest.fixture(scope="session")
def prod_dockerd():
    """The production-shaped dockerd (tests/support/prod_docker.py): started once per session in
    a network namespace of its own, with its own iptables and ip6tables; yields that namespace
    (a ``network_lab.Netns``). Stopped, its namespace deleted, at the end of the session. Fails (never
    skips) in CI when it cannot start; skips elsewhere."""
    from tests.support.prod_docker import (
        ProdDockerdUnavailable,
        build_agent_image,
        start_prod_dockerd,
        stop_prod_dockerd,
    )

    try:
        ns = start_prod_dockerd()
        build_agent_image()
    except ProdDockerdUnavailable as exc:
        stop_prod_dockerd()
        if IN_CI:
            pytest.fail(f"the production-shaped dockerd could not start: {exc}")
        pytest.skip(f"production-shaped dockerd unavailable: {exc}")
    yield ns
    stop_prod_dockerd()


# --- network namespaces and Firecracker (root) ---------------------------------------------------


@pytest.fixture
def netns_nft(settings):
    """Operations' nft (and Firecracker link) commands run inside a namespace of our own, so no rule
    lands in the host's tables; yields an NftClient on table ``ops_kici`` (= KICI_NFT_TABLE) there."""
    import secrets
    import subprocess

    from network.nft.apply import NftClient

    require_root()
    name = f"ops-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    settings.KICI_NFT_NETNS = name
    settings.KICI_NFT_TABLE = "ops_kici"
    yield NftClient("ops_kici", netns=name)
    subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture
def fc_env(tmp_path):
    """One test's Firecracker world (tests.support.firecracker.FcEnv), torn down afterwards."""
    from tests.support.firecracker import make_fc_env, teardown_fc_env

    env = make_fc_env(tmp_path)
    yield env
    teardown_fc_env(env)
