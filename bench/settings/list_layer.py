"""Bench-only settings: the project's settings with channels_redis's list-based RedisChannelLayer.

``bench/fanout.py --layer list`` runs daphne with these to compare it with the Pub/Sub layer the
project uses. Not used by the project.
"""

from kici_site.settings import *  # noqa: F403
from kici_site.settings import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}], "capacity": 1000, "expiry": 30},
    }
}
