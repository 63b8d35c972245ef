"""Drop ``agent_heartbeat_order``: with an index on ``last_heartbeat`` no heartbeat was a HOT update,
so each wrote a new entry into every index of the table; ``/agents/?sort=last_heartbeat`` sorts
narrow rows without it (``agents.listing.page_rows``, docs/fleet-lists.md)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0002_squashed_0020_hold"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="agent", name="agent_heartbeat_order"),
    ]
