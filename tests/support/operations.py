"""Operations driven for real: a listening rq worker, a scalers.yaml on disk, approve-and-run, outcomes."""

from __future__ import annotations

import contextlib
import textwrap
import uuid

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


def login(client, user):
    client.force_login(user)
    return client


@contextlib.contextmanager
def listening_worker(queue_name: str):
    """Register a real rq worker on ``queue_name`` (as ``rqworker`` does at start) for the block, so
    the "is anyone listening?" check sees it; jobs are then run with the ``run_rq_jobs`` fixture."""
    from django.conf import settings
    from rq import SimpleWorker

    from scalers.hosts import queue_named

    queue = queue_named(queue_name)
    worker = SimpleWorker(
        [queue],
        connection=queue.connection,
        serializer=settings.KICI_JOB_SERIALIZER,
        name=f"ops-test-{uuid.uuid4().hex[:8]}",
    )
    worker.register_birth()
    try:
        yield worker
    finally:
        worker.register_death()


def write_config(path, name: str, label: str = "ops") -> str:
    path.write_text(textwrap.dedent(CONTAINER_CONFIG.format(name=name, label=label)))
    return str(path)


def approve_and_run(op, approver, run_rq_jobs, *, confirm_warnings: bool = False):
    """Approve ``op`` while a worker listens on its host queue (``confirm_warnings``: its warnings
    confirmed read), run the queued job, return ``op`` reloaded."""
    from operations.services import approve_operation

    with listening_worker(op.host_queue):
        approve_operation(op, approver, warnings_confirmed=confirm_warnings)
    run_rq_jobs(op.host_queue)
    op.refresh_from_db()
    return op


def outcome(op, key):
    """``(outcome, detail)`` recorded for target ``key`` of ``op``."""
    return op.outcomes[key]["outcome"], op.outcomes[key]["detail"]
