#!/usr/bin/env python3
"""The soak's agent (``bench/soak.py``): a bare-metal process agent that plays one job.

Registers with ``KICI_AGENT_TOKEN`` at ``KICI_ORCHESTRATOR_URL``, then heartbeats every
``SOAK_HEARTBEAT_SECONDS`` (default 1) reporting ``activeJobs`` 1 while it holds its bound job and
0 once the job is over: the job is over when the file ``SOAK_CONTROL_DIR/<agent id>.done`` exists
(the soak's orchestrator writes it). Exits 0 when the console answers ``stop`` or 410, or on
SIGTERM; 1 when the registration is refused (HTTP 4xx) or the console stays unreachable for 2
minutes at registration (as the reference agents, it retries every 2 s: a console restart must not
cost a booting agent its registration) or for 10 beats after; 2 on missing environment. Python
standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

_stopping = False


def _on_term(signum, frame):
    global _stopping
    _stopping = True


def post(url: str, bearer: str, body: dict) -> dict:
    """POST JSON with a bearer token; the decoded answer. Raises urllib errors."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # the console's loopback URL
        return json.loads(resp.read() or b"{}")


def pause(seconds: float) -> None:
    end = time.monotonic() + seconds
    while not _stopping and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def main() -> int:
    signal.signal(signal.SIGTERM, _on_term)
    base = os.environ.get("KICI_ORCHESTRATOR_URL", "").rstrip("/")
    agent = os.environ.get("KICI_AGENT_ID", "")
    token = os.environ.get("KICI_AGENT_TOKEN", "")
    control = os.environ.get("SOAK_CONTROL_DIR", "")
    interval = float(os.environ.get("SOAK_HEARTBEAT_SECONDS") or 1)
    if not (base and agent and token and control):
        print("soak-agent: KICI_ORCHESTRATOR_URL, KICI_AGENT_ID, KICI_AGENT_TOKEN, SOAK_CONTROL_DIR needed", flush=True)
        return 2
    answer = None
    for _attempt in range(60):
        try:
            answer = post(f"{base}/api/v1/agents/register", token, {"agentId": agent})
            break
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                print(f"soak-agent: registration refused: HTTP {exc.code}", flush=True)
                return 1
            print(f"soak-agent: registration attempt failed: HTTP {exc.code}", flush=True)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            print(f"soak-agent: registration attempt failed: {exc}", flush=True)
        pause(2.0)
        if _stopping:
            return 0
    if answer is None:
        print("soak-agent: registration failed", flush=True)
        return 1
    session = answer["sessionToken"]
    job = answer.get("boundJobId")
    done_file = os.path.join(control, f"{agent}.done")
    misses = 0
    while not _stopping:
        active = 1 if job and not os.path.exists(done_file) else 0
        try:
            beat = post(f"{base}/api/v1/agents/{agent}/heartbeat", session, {"activeJobs": active})
            misses = 0
            if beat.get("stop"):
                return 0
        except urllib.error.HTTPError as exc:
            if exc.code == 410:
                return 0
            misses += 1
        except (urllib.error.URLError, OSError, ValueError):
            misses += 1
        if misses >= 10:
            return 1
        pause(interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
