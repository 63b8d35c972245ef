"""IP allocations in the admin: view only (``lib.readonly_admin``)."""

from django.contrib import admin

from lib.readonly_admin import ReadOnlyAdmin

from .models import IpAllocation


@admin.register(IpAllocation)
class IpAllocationAdmin(ReadOnlyAdmin):
    list_display = ("ip", "vm_id", "scaler_name", "tap_device", "mac_address", "created_at")
    list_filter = ("scaler_name",)
