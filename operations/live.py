"""Live progress of an operation, pushed to its page over Channels (group ``operation.<id>``).

Producers (the rq job, the services) send a small notice; the consumer renders the changed parts
from the database with the same template partials as the page (``operations/detail.html#...``), so
the markup of a row cannot drift between the first render and a live update.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


def group_name(operation_id: int) -> str:
    return f"operation.{operation_id}"


def publish(
    operation_id: int, keys: Iterable[str] = (), log_from: int | None = None, log_to: int | None = None
) -> None:
    """Tell the operation's viewers that its status changed, that the targets ``keys`` have new
    outcomes, and that log entries ``[log_from:log_to]`` are new (the consumer renders exactly that
    slice from the database, so a notice handled late never repeats a line). Never raises: a push
    failure must not fail the producer."""
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        async_to_sync(layer.group_send)(
            group_name(operation_id),
            {
                "type": "operation.progress",
                "operation_id": operation_id,
                "keys": list(keys),
                "log_from": log_from,
                "log_to": log_to,
            },
        )
    except Exception:  # noqa: BLE001
        log.warning("could not publish progress of operation %s", operation_id, exc_info=True)


def publish_on_commit(operation_id: int, keys: Iterable[str] = (), log_from: int | None = None) -> None:
    """:func:`publish` once the surrounding transaction commits (immediately outside one)."""
    from django.db import transaction

    keys = list(keys)
    transaction.on_commit(lambda: publish(operation_id, keys, log_from))
