"""Idempotent scale: a job has at most one live agent, and so has an ``Idempotency-Key``.
:func:`verdict` (pure) answers a request that meets a live agent: that agent again, or a refusal
naming the field that differs. The database holds both rules for every writer (the unique indexes
``agent_one_live_per_job`` and ``agent_one_live_per_key``). Each case and why:
docs/admission.md ("One live agent per job").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib.wording import json_text

from .validate import JobImage

#: The fields of a scale body compared on a repeat, in the order a mismatch is reported.
BODY_FIELDS = ("labels", "resources", "runId", "exclude", "container")
#: The fields of a KiCI scale-up's payload compared on a repeat, in the order a mismatch is reported.
EVENT_BODY_FIELDS = (
    "agentId",
    "scalerName",
    "labels",
    "mandatoryLabels",
    "resources",
    "orchestratorUrl",
    "claimCode",
    "jobId",
)
#: Fields whose values a refusal does not show (secrets).
UNSHOWN_FIELDS = frozenset({"claimCode"})
#: The header's name, as the refusal's ``field``.
KEY_FIELD = "Idempotency-Key"


def scale_body(
    labels: tuple[str, ...], raw_resources: Any, run_id: str, exclude: tuple[str, ...], job_image: JobImage | None
) -> dict:
    """The validated request as kept on its agent (``Agent.scale_body``) and compared on a repeat."""
    container = {"image": job_image.image, "credentialsRef": job_image.credentials_ref} if job_image else None
    return {
        "labels": list(labels),
        "resources": raw_resources,
        "runId": run_id,
        "exclude": list(exclude),
        "container": container,
    }


@dataclass
class LiveAgent:
    """A live agent bound to a job, as the repeat of its request is answered. ``spawn``: the
    batch's own admission when the agent is not written yet (its id may still change)."""

    agent_id: str
    pk: int | None
    scaler: str
    backend_type: str
    warm: bool
    job_id: str
    key: str
    body: dict | None
    spawn: object = None


@dataclass(frozen=True)
class Verdict:
    """A request meets a live agent: a repeat (``field`` None) or a mismatch naming ``field``."""

    agent: LiveAgent
    field: str | None = None
    message: str = ""


def _key_wording(key: str) -> str:
    return f"with Idempotency-Key {json_text(key)}" if key else "without an Idempotency-Key"


def verdict(
    job_id: str, key: str, body: dict | None, by_job: LiveAgent | None, by_key: LiveAgent | None
) -> Verdict | None:
    """How a request for ``job_id`` with ``key`` ("" for none) and ``body`` meets the live agent of
    its job (``by_job``) and of its key (``by_key``); None when neither exists (decide it). A
    request without a job (a KiCI scale-up) meets the live agent of its key asked for without one
    as its repeat."""
    if by_job is None and not job_id and key and by_key is not None and not by_key.job_id:
        by_job = by_key
    if by_job is not None:
        agent = by_job.agent_id
        if key != by_job.key:
            return Verdict(
                by_job,
                KEY_FIELD,
                f"job {json_text(job_id)} has live agent {agent}, asked for {_key_wording(by_job.key)}, "
                f"not {_key_wording(key)}: repeat the first request, or end that agent first",
            )
        first_body = by_job.body or {}
        fields = EVENT_BODY_FIELDS if "claimCode" in first_body else BODY_FIELDS
        whose = f"job {json_text(job_id)}" if job_id else f"requestId {json_text(key)}"
        for name in fields if by_job.body is not None else ():
            first, now = first_body.get(name), (body or {}).get(name)
            if first != now:
                asked = (
                    f"another {name}" if name in UNSHOWN_FIELDS else f"{name} {json_text(first)}, not {json_text(now)}"
                )
                return Verdict(
                    by_job,
                    name,
                    f"{whose} has live agent {agent}, asked for with {asked}: repeat the first request, "
                    "or end that agent first",
                )
        return Verdict(by_job)
    if key and by_key is not None:
        return Verdict(
            by_key,
            "jobId",
            f"Idempotency-Key {json_text(key)} asked for live agent {by_key.agent_id} of job "
            f"{json_text(by_key.job_id)}, not {json_text(job_id)}: a key names one request",
        )
    return None
