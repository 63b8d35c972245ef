from django.db import migrations

# Every decided request is one row upserted under the admission lock. Its job_id has a unique
# index; the varchar_pattern_ops copy PostgreSQL gets beside it serves only LIKE 'prefix%'
# look-ups, which nothing makes.
NAME = "scalers_scalerequest_job_id_753de116_like"


class Migration(migrations.Migration):
    dependencies = [("scalers", "0012_usage_tally")]

    operations = [
        migrations.RunSQL(
            f"DROP INDEX IF EXISTS {NAME}",
            f"CREATE INDEX {NAME} ON scalers_scalerequest (job_id varchar_pattern_ops)",
        )
    ]
