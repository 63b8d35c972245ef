"""The trace of one spawn: when each of its steps ended, stored with the agent and observed in a
histogram per step, each step counted once whoever completes it. How marks are written and merged:
docs/container-spawn.md ("Trace").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from agents.models import Agent
from scalers.choices import SpawnStep
from scalers.metrics import SPAWN_STEP, add_to_counters, histogram_increments

#: The marks in the order they are normally reached; ``admitted`` is 0 by definition.
MARKS = (
    "admitted",
    "picked_up",
    "checked",
    "created",
    "started",
    "process_started",
    "bound",
    "connecting",
    "register_received",
    "running",
)
#: Each step and the marks it spans (from, to).
STEPS: dict[SpawnStep, tuple[str, str]] = {
    SpawnStep.QUEUE: ("admitted", "picked_up"),
    SpawnStep.CHECKS: ("picked_up", "checked"),
    SpawnStep.CREATE: ("checked", "created"),
    SpawnStep.START: ("created", "started"),
    SpawnStep.RULES: ("started", "bound"),
    SpawnStep.CONNECTING: ("bound", "connecting"),
    SpawnStep.AGENT: ("process_started", "register_received"),
    SpawnStep.REGISTER: ("register_received", "running"),
}


def offsets(agent: Agent, moments: dict[str, datetime]) -> dict[str, float]:
    """``moments`` (mark -> time) as seconds since ``agent.created_at``, to the tenth of a
    millisecond. Raises ``ValueError`` naming a mark :data:`MARKS` does not know."""
    unknown = sorted(set(moments) - set(MARKS))
    if unknown:
        raise ValueError(f"spawn trace mark {unknown[0]!r} is not one of {', '.join(MARKS)}")
    return {name: round((at - agent.created_at).total_seconds(), 4) for name, at in moments.items()}


def record_marks(agent: Agent, moments: dict[str, datetime]) -> dict[str, float]:
    """Merge ``moments`` into ``agent``'s stored trace (one statement, on the current connection:
    inside a transaction it commits with the work) and observe each step they complete, labelled
    with the agent's scaler. Returns the merged trace ({} when the row is gone)."""
    mine = offsets(agent, moments)
    if not mine:
        return {}
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE agents_agent SET spawn_trace = spawn_trace || %s::jsonb WHERE id = %s RETURNING spawn_trace",
            [json.dumps(mine), agent.pk],
        )
        row = cur.fetchone()
    if row is None:
        return {}
    merged = row[0] if isinstance(row[0], dict) else json.loads(row[0])
    merged["admitted"] = 0.0
    others = set(merged) - set(mine)
    increments: dict = {}
    for step, (start, end) in STEPS.items():
        if start in merged and end in merged and not (start in others and end in others):
            seconds = max(0.0, merged[end] - merged[start])
            increments |= histogram_increments(SPAWN_STEP, {"scaler": agent.scaler.name, "step": step.value}, seconds)
    if increments:
        add_to_counters(increments)
    return merged


@dataclass(frozen=True)
class WaterfallBar:
    """One step of a waterfall: its name and what it is, where it starts (seconds since admission)
    and how long it takes (seconds, and whole milliseconds), and the same as percentages of the
    whole trace (for drawing)."""

    step: str
    what: str
    start: float
    seconds: float
    ms: int
    left_pct: float
    width_pct: float


def waterfall(trace: dict | None) -> list[WaterfallBar]:
    """The bars of the steps ``trace`` (``Agent.spawn_trace``) has both marks of, in the order they
    started (steps overlap: the agent's own start runs while its rules are written); [] for an
    empty trace. A step that ends before it starts (marks of two clocks) is drawn with no width."""
    marks = {"admitted": 0.0, **(trace or {})}
    spans = [(step, marks[a], marks[b]) for step, (a, b) in STEPS.items() if a in marks and b in marks]
    spans.sort(key=lambda span: span[1])  # stable: steps starting together keep their step order
    if not spans:
        return []
    total = max(max(end for _, _, end in spans), 1e-6)
    return [
        WaterfallBar(
            step=step.value,
            what=step.label,
            start=start,
            seconds=max(0.0, end - start),
            ms=round(1000 * max(0.0, end - start)),
            left_pct=round(100 * max(0.0, start) / total, 2),
            width_pct=round(100 * max(0.0, end - start) / total, 2),
        )
        for step, start, end in spans
    ]
