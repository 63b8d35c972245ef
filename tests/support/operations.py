"""Fixtures shared by tests/test_operations*.py: the three roles, an outsider, a listening rq worker,
a scalers.yaml on disk. Import with ``from tests.support.operations import *``."""

from __future__ import annotations

import contextlib
import textwrap
import uuid

import pytest

__all__ = [
    "users",
    "listening_worker",
    "config_file",
    "write_config",
    "csrf_client",
    "login",
    "netns_nft",
    "approve_and_run",
    "outcome",
]

CONTAINER_CONFIG = """
version: 1
globalMaxAgents: 10
scalers:
  - name: {name}
    type: container
    maxAgents: 3
    labelSets:
      - labels: ['linux', '{label}']
        image: 'kici-agent:local'
"""


@pytest.fixture
def users(db):
    """``{"viewer", "operator", "approver", "approver2", "outsider"}`` → users in the role groups
    created by the data migration (the outsider is in none). Password ``pw-<name>``."""
    from django.contrib.auth.models import Group, User

    made = {}
    for name, group in [
        ("viewer", "viewers"),
        ("operator", "operators"),
        ("approver", "approvers"),
        ("approver2", "approvers"),
        ("outsider", None),
    ]:
        user = User.objects.create_user(f"ops-{name}", password=f"pw-{name}")
        if group:
            user.groups.add(Group.objects.get(name=group))
        made[name] = User.objects.get(pk=user.pk)  # fresh: no cached permissions
    return made


def login(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def csrf_client():
    """A test client that enforces CSRF like a browser-facing server does."""
    from django.test import Client

    return Client(enforce_csrf_checks=True)


@contextlib.contextmanager
def listening_worker(queue_name: str):
    """Register a real rq worker on ``queue_name`` (as ``rqworker`` does at start) for the block, so
    the "is anyone listening?" check sees it; jobs are then run with the ``run_rq_jobs`` fixture."""
    import django_rq
    from rq import SimpleWorker

    queue = django_rq.get_queue(queue_name)
    worker = SimpleWorker([queue], connection=queue.connection, name=f"ops-test-{uuid.uuid4().hex[:8]}")
    worker.register_birth()
    try:
        yield worker
    finally:
        worker.register_death()


def write_config(path, name: str, label: str = "ops") -> str:
    path.write_text(textwrap.dedent(CONTAINER_CONFIG.format(name=name, label=label)))
    return str(path)


@pytest.fixture
def config_file(tmp_path):
    """A valid scalers.yaml with one container scaler ``ops-reload`` (returns its path)."""
    return write_config(tmp_path / "scalers.yaml", "ops-reload")


@pytest.fixture
def netns_nft(settings):
    """Operations' nft (and Firecracker link) commands run inside a namespace of our own, so no rule
    lands in the host's tables; yields an NftClient on table ``ops_kici`` (= KICI_NFT_TABLE) there."""
    import secrets
    import subprocess

    from tests.conftest import require_root

    require_root()
    from network.nft.apply import NftClient

    name = f"ops-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    settings.KICI_NFT_NETNS = name
    settings.KICI_NFT_TABLE = "ops_kici"
    yield NftClient("ops_kici", netns=name)
    subprocess.run(["ip", "netns", "delete", name], check=False)


def approve_and_run(op, approver, run_rq_jobs):
    """Approve ``op`` while a worker listens on its host queue, run the queued job, return ``op`` reloaded."""
    from operations.services import approve_operation

    with listening_worker(op.host_queue):
        approve_operation(op, approver)
    run_rq_jobs(op.host_queue)
    op.refresh_from_db()
    return op


def outcome(op, key):
    """``(outcome, detail)`` recorded for target ``key`` of ``op``."""
    return op.outcomes[key]["outcome"], op.outcomes[key]["detail"]
