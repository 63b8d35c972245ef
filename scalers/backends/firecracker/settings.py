"""Validated settings of one Firecracker scaler plus the shared ``firecracker`` network block."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NETWORK_DEFAULTS = {
    "cidr": "10.0.0.0/24",
    "bridgeName": "kici-br0",
    "gateway": "10.0.0.1",
    "netmask": "255.255.255.0",
    "table": "kici",
    "autoProvisionHost": True,
}


@dataclass(frozen=True)
class FirecrackerSettings:
    """Everything the backend reads from config, already validated.

    Times are seconds. ``netns``: optional network namespace (a name under ``/run/netns``) holding
    the bridge, the TAPs and the nft table; the jailer is then started through ``ip netns exec``.
    Used by the tests to keep every network object off the host's own namespace; empty in production.
    """

    name: str
    max_agents: int
    firecracker_path: str
    jailer_path: str
    kernel_path: str
    chroot_base_dir: str
    uid: int
    gid: int
    vcpu_count: int
    mem_size_mib: int
    require_sudo: bool
    cidr: str
    bridge_name: str
    gateway: str
    netmask: str
    table: str
    auto_provision_host: bool
    netns: str | None = None
    #: Optional initramfs (``initrdPath``): given to the kernel as its initrd when set.
    initrd_path: str = ""
    socket_wait_s: float = 5.0
    destroy_wait_s: float = 5.0
    exit_grace_s: float = 0.5
    #: Disk guard floor: below this many free bytes on the chroot volume no VM is spawned.
    min_free_bytes: int = 1 << 30

    @property
    def prefix(self) -> int:
        return ipaddress.IPv4Network(self.cidr, strict=False).prefixlen

    @property
    def subnet(self) -> str:
        """The VM subnet without host bits (``10.0.0.0/24``): the guarded network of the bridge."""
        return str(ipaddress.IPv4Network(self.cidr, strict=False))

    def scaler_shape(self) -> dict:
        """The scaler-level ``vcpuCount``/``memSizeMib``, as ``jail.resolve_vm_shape`` reads them."""
        return {"vcpuCount": self.vcpu_count, "memSizeMib": self.mem_size_mib}

    @classmethod
    def from_config(
        cls, entry: Mapping[str, Any], network: Mapping[str, Any] | None = None, **overrides: Any
    ) -> FirecrackerSettings:
        """Build from a ``scalers[]`` entry and the top-level ``firecracker`` block (camelCase keys).

        Raises ValueError naming the field and value: ``Firecracker scaler "X" requires a
        'jailerPath' field``, a non-integer uid, a gateway outside the CIDR, and so on.
        """
        name = str(entry.get("name") or "")
        if not name:
            raise ValueError("Firecracker scaler requires a 'name' field")
        for key in ("firecrackerPath", "jailerPath", "kernelPath", "uid", "gid"):
            if entry.get(key) in (None, ""):
                raise ValueError(f"Firecracker scaler \"{name}\" requires a '{key}' field")
        net = {**NETWORK_DEFAULTS, **(network or {})}

        def pos_int(key: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Firecracker scaler \"{name}\": '{key}' must be a positive integer, got {value!r}")
            return value

        for key in ("uid", "gid"):
            if isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] < 0:
                raise ValueError(
                    f"Firecracker scaler \"{name}\": '{key}' must be a non-negative integer, got {entry[key]!r}"
                )
        try:
            subnet = ipaddress.IPv4Network(str(net["cidr"]), strict=False)
        except ValueError:
            raise ValueError(f"firecracker.cidr {net['cidr']!r} is not an IPv4 CIDR") from None
        try:
            gw = ipaddress.IPv4Address(str(net["gateway"]))
        except ValueError:
            raise ValueError(f"firecracker.gateway {net['gateway']!r} is not an IPv4 address") from None
        if gw not in subnet:
            raise ValueError(f"firecracker.gateway {gw} is outside firecracker.cidr {subnet}")
        values = dict(
            name=name,
            max_agents=pos_int("maxAgents", entry.get("maxAgents", 1)),
            firecracker_path=str(entry["firecrackerPath"]),
            jailer_path=str(entry["jailerPath"]),
            kernel_path=str(entry["kernelPath"]),
            initrd_path=str(entry.get("initrdPath") or ""),
            chroot_base_dir=str(entry.get("chrootBaseDir") or "/srv/jailer"),
            uid=entry["uid"],
            gid=entry["gid"],
            vcpu_count=pos_int("vcpuCount", entry.get("vcpuCount", 2)),
            mem_size_mib=pos_int("memSizeMib", entry.get("memSizeMib", 512)),
            require_sudo=bool(entry.get("requireSudo", False)),
            cidr=str(subnet),
            bridge_name=str(net["bridgeName"]),
            gateway=str(gw),
            netmask=str(net["netmask"]),
            table=str(net["table"]),
            auto_provision_host=bool(net["autoProvisionHost"]),
        )
        values.update(overrides)
        return cls(**values)
