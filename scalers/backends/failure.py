"""The ``scaler.failed`` detail of a failed spawn: the error plus the agent's last output lines (SPEC (d))."""

from __future__ import annotations

#: Lines of agent output (a container's logs, a process's log file) attached to a ``scaler.failed``
#: detail (SPEC (d)).
CAPTURED_LINES = 50


def failure_detail(error: BaseException, captured: list[str]) -> str:
    """``scaler.failed`` detail: the message, plus ``\\n--- captured output ---\\n<lines>`` when any (CTR-26)."""
    detail = str(error) or type(error).__name__
    if captured:
        detail += "\n--- captured output ---\n" + "\n".join(captured[-CAPTURED_LINES:])
    return detail
