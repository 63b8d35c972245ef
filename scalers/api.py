"""The orchestrator's API: ask for an agent for a job, follow it, and end it. Every route takes a
bearer token with the route's scope; the routes, their bodies and every answer are in
docs/api-contract.md ("The orchestrator's routes and their answers")."""

from __future__ import annotations

import json
import logging
from functools import cache, wraps

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from agents.choices import TERMINAL_STATES, AgentState
from agents.models import Agent
from audit.choices import ActorKind, AuditAction
from audit.records import record_audit
from lib.errors import api_error, json_content_type_refusal
from lib.json_body import BodyRefused, JsonBody, validate_body
from lib.json_input import parse_json_object
from lib.prepared import forget, prepare_once, statement_lost
from lib.query import BadParameter, check_parameters, choice, whole_number
from lib.wording import json_text, listed
from scalers.admission.decide import ScaleDecision, scale_asked
from scalers.admission.queue import AdmissionTimeout
from scalers.admission.service import decide_async
from scalers.admission.validate import (
    InvalidScaleRequest,
    JobImage,
    ScaleInput,
    validate_idempotency_key,
    validate_kici_scale_up,
    validate_scale_request,
)
from scalers.api_models import JobCompleteBody, KiciScaleDownBody, ReleaseBody
from scalers.api_tokens import Caller, any_configured, environment_caller, token_caller
from scalers.credentials import credential_problem
from scalers.jobs import enqueue_spawn_or_fail
from scalers.lifecycle import Refused, complete_job, release_agent
from scalers.models import ScaleOutcome, Scaler

log = logging.getLogger(__name__)
#: One line per admission, job-complete and release, with the caller's token name.
audit = logging.getLogger("kici.audit")


def _enqueue_spawn(decision, agent):
    """From an executor thread: enqueue the spawn of a ``spawning`` decision (its batch committed
    already, with its audit record), then let that thread's connection go the way ``CONN_MAX_AGE``
    says (the request cycle that would close it does not run in this thread). Returns the decision
    as it now stands (``skipped`` when the spawn could not be enqueued)."""
    try:
        return enqueue_spawn_or_fail(decision, agent)
    finally:
        close_old_connections()


def _error(status: int, reason: str, message: str, *, field: str | None = None, **extra) -> JsonResponse:
    """``lib.errors.api_error`` with ``reason`` as the code (module doc)."""
    return api_error(status, reason, message, field=field, **extra)


def bearer_token(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header's value, "" for any other."""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _bearer(request) -> str:
    return bearer_token(request.headers.get("Authorization", ""))


def _authenticate(request, scope: str) -> Caller | JsonResponse:
    """The caller of ``request`` when its bearer token may ``scope``, else the refusal (module doc).
    Reads the database for a named token (at most every few seconds per token and process)."""
    raw = _bearer(request)
    try:
        caller = token_caller(raw)
        if caller is None and not any_configured():
            return _error(503, "unavailable", "no API token is configured on this console (KICI_API_TOKEN)")
    except DatabaseError:
        return _error(503, "unavailable", "database unavailable")
    if caller is None:
        return _error(401, "unauthorized", "send Authorization: Bearer <an API token of this console>")
    if not caller.may(scope):
        return _error(403, "forbidden", f"token {caller.name} lacks the scope {json_text(scope)}")
    return caller


@csrf_exempt
async def scale(request):
    """Admit (or refuse) one job; see the module docstring for the answers."""
    if refused := _only(request, "POST"):
        return refused
    caller = await _scale_caller(request)
    if isinstance(caller, JsonResponse):
        return caller
    data = _scale_request(request)
    if isinstance(data, JsonResponse):
        return data
    try:
        key = validate_idempotency_key(request.headers.get("Idempotency-Key"))
    except InvalidScaleRequest as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)
    if data.container and data.container.credentials_ref:
        if refused := await _credentials_refusal(data.container, data.job_id):
            return refused
    return await _admit(data, key, caller)


async def _scale_caller(request) -> Caller | JsonResponse:
    """The caller of a scale POST, or its refusal (:func:`_authenticate`, scope ``scale``); the
    environment's token needs no thread hop."""
    caller = environment_caller(_bearer(request))
    if caller is not None:
        return caller
    return await sync_to_async(_authenticate_in_thread)(request, "scale")


def _authenticate_in_thread(request, scope: str) -> Caller | JsonResponse:
    """:func:`_authenticate` from an executor thread, whose connection then goes the way
    ``CONN_MAX_AGE`` says (back to the pool): no request cycle closes it in that thread."""
    try:
        return _authenticate(request, scope)
    finally:
        close_old_connections()


async def _admit(data: ScaleInput, key: str, caller: Caller) -> JsonResponse:
    """Decide a validated request (``/scale`` or a KiCI scale-up) keyed by ``key`` ("" for none),
    enqueue its spawn and audit it; the answer (module doc)."""
    what = data.job_id or data.agent_id
    try:
        decision, agent = await decide_async(data, key, token_name=caller.name)
    except AdmissionTimeout as exc:
        return _error(503, "unavailable", str(exc))
    except DatabaseError as exc:
        log.warning("scale request %s: database error %s", what, exc)
        return _error(503, "unavailable", "database unavailable")
    if decision.action == ScaleOutcome.SPAWNING and agent is not None:
        decision = await sync_to_async(_enqueue_spawn, thread_sensitive=False)(decision, agent)
    if decision.action in (ScaleOutcome.SPAWNING, ScaleOutcome.ASSIGNED, ScaleOutcome.REPLAYED):
        audit.info("scale by token %s: %s -> %s (%s)", caller.name, _asked(data), decision.agent, decision.action)
    return _decision_response(decision, data)


def _asked(data: ScaleInput) -> str:
    """What a request asked for, in the audit's words (``scalers.admission.decide.scale_asked``)."""
    return scale_asked(data.job_id, data.event)


@csrf_exempt
async def kici_scale_up(request):
    """``POST /api/v1/scale/kici-event/scale-up``: the payload of a KiCI event scaler's
    ``kici.scaler.scale-up`` (``scalers.admission.validate.KiciScaleUpBody``), as its provisioning
    workflow holds it: admit the agent ``agentId`` as ``/scale`` admits a job's (the same answers),
    keyed by ``requestId``. An ``Idempotency-Key`` header, when sent, must be that ``requestId``."""
    if refused := _only(request, "POST"):
        return refused
    caller = await _scale_caller(request)
    if isinstance(caller, JsonResponse):
        return caller
    parsed = _body_of(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    try:
        data, key = validate_kici_scale_up(parsed)
        header = validate_idempotency_key(request.headers.get("Idempotency-Key"))
    except InvalidScaleRequest as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)
    if header and header != key:
        return _error(
            400,
            "invalid-request",
            f"Idempotency-Key: must be the body's requestId {json_text(key)} or absent, got {json_text(header)}",
            field="Idempotency-Key",
        )
    return await _admit(data, key, caller)


def _body_of(request) -> object:
    """The parsed JSON body of ``request``, or the 415/413/400 answer naming what is wrong with it."""
    if refused := json_content_type_refusal(request):
        return refused
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, "invalid-request", "request body too large", field="body")
    try:
        return parse_json_object(body or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(400, "invalid-request", str(exc), field="body")


def _scale_request(request) -> ScaleInput | JsonResponse:
    """The validated scale request of ``request``'s body, or the 415/413/400 answer naming what is
    wrong with it."""
    payload = _body_of(request)
    if isinstance(payload, JsonResponse):
        return payload
    try:
        return validate_scale_request(payload)
    except InvalidScaleRequest as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)


def _credential_problem(ref: str, image: str) -> str | None:
    """``scalers.credentials.credential_problem`` from an executor thread, then that thread's
    connection goes back (to the process's pool, when it has one): no request cycle closes it
    there, and a pooled connection an executor thread kept would be lost to every request."""
    try:
        return credential_problem(ref, image)
    finally:
        close_old_connections()


async def _credentials_refusal(container: JobImage, job_id: str) -> JsonResponse | None:
    """The 422 answer when the job image's ``credentialsRef`` cannot be used for it (503 when the
    database cannot say), None when it can. Checked before admission, so no agent waits on it."""
    try:
        problem = await sync_to_async(_credential_problem, thread_sensitive=False)(
            container.credentials_ref, container.image
        )
    except DatabaseError as exc:
        log.warning("scale request %s: database error %s", job_id, exc)
        return _error(503, "unavailable", "database unavailable")
    if problem:
        return _error(422, "invalid-credentials-ref", problem, field="container.credentialsRef")
    return None


def _decision_response(decision: ScaleDecision, data: ScaleInput) -> JsonResponse:
    """The HTTP answer to the orchestrator for ``decision`` (module docstring): 201 spawning, 200
    assigned or replayed, 409 at-capacity or paused with Retry-After, 422 idempotency-mismatch, exceeds-cap
    or no matching label set, 503 skipped."""
    if decision.action == ScaleOutcome.SPAWNING:
        return JsonResponse(
            {"agentId": decision.agent, "scaler": decision.scaler, "backendType": decision.backend_type}, status=201
        )
    if decision.action == ScaleOutcome.ASSIGNED:
        return JsonResponse(
            {"agentId": decision.agent, "scaler": decision.scaler, "backendType": decision.backend_type, "warm": True},
            status=200,
        )
    if decision.action == ScaleOutcome.REPLAYED:
        body = {"agentId": decision.agent, "scaler": decision.scaler, "backendType": decision.backend_type}
        response = JsonResponse(body | ({"warm": True} if decision.warm else {}), status=200)
        response["Idempotent-Replayed"] = "true"
        return response
    if decision.action == ScaleOutcome.IDEMPOTENCY_MISMATCH:
        return _error(422, "idempotency-mismatch", decision.reason, field=decision.field, agentId=decision.agent)
    if decision.action == ScaleOutcome.PAUSED:
        retry = int(settings.KICI_SCALE_RETRY_AFTER_SECONDS)
        response = _error(
            409, "paused", decision.reason, scaler=decision.scaler, pause=decision.pause, retryAfterSeconds=retry
        )
        response["Retry-After"] = str(retry)
        return response
    if decision.action == ScaleOutcome.AT_CAPACITY:
        retry = int(settings.KICI_SCALE_RETRY_AFTER_SECONDS)
        response = _error(
            409, "at-capacity", decision.reason, cap=decision.cap, scaler=decision.scaler, retryAfterSeconds=retry
        )
        response["Retry-After"] = str(retry)
        return response
    if decision.action == ScaleOutcome.EXCEEDS_CAP:
        return _error(
            422, "exceeds-cap", decision.reason, cap=decision.cap, scaler=decision.scaler, detail=decision.reason
        )
    if decision.action == ScaleOutcome.NO_BACKEND:
        return _error(
            422,
            "no-matching-label-set",
            decision.reason
            if decision.reason != "no-matching-label-set"
            else f"no label set of any scaler matches labels {listed(data.labels)}",
            labels=list(data.labels),
        )
    return _error(503, "skipped", decision.reason)


# --- following and ending an agent ----------------------------------------------------------------

MAX_PAGE = 500


def _iso(value) -> str | None:
    return value.isoformat() if value else None


#: An agent's fields the orchestrator sees (:func:`agent_values_json`), the scaler's by name.
AGENT_JSON_FIELDS = (
    "agent_id",
    "scaler__name",
    "state",
    "labels",
    "bound_job_id",
    "warm",
    "ip",
    "registered_at",
    "last_heartbeat",
    "active_jobs",
)


def agent_values_json(values: dict) -> dict:
    """One agent as the orchestrator sees it, from its :data:`AGENT_JSON_FIELDS` (a ``values()``
    row): ``{agentId, scaler, state, labels, jobId, warm, ip, registeredAt, lastHeartbeat,
    activeJobs}`` (times ISO 8601 UTC or null; ``jobId`` "" when unbound; ``ip`` its current
    address, null before it has one and once it ended, as ``Agent.current_ip``)."""
    return {
        "agentId": values["agent_id"],
        "scaler": values["scaler__name"],
        "state": values["state"],
        "labels": list(values["labels"] or []),
        "jobId": values["bound_job_id"],
        "warm": values["warm"],
        "ip": None if values["state"] in TERMINAL_STATES else values["ip"],
        "registeredAt": _iso(values["registered_at"]),
        "lastHeartbeat": _iso(values["last_heartbeat"]),
        "activeJobs": values["active_jobs"],
    }


@cache
def _agent_by_id_sql(param: str = "%s") -> str:
    """The statement of :func:`agent_values`: :data:`AGENT_JSON_FIELDS` of one agent by its id,
    the id as ``param`` (``%s`` for a Django cursor, ``$1`` for ``PREPARE``)."""
    columns = ", ".join("s.name" if field == "scaler__name" else f"a.{field}" for field in AGENT_JSON_FIELDS)
    return (
        f"SELECT {columns} FROM {Agent._meta.db_table} a JOIN {Scaler._meta.db_table} s ON s.id = a.scaler_id "
        f"WHERE a.agent_id = {param}"
    )


#: The name :func:`agent_values` prepares its statement under, on each pooled connection.
AGENT_BY_ID_STATEMENT = "kici_agent_by_id"


def agent_values(agent_id: str) -> dict | None:
    """:data:`AGENT_JSON_FIELDS` of the agent ``agent_id`` as ``values()`` gives them (None when
    there is none), from a statement written once: the ORM's compile of the same query cost a third
    of a ``GET /api/v1/agents/<agentId>``. Raises ``DatabaseError``."""
    connection.ensure_connection()
    if connection.in_atomic_block or not connection.get_autocommit():
        # A failing EXECUTE would abort the caller's transaction: the statement as it is.
        row = _agent_row(_agent_by_id_sql(), agent_id)
    else:
        row = _prepared_agent_row(agent_id)
    if row is None:
        return None
    values = dict(zip(AGENT_JSON_FIELDS, row, strict=True))
    if values["labels"] is not None:  # jsonb arrives as its text (Django's loader for it)
        values["labels"] = json.loads(values["labels"])
    return values


def _agent_row(sql: str, agent_id: str) -> tuple | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, [agent_id])
        return cursor.fetchone()


def _prepared_agent_row(agent_id: str) -> tuple | None:
    """:func:`agent_values`'s row by the statement prepared on this connection (in autocommit),
    which PostgreSQL neither parses nor plans again. A statement found gone or invalid
    (``lib.prepared.statement_lost``) is prepared again and run once more; found so again, the
    plain statement answers. Raises ``DatabaseError``."""
    raw = connection.connection
    statements = {AGENT_BY_ID_STATEMENT: _agent_by_id_sql("$1")}
    for _attempt in range(2):
        with connection.wrap_database_errors:
            prepare_once(raw, statements)
        try:
            return _agent_row(f"EXECUTE {AGENT_BY_ID_STATEMENT}(%s)", agent_id)
        except DatabaseError as exc:
            if not statement_lost(exc):
                raise
            with connection.wrap_database_errors:
                forget(raw, statements)
    return _agent_row(_agent_by_id_sql(), agent_id)


def agent_json(agent: Agent) -> dict:
    """:func:`agent_values_json` of a loaded agent (its scaler is read)."""
    values = {field: getattr(agent, field) for field in AGENT_JSON_FIELDS if field != "scaler__name"}
    return agent_values_json(values | {"scaler__name": agent.scaler.name})


def _orchestrator(scope: str):
    """CSRF-exempt and bearer-checked for ``scope`` (module doc); the view gets ``request.caller``."""

    def wrap(view):
        @wraps(view)
        def check(request, *args, **kwargs):
            answer = _authenticate(request, scope)
            if isinstance(answer, JsonResponse):
                return answer
            request.caller = answer
            return view(request, *args, **kwargs)

        return csrf_exempt(check)

    return wrap


def _only(request, method: str) -> JsonResponse | None:
    if request.method == method:
        return None
    response = _error(405, "method-not-allowed", f"{request.method} is not allowed here; allowed: {method}")
    response["Allow"] = method
    return response


def _json_object(request) -> tuple[dict, JsonResponse | None]:
    """The request body as a JSON object (an empty body is ``{}``), or the 415 answer for a body
    that is not sent as JSON, or the 400 answer for one that is not a JSON object."""
    if refused := json_content_type_refusal(request):
        return {}, refused
    try:
        return parse_json_object(request.body), None
    except ValueError as exc:
        return {}, _error(400, "invalid-request", str(exc), field="body")


#: Parameters of ``GET /api/v1/agents``, each taken once.
LIST_PARAMETERS = ("scaler", "state", "jobId", "limit", "cursor")

#: Largest ``cursor`` (an agent's row id, PostgreSQL ``bigint``).
CURSOR_MAX = 2**63 - 1


def _bad_parameter(exc: BadParameter) -> JsonResponse:
    return _error(400, "invalid-request", str(exc), field=exc.field)


#: The scope a token needs to follow agents (``GET /api/v1/agents``, ``GET /api/v1/agents/<agentId>``).
READ_SCOPE = "read"


def agent_document(values: dict) -> bytes:
    """The body of ``GET /api/v1/agents/<agentId>`` for an agent's :func:`agent_values`: its
    :func:`agent_values_json` as ``JsonResponse`` writes it."""
    return json.dumps(agent_values_json(values), cls=DjangoJSONEncoder).encode()


@_orchestrator(READ_SCOPE)
def agent_detail(request, agent_id: str):
    """``GET /api/v1/agents/<agentId>``: the agent (:func:`agent_json`); 400 naming any query
    parameter (it takes none), 404 for an unknown agent. The plain GET of a known agent is usually
    answered before Django's handler, by :func:`agent_detail_answer`."""
    if refused := _only(request, "GET"):
        return refused
    try:
        check_parameters(request.GET)
    except BadParameter as exc:
        return _bad_parameter(exc)
    agent = agent_values(agent_id)
    if agent is None:
        return _error(404, "not-found", f"no agent {agent_id!r}")
    return HttpResponse(agent_document(agent), content_type="application/json")


def agent_detail_answer(scope: dict, agent_id: str) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """:func:`agent_detail`'s 200 answer (status, headers, body) to the ASGI request ``scope`` for
    ``agent_id`` (the path's match), made without Django's request object, signals or middleware,
    when the request is a plain one: ``GET``, no query string, no NUL in the path, one
    ``Authorization`` header whose bearer token may :data:`READ_SCOPE` (:func:`token_caller`), a
    known agent. None for anything else, a database error included: then Django's handler serves
    the request and the view gives the answer (every refusal has its one home there). The
    connection goes back as the request cycle gives it back (``close_old_connections``, to the
    pool). Where the ORM may run (no running event loop)."""
    if scope["method"] != "GET" or scope["query_string"] or "\x00" in scope["path"]:
        return None
    header = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if header is not None:
                return None  # Django joins repeated headers: the view says what that is
            header = value
    if header is None:
        return None
    try:
        caller = token_caller(bearer_token(header.decode("latin-1")))
        if caller is None or not caller.may(READ_SCOPE):
            return None
        values = agent_values(agent_id)
    except DatabaseError:
        return None
    finally:
        close_old_connections()
    if values is None:
        return None
    body = agent_document(values)
    return 200, [(b"Content-Type", b"application/json"), (b"Content-Length", str(len(body)).encode("ascii"))], body


@_orchestrator(READ_SCOPE)
def agent_list(request):
    """``GET /api/v1/agents?scaler=&state=&jobId=&limit=&cursor=``: agents in creation order,
    ``limit`` (1 to :data:`MAX_PAGE`, default 100) at a time, ``nextCursor`` the ``cursor`` of the
    next page. 400 ``invalid-request`` with ``field`` for an unknown parameter, one given twice, an
    unknown state, a bad limit or a cursor we did not give."""
    if refused := _only(request, "GET"):
        return refused
    query = request.GET
    try:
        check_parameters(query, single=LIST_PARAMETERS)
        state = choice("state", query.get("state"), AgentState.values)
        limit = whole_number("limit", query.get("limit"), 1, MAX_PAGE, default=100)
        raw_cursor = query.get("cursor")
        try:
            cursor = whole_number("cursor", raw_cursor, 1, CURSOR_MAX, default=0)
        except BadParameter:
            raise BadParameter("cursor", f"must be a nextCursor this API gave, got {json_text(raw_cursor)}") from None
    except BadParameter as exc:
        return _bad_parameter(exc)
    agents = Agent.objects.select_related("scaler").order_by("pk")
    if query.get("scaler"):
        agents = agents.filter(scaler__name=query["scaler"])
    if state:
        agents = agents.filter(state=state)
    if query.get("jobId"):
        agents = agents.filter(bound_job_id=query["jobId"])
    if cursor:
        agents = agents.filter(pk__gt=cursor)
    page = list(agents[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return JsonResponse(
        {"agents": [agent_json(a) for a in page], "nextCursor": str(page[-1].pk) if more and page else None}
    )


def _end(request, agent_id: str, model: type[JsonBody], call):
    """POST a body of ``model`` (an empty body is ``{}``), checked first; then ``call(agent_id,
    body)`` answers the agent as it now is; a :class:`Refused` is its error."""
    if refused := _only(request, "POST"):
        return refused
    payload, bad = _json_object(request)
    if bad:
        return bad
    try:
        body = validate_body(model, payload)
    except BodyRefused as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)
    what = request.path.rsplit("/", 1)[-1]
    try:
        with transaction.atomic():  # the change and its audit record commit together
            agent = call(agent_id, body)
            record_audit(
                AuditAction.API_JOB_COMPLETE if what == "job-complete" else AuditAction.API_RELEASE,
                actor=request.caller.name,
                actor_kind=ActorKind.TOKEN,
                scaler_name=agent.scaler.name,
                agent_ref=agent_id,
                detail=", ".join(f"{key} {json_text(value)}" for key, value in payload.items() if value),
            )
    except Refused as exc:
        return _error(exc.status, exc.code, exc.message, field=exc.field)
    audit.info("%s by token %s: %s", what, request.caller.name, agent_id)
    return JsonResponse(agent_json(agent))


@_orchestrator("scale")
def job_complete(request, agent_id: str):
    return _end(
        request,
        agent_id,
        JobCompleteBody,
        lambda a, body: complete_job(a, body.job_id, caller=request.caller.name, failed=body.result == "failure"),
    )


@_orchestrator("scale")
def agent_release(request, agent_id: str):
    return _end(
        request,
        agent_id,
        ReleaseBody,
        lambda a, body: release_agent(a, (body.reason or "").strip(), caller=request.caller.name),
    )


@_orchestrator("scale")
def kici_scale_down(request):
    """``POST /api/v1/scale/kici-event/scale-down``: the payload of a KiCI event scaler's
    ``kici.scaler.scale-down`` (``scalers.api_models.KiciScaleDownBody``): tear its agent down, as
    a release does (its ``reason`` and ``requestId`` recorded with it). Idempotent, and so is an
    agent id this console never had: 200 with ``state`` null (the scale-up it answers may have
    been refused). 422 ``scaler-mismatch`` (``error.field`` ``scalerName``) when the agent was
    scaled up for another scaler than ``scalerName``."""
    if refused := _only(request, "POST"):
        return refused
    parsed = _body_of(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    try:
        body = validate_body(KiciScaleDownBody, parsed)
    except BodyRefused as exc:
        return _error(400, "invalid-request", str(exc), field=exc.field)
    agent = Agent.objects.filter(agent_id=body.agent_id).only("scale_body").first()
    if agent is None:
        audit.info("kici scale-down by token %s: no agent %s", request.caller.name, body.agent_id)
        return JsonResponse({"agentId": body.agent_id, "state": None, "reason": body.reason})
    asked_for = (agent.scale_body or {}).get("scalerName")
    if asked_for is not None and asked_for != body.scaler_name:
        return _error(
            422,
            "scaler-mismatch",
            f"agent {body.agent_id} was scaled up for scaler {json_text(asked_for)}, not {json_text(body.scaler_name)}",
            field="scalerName",
        )
    why = f"kici.scaler.scale-down {body.reason} (requestId {body.request_id})"
    try:
        with transaction.atomic():  # the change and its audit record commit together
            agent = release_agent(body.agent_id, why, caller=request.caller.name)
            record_audit(
                AuditAction.API_RELEASE,
                actor=request.caller.name,
                actor_kind=ActorKind.TOKEN,
                scaler_name=agent.scaler.name,
                agent_ref=body.agent_id,
                detail=f"reason {json_text(why)}",
            )
    except Refused as exc:
        return _error(exc.status, exc.code, exc.message, field=exc.field)
    audit.info("kici scale-down by token %s: %s (%s)", request.caller.name, body.agent_id, body.reason)
    return JsonResponse({"agentId": agent.agent_id, "state": agent.state, "reason": body.reason})
