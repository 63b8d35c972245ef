"""Status values for scalers (TextChoices)."""

from django.db import models


class ScalerType(models.TextChoices):
    CONTAINER = "container", "Container"
    BARE_METAL = "bare-metal", "Bare metal"
    FIRECRACKER = "firecracker", "Firecracker"
    EVENT = "event", "Event"


#: Backends whose spawns run in this process's host and cannot outlive it.
LOCAL_SCALER_TYPES = frozenset({ScalerType.CONTAINER, ScalerType.BARE_METAL, ScalerType.FIRECRACKER})
