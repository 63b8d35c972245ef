"""``POST /api/v1/scale``: the orchestrator asks for an agent for one job.

Request: JSON ``{labels: [str, ...], jobId: str, resources?: {...}, runId?: str, exclude?: [str]}``
with ``Authorization: Bearer <KICI_API_TOKEN>``.

Answers (JSON):

* 201 ``{agentId, scaler, backendType}``: admitted; the agent is spawning.
* 200 ``{agentId, scaler, backendType, warm: true}``: an idle warm agent was bound to the job.

Errors have the one ``/api/v1`` shape (``kici_site.errors.api_error``)
``{"error": {"code", "message", "field"?}, "reason": code, ...}``; ``reason`` and the extras below
stay at the top level, where orchestrators read them:

* 409 ``{reason: "at-capacity", cap, scaler}``: a cap refused; the job should wait.
* 422 ``{reason: "exceeds-cap", cap, scaler, detail}``: the request alone is larger than resource
  cap ``cap`` (scaler, global or machine pool): it can never be admitted while that cap stands, so
  retrying cannot help (nothing is reserved; the request is recorded with that outcome). Answering
  at-capacity here would make an orchestrator retry forever.
* 422 ``{reason: "no-matching-label-set", labels}``.
* 400 ``{reason: "invalid-request"}`` with ``error.field``: malformed JSON, missing or empty
  labels, non-string labels, negative or huge resources, unknown fields (413 for a huge body).
* 401 ``{reason: "unauthorized"}`` without the right bearer token.
* 405 ``{reason: "method-not-allowed"}`` for anything but POST.
* 503 ``{reason: "skipped" | "unavailable"}``: provision backoff, unresolvable resources, database or
  spawn queue unavailable (with ``Retry-After``).

The view is async: while a request waits for its batch it holds no thread and no database
connection (see ``scalers.admission.queue``). Nothing is written unless the decision is
``spawning``/``assigned``, and then atomically.
"""

from __future__ import annotations

import hmac
import json
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, close_old_connections
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from kici_site.errors import api_error
from scalers.admission.decide import Request
from scalers.admission.queue import AdmissionTimeout, get_queue
from scalers.admission.validate import InvalidScaleRequest, validate_scale_request
from scalers.jobs import enqueue_spawn_or_fail
from scalers.models import ScaleOutcome

log = logging.getLogger(__name__)


def _enqueue_in_worker(decision, agent):
    """Enqueue the spawn from an executor thread, then let that thread's connection go the way
    ``CONN_MAX_AGE`` says (the request cycle that would close it does not run in this thread)."""
    try:
        return enqueue_spawn_or_fail(decision, agent)
    finally:
        close_old_connections()


def _error(status: int, reason: str, message: str, *, field: str | None = None, **extra) -> JsonResponse:
    """``kici_site.errors.api_error`` with ``reason`` as the code (module doc)."""
    return api_error(status, reason, message, field=field, **extra)


def _authorized(request) -> bool | None:
    """True/False for the bearer token; None when no token is configured."""
    expected = settings.KICI_API_TOKEN
    if not expected:
        return None
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(token.strip().encode(), expected.encode())


@csrf_exempt
async def scale(request):
    """Admit (or refuse) one job; see the module docstring for the answers."""
    if request.method != "POST":
        response = _error(405, "method-not-allowed", f"{request.method} is not allowed here; allowed: POST")
        response["Allow"] = "POST"
        return response
    auth = _authorized(request)
    if auth is None:
        return _error(503, "unavailable", "KICI_API_TOKEN is not configured on this console")
    if not auth:
        return _error(401, "unauthorized", "send Authorization: Bearer <KICI_API_TOKEN>")
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, "invalid-request", "request body too large", field="body")
    try:
        payload = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(400, "invalid-request", f"malformed JSON: {exc}", field="body")
    try:
        data = validate_scale_request(payload)
    except InvalidScaleRequest as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)

    req = Request(
        labels=data.labels,
        job_id=data.job_id,
        resources=data.resources,
        run_id=data.run_id,
        exclude=data.exclude,
        raw_resources=data.raw_resources,
    )
    try:
        decision, agent = await get_queue().submit_async(req)
    except AdmissionTimeout as exc:
        return _error(503, "unavailable", str(exc))
    except DatabaseError as exc:
        log.warning("scale request %s: database error %s", data.job_id, exc)
        return _error(503, "unavailable", "database unavailable")
    if decision.action == ScaleOutcome.SPAWNING and agent is not None:
        decision = await sync_to_async(_enqueue_in_worker, thread_sensitive=False)(decision, agent)

    if decision.action == ScaleOutcome.SPAWNING:
        return JsonResponse(
            {"agentId": decision.agent, "scaler": decision.scaler, "backendType": decision.backend_type}, status=201
        )
    if decision.action == ScaleOutcome.ASSIGNED:
        return JsonResponse(
            {"agentId": decision.agent, "scaler": decision.scaler, "backendType": decision.backend_type, "warm": True},
            status=200,
        )
    if decision.action == ScaleOutcome.AT_CAPACITY:
        return _error(409, "at-capacity", decision.reason, cap=decision.cap, scaler=decision.scaler)
    if decision.action == ScaleOutcome.EXCEEDS_CAP:
        return _error(
            422, "exceeds-cap", decision.reason, cap=decision.cap, scaler=decision.scaler, detail=decision.reason
        )
    if decision.action == ScaleOutcome.NO_BACKEND:
        return _error(
            422,
            "no-matching-label-set",
            f"no label set of any scaler matches {list(data.labels)}",
            labels=list(data.labels),
        )
    return _error(503, "skipped", decision.reason)
