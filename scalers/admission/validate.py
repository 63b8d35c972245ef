"""Validating a scale request before anything is decided (pure; used by the ``/scale`` view).
Errors name the field and the offending value."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from lib.json_body import MISSING, PRINTABLE_FORMAT, BodyRefused, JsonBody, validate_body
from lib.units import parse_memory
from lib.wording import header_text, json_text
from scalers.config.schema import Resources, kici_agent_url, parse_resource_request
from scalers.credentials import IMAGE_REFERENCE, MAX_IMAGE_LENGTH, image_problem
from scalers.resources import MIN_MEMORY_BYTES, resource_floor_error

MAX_LABELS = 64
MAX_LABEL_LENGTH = 200
MAX_ID_LENGTH = 200
#: Largest memory a single job may request (bytes): 16 TiB. More is refused as malformed.
MAX_MEMORY_BYTES = 16 * 1024**4


class InvalidScaleRequest(BodyRefused):
    """A malformed scale request. ``field`` is the JSON path (``labels[2]``,
    ``resources.requests.cpus``); ``str(error)`` reads ``<field>: <message>``."""


@dataclass(frozen=True)
class JobImage:
    """A job's own container image (``container.image``) and the name of the registry credential
    to pull it with (``container.credentialsRef``, "" for none; resolved at pull time)."""

    image: str
    credentials_ref: str = ""


@dataclass(frozen=True)
class ScaleInput:
    """A validated request: labels (trimmed), job id, run id, exclude labels, the parsed
    resources (``scalers.config.schema.ResourceRequest``) and the resources as sent.

    A KiCI scale-up event (:class:`KiciScaleUpBody`) also gives the agent's id (``agent_id``),
    the labels it registers with (``agent_labels``; ``labels`` are those of them that route) and
    ``event``: the payload as kept on its agent (``Agent.scale_body``; its claim code is read from
    there by the spawn)."""

    labels: tuple[str, ...]
    job_id: str
    run_id: str = ""
    exclude: tuple[str, ...] = ()
    resources: Any = None
    raw_resources: Any = None
    container: JobImage | None = None
    agent_id: str = ""
    agent_labels: tuple[str, ...] = ()
    event: dict | None = None


#: Longest ``Idempotency-Key`` header (Stripe's limit).
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def validate_idempotency_key(value: str | None) -> str:
    """The ``/scale`` ``Idempotency-Key`` header, trimmed; "" when absent. Raises
    :class:`InvalidScaleRequest` (field ``Idempotency-Key``) for an empty one, a longer one than
    :data:`MAX_IDEMPOTENCY_KEY_LENGTH` or one with characters outside printable ASCII (header
    values are ASCII in practice, and a key is compared byte for byte); the refused value is
    repeated as the client sent it (``lib.wording.header_text``), not as the latin-1 text the
    server decoded it to."""
    if value is None:
        return ""
    key = value.strip()
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        shown = json_text(header_text(value))
        raise InvalidScaleRequest(
            "Idempotency-Key", f"must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters, got {shown}"
        )
    return key


def _as_written(field: str, value: dict) -> str:
    """The field path in the caller's shape: a flat ``{cpus, memory}`` request is reported as
    ``resources.memory``, not as the ``resources.requests.memory`` it is parsed into."""
    flat = not ({"requests", "limits"} & set(value))
    if flat and field.startswith("resources.requests."):
        return "resources." + field[len("resources.requests.") :]
    return field


def _labels(value: Any, field: str, *, allow_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidScaleRequest(field, f"must be a list of strings, got {json_text(value)}")
    if not value and not allow_empty:
        raise InvalidScaleRequest(field, "must name at least one label")
    if len(value) > MAX_LABELS:
        raise InvalidScaleRequest(field, f"at most {MAX_LABELS} labels, got {len(value)}")
    out = []
    for i, label in enumerate(value):
        if not isinstance(label, str):
            raise InvalidScaleRequest(f"{field}[{i}]", f"must be a string, got {json_text(label)}")
        label = label.strip()
        if not label:
            raise InvalidScaleRequest(f"{field}[{i}]", "must not be empty")
        if len(label) > MAX_LABEL_LENGTH or not label.isprintable():
            raise InvalidScaleRequest(f"{field}[{i}]", f"must be printable and at most {MAX_LABEL_LENGTH} characters")
        out.append(label)
    return tuple(out)


def _ident(value: Any, field: str, *, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidScaleRequest(field, f"must be a non-empty string, got {json_text(value)}")
    if len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise InvalidScaleRequest(field, f"must be printable and at most {MAX_ID_LENGTH} characters")
    return value.strip()


def validate_resources(value: Any) -> Any:
    """Parse a job's ``resources`` (flat or nested) and refuse negative or huge values. Returns a
    ``scalers.config.schema.ResourceRequest`` (``None`` for absent); raises
    :class:`InvalidScaleRequest` naming the field as written (``resources.<side>.<field>`` nested,
    ``resources.<field>`` flat). Jobs repeat a few shapes, so a parse is remembered by the value's
    canonical JSON text (the result is immutable); refusals are not remembered.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidScaleRequest("resources", f"must be an object, got {json_text(value)}")
    try:
        key = _CANONICAL_JSON.encode(value)
    except (TypeError, ValueError):  # not plain JSON (a Python caller's own types): parse as it is
        return _parse_resources(value)
    return _parse_resources_text(key)


#: The canonical text of a JSON value (keys sorted): one encoder, not one per request.
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True)


@functools.lru_cache(maxsize=1024)
def _parse_resources_text(text: str) -> Any:
    return _parse_resources(json.loads(text))


def _parse_resources(value: dict) -> Any:
    try:
        parsed = parse_resource_request(value)
    except ValueError as exc:
        text = str(exc)
        field = text.split(":", 1)[0] if text.startswith("resources") else "resources"
        message = text.split(": ", 1)[1] if text.startswith("resources") and ": " in text else text
        raise InvalidScaleRequest(_as_written(field, value), message) from None
    for side in ("requests", "limits"):
        spec = getattr(parsed, side)
        if spec is not None and spec.memory is not None and parse_memory(spec.memory) > MAX_MEMORY_BYTES:
            raise InvalidScaleRequest(
                _as_written(f"resources.{side}.memory", value), f"must be at most 16 TiB, got {json_text(spec.memory)}"
            )
    return parsed


def _image(value: Any) -> str:
    if value is MISSING:
        raise InvalidScaleRequest("container.image", "is required")
    if problem := image_problem(value):
        raise InvalidScaleRequest("container.image", problem)
    return value


def _credentials_ref(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip() or len(value) > MAX_ID_LENGTH):
        raise InvalidScaleRequest(
            "container.credentialsRef",
            f"must be a non-empty string of at most {MAX_ID_LENGTH} characters, got {json_text(value)}",
        )
    return value.strip() if value is not None else None


class JobImageBody(JsonBody):
    """``container`` of a scale request: the job's own image, run with the console's agent
    injected, pulled with the registry credential ``credentialsRef`` names (stored at /admin/)."""

    body_path: ClassVar[str] = "container"

    image: Annotated[
        Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_LENGTH, pattern=f"^{IMAGE_REFERENCE.pattern}$")],
        BeforeValidator(_image),
    ]
    credentials_ref: Annotated[
        Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)] | None, BeforeValidator(_credentials_ref)
    ] = None


#: A label as sent: a printable string with something besides white space (trimmed before use).
Label = Annotated[
    str, Field(min_length=1, max_length=MAX_LABEL_LENGTH, pattern=r"\S", json_schema_extra={"format": PRINTABLE_FORMAT})
]
#: A job or run id as sent: printable, trimmed before use.
Ident = Annotated[str, Field(max_length=MAX_ID_LENGTH, json_schema_extra={"format": PRINTABLE_FORMAT})]
LabelList = Annotated[tuple[Label, ...], Field(max_length=MAX_LABELS)]


def _required_labels(value: Any) -> tuple[str, ...]:
    if value is MISSING:
        raise InvalidScaleRequest("labels", "is required")
    return _labels(value, "labels", allow_empty=False)


def _job_id(value: Any) -> str:
    if value is MISSING:
        raise InvalidScaleRequest("jobId", "is required")
    return _ident(value, "jobId", required=True)


def _run_id(value: Any) -> str | None:
    return None if value is None else _ident(value, "runId", required=False)


def _exclude(value: Any) -> tuple[str, ...]:
    return _labels(value or [], "exclude", allow_empty=True)


class ScaleRequestBody(JsonBody):
    """The body of ``POST /api/v1/scale``: a job's ``runsOn`` labels and id, and what it needs.
    Unknown keys are refused: a misspelt ``resource`` must not silently spawn a default-sized
    agent. ``resources`` is flat ``{cpus, memory}`` or nested ``{requests, limits}`` (cpus in
    cores, memory like ``"512m"``, ``"2g"``, at most 16 TiB)."""

    labels: Annotated[LabelList, Field(min_length=1), BeforeValidator(_required_labels)]
    job_id: Annotated[Annotated[Ident, Field(min_length=1, pattern=r"\S")], BeforeValidator(_job_id)]
    run_id: Annotated[Ident | None, BeforeValidator(_run_id)] = None
    exclude: Annotated[LabelList | None, BeforeValidator(_exclude)] = None
    resources: Annotated[Resources | None, BeforeValidator(validate_resources)] = None
    container: JobImageBody | None = None


def _job_image(body: JobImageBody | None) -> JobImage | None:
    return JobImage(body.image, body.credentials_ref or "") if body else None


def _validated[M: JsonBody](model: type[M], payload: Any) -> M:
    try:
        return validate_body(model, payload)
    except InvalidScaleRequest:
        raise
    except BodyRefused as exc:
        raise InvalidScaleRequest(exc.field, exc.message, text=str(exc)) from None


def validate_scale_request(payload: Any) -> ScaleInput:
    """Validate the JSON body of ``POST /api/v1/scale`` (:class:`ScaleRequestBody`). Raises
    :class:`InvalidScaleRequest` naming the first field at fault."""
    body = _validated(ScaleRequestBody, payload)
    return ScaleInput(
        labels=body.labels,
        job_id=body.job_id,
        run_id=body.run_id or "",
        exclude=body.exclude or (),
        resources=body.resources,
        raw_resources=payload.get("resources"),
        container=_job_image(body.container),
    )


# --- a KiCI 0.9 event scaler's kici.scaler.scale-up payload -------------------------------------------

#: An agent id a KiCI orchestrator chose: it names the agent's container and rules, so a letter or
#: digit, then letters, digits, ".", "_" and "-", at most 100 characters (``Agent.agent_id``).
KICI_AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
#: A claim code: printable ASCII without spaces (it is put in an environment variable), 1-256
#: characters (the orchestrator's are 64 hex digits).
CLAIM_CODE_PATTERN = r"^[!-~]{1,256}$"
#: A TCP port, 0-65535, as the URL pattern's.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
#: ``orchestratorUrl``: ws(s), a host name or IPv4 address, an optional port, a path ending ``/ws``;
#: no credentials, query or fragment. Everything it takes, ``kici_agent_url`` takes too.
ORCHESTRATOR_URL_PATTERN = rf"^wss?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:{_PORT})?(/[A-Za-z0-9._~-]+)*/ws$"
#: Labels a KiCI orchestrator adds to a scale-up's (``kici:agent:``, ``kici:scaler:``,
#: ``kici:role:``): they go to the agent, not into routing.
KICI_LABEL_PREFIX = "kici:"
#: Largest ``resources.cpus`` of a scale-up (cores), as a label set's.
MAX_EVENT_CPUS = 256
#: Smallest ``cpus`` the schema publishes (the label set's floor refuses less, naming it).
MIN_EVENT_CPUS = 0.01


def kici_agent_id(value: Any, field: str = "agentId") -> str:
    """An agent id a KiCI orchestrator chose (:data:`KICI_AGENT_ID_PATTERN`); raises
    :class:`InvalidScaleRequest` naming ``field`` and the value."""
    if value is MISSING:
        raise InvalidScaleRequest(field, "is required")
    if not isinstance(value, str) or re.fullmatch(KICI_AGENT_ID_PATTERN, value) is None:
        raise InvalidScaleRequest(
            field,
            "must be 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            f"got {json_text(value)}",
        )
    return value


def kici_request_id(value: Any) -> str:
    """A scale-up's or scale-down's ``requestId``: 1 to 255 printable ASCII characters (it is the
    request's idempotency key); raises :class:`InvalidScaleRequest` naming ``requestId``."""
    if value is MISSING:
        raise InvalidScaleRequest("requestId", "is required")
    if not isinstance(value, str) or not value.strip():
        raise InvalidScaleRequest("requestId", f"must be a non-empty string, got {json_text(value)}")
    try:
        return validate_idempotency_key(value)
    except InvalidScaleRequest:
        raise InvalidScaleRequest(
            "requestId",
            f"must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters, got {json_text(value)}",
        ) from None


def kici_scaler_name(value: Any) -> str:
    """The ``scalerName`` of a KiCI event: the orchestrator's scaler entry (an id, not routed on)."""
    if value is MISSING:
        raise InvalidScaleRequest("scalerName", "is required")
    return _ident(value, "scalerName", required=True)


def _orchestrator_url(value: Any) -> str:
    if value is MISSING:
        raise InvalidScaleRequest("orchestratorUrl", "is required")
    if not isinstance(value, str) or len(value) > MAX_IMAGE_LENGTH:
        raise InvalidScaleRequest("orchestratorUrl", f"must be a string, got {json_text(value)}")
    try:
        return kici_agent_url(value)
    except ValueError as exc:
        raise InvalidScaleRequest("orchestratorUrl", str(exc)) from None


def _claim_code(value: Any) -> str:
    if value is MISSING:
        raise InvalidScaleRequest("claimCode", "is required")
    if not isinstance(value, str) or re.fullmatch(CLAIM_CODE_PATTERN, value) is None:
        # The value is a secret: its type and length are named, never its text.
        what = f"a string of {len(value)} characters" if isinstance(value, str) else json_text(value)
        raise InvalidScaleRequest(
            "claimCode", f"must be 1 to 256 printable ASCII characters without spaces, got {what}"
        )
    return value


def _event_labels(value: Any) -> tuple[str, ...]:
    if value is MISSING:
        raise InvalidScaleRequest("labels", "is required")
    labels = _labels(value, "labels", allow_empty=False)
    if all(label.startswith(KICI_LABEL_PREFIX) for label in labels):
        raise InvalidScaleRequest(
            "labels",
            f"names only labels the orchestrator adds ({KICI_LABEL_PREFIX}*), none a label set can match, "
            f"got {json_text(list(labels))}",
        )
    return labels


def _mandatory_labels(value: Any) -> tuple[str, ...]:
    return _labels([] if value is None else value, "mandatoryLabels", allow_empty=True)


def _event_job_id(value: Any) -> str | None:
    return None if value is None else _ident(value, "jobId", required=True)


def _event_cpus(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_EVENT_CPUS:
        raise InvalidScaleRequest(
            "resources.cpus", f"must be a number above 0, at most {MAX_EVENT_CPUS}, got {json_text(value)}"
        )
    if problem := resource_floor_error(cpus=value):
        raise InvalidScaleRequest("resources.cpus", f"{problem}, got {json_text(value)}")
    return value


def _mem_bytes(value: Any) -> int | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON does not tell 3 from 3.0
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_MEMORY_BYTES:
        raise InvalidScaleRequest(
            "resources.memBytes", f"must be a whole number of bytes above 0, at most 16 TiB, got {json_text(value)}"
        )
    if problem := resource_floor_error(mem_bytes=value):
        raise InvalidScaleRequest("resources.memBytes", f"{problem}, got {json_text(value)}")
    return value


class KiciResourcesBody(JsonBody):
    """``resources`` of a scale-up: the orchestrator's resolved hints, ``cpus`` (cores) and
    ``memBytes`` (bytes); each absent one is the label set's."""

    body_path: ClassVar[str] = "resources"

    cpus: Annotated[
        Annotated[float, Field(gt=0, le=MAX_EVENT_CPUS, json_schema_extra={"minimum": MIN_EVENT_CPUS})] | None,
        BeforeValidator(_event_cpus),
    ] = None
    mem_bytes: Annotated[
        Annotated[int, Field(gt=0, le=MAX_MEMORY_BYTES, strict=True, json_schema_extra={"minimum": MIN_MEMORY_BYTES})]
        | None,
        BeforeValidator(_mem_bytes),
    ] = None


#: The agent id, as the schema publishes it.
KiciAgentId = Annotated[str, Field(pattern=KICI_AGENT_ID_PATTERN)]
#: The request id (the idempotency key), as the schema publishes it.
RequestId = Annotated[str, Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_LENGTH, pattern=r"^[ -~]*[!-~][ -~]*$")]


class KiciScaleUpBody(JsonBody):
    """The payload of a KiCI 0.9 event scaler's ``kici.scaler.scale-up`` event, as its
    provisioning workflow holds it: start the agent ``agentId`` for the orchestrator at
    ``orchestratorUrl``, which redeems ``claimCode`` for its own token. ``labels`` are the pending
    job's and the orchestrator's ``kici:*`` ones: the others route to a label set running the real
    KiCI agent (``kiciAgent``) of that orchestrator, and the agent registers with all of them.
    ``requestId`` is the request's idempotency key. Unknown keys are refused."""

    scaler_name: Annotated[Annotated[Ident, Field(min_length=1, pattern=r"\S")], BeforeValidator(kici_scaler_name)]
    agent_id: Annotated[KiciAgentId, BeforeValidator(kici_agent_id)]
    labels: Annotated[LabelList, Field(min_length=1), BeforeValidator(_event_labels)]
    mandatory_labels: Annotated[LabelList | None, BeforeValidator(_mandatory_labels)] = None
    resources: KiciResourcesBody | None = None
    orchestrator_url: Annotated[
        Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_LENGTH, pattern=ORCHESTRATOR_URL_PATTERN)],
        BeforeValidator(_orchestrator_url),
    ]
    claim_code: Annotated[Annotated[str, Field(pattern=CLAIM_CODE_PATTERN)], BeforeValidator(_claim_code)]
    job_id: Annotated[Annotated[Ident, Field(min_length=1, pattern=r"\S")] | None, BeforeValidator(_event_job_id)] = (
        None
    )
    request_id: Annotated[RequestId, BeforeValidator(kici_request_id)]


def _console_resources(body: KiciResourcesBody | None) -> dict | None:
    """A scale-up's ``resources`` in the console's flat shape (``{cpus, memory}``), None when it
    names neither."""
    if body is None or (body.cpus is None and body.mem_bytes is None):
        return None
    out: dict[str, Any] = {}
    if body.cpus is not None:
        out["cpus"] = body.cpus
    if body.mem_bytes is not None:
        out["memory"] = f"{format(Decimal(body.mem_bytes) / 1024, 'f')}k"  # exact: 1024 divides into decimals
    return out


def validate_kici_scale_up(payload: Any) -> tuple[ScaleInput, str]:
    """Validate a ``kici.scaler.scale-up`` payload (:class:`KiciScaleUpBody`): the request to
    admit and its ``requestId`` (its idempotency key). Raises :class:`InvalidScaleRequest` naming
    the first field at fault (``resources.memBytes`` and the like for the resources, the
    runtime's floor is checked there too)."""
    body = _validated(KiciScaleUpBody, payload)
    flat = _console_resources(body.resources)
    resources = validate_resources(flat)
    event = {
        "agentId": body.agent_id,
        "scalerName": body.scaler_name.strip(),
        "labels": list(body.labels),
        "mandatoryLabels": list(body.mandatory_labels or ()),
        "resources": payload.get("resources") or {},
        "orchestratorUrl": body.orchestrator_url,
        "claimCode": body.claim_code,
        "jobId": body.job_id or "",
    }
    data = ScaleInput(
        labels=tuple(label for label in body.labels if not label.startswith(KICI_LABEL_PREFIX)),
        job_id=body.job_id or "",
        resources=resources,
        raw_resources=flat,
        agent_id=body.agent_id,
        agent_labels=body.labels,
        event=event,
    )
    return data, body.request_id
