"""Provision backoff of a scaler whose spawns keep failing. Pure.

Backoff after ``n`` consecutive failures = ``base * 2**(n-1)`` seconds, capped at ``max``
(defaults 30 s and 900 s), counted from the last failure; at ``n >= 5`` the reason says the
scaler is consistently failing. Cleared by any successful registration of the scaler's agents.
"""

from __future__ import annotations

from datetime import datetime, timedelta

BACKOFF_BASE_SECONDS = 30.0
BACKOFF_MAX_SECONDS = 900.0
CONSISTENT_FAILURES = 5


def backoff_seconds(
    consecutive_failures: int, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_MAX_SECONDS
) -> float:
    """Seconds to wait after ``consecutive_failures`` failures (0 failures => 0)."""
    if consecutive_failures <= 0:
        return 0.0
    return min(base * 2 ** (consecutive_failures - 1), cap)


def backoff_reason(
    scaler_name: str, consecutive_failures: int, last_failure: datetime | None, now: datetime
) -> str | None:
    """The ``skipped`` reason while inside the backoff window, else ``None``."""
    if consecutive_failures <= 0 or last_failure is None:
        return None
    until = last_failure + timedelta(seconds=backoff_seconds(consecutive_failures))
    if now >= until:
        return None
    left = (until - now).total_seconds()
    how = "is consistently failing" if consecutive_failures >= CONSISTENT_FAILURES else "failed to provision"
    return f'scaler "{scaler_name}" {how} ({consecutive_failures} consecutive failures); next attempt in {left:.0f}s'
