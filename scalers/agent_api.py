"""Agent-facing API: registration, heartbeat, event-scaler claims; the only routes the agents'
gateway serves. Each route's token, body and answers: docs/api-contract.md ("The agent's routes
and their answers")."""

from __future__ import annotations

import logging
from functools import wraps

from django.conf import settings
from django.db import DatabaseError, transaction
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.choices import TERMINAL_STATES, UNREGISTERED_STATES, AgentState, EventType
from agents.events import record_event
from agents.heartbeats import beat_with_session, store_heartbeat
from agents.models import Agent
from agents.tokens import TokenRejected, authenticate_session, mint_session_token, redeem_registration_token
from lib.errors import api_error, json_content_type_refusal
from lib.json_body import BodyRefused, validate_body
from lib.json_input import parse_json_object
from scalers.api_models import ClaimBody, HeartbeatBody, RegisterBody
from scalers.backends.claims import ClaimError, redeem_claim
from scalers.backends.factory import get_backend
from scalers.lifecycle import enqueue_reclaim
from scalers.metrics import ADOPTION_LOOKUP_FAILURES, SCALE_TO_REGISTERED, observe
from scalers.spawn_trace import record_marks

log = logging.getLogger(__name__)


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization`` header's value ``Bearer <token>``, None for any other."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _bearer(request) -> str | None:
    return bearer_token(request.headers.get("Authorization", ""))


_TOKEN_MESSAGES = {
    "missing-token": "send Authorization: Bearer <token>",
    "invalid-token": "the bearer token is not a token of this kind",
    "unknown": "the bearer token is not known to this console",
    "expired": "the bearer token has expired",
    "used": "the registration token was already used",
    "agent-mismatch": "the token belongs to another agent",
}


def _unauthorized(reason: str) -> JsonResponse:
    """401 with ``error.code`` and ``reason`` both the token's refusal reason."""
    return api_error(401, reason, _TOKEN_MESSAGES.get(reason, reason))


def _bad_request(message: str, field: str | None = None) -> JsonResponse:
    return api_error(400, "invalid-request", message, field=field)


#: ``reason`` of a refused claim, by the claim store's message (``scalers.backends.claims.MESSAGES``).
_CLAIM_CODES = {
    "invalid claim code": "invalid-claim",
    "claim code already consumed": "claim-used",
    "claim code expired": "claim-expired",
}


def _bearer_request(view):
    """Decorator of the bearer-authenticated endpoints: 401 without a bearer token, then 415 for a
    body not sent as JSON (``lib.errors.json_content_type_refusal``), then 400 for a body
    that is not a JSON object; otherwise ``view(request, token, body, *args, **kwargs)``."""

    @wraps(view)
    def checked(request, *args, **kwargs):
        token = _bearer(request)
        if token is None:
            return _unauthorized("missing-token")
        if refused := json_content_type_refusal(request):
            return refused
        try:
            body = parse_json_object(request.body)
        except ValueError as exc:
            return _bad_request(str(exc), "body")
        return view(request, token, body, *args, **kwargs)

    return checked


def _mandatory_labels(agent: Agent) -> list[str]:
    return list(agent.scaler.mandatory_labels or [])


def _registration_hooks(agent: Agent) -> None:
    """The backend's optional hooks after a registration, each failure logged, never fatal:
    ``mark_registered(agent)`` (firecracker: the VM's exit is no longer a boot failure) and
    ``clear_mmds(agent)`` (firecracker: the registration answer is this console's config, so the
    spent token leaves the metadata service now)."""
    try:
        backend = get_backend(agent.scaler)
    except Exception:
        log.warning("no backend for the registration hooks of %s", agent.agent_id, exc_info=True)
        return
    for name in ("mark_registered", "clear_mmds"):
        hook = getattr(backend, name, None)
        if hook is not None:
            try:
                hook(agent)
            except Exception:
                log.warning("%s of %s failed", name, agent.agent_id, exc_info=True)


@csrf_exempt
@require_POST
@_bearer_request
def register(request, raw: str, body: dict):
    """Redeem the ephemeral token once and mark the agent running (see the module doc)."""
    received = timezone.now()
    try:
        claimed_id = validate_body(RegisterBody, body).agent_id
    except BodyRefused as exc:
        return _bad_request(str(exc), exc.field)
    try:
        agent = redeem_registration_token(raw)
    except TokenRejected as exc:
        return _unauthorized(exc.reason)
    except DatabaseError as exc:
        ADOPTION_LOOKUP_FAILURES.inc()
        log.warning("registration lookup failed: %s", exc)
        return api_error(503, "lookup-failed", "the console could not look up this registration; ask again")
    if claimed_id and claimed_id != agent.agent_id:
        return _unauthorized("agent-mismatch")
    now = timezone.now()
    with transaction.atomic():
        won = Agent.objects.filter(pk=agent.pk, state__in=UNREGISTERED_STATES).update(
            state=AgentState.RUNNING, registered_at=now, last_heartbeat=now
        )
        if not won:
            current = Agent.objects.filter(pk=agent.pk).values_list("state", flat=True).first()
            if current in TERMINAL_STATES:
                # Its sandbox runs and asks to register, but no teardown will come for it any more.
                transaction.on_commit(lambda: enqueue_reclaim(agent))
            return api_error(
                409,
                "not-spawning",
                f"agent {agent.agent_id} is {current}, no longer spawning: its spawn was given up",
                state=current,
            )
        agent.state, agent.registered_at, agent.last_heartbeat = AgentState.RUNNING, now, now
        observe(SCALE_TO_REGISTERED, {"scaler": agent.scaler.name}, (now - agent.created_at).total_seconds())
        session = mint_session_token(agent)
        record_event(
            agent,
            EventType.REGISTERED,
            "agent registered",
            payload={"remote": request.META.get("REMOTE_ADDR", ""), "instance": settings.KICI_INSTANCE_ID},
        )
        # Last before the commit: what the API answers from here on is "running".
        record_marks(agent, {"register_received": received, "running": timezone.now()})
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
            "heartbeatIntervalSeconds": settings.KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS,
        }
    )


@csrf_exempt
@require_POST
@_bearer_request
def heartbeat(request, raw: str, body: dict, agent_id: str):
    """Record a heartbeat from a registered agent (see the module doc). The token is answered
    before the body: a caller without one learns nothing about what a body must hold.

    A valid body is written in the one statement that checks the token (``beat_with_session``);
    only when that writes nothing is the token read again to say why (401, or 410 for an ended
    agent)."""
    try:
        active, refused = validate_body(HeartbeatBody, body).active_jobs, None
    except BodyRefused as exc:
        active, refused = None, exc
    if refused is None and (beaten := beat_with_session(raw, agent_id, active)) is not None:
        return heartbeat_answer(beaten.state)
    try:
        agent = authenticate_session(raw, agent_id)
    except TokenRejected as exc:
        return _unauthorized(exc.reason)
    if refused is not None:
        return _bad_request(str(refused), refused.field)
    if agent.state in TERMINAL_STATES:
        return api_error(
            410,
            "agent-finished",
            f"agent {agent.agent_id} is {agent.state}: stop",
            state=agent.state,
            drain=False,
            stop=True,
        )
    # Reached only when the token or the state moved between the two statements: write as asked.
    store_heartbeat(agent, active)
    return heartbeat_answer(agent.state)


def heartbeat_answer(state: str) -> JsonResponse:
    """200 ``{state, drain, stop}`` of a recorded heartbeat of an agent in ``state`` (open pages
    show its new age, batched per page: ``live.rows``); the gateway's batched heartbeats answer
    with it too (``kici_site.heartbeat_path``)."""
    return JsonResponse(
        {
            "state": state,
            "drain": state in (AgentState.DRAINING, AgentState.HELD),
            "stop": state == AgentState.DESTROYING,
        }
    )


@csrf_exempt
@require_POST
def claim(request):
    """Exchange an event scaler's claim code for a registration token (from the claim store)."""
    if refused := json_content_type_refusal(request):
        return refused
    try:
        body = parse_json_object(request.body)
    except ValueError as exc:
        return _bad_request(str(exc), "body")
    try:
        code = validate_body(ClaimBody, body).claim_code
    except BodyRefused as exc:
        return _bad_request(str(exc), exc.field)
    try:
        grant = redeem_claim(code)
    except ClaimError as exc:
        return api_error(401, _CLAIM_CODES.get(str(exc), "invalid-claim"), str(exc))
    return JsonResponse(grant)
