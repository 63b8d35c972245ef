"""What the real KiCI agent's own log says it does: idle, busy with a job, or refused by its
orchestrator (design: docs/real-kici-agent.md, "Idle and busy"). Only the agent's own JSON records
count (``service`` ``agent``): ``Accepting job dispatch`` (busy, ``jobId``, ``runId``), the
``Scaler-managed agent ... idle`` lines (idle), and ``Orchestrator connection closed`` with
``code`` 4010 (refused; it neither retries nor exits); anything else is passed over. A job can
write lines of this shape too, so what is read here is only shown, and ends a refused agent only
before it registered, while no job has run in its sandbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: The message the agent logs when it accepts a job (with ``jobId`` and ``runId``).
JOB_ACCEPTED = "Accepting job dispatch"
#: The beginnings of the messages a scaler-managed agent logs when its last job ended.
IDLE_PREFIXES = ("Scaler-managed agent idle", "Scaler-managed agent reconnected and idle")
#: The message the agent logs when its WebSocket closes (with ``code`` and ``reason``).
CONNECTION_CLOSED = "Orchestrator connection closed"
#: The close code of an orchestrator that refused the agent's token or labels for good.
AUTH_REFUSED_CODE = 4010
#: The ``service`` field of every record the agent's own logger writes.
AGENT_SERVICE = "agent"

IDLE, BUSY = "idle", "busy"


@dataclass(frozen=True)
class Activity:
    """What the agent does: ``state`` :data:`IDLE` or :data:`BUSY`, and while busy the
    orchestrator's ids of the job and its run."""

    state: str
    job_id: str = ""
    run_id: str = ""

    @property
    def text(self) -> str:
        """``busy: job <id> (run <id>)`` or ``idle``, as the pages say it."""
        return f"busy: job {self.job_id} (run {self.run_id})" if self.state == BUSY else IDLE

    def as_context(self) -> dict[str, str]:
        """Its form on the agent row (``backend_context["kici_activity"]``, read by the pages)."""
        return {"state": self.state, "jobId": self.job_id, "runId": self.run_id}

    @classmethod
    def from_context(cls, value: object) -> Activity | None:
        """The :class:`Activity` :meth:`as_context` stored, None for none or another shape."""
        if not isinstance(value, dict) or value.get("state") not in (IDLE, BUSY):
            return None
        return cls(str(value["state"]), str(value.get("jobId") or ""), str(value.get("runId") or ""))


def log_record(line: str) -> dict | None:
    """The agent's own log record a line holds: a JSON object (the whole line, blanks and a serial
    console's carriage return aside) with ``service`` ``agent`` and a string ``message``; None for
    anything else, such as a forked runner's JSON the agent relays behind a
    ``[workflow-runner:stdout]`` prefix."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("service") != AGENT_SERVICE:
        return None
    return record if isinstance(record.get("message"), str) else None


def latest_activity(lines: list[str]) -> Activity | None:
    """The activity the last marking message of ``lines`` (oldest first) says, None when they hold
    none (the caller keeps what it knew)."""
    for line in reversed(lines):
        record = log_record(line)
        if record is None:
            continue
        message = record["message"]
        if message == JOB_ACCEPTED:
            return Activity(BUSY, str(record.get("jobId") or ""), str(record.get("runId") or ""))
        if message.startswith(IDLE_PREFIXES):
            return Activity(IDLE)
    return None


def refusal(lines: list[str]) -> str | None:
    """How the orchestrator refused the agent (``closed the connection with code 4010: <reason>``)
    when ``lines`` hold that close, else None."""
    for line in reversed(lines):
        record = log_record(line)
        if record is None or record["message"] != CONNECTION_CLOSED:
            continue
        if record.get("code") == AUTH_REFUSED_CODE:
            reason = str(record.get("reason") or "no reason given")
            return f"closed the connection with code {AUTH_REFUSED_CODE}: {reason}"
    return None
