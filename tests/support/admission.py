"""Admission for tests: ``request_scale``, a scale request through the ``/scale`` view's path
without HTTP."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import connection, transaction

from scalers.admission.decide import ScaleDecision, decide_batch
from scalers.admission.queue import get_queue
from scalers.admission.service import scale_request
from scalers.admission.validate import InvalidScaleRequest, validate_idempotency_key, validate_scale_request
from scalers.credentials import credential_problem
from scalers.jobs import enqueue_spawn_or_fail
from scalers.models import ScaleOutcome


def request_scale(
    labels: Any,
    job_id: Any,
    resources: Any = None,
    run_id: str = "",
    exclude: Any = (),
    warm: bool = False,
    *,
    job_image: dict | None = None,
    idempotency_key: str = "",
    timeout: float | None = 30.0,
) -> ScaleDecision:
    """Ask for an agent as ``POST /api/v1/scale`` does: the body (``labels``, ``jobId``,
    ``resources``, ``runId``, ``exclude``, ``container`` = ``job_image``) is validated by
    ``validate_scale_request``, the ``Idempotency-Key`` and a ``credentialsRef`` are checked, and
    the request is decided; a ``spawning`` decision's spawn is enqueued by
    ``enqueue_spawn_or_fail``. ``warm=True`` makes it an unbound warm spawn (as a warm pool asks).

    Outside a transaction it joins this process's admission queue, as the view's request does.
    Inside one (a ``django_db`` test, or ``transaction.atomic``), where the queue's own connection
    could not see the caller's rows, its batch is decided on the caller's connection and the spawn
    enqueued when the caller commits. Raises ``InvalidScaleRequest`` naming the field (nothing
    written), ``AdmissionTimeout``, or the database error of its batch.
    """
    body: dict[str, Any] = {"labels": list(labels) if isinstance(labels, tuple) else labels, "jobId": job_id}
    if resources is not None:
        body["resources"] = resources
    if run_id:
        body["runId"] = run_id
    if exclude:
        body["exclude"] = list(exclude)
    if job_image is not None:
        body["container"] = job_image
    data = validate_scale_request(body)
    key = validate_idempotency_key(idempotency_key or None)
    if data.container and data.container.credentials_ref:
        if problem := credential_problem(data.container.credentials_ref, data.container.image):
            raise InvalidScaleRequest("container.credentialsRef", problem)
    request = dataclasses.replace(scale_request(data, key), warm=warm)
    if not connection.in_atomic_block:
        decision, admitted = get_queue().submit(request, timeout=timeout)
        if decision.action == ScaleOutcome.SPAWNING and admitted is not None:
            decision = enqueue_spawn_or_fail(decision, admitted)
        return decision
    result = decide_batch([request])
    decision = result.decisions[0]
    if decision.action == ScaleOutcome.SPAWNING:
        agent = result.admitted[0]
        transaction.on_commit(lambda: enqueue_spawn_or_fail(decision, agent))
    return decision
