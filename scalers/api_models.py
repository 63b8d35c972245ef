"""The bodies of the machine-facing APIs as pydantic models: what the views check a request body
against (:func:`lib.json_body.validate_body`) and what they answer, and so what
``scalers.openapi`` publishes. The scale request's own body is
``scalers.admission.validate.ScaleRequestBody``.

Request bodies refuse in the wording their views always used; the agent's own bodies
(register, heartbeat, claim) keep unknown keys, so an agent newer than its console still works.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agents.choices import AgentState
from lib.json_body import MISSING, BodyRefused, JsonBody
from lib.wording import json_text
from scalers.admission.validate import (
    Ident,
    KiciAgentId,
    RequestId,
    kici_agent_id,
    kici_request_id,
    kici_scaler_name,
)

#: Largest ``activeJobs`` a heartbeat may report.
MAX_ACTIVE_JOBS = 10_000
#: Longest ``reason`` of a release (characters).
MAX_REASON_LENGTH = 500


# --- the orchestrator's request bodies -------------------------------------------------------------


def _job_id(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    shown = None if value is MISSING else value
    raise BodyRefused("jobId", f"must be a non-empty string, got {json_text(shown)}")


def _reason(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and len(value) <= MAX_REASON_LENGTH):
        return value
    raise BodyRefused("reason", f"must be a string of at most {MAX_REASON_LENGTH} characters, got {json_text(value)}")


def _result(value: Any) -> str | None:
    if value is None or value in JOB_RESULTS:
        return value
    raise BodyRefused("result", f"must be one of {', '.join(JOB_RESULTS)}, got {json_text(value)}")


#: The ``result`` a job-complete may report; ``failure`` lets a label set's ``debugHold.onFailure``
#: keep the agent's sandbox (``scalers.holds``).
JOB_RESULTS = ("success", "failure")


class JobCompleteBody(JsonBody):
    """``POST /api/v1/agents/{agentId}/job-complete``: the job the agent was bound to ended;
    ``result`` (optional) says how: ``failure`` holds the agent when its label set says
    ``debugHold.onFailure``."""

    job_id: Annotated[Annotated[str, Field(min_length=1, pattern=r"\S")], BeforeValidator(_job_id)]
    result: Annotated[Literal["success", "failure"] | None, BeforeValidator(_result)] = None


class ReleaseBody(JsonBody):
    """``POST /api/v1/agents/{agentId}/release``: the orchestrator lost or gave up the agent;
    ``reason`` (trimmed) is recorded with its teardown."""

    reason: Annotated[Annotated[str, Field(max_length=MAX_REASON_LENGTH)] | None, BeforeValidator(_reason)] = None


#: Why a KiCI event scaler asks for an agent's teardown (``kici.scaler.scale-down``'s ``reason``).
ScaleDownReason = Literal["idle", "job-complete", "heartbeat-timeout", "spawn-timeout", "drain", "shutdown"]
SCALE_DOWN_REASONS: tuple[str, ...] = get_args(ScaleDownReason)


def _scale_down_reason(value: Any) -> str:
    if value in SCALE_DOWN_REASONS:
        return value
    shown = None if value is MISSING else value
    raise BodyRefused("reason", f"must be one of {', '.join(SCALE_DOWN_REASONS)}, got {json_text(shown)}")


class KiciScaleDownBody(JsonBody):
    """The payload of a KiCI 0.9 event scaler's ``kici.scaler.scale-down`` event: tear down the
    agent ``agentId`` that a scale-up of scaler ``scalerName`` started. Unknown keys are refused."""

    scaler_name: Annotated[Annotated[Ident, Field(min_length=1, pattern=r"\S")], BeforeValidator(kici_scaler_name)]
    agent_id: Annotated[KiciAgentId, BeforeValidator(kici_agent_id)]
    reason: Annotated[ScaleDownReason, BeforeValidator(_scale_down_reason)]
    request_id: Annotated[RequestId, BeforeValidator(kici_request_id)]


# --- the agent's request bodies ----------------------------------------------------------------------


def _agent_id(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise BodyRefused("agentId", "", text=f"agentId must be a string, got {json_text(value)}")


def _active_jobs(value: Any) -> int | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON does not tell 3 from 3.0, and JSON Schema calls both integers
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ACTIVE_JOBS):
        return value
    text = f"activeJobs must be an integer 0..{MAX_ACTIVE_JOBS}, got {json_text(value)}"
    raise BodyRefused("activeJobs", text, text=text)


def _claim_code(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    shown = None if value is MISSING else value
    text = f"claimCode must be a non-empty string, got {json_text(shown)}"
    raise BodyRefused("claimCode", text, text=text)


class RegisterBody(JsonBody):
    """``POST /api/v1/agents/register`` (optional body): the agent may say which agent it is;
    another agent's id than its token's is refused as ``agent-mismatch``."""

    model_config = ConfigDict(extra="allow")
    agent_id: Annotated[str | None, BeforeValidator(_agent_id)] = None


class HeartbeatBody(JsonBody):
    """``POST /api/v1/agents/{agentId}/heartbeat`` (optional body): how many jobs the agent runs."""

    model_config = ConfigDict(extra="allow")
    active_jobs: Annotated[
        Annotated[int, Field(ge=0, le=MAX_ACTIVE_JOBS, strict=True)] | None, BeforeValidator(_active_jobs)
    ] = None


class ClaimBody(JsonBody):
    """``POST /api/v1/agents/claim``: the claim code of a ``kici.scaler.scale-up`` event."""

    model_config = ConfigDict(extra="allow")
    claim_code: Annotated[Annotated[str, Field(min_length=1)], BeforeValidator(_claim_code)]


# --- answers -----------------------------------------------------------------------------------------


class _Answer(BaseModel):
    """An answer body: camelCase keys, every key always present (null where there is no value)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid")


class AgentView(_Answer):
    """One agent as the orchestrator sees it (``scalers.api.agent_json``). ``jobId`` is "" while
    unbound; ``ip`` is null before the agent has an address and once it ended (its address may be
    the next agent's); times are ISO 8601 UTC."""

    agent_id: str
    scaler: str
    state: AgentState
    labels: list[str]
    job_id: str
    warm: bool
    ip: str | None
    registered_at: datetime | None
    last_heartbeat: datetime | None
    active_jobs: int


class AgentPage(_Answer):
    """One page of ``GET /api/v1/agents``, oldest first; ``nextCursor`` is the ``cursor`` of the
    next page, null on the last one."""

    agents: list[AgentView]
    next_cursor: Annotated[str, Field(pattern=r"^[1-9][0-9]*$")] | None


class ScaleAdmitted(_Answer):
    """201: the job was admitted and its agent is spawning; 200 (``warm: true``): an idle warm
    agent was bound to it."""

    agent_id: str
    scaler: str
    backend_type: str
    warm: Literal[True] | None = Field(default=None, json_schema_extra={"description": "only on 200"})


class Registered(_Answer):
    """The agent's session: heartbeat every ``heartbeatIntervalSeconds`` with ``sessionToken``."""

    agent_id: str
    scaler: str
    bound_job_id: str | None
    run_id: str | None
    labels: list[str]
    mandatory_labels: list[str]
    warm: bool
    session_token: str
    heartbeat_interval_seconds: int


class HeartbeatAnswer(_Answer):
    """What the agent is to do: ``drain`` (take no new job), ``stop`` (exit)."""

    state: AgentState
    drain: bool
    stop: bool


class ClaimGrant(_Answer):
    """A registration token for the claimed agent, and where to register."""

    agent_id: str
    token: str
    orchestrator_url: str
    labels: list[str]


class ScaleDownDone(_Answer):
    """The agent a scale-down named, as it now is: ``state`` ``destroying`` (its teardown began)
    or the state it ended in; null when this console never had an agent of that id (nothing to
    tear down: a scale-up it refused, or another console's)."""

    agent_id: str
    state: AgentState | None
    reason: str


class ErrorDetail(_Answer):
    """``code`` (also the answer's top-level ``reason``), a message for people, and ``field``: the
    JSON path, query parameter or header at fault, when one is."""

    code: str
    message: str
    field: str | None = Field(default=None, json_schema_extra={"description": "absent when no one field is at fault"})


class ApiError(BaseModel):
    """Every error of ``/api/v1`` (``lib.errors.api_error``); an endpoint may add keys at the
    top level (the ones below)."""

    model_config = ConfigDict(extra="allow")
    error: ErrorDetail
    reason: str


class AtCapacity(ApiError):
    """409 ``at-capacity``: a cap is full now; ask again after ``retryAfterSeconds`` (also the
    ``Retry-After`` header)."""

    cap: str
    scaler: str
    retry_after_seconds: int = Field(alias="retryAfterSeconds")


class ExceedsCap(ApiError):
    """422 ``exceeds-cap``: the request alone is larger than cap ``cap``: asking again cannot help."""

    cap: str
    scaler: str
    detail: str


class NoMatchingLabelSet(ApiError):
    """422 ``no-matching-label-set``: the labels asked for."""

    labels: list[str]


class AgentFinished(ApiError):
    """410 ``agent-finished``: the agent was destroyed or failed; it is to stop."""

    state: AgentState
    drain: Literal[False]
    stop: Literal[True]


class NotSpawning(ApiError):
    """409 ``not-spawning``: the agent's spawn was given up before it registered."""

    state: AgentState | None
