from django.db import migrations, models

import scalers.models


class Migration(migrations.Migration):
    """Every scaler belongs to a host; the rows that exist belong to the host that migrates."""

    dependencies = [
        ("scalers", "0010_capacity_sample"),
    ]

    operations = [
        migrations.AddField(
            model_name="scaler",
            name="host",
            field=models.CharField(
                db_index=True,
                default=scalers.models.this_host,
                help_text="KICI_HOST_NAME of the console that imported it",
                max_length=200,
            ),
        ),
    ]
