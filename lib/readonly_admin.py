"""The one admin base for every project model: view only (no add, change or delete).

Configuration comes from ``scalers.yaml`` (``import_scalers`` / the config-reload operation) and
every change to agents, reservations, host access or capacity goes through an approved operation.
The Django admin would bypass both the validation and the approval workflow, so the project's
models are registered with :class:`ReadOnlyAdmin` (and inlines with :class:`ReadOnlyInline`).
Users and groups keep Django's own, editable admins.
"""

from __future__ import annotations

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Every field shown read-only; nothing is added, changed or deleted from the admin.

    Viewing still needs the model's ``view`` permission (superusers have it).
    """

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields] + [f.name for f in self.model._meta.many_to_many]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    """A tabular inline with the same rule as :class:`ReadOnlyAdmin` (set ``fields``)."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return list(self.fields or [f.name for f in self.model._meta.fields])

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
