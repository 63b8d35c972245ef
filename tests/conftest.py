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
