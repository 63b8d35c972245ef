#!/usr/bin/env python3
"""KiCI reference agent (Python standard library only) for bare-metal process mode.

Same protocol as ``sandbox_agent/kici_agent.sh``: reads ``KICI_ORCHESTRATOR_URL``, ``KICI_AGENT_ID``,
``KICI_AGENT_TOKEN`` (and informational ``KICI_LABELS``) from the environment (the process-mode
environment), registers once with ``POST /api/v1/agents/register`` (bearer = the single-use
ephemeral token), then heartbeats ``POST /api/v1/agents/<id>/heartbeat`` (bearer = the session
token from the register answer) every ``heartbeatIntervalSeconds`` until the console answers
``{"stop": true}``, the console stays unreachable for ``KICI_CONSOLE_PATIENCE_SECONDS`` (300: a
console restart, however slow, is not the end of its agents), or SIGTERM arrives.

Exit status: 0 on a requested stop or SIGTERM, 1 when registration or the console fails,
2 on missing environment.

Speaks HTTP through ``http.client`` (``http://`` or ``https://`` console URLs, certificates
checked as ``urllib`` does), dialling the console directly: a proxy named in the environment is
not used. Not ``urllib.request``, whose imports (``tempfile``, ``hashlib``, ``email.utils``, ...)
would be most of the agent's start before it registers (``docs/container-spawn.md``).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from urllib.parse import urlsplit

_stopping = False


def _on_term(signum, frame):
    global _stopping
    _stopping = True


def log(msg: str) -> None:
    print(f"kici-agent: {msg}", flush=True)


class HTTPStatusError(Exception):
    """The console answered with a status other than 2xx (``code``)."""

    def __init__(self, code: int):
        super().__init__(f"HTTP {code}")
        self.code = code


#: What a failed exchange with the console raises (besides :class:`HTTPStatusError`): no
#: connection or a timeout (``OSError``), a malformed answer (``HTTPException``), an answer that
#: is not JSON or a URL that is not http(s) (``ValueError``).
EXCHANGE_ERRORS = (OSError, http.client.HTTPException, ValueError)


def post(url: str, bearer: str, body: dict, timeout: float = 10.0) -> dict:
    """POST JSON to ``url`` (http:// or https://) with a bearer token, ``timeout`` seconds for the
    connection and each read; the decoded JSON answer ({} for an empty one). Raises
    :class:`HTTPStatusError` for a non-2xx answer, else one of :data:`EXCHANGE_ERRORS`."""
    parts = urlsplit(url)  # the console URL from our own environment
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"KICI_ORCHESTRATOR_URL must be an http:// or https:// URL, got {url}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request(
            "POST",
            (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    if not 200 <= answer.status < 300:
        raise HTTPStatusError(answer.status)
    return json.loads(data or b"{}")


def sleep_interruptibly(seconds: float) -> None:
    end = time.monotonic() + seconds
    while not _stopping and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def register(base: str, agent: str, token: str) -> dict | int:
    """The console's registration answer (it has a ``sessionToken``), or the exit code when
    registering ends without one: 0 when told to stop, 1 when refused or out of attempts."""
    answer = None
    # Every 2 s for up to 2 minutes: a console restarting (its workers finish their jobs first) must
    # not cost the agents that were booting meanwhile their one registration.
    for attempt in range(1, 61):
        if _stopping:
            return 0
        try:
            answer = post(f"{base}/api/v1/agents/register", token, {"agentId": agent})
            break
        except HTTPStatusError as exc:
            if exc.code in (400, 401, 403, 404, 409):
                log(f"registration refused: HTTP {exc.code}")
                return 1
            log(f"registration attempt {attempt}: HTTP {exc.code}")
        except EXCHANGE_ERRORS as exc:
            log(f"registration attempt {attempt}: {exc}")
        sleep_interruptibly(2.0)
    if not answer or not answer.get("sessionToken"):
        log("registration failed")
        return 1
    return answer


def heartbeat_until_stopped(base: str, agent: str, session: str, interval: float, patience: float) -> int:
    """Heartbeat every ``interval`` seconds until told to stop; the exit code: 0 when stopped or
    forgotten by the console, 1 once no heartbeat succeeded for ``patience`` seconds."""
    misses = 0
    last_answer = time.monotonic()
    while not _stopping:
        sleep_interruptibly(interval)
        if _stopping:
            break
        try:
            beat = post(f"{base}/api/v1/agents/{agent}/heartbeat", session, {"activeJobs": 0})
            if misses:
                log(f"heartbeat answered again after {misses} failed")
            misses, last_answer = 0, time.monotonic()
            if beat.get("stop"):
                log("console asked us to stop")
                return 0
        except HTTPStatusError as exc:
            if exc.code in (401, 403, 404, 410):
                log(f"console no longer knows this agent: HTTP {exc.code}")
                return 0
            misses += 1
            log(f"heartbeat failed ({misses}): HTTP {exc.code}")
            if time.monotonic() - last_answer >= patience:
                log(f"no heartbeat answered for {patience:g}s; exiting")
                return 1
        except EXCHANGE_ERRORS as exc:
            misses += 1
            log(f"heartbeat failed ({misses}): {exc}")
            if time.monotonic() - last_answer >= patience:
                log(f"console unreachable for {patience:g}s; exiting")
                return 1
    log("terminated")
    return 0


def main() -> int:
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    base = os.environ.get("KICI_ORCHESTRATOR_URL", "").rstrip("/")
    agent = os.environ.get("KICI_AGENT_ID", "")
    token = os.environ.get("KICI_AGENT_TOKEN", "")
    if not (base and agent and token):
        log("KICI_ORCHESTRATOR_URL, KICI_AGENT_ID and KICI_AGENT_TOKEN are required")
        return 2
    log(f"registering {agent} with {base} (labels: {os.environ.get('KICI_LABELS', '')})")
    answer = register(base, agent, token)
    if isinstance(answer, int):
        return answer
    session = answer["sessionToken"]
    interval = float(answer.get("heartbeatIntervalSeconds") or os.environ.get("KICI_HEARTBEAT_SECONDS") or 5)
    patience = float(os.environ.get("KICI_CONSOLE_PATIENCE_SECONDS") or 300)
    log(f"registered; heartbeat every {interval:g}s")
    return heartbeat_until_stopped(base, agent, session, interval, patience)


if __name__ == "__main__":
    sys.exit(main())
