"""Shared fixtures: users with the three roles (viewer, operator, approver) and an rq SimpleWorker."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def require_root():
    """Fail (in CI) or skip (elsewhere) a test that needs root for netns/nft/TAPs."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("this test needs root (netns, nft, TAPs) and CI runs as root")
        pytest.skip("needs root")


def pytest_sessionfinish(session, exitstatus):
    """Drop the tests' default nft table (settings_test.KICI_NFT_TABLE) so no rule outlives the run."""
    import shutil
    import subprocess

    if os.geteuid() == 0 and shutil.which("nft"):
        subprocess.run(["nft", "delete", "table", "inet", "kicitest"], capture_output=True, check=False)


def pytest_collection_modifyitems(config, items):
    """Run the browser tests last: Playwright's sync API leaves an event loop running in the
    main thread for the rest of the session, which breaks async tests that come after it."""
    items.sort(key=lambda item: "tests/browser/" in item.nodeid.replace("\\", "/"))


@pytest.fixture
def run_rq_jobs():
    """Run every queued rq job with a burst-mode SimpleWorker (no fork: shares the test's DB safely)."""
    import django_rq
    from django.conf import settings
    from rq import SimpleWorker

    def run(*queue_names: str) -> int:
        names = queue_names or tuple(settings.RQ_QUEUES)
        queues = [django_rq.get_queue(n) for n in names]
        worker = SimpleWorker(queues, connection=queues[0].connection)
        worker.work(burst=True)
        return worker.successful_job_count if hasattr(worker, "successful_job_count") else 0

    return run


# --- private dockerd (helper ctr; see tests/support/docker.py) -------------------------------------------


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
    """Build (or reuse) the reference agent image ``kici-agent:local`` on the private dockerd."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "agent" / "build_image.sh"
    env = {**os.environ, "DOCKER_HOST": dockerd}
    proc = subprocess.run(["sh", str(script), "kici-agent:local"], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"agent/build_image.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return "kici-agent:local"
