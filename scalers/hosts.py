"""Which host's rq queue runs the work of a scaler's agents (docs/multi-host.md).

Every scaler belongs to the host whose console imported it (``Scaler.host``, its
``KICI_HOST_NAME``). A spawn, registration watch, teardown or reclaim of one of its agents runs
on that host's queue ``host:<scaler.host>``, whichever console admitted the agent or ended it:
only that host reaches its docker, its VMs, its chroots and its nft table. All hosts share one
Redis, so any console can put a job on any host's queue.
"""

from __future__ import annotations

from typing import cast

import django_rq
from django.conf import settings
from rq import Queue

from scalers.models import this_host


def host_queue_name(host: str) -> str:
    """The rq queue of host ``host``: ``host:<host>``."""
    return f"host:{host}"


def scaler_host(scaler) -> str:
    """The host owning ``scaler``'s sandboxes (``Scaler.host``); this host for no scaler."""
    return (scaler.host if scaler is not None else "") or this_host()


def queue_named(name: str) -> Queue:
    """The rq queue ``name`` on the shared Redis: django-rq's own when ``RQ_QUEUES`` lists it (this
    host's queue, ``default``), else a queue of the same connection and default timeout (another
    host's ``host:<name>``)."""
    if name in settings.RQ_QUEUES:
        return django_rq.get_queue(name)
    timeout = cast(int | None, settings.RQ_QUEUES["default"].get("DEFAULT_TIMEOUT"))
    return Queue(
        name,
        connection=django_rq.get_connection("default"),
        default_timeout=timeout,
        serializer=settings.KICI_JOB_SERIALIZER,
    )


def scaler_queue(scaler) -> Queue:
    """The queue of ``scaler``'s host: where its agents' spawns, watches, teardowns and reclaims run."""
    return queue_named(host_queue_name(scaler_host(scaler)))
