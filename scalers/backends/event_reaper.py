"""Verdicts of the event-provision reaper: which event-backend spawns that never registered to fail.

Pure functions; the sweep that feeds them lives with the periodic sweeper. Times in ms.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_FLAP_GRACE_MS = 120_000
STRANDED_TIMEOUT_MS = 1_800_000


def flap_grace_ms(knob_ms: int = DEFAULT_FLAP_GRACE_MS, peer_stale_timeout_ms: int = 60_000) -> int:
    """``max(reroute_flap_grace_ms, 2 × peer stale timeout)``, in ms: how long an agent may go
    unseen before it is a reaping candidate, so a reroute between peers is not mistaken for a loss."""
    return max(int(knob_ms), 2 * int(peer_stale_timeout_ms))


def may_reap(known_peers: int, connected_peers: int) -> bool:
    """Stand down when peers are known but none is connected: a partitioned node must not reap."""
    return known_peers == 0 or connected_peers > 0


@dataclass(frozen=True)
class Verdict:
    """``action``: ``spare`` | ``heartbeat-timeout`` | ``spawn-timeout``;
    ``clock``: ``reset`` | ``start`` | ``keep``."""

    action: str
    clock: str = "keep"
    reason: str = ""


def reap_verdict(
    *,
    now_ms: int,
    registered: bool,
    unseen_since_ms: int | None,
    grace_ms: int,
    owner: str | None,
    adopted_by: str | None,
    adopter_alive: bool,
    spawned_at_ms: int,
    spawn_timeout_ms: int,
    stranded_timeout_ms: int = STRANDED_TIMEOUT_MS,
) -> Verdict:
    """The fate of one spawn row older than the spawn timeout (all times in ms)."""
    if registered:
        return Verdict("spare", "reset", "registered")
    if unseen_since_ms is None:
        return Verdict("spare", "start", "first unseen")
    unseen = now_ms - unseen_since_ms
    if unseen < grace_ms:
        return Verdict("spare", reason="inside the flap grace")
    if adopted_by:
        if not adopter_alive:
            return Verdict("heartbeat-timeout", reason=f"adopter {adopted_by} is gone")
        if unseen >= stranded_timeout_ms:
            return Verdict("heartbeat-timeout", reason="stranded with a live adopter")
        return Verdict("spare", reason="adopted by a live peer")
    if not owner:
        return Verdict("spare", reason="no owner recorded")
    if now_ms - spawned_at_ms >= spawn_timeout_ms:
        return Verdict("spawn-timeout", reason="never registered")
    return Verdict("spare", reason="inside the spawn timeout")
