from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0011_agent_registered_at_index"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="agent",
            index=models.Index(
                models.OrderBy(models.F("last_heartbeat"), descending=True, nulls_last=True),
                models.OrderBy(models.F("id"), descending=True),
                name="agent_heartbeat_order",
            ),
        ),
    ]
