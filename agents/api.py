"""Agent-facing API: registration, heartbeat, event-scaler claims (SPEC (d), (k)).

- ``POST /api/v1/agents/register`` — bearer: the single-use ephemeral token from
  ``KICI_AGENT_TOKEN``. Body (optional JSON): ``{"agentId": "..."}``. 200 →
  ``{agentId, scaler, boundJobId, runId, labels, mandatoryLabels, warm, sessionToken,
  heartbeatIntervalSeconds}``; 401 for a missing, unknown, expired or reused token (or an
  ``agentId`` that is not the token's); 409 when the agent is no longer spawning (its spawn was
  given up); 400 for malformed JSON.
- ``POST /api/v1/agents/<agent_id>/heartbeat`` — bearer: the session token. Body (optional):
  ``{"activeJobs": n}`` (integer 0..10000). 200 → ``{state, drain, stop}``; 410 with
  ``stop: true`` once the agent is destroyed or failed; 401 for a bad token; 400 for bad input.
- ``POST /api/v1/agents/claim`` — body ``{"claimCode": "..."}`` from a ``kici.scaler.scale-up``
  event; 200 → ``{agentId, token, orchestratorUrl, labels}``; 401 with the claim store's message
  (``invalid claim code`` / ``claim code already consumed`` / ``claim code expired``).
"""

from __future__ import annotations

import json
import logging
from functools import wraps

from django.db import transaction
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .choices import TERMINAL_STATES, AgentState, EventType
from .events import record_event
from .models import Agent
from .tokens import TokenRejected, authenticate_session, mint_session_token, redeem_registration_token

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_SECONDS = 5
MAX_ACTIVE_JOBS = 10_000


class BadRequest(Exception):
    pass


def _bearer(request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _json_body(request) -> dict:
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def _unauthorized(reason: str) -> JsonResponse:
    resp = JsonResponse({"error": "unauthorized", "reason": reason}, status=401)
    resp["WWW-Authenticate"] = "Bearer"
    return resp


def _bad_request(detail: str) -> JsonResponse:
    return JsonResponse({"error": "bad-request", "detail": detail}, status=400)


def _bearer_request(view):
    """Decorator of the bearer-authenticated endpoints: 401 without a bearer token, then 400 for a
    body that is not a JSON object; otherwise ``view(request, token, body, *args, **kwargs)``."""

    @wraps(view)
    def checked(request, *args, **kwargs):
        token = _bearer(request)
        if token is None:
            return _unauthorized("missing bearer token")
        try:
            body = _json_body(request)
        except BadRequest as exc:
            return _bad_request(str(exc))
        return view(request, token, body, *args, **kwargs)

    return checked


def _mandatory_labels(agent: Agent) -> list[str]:
    return list(agent.scaler.mandatory_labels or [])


def _registration_hooks(agent: Agent) -> None:
    """The backend's optional hooks after a registration, each failure logged, never fatal:
    ``mark_registered(agent)`` (firecracker: the VM's exit is no longer a boot failure) and
    ``clear_mmds(agent)`` (firecracker: SPEC d config.ack; the registration answer is this
    console's config, so the spent token leaves the metadata service now)."""
    try:
        from scalers.backends.base import get_backend

        backend = get_backend(agent.scaler)
    except Exception:  # noqa: BLE001
        log.warning("no backend for the registration hooks of %s", agent.agent_id, exc_info=True)
        return
    for name in ("mark_registered", "clear_mmds"):
        hook = getattr(backend, name, None)
        if hook is not None:
            try:
                hook(agent)
            except Exception:  # noqa: BLE001
                log.warning("%s of %s failed", name, agent.agent_id, exc_info=True)


@csrf_exempt
@require_POST
@_bearer_request
def register(request, raw: str, body: dict):
    """Redeem the ephemeral token once and mark the agent running (see the module doc)."""
    claimed_id = body.get("agentId")
    if claimed_id is not None and not isinstance(claimed_id, str):
        return _bad_request(f"agentId must be a string, got {claimed_id!r}")
    try:
        agent = redeem_registration_token(raw)
    except TokenRejected as exc:
        return _unauthorized(exc.reason)
    if claimed_id and claimed_id != agent.agent_id:
        return _unauthorized("agent-mismatch")
    now = timezone.now()
    with transaction.atomic():
        won = Agent.objects.filter(pk=agent.pk, state=AgentState.SPAWNING).update(
            state=AgentState.RUNNING, registered_at=now, last_heartbeat=now
        )
        if not won:
            current = Agent.objects.filter(pk=agent.pk).values_list("state", flat=True).first()
            return JsonResponse({"error": "not-spawning", "state": current}, status=409)
        agent.state, agent.registered_at, agent.last_heartbeat = AgentState.RUNNING, now, now
        session = mint_session_token(agent)
        record_event(agent, EventType.REGISTERED, "agent registered", payload={"remote": request.META.get("REMOTE_ADDR", "")})
    _registration_hooks(agent)
    return JsonResponse(
        {
            "agentId": agent.agent_id,
            "scaler": agent.scaler.name,
            "boundJobId": agent.bound_job_id or None,
            "runId": agent.run_id or None,
            "labels": list(agent.labels or []),
            "mandatoryLabels": _mandatory_labels(agent),
            "warm": not agent.bound_job_id,
            "sessionToken": session,
            "heartbeatIntervalSeconds": HEARTBEAT_INTERVAL_SECONDS,
        }
    )


@csrf_exempt
@require_POST
@_bearer_request
def heartbeat(request, raw: str, body: dict, agent_id: str):
    """Record a heartbeat from a registered agent (see the module doc)."""
    active = body.get("activeJobs")
    if active is not None and (not isinstance(active, int) or isinstance(active, bool) or not 0 <= active <= MAX_ACTIVE_JOBS):
        return _bad_request(f"activeJobs must be an integer 0..{MAX_ACTIVE_JOBS}, got {active!r}")
    try:
        agent = authenticate_session(raw, agent_id)
    except TokenRejected as exc:
        return _unauthorized(exc.reason)
    if agent.state in TERMINAL_STATES:
        return JsonResponse({"state": agent.state, "drain": False, "stop": True}, status=410)
    fields = {"last_heartbeat": timezone.now()}
    if active is not None:
        fields["active_jobs"] = active
    Agent.objects.filter(pk=agent.pk).update(**fields)
    return JsonResponse(
        {"state": agent.state, "drain": agent.state == AgentState.DRAINING, "stop": agent.state == AgentState.DESTROYING}
    )


@csrf_exempt
@require_POST
def claim(request):
    """Exchange an event scaler's claim code for a registration token (SPEC (k) claim store)."""
    from scalers.backends.claims import ClaimError, redeem_claim

    try:
        body = _json_body(request)
    except BadRequest as exc:
        return _bad_request(str(exc))
    code = body.get("claimCode")
    if not isinstance(code, str) or not code:
        return _bad_request(f"claimCode must be a non-empty string, got {code!r}")
    try:
        grant = redeem_claim(code)
    except ClaimError as exc:
        return JsonResponse({"error": "unauthorized", "reason": str(exc)}, status=401)
    return JsonResponse(grant)
