"""Delivering scaler events (``kici.scaler.scale-up`` / ``scale-down``) to provisioning targets,
signed with HMAC-SHA256 and retried with backoff up to a deadline; every target must accept, or
:class:`EventEmitError` is raised. Targets, the request and the retries: docs/event-provisions.md
("Deliveries").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable

from django.conf import settings

log = logging.getLogger(__name__)

SCALE_UP = "kici.scaler.scale-up"
SCALE_DOWN = "kici.scaler.scale-down"
SCALE_DOWN_REASONS = ("idle", "job-complete", "heartbeat-timeout", "spawn-timeout", "drain", "shutdown")


class EventEmitError(RuntimeError):
    """An event could not be delivered to a target; the message names the target and why."""


def _setting(name: str, default=None):
    value = getattr(settings, name, None)
    return value if value not in (None, "") else os.environ.get(name, default)


def target_urls() -> dict[str, str]:
    raw = _setting("KICI_PROVISIONING_TARGET_URLS", {})
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    out = {}
    for part in str(raw).split(","):
        if "=" in part:
            name, url = part.split("=", 1)
            out[name.strip()] = url.strip()
    return out


def resolve_target(target: str) -> str:
    """The URL of one provisioning target; raises :class:`EventEmitError` for an unmapped name."""
    if target.startswith(("http://", "https://")):
        return target
    url = target_urls().get(target)
    if not url:
        raise EventEmitError(f'provisioning target "{target}" has no URL: map it in KICI_PROVISIONING_TARGET_URLS')
    return url


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body>``, the ``X-Kici-Signature-256`` value."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class HttpEventEmitter:
    """Signs and POSTs events; ``secret`` defaults to ``KICI_PROVISIONING_SECRET``."""

    def __init__(
        self,
        secret: str | None = None,
        *,
        attempts: int = 5,
        timeout: float = 10.0,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        session=None,
    ):
        self.secret = secret if secret is not None else _setting("KICI_PROVISIONING_SECRET")
        self.attempts, self.timeout, self.backoff, self.max_backoff = attempts, timeout, backoff, max_backoff
        self._session = session

    @property
    def session(self):
        if self._session is None:
            import requests

            self._session = requests.Session()
        return self._session

    def emit(self, event: str, payload: dict, targets: Iterable[str], deadline: float | None = None) -> list[str]:
        """Deliver ``event`` to every target; returns the delivery ids. Raises EventEmitError."""
        if not self.secret:
            raise EventEmitError("KICI_PROVISIONING_SECRET is not set: refusing to send unsigned provisioning events")
        targets = list(targets)
        if not targets:
            raise EventEmitError("no provisioning targets configured")
        return [self._deliver(event, payload, resolve_target(t), t, deadline) for t in targets]

    def _deliver(self, event: str, payload: dict, url: str, name: str, deadline: float | None) -> str:
        import requests

        delivery = str(uuid.uuid4())
        body = json.dumps(
            {"event": event, "deliveryId": delivery, "timestampMs": int(time.time() * 1000), "payload": payload},
            separators=(",", ":"),
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Kici-Event": event,
            "X-Kici-Delivery": delivery,
            "X-Kici-Signature-256": sign(self.secret, body),
        }
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                resp = self.session.post(url, data=body, headers=headers, timeout=self.timeout)
                if 200 <= resp.status_code < 300:
                    return delivery
                last = f"HTTP {resp.status_code}"
                if resp.status_code != 429 and resp.status_code < 500:
                    raise EventEmitError(f'{event} to "{name}" was refused: {last}')
            except requests.RequestException as exc:
                last = f"{type(exc).__name__}: {exc}"
            pause = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
            if attempt == self.attempts or (deadline is not None and time.time() + pause >= deadline):
                break
            log.info("%s to %s failed (%s); retry %d in %.1f s", event, name, last, attempt, pause)
            time.sleep(pause)
        raise EventEmitError(f'{event} to "{name}" failed after {attempt} attempt(s): {last}')
