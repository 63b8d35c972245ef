"""The three roles as Django groups: ``viewers``, ``operators`` (plan operations, read the audit) and
``approvers`` (approve or reject). Created by the migration and kept complete after every
``migrate`` (post_migrate), so view permissions of models added later join too; idempotent, never
removing a permission added by hand. Each role's permissions: docs/operations.md ("Roles and
permissions").
"""

from __future__ import annotations

VIEWERS = "viewers"
OPERATORS = "operators"
APPROVERS = "approvers"

VIEW_APPS = ("scalers", "agents", "network", "operations")


def sync_groups(apps) -> None:
    """Create the groups and grant their permissions; ``apps`` is a migration or the real registry."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = list(Permission.objects.filter(content_type__app_label__in=VIEW_APPS, codename__startswith="view_"))
    request = list(Permission.objects.filter(content_type__app_label="operations", codename="request_operation"))
    request += list(Permission.objects.filter(content_type__app_label="audit", codename="view_auditrecord"))
    approve = list(Permission.objects.filter(content_type__app_label="operations", codename="approve_operation"))
    grants = {VIEWERS: view, OPERATORS: view + request, APPROVERS: view + request + approve}
    for name, perms in grants.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*perms)


def ensure_permissions(apps) -> None:
    """Create the content types and permissions of every app now (a data migration runs before
    Django's post_migrate would create them)."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0, apps=apps)
        app_config.models_module = None
