"""Create the viewers / operators / approvers groups with their permissions (operations.roles)."""

from django.db import migrations


def forwards(apps, schema_editor):
    from operations.roles import ensure_permissions, sync_groups

    ensure_permissions(apps)
    sync_groups(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("agents", "0002_initial"),
        ("network", "0001_initial"),
        ("scalers", "0002_admission"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
