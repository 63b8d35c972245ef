from django.contrib import admin

from .models import IpAllocation


@admin.register(IpAllocation)
class IpAllocationAdmin(admin.ModelAdmin):
    list_display = ("ip", "vm_id", "scaler_name", "tap_device", "mac_address", "created_at")
    list_filter = ("scaler_name",)
