"""``decide_async``: how the ``/scale`` view hands a validated request to this process's admission
batches (:mod:`scalers.admission.queue`)."""

from __future__ import annotations

from .decide import Admitted, Request, ScaleDecision
from .queue import get_queue
from .validate import ScaleInput


def scale_request(data: ScaleInput, idempotency_key: str = "", token_name: str = "") -> Request:
    """The admission request of a validated ``/scale`` body (``validate_scale_request``) or KiCI
    scale-up, its validated ``Idempotency-Key`` (a scale-up's ``requestId``; "" for none) and the
    name of the API token that sent it."""
    return Request(
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


async def decide_async(
    data: ScaleInput, idempotency_key: str = "", timeout: float | None = 30.0, *, token_name: str = ""
) -> tuple[ScaleDecision, Admitted | None]:
    """Queue a validated ``/scale`` request (:func:`scale_request`) for this process's admission
    batches and await the decision, without holding a thread. On ``spawning`` the agent and its
    reservation are committed and the admitted agent is returned; its spawn is not enqueued yet
    (``scalers.jobs.enqueue_spawn_or_fail`` does that). Whether ``container.credentialsRef``
    exists is the caller's to check first. Raises ``AdmissionTimeout`` or the database error of its
    batch.
    """
    request = scale_request(data, idempotency_key, token_name)
    return await get_queue().submit_async(request, timeout=timeout)
