"""Agent states and lifecycle event types."""

from django.db import models


class AgentState(models.TextChoices):
    SPAWNING = "spawning", "Spawning"
    CONNECTING = "connecting", "Connecting"
    RUNNING = "running", "Running"
    DRAINING = "draining", "Draining"
    DESTROYING = "destroying", "Destroying"
    HELD = "held", "Held"
    DESTROYED = "destroyed", "Destroyed"
    FAILED = "failed", "Failed"


#: States that hold a slot and whose sandbox may exist. ``spawning``: admitted, its backend call
#: queued or in flight; ``connecting``: the backend call is done, the agent has not registered yet;
#: ``held``: it ended, but its sandbox, rules and reservation are kept for debugging until the
#: hold expires or is released (``scalers.holds``).
ACTIVE_STATES = (
    AgentState.SPAWNING,
    AgentState.CONNECTING,
    AgentState.RUNNING,
    AgentState.DRAINING,
    AgentState.DESTROYING,
    AgentState.HELD,
)
#: States of an agent that serves, or is about to serve, the job it is bound to: a ``/scale`` for
#: that job (or with the idempotency key it was asked for with) answers this agent again. A
#: release, a job-complete that ends it, or a failed spawn moves it out of them and ends the key.
LIVE_STATES = (AgentState.SPAWNING, AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)
#: States of an agent that has not registered yet and whose spawn has not been given up.
UNREGISTERED_STATES = (AgentState.SPAWNING, AgentState.CONNECTING)
TERMINAL_STATES = (AgentState.DESTROYED, AgentState.FAILED)

STATE_COLOURS = {
    AgentState.SPAWNING: "blue",
    AgentState.CONNECTING: "blue",
    AgentState.RUNNING: "green",
    AgentState.DRAINING: "amber",
    AgentState.DESTROYING: "amber",
    AgentState.HELD: "amber",
    AgentState.DESTROYED: "grey",
    AgentState.FAILED: "red",
}


class EventType(models.TextChoices):
    """The five scaler lifecycle events an orchestrator knows, the console's own milestones, the
    audit of configuration values an import changed or warned about (`config.*`), a scaler's
    host-tool check (`host.*`) and the exits of the console's own processes under ``make run``
    (`console.*`); the last three are not tied to an agent."""

    PROVISIONING = "scaler.provisioning", "provisioning"
    NETWORK = "scaler.network", "network"
    READY = "scaler.ready", "ready"
    FAILED = "scaler.failed", "failed"
    CONNECTING = "agent.connecting", "connecting"
    REGISTERED = "agent.registered", "registered"
    DRAINING = "agent.draining", "draining"
    LOST = "agent.lost", "lost"
    DESTROYED = "agent.destroyed", "destroyed"
    HOLD_ARMED = "agent.hold_armed", "hold armed"
    HELD = "agent.held", "held for debugging"
    RELEASED = "reservation.released", "reservation released"
    CONFIG_CHANGED = "config.changed", "configuration changed by an import"
    CONFIG_OVERRIDE_KEPT = "config.override_kept", "file changed, console value kept"
    CONFIG_WARNING = "config.warning", "configuration accepted with a warning"
    HOST_TOOLS_MISSING = "host.tools_missing", "scaler not started: host tools missing"
    HOST_TOOLS_FOUND = "host.tools_found", "host tools present: scaler started"
    PROCESS_RESTARTED = "console.process_restarted", "console process exited, restarted"
    PROCESS_GAVE_UP = "console.process_gave_up", "console process given up after its retries"
    API_CALL = "api.call", "orchestrator API call"


#: Badge class of an event type on the pages; an event not listed is blue.
EVENT_BADGES: dict[str, str] = {
    EventType.FAILED: "b-red",
    EventType.LOST: "b-red",
    EventType.READY: "b-green",
    EventType.REGISTERED: "b-green",
    EventType.DRAINING: "b-amber",
    EventType.HOLD_ARMED: "b-amber",
    EventType.HELD: "b-amber",
    EventType.DESTROYED: "b-grey",
    EventType.RELEASED: "b-grey",
    EventType.CONFIG_CHANGED: "b-amber",
    EventType.CONFIG_OVERRIDE_KEPT: "b-amber",
    EventType.CONFIG_WARNING: "b-amber",
    EventType.HOST_TOOLS_MISSING: "b-red",
    EventType.HOST_TOOLS_FOUND: "b-green",
    EventType.PROCESS_RESTARTED: "b-amber",
    EventType.PROCESS_GAVE_UP: "b-red",
}
