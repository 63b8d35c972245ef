"""Validating a scale request before anything is decided (pure; used by the ``/scale`` view).
Errors name the field and the offending value."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from lib.json_body import MISSING, PRINTABLE_FORMAT, BodyRefused, JsonBody, validate_body
from lib.units import parse_memory
from lib.wording import json_text
from scalers.config.schema import Resources, parse_resource_request
from scalers.credentials import IMAGE_REFERENCE, MAX_IMAGE_LENGTH, image_problem

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
    resources (``scalers.config.schema.ResourceRequest``) and the resources as sent."""

    labels: tuple[str, ...]
    job_id: str
    run_id: str = ""
    exclude: tuple[str, ...] = ()
    resources: Any = None
    raw_resources: Any = None
    container: JobImage | None = None


#: Longest ``Idempotency-Key`` header (Stripe's limit).
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def validate_idempotency_key(value: str | None) -> str:
    """The ``/scale`` ``Idempotency-Key`` header, trimmed; "" when absent. Raises
    :class:`InvalidScaleRequest` (field ``Idempotency-Key``) for an empty one, a longer one than
    :data:`MAX_IDEMPOTENCY_KEY_LENGTH` or one with characters outside printable ASCII."""
    if value is None:
        return ""
    key = value.strip()
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidScaleRequest(
            "Idempotency-Key",
            f"must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters, got {json_text(value)}",
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
    """Parse a job's ``resources`` (flat or nested) and refuse negative or huge values.

    Returns a ``scalers.config.schema.ResourceRequest`` (``None`` for absent). Raises
    :class:`InvalidScaleRequest` naming the field as the caller wrote it:
    ``resources.<side>.<field>`` for the nested shape, ``resources.<field>`` for the flat one.

    Jobs repeat a few shapes, so a JSON value's parse is remembered by its canonical text (the
    result is immutable); the remembered parse is of that text itself, so it is the parse of the
    value. Refusals are not remembered.
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
