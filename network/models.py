"""Address allocations for microVM TAPs (the ``ip_allocations`` table)."""

from django.db import models


class IpAllocation(models.Model):
    """One VM address; the primary key makes two consoles racing for an address collide."""

    ip = models.GenericIPAddressField(primary_key=True, protocol="IPv4")
    vm_id = models.CharField(max_length=100, unique=True)
    scaler_name = models.CharField(max_length=200, db_index=True)
    tap_device = models.CharField(max_length=15)
    mac_address = models.CharField(max_length=17)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.ip} → {self.vm_id}"
