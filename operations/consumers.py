"""Live progress of one operation over a WebSocket (``ws/operations/<id>/``, group ``operation.<id>``).

On connect the viewer gets a snapshot (status, progress, every row, the whole log, audit), because
messages sent while a socket was away are lost; then each ``operation.progress`` notice is rendered
from the database with the page's own partials (``operations/detail.html#live_update``) and sent as
out-of-band swaps for the htmx ``ws`` extension. Viewers need ``operations.view_operation``.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from front.presenters import detail_context

from .live import group_name
from .models import Operation


def render_update(
    operation_id: int, user, keys=None, log_from: int | None = None, snapshot: bool = False, log_to: int | None = None
) -> list[str] | None:
    """The WebSocket messages of one push (None when the operation is gone): status, progress, new
    log lines and audit; then, in a message of their own, the target rows of ``keys`` (every row
    when ``keys`` is None). Table rows travel alone because an HTML template parses ``<tr>`` only
    when the first element is table content."""
    operation = (
        Operation.objects.select_related("scaler", "label_set", "requested_by", "approved_by", "rejected_by")
        .filter(pk=operation_id)
        .first()
    )
    if operation is None:
        return None
    if snapshot:
        context = detail_context(operation, user, keys=keys)
    else:
        context = detail_context(operation, user, keys=keys, log_from=log_from or 0, log_to=log_to)
        if log_from is None:
            context["log_entries"] = []
    context.update(oob=True, snapshot=snapshot)
    messages = [render_to_string("operations/detail.html#live_update", context)]
    if context["rows"]:
        messages.append(render_to_string("operations/detail.html#live_rows", context).strip())
    return messages


class OperationConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if not (
            user and user.is_authenticated and await database_sync_to_async(user.has_perm)("operations.view_operation")
        ):
            await self.close(code=4403)
            return
        self.operation_id = int(self.scope["url_route"]["kwargs"]["operation_id"])
        self.group = group_name(self.operation_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        messages = await database_sync_to_async(render_update)(self.operation_id, user, snapshot=True)
        if messages is None:
            await self.close(code=4404)
            return
        for html in messages:
            await self.send(text_data=html)

    async def disconnect(self, code):
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def operation_progress(self, event):
        keys = event.get("keys") or []
        messages = await database_sync_to_async(render_update)(
            self.operation_id, self.scope["user"], keys=keys, log_from=event.get("log_from"), log_to=event.get("log_to")
        )
        for html in messages or []:
            await self.send(text_data=html)
