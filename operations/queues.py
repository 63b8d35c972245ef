"""Which rq queue runs an operation, and whether anyone listens on it.

An operation runs on the queue of the host that owns its targets, ``host:<name>``: the docker host
or VM host the containers, VMs, chroots and rules live on, so several hosts each run a worker for
their own backends. Local backends (container on the local socket, bare-metal, firecracker) belong
to the host of their scaler (``Scaler.host``, ``scalers.hosts``), whichever console plans or
approves the operation.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings

from scalers.hosts import host_queue_name, queue_named, scaler_host


class QueueNotConfigured(LookupError):
    """The queue is not in ``settings.RQ_QUEUES`` (add it with ``KICI_EXTRA_QUEUES``)."""


def queue_for_scaler(scaler) -> str:
    """``host:<name>`` of the host owning ``scaler``'s resources.

    A container scaler with ``host: tcp://h:2376`` lives on ``h`` (queue ``host:h``); everything
    else lives on its scaler's host (``host:<Scaler.host>``), no scaler at all on this console's
    host (``settings.KICI_HOST_QUEUE``).
    """
    if scaler is None:
        return settings.KICI_HOST_QUEUE
    config = scaler.config or {}
    remote = config.get("host")
    if scaler.type == "container" and isinstance(remote, str) and remote.strip():
        host = urlsplit(remote.strip()).hostname
        if host:
            return host_queue_name(host)
    return host_queue_name(scaler_host(scaler))


def get_queue(name: str):
    """The rq queue ``name`` on the shared Redis (``scalers.hosts.queue_named``): one of
    ``RQ_QUEUES`` or any host's ``host:<name>``; QueueNotConfigured for another name."""
    if name not in settings.RQ_QUEUES and not name.startswith("host:"):
        raise QueueNotConfigured(
            f"queue {name!r} is not configured on this console (known: {', '.join(settings.RQ_QUEUES)}); "
            f"add it to KICI_EXTRA_QUEUES"
        )
    return queue_named(name)


def workers_listening(name: str) -> int:
    """How many live rq workers listen on queue ``name`` (workers whose registration has not expired)."""
    from rq import Worker

    queue = get_queue(name)
    return len(Worker.all(queue=queue))
