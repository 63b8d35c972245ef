"""Status values for scalers (TextChoices)."""

from django.db import models


class ScalerType(models.TextChoices):
    CONTAINER = "container", "Container"
    BARE_METAL = "bare-metal", "Bare metal"
    FIRECRACKER = "firecracker", "Firecracker"
    EVENT = "event", "Event"


#: Backends whose spawns run in this process's host and cannot outlive it.
LOCAL_SCALER_TYPES = frozenset({ScalerType.CONTAINER, ScalerType.BARE_METAL, ScalerType.FIRECRACKER})


class SpawnStep(models.TextChoices):
    """The timed steps of one spawn, in order (``scalers.spawn_trace``: the marks each spans)."""

    QUEUE = "queue", "admission to the spawn job's start (queue and rq pickup)"
    CHECKS = "checks", "runtime client, network lookup, bridge guard, registration token"
    CREATE = "create", "create call (a pull included)"
    START = "start", "start call"
    RULES = "rules", "address and bridge port read, isolation rules and binding written"
    CONNECTING = "connecting", "spawn job's last writes: events, state connecting"
    AGENT = "agent", "agent process start to its registration request"
    REGISTER = "register", "registration request to running committed (what the API then answers)"
