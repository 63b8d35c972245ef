"""The OpenAPI 3.1 document of ``/api/v1`` (the orchestrator's API and the agent's), served at
``/api/v1/openapi.json`` on the operator listener and rendered by ``front.views.api_docs``. Every
body schema is generated from the pydantic models the views check against, so a body rule changes
the document with it; what a model cannot say (routes by URL name, methods, bearer, query
parameters, answers and their headers) is here. Design: docs/api-contract.md.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from django.conf import settings
from django.http import JsonResponse
from django.urls import URLResolver, get_resolver
from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from agents.choices import AgentState
from lib.errors import api_error
from scalers.admission.validate import KiciScaleUpBody, ScaleRequestBody
from scalers.api import CURSOR_MAX, LIST_PARAMETERS, MAX_PAGE
from scalers.api_models import (
    AgentFinished,
    AgentPage,
    AgentView,
    ApiError,
    AtCapacity,
    ClaimBody,
    ClaimGrant,
    ExceedsCap,
    HeartbeatAnswer,
    HeartbeatBody,
    JobCompleteBody,
    KiciScaleDownBody,
    NoMatchingLabelSet,
    NotSpawning,
    RegisterBody,
    Registered,
    ReleaseBody,
    ScaleAdmitted,
    ScaleDownDone,
)

OPENAPI_VERSION = "3.1.0"
API_VERSION = "1"
JSON = "application/json"

REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ScaleRequestBody,
    KiciScaleUpBody,
    KiciScaleDownBody,
    JobCompleteBody,
    ReleaseBody,
    RegisterBody,
    HeartbeatBody,
    ClaimBody,
)
ANSWER_MODELS: tuple[type[BaseModel], ...] = (
    ScaleAdmitted,
    ScaleDownDone,
    AgentView,
    AgentPage,
    Registered,
    HeartbeatAnswer,
    ClaimGrant,
    ApiError,
    AtCapacity,
    ExceedsCap,
    NoMatchingLabelSet,
    AgentFinished,
    NotSpawning,
)

#: pydantic's names of the bounds it could not place on a union (``int | float``), as JSON Schema's.
_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


class _Generator(GenerateJsonSchema):
    """pydantic's JSON Schema, with two fixes for a document a validator and a fuzzer read:
    a union picked by a function (the two ``resources`` shapes) is ``anyOf`` (both shapes take
    ``{}``, so ``oneOf`` would refuse it), and bounds on a number union get JSON Schema's names."""

    def field_title_should_be_set(self, schema) -> bool:
        return False  # "Jobid" says nothing the key does not

    def tagged_union_schema(self, schema):
        generated = super().tagged_union_schema(schema)
        if "discriminator" not in generated and "oneOf" in generated:
            generated["anyOf"] = generated.pop("oneOf")
        return generated

    def generate_inner(self, schema):
        generated = super().generate_inner(schema)
        if isinstance(generated, dict) and "anyOf" in generated:
            for short, name in _BOUNDS.items():
                if short in generated:
                    generated[name] = generated.pop(short)
        return generated


@cache
def component_schemas() -> dict[str, Any]:
    """``components.schemas``: every request body (as checked) and answer (as sent), by model name."""
    pairs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in REQUEST_MODELS]
    pairs += [(m, "serialization") for m in ANSWER_MODELS]
    _, top = models_json_schema(pairs, ref_template="#/components/schemas/{model}", schema_generator=_Generator)
    return top["$defs"]


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


_DIGITS = {"type": "string", "pattern": "^[0-9]+$"}
_HEADERS = {
    "Retry-After": {"description": "seconds to wait before asking again", "schema": _DIGITS},
    "WWW-Authenticate": {"description": 'Bearer realm="kici"', "schema": {"type": "string"}},
    "Allow": {"description": "the methods this path takes", "schema": {"type": "string"}},
    "Idempotent-Replayed": {
        "description": "`true` when the answer is the job's live agent, answered again",
        "schema": {"type": "string", "enum": ["true"]},
    },
}


def _error(description: str, model: type[BaseModel] = ApiError, *headers: str) -> dict:
    answer: dict[str, Any] = {"description": description, "content": {JSON: {"schema": _ref(model)}}}
    if headers:
        answer["headers"] = {name: _HEADERS[name] for name in headers}
    return answer


def _ok(description: str, model: type[BaseModel], links: dict | None = None, *headers: str) -> dict:
    answer: dict[str, Any] = {"description": description, "content": {JSON: {"schema": _ref(model)}}}
    if links:
        answer["links"] = links
    if headers:
        answer["headers"] = {name: _HEADERS[name] for name in headers}
    return answer


def _agent_links(job_id: str) -> dict:
    """Links of an answer naming an agent (``agentId`` in its body) to what follows it: follow it,
    end its job (``jobId`` from ``job_id``, a runtime expression), release it."""
    agent = {"agentId": "$response.body#/agentId"}
    return {
        "GetAgent": {"operationId": "getAgent", "parameters": agent, "description": "follow the agent"},
        "CompleteJob": {
            "operationId": "jobComplete",
            "parameters": agent,
            "requestBody": {"jobId": job_id},
            "description": "its job ended",
        },
        "ReleaseAgent": {"operationId": "releaseAgent", "parameters": agent, "description": "give it up"},
    }


_BAD_BODY = _error(
    "`invalid-request`: the body is not a JSON object of this shape; `error.field` names the JSON path at "
    "fault (`body` for the whole: malformed JSON, a key twice in one object, nesting too deep), or the "
    "query parameter; a NUL byte anywhere is refused naming where"
)
_TOO_LARGE = _error("`body-too-large` / `invalid-request`: the body is over `KICI_MAX_REQUEST_BODY_BYTES`")
_NOT_JSON = _error("`unsupported-media-type`: a body not sent as `application/json`; `error.field` is `Content-Type`")
_UNAVAILABLE = _error(
    "`unavailable` / `skipped` / `lookup-failed`: the console cannot decide now (database, queue, backoff); "
    "ask again after `Retry-After`",
    ApiError,
    "Retry-After",
)
_NOT_FOUND = _error("`not-found`: no agent of that id")


def _orchestrator_refusals() -> dict:
    return {
        "401": _error("`unauthorized`: no bearer token, or not one of this console's", ApiError, "WWW-Authenticate"),
        "403": _error("`forbidden`: the token lacks the scope this operation needs"),
    }


def _agent_refusal(what: str) -> dict:
    return {
        "401": _error(
            f"the {what} was refused; `reason`: `missing-token`, `invalid-token`, `unknown`, `expired`, `used` "
            "or `agent-mismatch`",
            ApiError,
            "WWW-Authenticate",
        )
    }


def _body(model: type[BaseModel], *, required: bool) -> dict:
    return {"required": required, "content": {JSON: {"schema": _ref(model)}}}


_AGENT_ID = {
    "name": "agentId",
    "in": "path",
    "required": True,
    "description": "the agent's id (`agentId` of the scale answer)",
    "schema": {"type": "string", "minLength": 1},
}


def _list_parameters() -> list[dict]:
    described = {
        "scaler": ("the scaler's name", {"type": "string"}),
        "state": ("the agent's state", {"type": "string", "enum": list(AgentState.values)}),
        "jobId": ("the job the agent is bound to", {"type": "string"}),
        "limit": (
            "agents in a page",
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
        ),
        "cursor": (
            "the `nextCursor` of the page before",
            {"type": "string", "pattern": "^[1-9][0-9]*$", "maxLength": len(str(CURSOR_MAX))},
        ),
    }
    return [
        {
            "name": name,
            "in": "query",
            "required": False,
            "allowEmptyValue": True,
            "description": f"{described[name][0]}; an empty value is as if it were absent",
            "schema": described[name][1],
        }
        for name in LIST_PARAMETERS
    ]


def _operations() -> dict[str, dict[str, dict]]:
    """``{url name: {method: operation}}`` of every ``/api/v1`` route in ``scalers.urls``."""
    orchestrator = _orchestrator_refusals()
    scale_security = [{"orchestratorToken": ["scale"]}]
    read_security = [{"orchestratorToken": ["read"]}]
    return {
        "api_openapi": {
            "get": {
                "operationId": "openapiDocument",
                "tags": ["orchestrator"],
                "summary": "This document (operator listener; no token)",
                "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1", "content": {JSON: {"schema": {"type": "object"}}}}},
            }
        },
        "api_scale": {
            "post": {
                "operationId": "scale",
                "tags": ["orchestrator"],
                "summary": "Ask for an agent for one job",
                "description": (
                    "Idempotent per job: while the job's agent is live (spawning, connecting, running, draining) "
                    "the same `jobId` is answered with that agent again (200, the first answer's body, "
                    "`Idempotent-Replayed: true`), however many requests arrive at once. An optional "
                    "`Idempotency-Key` header must then be repeated with the same body (else 422 "
                    "`idempotency-mismatch`). A release, job-complete or failed spawn ends the claim."
                ),
                "security": scale_security,
                "requestBody": _body(ScaleRequestBody, required=True),
                "responses": {
                    "201": _ok("admitted: the agent is spawning", ScaleAdmitted, _agent_links("$request.body#/jobId")),
                    "200": _ok(
                        "an idle warm agent was bound to the job (`warm: true`), or the job's live agent "
                        "answered again (`Idempotent-Replayed: true`)",
                        ScaleAdmitted,
                        _agent_links("$request.body#/jobId"),
                        "Idempotent-Replayed",
                    ),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "409": _error(
                        "`at-capacity`: a cap is full; ask again after `Retry-After` seconds",
                        AtCapacity,
                        "Retry-After",
                    ),
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "422": {
                        "description": (
                            "`exceeds-cap` (the request alone is over a cap), `no-matching-label-set`, or "
                            "`invalid-credentials-ref` (`error.field` `container.credentialsRef`): asking again "
                            "cannot help"
                        ),
                        "content": {
                            JSON: {"schema": {"anyOf": [_ref(ExceedsCap), _ref(NoMatchingLabelSet), _ref(ApiError)]}}
                        },
                    },
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_kici_scale_up": {
            "post": {
                "operationId": "kiciScaleUp",
                "tags": ["orchestrator", "kici-event"],
                "summary": "A KiCI event scaler's kici.scaler.scale-up: start that agent",
                "description": (
                    "The payload of a KiCI 0.9 `kici.scaler.scale-up` event, as the provisioning workflow holds it. "
                    "Its labels without the `kici:*` ones route to a label set running the real KiCI agent "
                    "(`kiciAgent`) of `orchestratorUrl`; the agent starts with id `agentId` and redeems `claimCode` "
                    "there for its own token. Answered as `/scale` is. Idempotent on `requestId`: a repeat while the "
                    "agent is live answers it again (200, `Idempotent-Replayed: true`), however many are sent at "
                    "once; a different payload under it, or an `agentId` that exists already, is a 422 "
                    "`idempotency-mismatch` naming the field. An `Idempotency-Key` header, when sent, must be the "
                    "`requestId`."
                ),
                "security": scale_security,
                "requestBody": _body(KiciScaleUpBody, required=True),
                "responses": {
                    "201": _ok("admitted: the agent `agentId` is spawning", ScaleAdmitted),
                    "200": _ok("a repeat of the request that admitted the live agent", ScaleAdmitted),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "409": {
                        "description": (
                            "`at-capacity` (a cap is full) or `paused` (its scaler or host is paused; `pause` says "
                            "who and why): ask again after `Retry-After` seconds"
                        ),
                        "headers": {"Retry-After": _HEADERS["Retry-After"]},
                        "content": {JSON: {"schema": {"anyOf": [_ref(AtCapacity), _ref(ApiError)]}}},
                    },
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "422": {
                        "description": (
                            "`exceeds-cap`, `no-matching-label-set` (none matches, or the one that does does not run "
                            "the KiCI agent of `orchestratorUrl`), or `idempotency-mismatch` (`error.field`): asking "
                            "again cannot help"
                        ),
                        "content": {
                            JSON: {"schema": {"anyOf": [_ref(ExceedsCap), _ref(NoMatchingLabelSet), _ref(ApiError)]}}
                        },
                    },
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_kici_scale_down": {
            "post": {
                "operationId": "kiciScaleDown",
                "tags": ["orchestrator", "kici-event"],
                "summary": "A KiCI event scaler's kici.scaler.scale-down: tear that agent down",
                "description": (
                    "The payload of a KiCI 0.9 `kici.scaler.scale-down` event, as the teardown workflow holds it: "
                    "the agent is released (its reason and `requestId` recorded). Idempotent: an agent that ended "
                    "answers its final state, one this console never had answers `state: null`."
                ),
                "security": scale_security,
                "requestBody": _body(KiciScaleDownBody, required=True),
                "responses": {
                    "200": _ok("the agent as it now is (`destroying`, ended, or null: never here)", ScaleDownDone),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "422": _error("`scaler-mismatch`: the agent was scaled up for another `scalerName`"),
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_agent_list": {
            "get": {
                "operationId": "listAgents",
                "tags": ["orchestrator"],
                "summary": "List agents, oldest first, a page at a time",
                "description": (
                    "Pass `nextCursor` back as `cursor` for the next page. Any other parameter, or one given "
                    "twice, is a 400 naming it in `error.field`."
                ),
                "security": read_security,
                "parameters": _list_parameters(),
                "responses": {
                    "200": _ok("one page", AgentPage),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_agent_detail": {
            "get": {
                "operationId": "getAgent",
                "tags": ["orchestrator"],
                "summary": "Follow one agent",
                "description": "Takes no query parameter (one is a 400 naming it).",
                "security": read_security,
                "parameters": [_AGENT_ID],
                "responses": {
                    "200": _ok("the agent", AgentView, _agent_links("$response.body#/jobId")),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "404": _NOT_FOUND,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_job_complete": {
            "post": {
                "operationId": "jobComplete",
                "tags": ["orchestrator"],
                "summary": "The agent's job ended: tear the agent down",
                "description": "Idempotent: the same `jobId` again answers 200.",
                "security": scale_security,
                "parameters": [_AGENT_ID],
                "requestBody": _body(JobCompleteBody, required=True),
                "responses": {
                    "200": _ok(
                        "the agent as it now is (`destroying`, or idle again for a reused warm agent)", AgentView
                    ),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "404": _NOT_FOUND,
                    "409": _error("`job-mismatch`: the agent is bound to another job (or none); `error.field` `jobId`"),
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "api_agent_release": {
            "post": {
                "operationId": "releaseAgent",
                "tags": ["orchestrator"],
                "summary": "The orchestrator lost or gave up the agent: tear it down",
                "description": "Idempotent.",
                "security": scale_security,
                "parameters": [_AGENT_ID],
                "requestBody": _body(ReleaseBody, required=False),
                "responses": {
                    "200": _ok("the agent as it now is", AgentView),
                    "400": _BAD_BODY,
                    **orchestrator,
                    "404": _NOT_FOUND,
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "agent_register": {
            "post": {
                "operationId": "registerAgent",
                "tags": ["agent"],
                "summary": "Register once, with the one-time token from `KICI_AGENT_TOKEN`",
                "security": [{"registrationToken": []}],
                "requestBody": _body(RegisterBody, required=False),
                "responses": {
                    "200": _ok("the agent's session", Registered),
                    "400": _BAD_BODY,
                    **_agent_refusal("registration token"),
                    "409": _error("`not-spawning`: the agent's spawn was given up", NotSpawning),
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "agent_claim": {
            "post": {
                "operationId": "claimAgent",
                "tags": ["agent"],
                "summary": "Exchange an event scaler's claim code for a registration token",
                "security": [],
                "requestBody": _body(ClaimBody, required=True),
                "responses": {
                    "200": _ok("the registration token and where to register", ClaimGrant),
                    "400": _BAD_BODY,
                    "401": _error("`invalid-claim`, `claim-used` or `claim-expired`"),
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                },
            }
        },
        "agent_heartbeat": {
            "post": {
                "operationId": "heartbeat",
                "tags": ["agent"],
                "summary": "Beat every `heartbeatIntervalSeconds` with the session token",
                "description": "On `stop: true`, or a 410, the agent exits; while `drain` is true it takes no new job.",
                "security": [{"agentSession": []}],
                "parameters": [_AGENT_ID],
                "requestBody": _body(HeartbeatBody, required=False),
                "responses": {
                    "200": _ok("what the agent is to do", HeartbeatAnswer),
                    "400": _BAD_BODY,
                    **_agent_refusal("session token"),
                    "410": _error("`agent-finished`: the agent was destroyed or failed; stop", AgentFinished),
                    "413": _TOO_LARGE,
                    "415": _NOT_JSON,
                },
            }
        },
    }


_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def route_paths() -> dict[str, str]:
    """``{url name: OpenAPI path}`` of every ``/api/v1/`` route of the site's URL map
    (``<str:agent_id>`` is ``{agentId}``)."""
    routes = {}
    for name, route in _routes(get_resolver().url_patterns, ""):
        if route.startswith("api/v1/"):
            routes[name] = "/" + _CONVERTER.sub(lambda m: "{" + to_camel(m.group(1)) + "}", route)
    return routes


def _routes(patterns, prefix: str):
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        else:
            yield pattern.name, route


def _security_schemes() -> dict:
    return {
        "orchestratorToken": {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "`KICI_API_TOKEN`, or a named API token an administrator made on /tokens/ or with "
                "`manage.py api_tokens`: scope `scale` for the POSTs, `read` for the GETs. Operator listener only."
            ),
        },
        "registrationToken": {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "the one-time registration token the sandbox was started with (`KICI_AGENT_TOKEN`); it lives "
                f"`KICI_AGENT_TOKEN_TTL_SECONDS` ({settings.KICI_AGENT_TOKEN_TTL_SECONDS} s here)"
            ),
        },
        "agentSession": {
            "type": "http",
            "scheme": "bearer",
            "description": "the `sessionToken` of the registration answer, valid for that agent only",
        },
    }


def build_document() -> dict:
    """The whole OpenAPI 3.1 document (module doc)."""
    routes = route_paths()
    paths: dict[str, dict] = {}
    for url_name, methods in _operations().items():
        paths.setdefault(routes[url_name], {}).update(methods)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "KiCI Scaler Console API",
            "version": API_VERSION,
            "description": (
                "The orchestrator's API (operator listener, `KICI_OPERATOR_LISTEN`) and the agent's API "
                "(the agents' gateway, `KICI_CONSOLE_URL`; also served on the operator listener). Every body is "
                "JSON; every error is `{error: {code, message, field?}, reason}` with endpoint extras at the top "
                "level; a 405 carries `Allow`, a 401 `WWW-Authenticate`, a 409 at-capacity and a 503 `Retry-After`."
            ),
        },
        "servers": [{"url": "/", "description": "this console"}],
        "tags": [
            {"name": "orchestrator", "description": "asking for agents and ending them (operator listener)"},
            {"name": "agent", "description": "what an agent calls (the agents' gateway)"},
            {
                "name": "kici-event",
                "description": (
                    "the console behind a KiCI 0.9 event scaler: its provisioning and teardown workflows post the "
                    "`kici.scaler.scale-up` and `kici.scaler.scale-down` payloads (operator listener)"
                ),
            },
        ],
        "paths": paths,
        "components": {"schemas": component_schemas(), "securitySchemes": _security_schemes()},
    }


def openapi_json(request):
    """``GET /api/v1/openapi.json``: :func:`build_document` (no token needed: it holds no secret)."""
    if request.method not in ("GET", "HEAD"):
        response = api_error(405, "method-not-allowed", f"{request.method} is not allowed here; allowed: GET")
        response["Allow"] = "GET, HEAD"
        return response
    return JsonResponse(build_document(), json_dumps_params={"indent": 1})
