"""A partial index of the lost agents (``lost`` set): ``operations.attention`` reads them for the nav
badge of every page, a few rows that it would otherwise find by reading the whole table. No
heartbeat writes ``lost``, so heartbeats stay HOT updates."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0021_agent_no_heartbeat_index"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="agent",
            index=models.Index(condition=~models.Q(lost={}), fields=["state"], name="agent_lost"),
        ),
    ]
