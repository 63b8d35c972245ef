from django.db import migrations, models

# Every admitted agent is one row inserted under the admission lock, and each index is written
# with it. Dropped: the scaler index (the (scaler, state) index leads with it) and the
# varchar_pattern_ops copies PostgreSQL gets for agent_id and state, which serve only LIKE
# 'prefix%' look-ups that nothing makes.
PATTERN_INDEXES = {
    "agents_agent_agent_id_fad8a618_like": "agent_id",
    "agents_agent_state_d34ecb87_like": "state",
}


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0013_agent_teardown_reason"),
        ("scalers", "0012_usage_tally"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agent",
            name="scaler",
            field=models.ForeignKey(
                db_index=False,
                on_delete=models.deletion.PROTECT,
                related_name="agents",
                to="scalers.scaler",
            ),
        ),
        *(
            migrations.RunSQL(
                f"DROP INDEX IF EXISTS {name}",
                f"CREATE INDEX {name} ON agents_agent ({column} varchar_pattern_ops)",
            )
            for name, column in PATTERN_INDEXES.items()
        ),
    ]
