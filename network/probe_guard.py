"""The route check every self-test probe passes before a packet is sent: a self-test must never
generate traffic that could leave this machine, so only destinations whose route ends here (the
host's own addresses, sandboxes on the agents' own bridge) are probed. How the route is asked:
docs/nft-isolation.md ("The isolation self-test").
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from dataclasses import dataclass
from typing import Literal

TIMEOUT_S = 5.0

Where = Literal["local", "bridge", "leaves", "unknown"]


class ProbeGuardError(RuntimeError):
    """The guard cannot be set up (no interface holds the gateway address, ``ip`` failed)."""


@dataclass(frozen=True)
class RouteCheck:
    """The answer for one destination. ``ok``: a probe may be sent. ``where``: ``local`` (a host
    address), ``bridge`` (on the agents' bridge), ``leaves`` (routed out through ``dev``) or
    ``unknown`` (no answer: refused). ``detail``: one line for a person."""

    destination: str
    ok: bool
    where: Where
    dev: str = ""
    detail: str = ""


def _ip(netns: str | None, *args: str) -> subprocess.CompletedProcess:
    argv = ["ip", *(("-n", netns) if netns else ()), "-j", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 255, "", f"{argv[0]}: {exc}")


def interface_holding(address: str, netns: str | None = None) -> str:
    """Name of the interface that has ``address`` configured (the agents' bridge for the gateway).

    Raises :class:`ProbeGuardError` when none does or ``ip`` fails.
    """
    addr = ipaddress.ip_address(address)
    proc = _ip(netns, "addr", "show", "to", f"{addr}/{addr.max_prefixlen}")
    if proc.returncode != 0:
        raise ProbeGuardError(f"cannot list interfaces: {proc.stderr.strip()}")
    for link in json.loads(proc.stdout or "[]"):
        if link.get("addr_info"):
            return str(link["ifname"])
    raise ProbeGuardError(f"no interface{f' in namespace {netns}' if netns else ''} holds the gateway address {addr}")


def _judge(dst: str, route: dict, bridge: str) -> RouteCheck:
    dev = str(route.get("dev", ""))
    if route.get("type") == "local":
        return RouteCheck(dst, True, "local", dev, "a host address: the packet ends on this machine")
    if route.get("type") in (None, "unicast") and dev == bridge and not route.get("gateway"):
        return RouteCheck(dst, True, "bridge", dev, f"on the agents' bridge {bridge}: the packet stays on it")
    via = f" via {route['gateway']}" if route.get("gateway") else ""
    kind = route.get("type") or "unicast"
    if kind != "unicast":
        return RouteCheck(dst, False, "unknown", dev, f"the route to {dst} is of type {kind}: not probed")
    return RouteCheck(dst, False, "leaves", dev, f"the route to {dst} leaves through {dev}{via}: not probed")


class ProbeGuard:
    """Answers "may a probe from ``agent_address`` to this destination be sent?".

    ``agent_address``: the agent's source address. ``bridge``: the host-side interface the agent's
    packets arrive on. ``netns``: the host's namespace (None: this process's). See the module doc.
    """

    def __init__(self, agent_address: str, bridge: str, netns: str | None = None):
        self.agent_address = str(ipaddress.ip_address(agent_address))
        self.bridge = bridge
        self.netns = netns
        self._cache: dict[str, RouteCheck] = {}

    @classmethod
    def for_gateway(cls, agent_address: str, gateway: str, netns: str | None = None) -> ProbeGuard:
        """A guard whose bridge is the interface holding ``gateway``; raises :class:`ProbeGuardError`."""
        return cls(agent_address, interface_holding(gateway, netns), netns)

    def check(self, destination: str) -> RouteCheck:
        """The :class:`RouteCheck` for ``destination`` (an address literal; cached per guard)."""
        dst = str(ipaddress.ip_address(destination))
        if dst not in self._cache:
            self._cache[dst] = self._check(dst)
        return self._cache[dst]

    def _check(self, dst: str) -> RouteCheck:
        proc = _ip(self.netns, "route", "get", dst, "from", self.agent_address, "iif", self.bridge)
        if proc.returncode == 0:
            routes = json.loads(proc.stdout or "[]")
            if routes:
                return _judge(dst, routes[0], self.bridge)
        first = proc.stderr.strip() or "no answer"
        proc = _ip(self.netns, "route", "get", dst)
        routes = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
        if not routes:
            return RouteCheck(dst, False, "unknown", "", f"no route answer for {dst} ({first}): not probed")
        check = _judge(dst, routes[0], self.bridge)
        return RouteCheck(
            check.destination, check.ok, check.where, check.dev, f"{check.detail} (the agent's lookup said: {first})"
        )
