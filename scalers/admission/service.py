"""``request_scale``: the entry point every caller uses (the API view, warm pools, tests)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, transaction

from lib.wording import json_text
from scalers.credentials import credential_problem
from scalers.jobs import enqueue_spawn_or_fail
from scalers.models import ScaleOutcome

from .decide import Admitted, Request, ScaleDecision, decide_batch
from .queue import get_queue
from .validate import (
    InvalidScaleRequest,
    JobImage,
    ScaleInput,
    _labels,
    validate_container,
    validate_idempotency_key,
    validate_resources,
)


def request_scale(
    labels,
    job_id: str,
    resources: Any = None,
    run_id: str = "",
    exclude=(),
    warm: bool = False,
    *,
    job_image: JobImage | dict | None = None,
    idempotency_key: str = "",
    timeout: float | None = 30.0,
) -> ScaleDecision:
    """Decide whether a job may get an agent, and if so reserve it and enqueue its spawn.

    ``labels``: the job's ``runsOn`` (list of strings; ``[]`` routes to the first label set with
    an empty gate). ``job_id``/``run_id``: strings recorded on the agent and the request
    record. ``resources``: flat ``{cpus, memory}`` or nested ``{requests, limits}`` (cpus
    in cores, memory strings like ``"2g"``). ``exclude``: labels whose label sets must not
    be chosen. ``warm=True`` spawns an unbound warm agent instead. ``job_image``: the job's own
    image (a :class:`~.validate.JobImage` or the ``/scale`` ``container`` object); such a job never
    takes a warm agent, and only container label sets (bare-metal ones in container mode) run it.
    ``idempotency_key``: the ``/scale`` ``Idempotency-Key`` header ("" for none). A job with a live
    agent gets that agent again (``replayed``) or ``idempotency-mismatch``
    (:mod:`scalers.admission.idempotency`).

    Returns a :class:`ScaleDecision` (see there for ``action``). On ``spawning`` the agent row and
    its reservation are committed and the spawn is enqueued (``scalers.jobs.enqueue_spawn``); if
    enqueueing fails the agent is failed and released and ``skipped`` is returned.

    Raises :class:`InvalidScaleRequest` for malformed input (nothing written), ``AdmissionTimeout``
    when no batch took the request within ``timeout`` seconds, or the database error of its batch.

    Outside a transaction the request joins this process's group-commit queue
    (:mod:`scalers.admission.queue`); inside one (``transaction.atomic``) it is decided inline on
    the caller's connection and the spawn is enqueued when the caller commits.
    """
    labels = _labels(list(labels) if isinstance(labels, (list, tuple)) else labels, "labels", allow_empty=True)
    exclude = _labels(list(exclude or ()), "exclude", allow_empty=True)
    if not isinstance(job_id, str) or (not job_id.strip() and not warm):
        raise InvalidScaleRequest("jobId", f"must be a non-empty string, got {json_text(job_id)}")
    parsed = validate_resources(resources) if not hasattr(resources, "requests") else resources
    raw = resources.model_dump(mode="json", exclude_none=True) if hasattr(resources, "model_dump") else resources
    idempotency_key = validate_idempotency_key(idempotency_key or None)
    if isinstance(job_image, dict):
        job_image = validate_container(job_image)
    if job_image and job_image.credentials_ref:
        if problem := credential_problem(job_image.credentials_ref, job_image.image):
            raise InvalidScaleRequest("container.credentialsRef", problem)
    req = Request(
        labels=labels,
        job_id=job_id.strip(),
        resources=parsed,
        run_id=run_id or "",
        exclude=exclude,
        warm=warm,
        job_image=job_image,
        raw_resources=raw,
        idempotency_key=idempotency_key,
    )
    if connection.in_atomic_block or not getattr(settings, "KICI_ADMISSION_BATCHING", True):
        result = decide_batch([req])
        decision = result.decisions[0]
        if decision.action == ScaleOutcome.SPAWNING:
            agent = result.admitted[0]
            if connection.in_atomic_block:
                transaction.on_commit(lambda: enqueue_spawn_or_fail(decision, agent))
            else:
                decision = enqueue_spawn_or_fail(decision, agent)
        return decision
    decision, admitted = get_queue().submit(req, timeout=timeout)
    if decision.action == ScaleOutcome.SPAWNING and admitted is not None:
        decision = enqueue_spawn_or_fail(decision, admitted)
    return decision


async def decide_async(
    data: ScaleInput, idempotency_key: str = "", timeout: float | None = 30.0, *, token_name: str = ""
) -> tuple[ScaleDecision, Admitted | None]:
    """Queue a validated ``/scale`` body (or KiCI scale-up), its validated ``Idempotency-Key`` (its
    ``requestId``; "" for none) and the
    name of the API token that sent it for
    this process's admission batches and await the decision, without holding a thread. On
    ``spawning`` the agent and its reservation are committed and the admitted agent is returned;
    its spawn is not enqueued yet (``scalers.jobs.enqueue_spawn_or_fail`` does that). Whether
    ``container.credentialsRef`` exists is the caller's to check first. Raises ``AdmissionTimeout``
    or the database error of its batch.
    """
    request = Request(
        labels=data.labels,
        job_id=data.job_id,
        resources=data.resources,
        run_id=data.run_id,
        exclude=data.exclude,
        raw_resources=data.raw_resources,
        job_image=data.container,
        idempotency_key=idempotency_key,
        token_name=token_name,
        agent_id=data.agent_id,
        agent_labels=data.agent_labels,
        event=data.event,
    )
    return await get_queue().submit_async(request, timeout=timeout)
