"""Who holds an agent address now: the question every path that deletes (or rewrites) an
address's isolation rules asks first, since rules are keyed by address and addresses are reused.
What counts as a holder, and how check and act are serialised per address (a PostgreSQL advisory
lock): ``docs/address-holders.md``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agents.models import Agent
from network.models import IpAllocation

from .docker_net import container_addresses

log = logging.getLogger(__name__)

#: Holder kinds.
AGENT, CONTAINER, VM, UNKNOWN = "agent", "container", "vm", "unknown"

#: ``() -> list of container summaries`` (``GET /containers/json?all=1``, kici-managed only).
ContainerLister = Callable[[], Iterable[dict]]
#: ``() -> iterable of (ip, vm_id, scaler_name)``: the VM address allocations.
AllocationLister = Callable[[], Iterable[tuple[str, str, str]]]


@dataclass(frozen=True)
class Holder:
    """One thing that holds an address now.

    ``kind``: ``agent`` | ``container`` | ``vm`` | ``unknown``. ``ident``: agent id, container id,
    VM id ("" for unknown). ``agent_id``: the agent it belongs to ("" when not known).
    ``detail``: one line for a person (``agent scaler-container-1a2b3c4d (running)``,
    ``container <name> (scaler ci)``, ``VM <id> (scaler fc)``, or why it is unknown).
    """

    kind: str
    ident: str
    agent_id: str
    detail: str

    def __str__(self) -> str:
        return self.detail


def _norm(address: object) -> str | None:
    try:
        return str(ipaddress.ip_address(str(address).strip()))
    except ValueError:
        return None


def holders_by_address(
    *,
    agents: Iterable[tuple[str, str, str]] = (),
    containers: Iterable[dict] = (),
    allocations: Iterable[tuple[str, str, str]] = (),
) -> dict[str, list[Holder]]:
    """Every address with its holders; pure.

    ``agents``: ``(agent_id, ip, state)`` of ACTIVE agent rows. ``containers``: container
    summaries (only ``kici-managed=true`` ones count; addresses per
    ``docker_net.container_addresses``). ``allocations``: ``(ip, vm_id, scaler_name)``. Addresses are
    normalised (``ipaddress``); unparsable ones are skipped. Order: agents, containers, VMs.
    """
    out: dict[str, list[Holder]] = {}

    def add(address: object, holder: Holder) -> None:
        key = _norm(address)
        if key is not None:
            out.setdefault(key, []).append(holder)

    for agent_id, ip, state in agents:
        if ip:
            add(ip, Holder(AGENT, agent_id, agent_id, f"agent {agent_id} ({state})"))
    for s in containers:
        labels = s.get("Labels") or {}
        if labels.get("kici-managed") != "true":
            continue
        name = ((s.get("Names") or [""])[0] or "").lstrip("/") or str(s.get("Id", ""))[:12]
        holder = Holder(
            CONTAINER, str(s.get("Id", "")), labels.get("kici-agent-id") or "",
            f"container {name} (scaler {labels.get('kici-scaler-name') or '?'})",
        )  # fmt: skip
        for address in container_addresses(s):
            add(address, holder)
    for ip, vm_id, scaler_name in allocations:
        add(ip, Holder(VM, vm_id, vm_id, f"VM {vm_id} (scaler {scaler_name})"))
    return out


def other_holders(holders: Iterable[Holder], exclude: Iterable[str] = ()) -> list[Holder]:
    """``holders`` minus the sandbox being torn down; pure.

    ``exclude``: its identifiers (agent id, container id, VM id; empty strings are ignored). A
    holder is left out when its ``ident`` or its ``agent_id`` is excluded; an excluded container
    also excludes the agent its label names. ``unknown`` holders are never left out.
    """
    holders = list(holders)
    gone = {e for e in exclude if e}
    gone |= {h.agent_id for h in holders if h.kind == CONTAINER and h.ident in gone and h.agent_id}
    return [h for h in holders if h.kind == UNKNOWN or not (h.ident in gone or (h.agent_id and h.agent_id in gone))]


def db_agents(addresses: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
    """``(agent_id, ip, state)`` of every active agent row with an address (any scaler); only
    those with one of ``addresses`` when given."""
    rows = Agent.objects.active().exclude(ip=None)
    if addresses is not None:
        rows = rows.filter(ip__in=list(addresses))
    return [(a, ip, s) for a, ip, s in rows.values_list("agent_id", "ip", "state") if ip]


def db_allocations(addresses: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
    """``(ip, vm_id, scaler_name)`` of the ``ip_allocations`` rows (only ``addresses`` when given)."""
    rows = IpAllocation.objects.all()
    if addresses is not None:
        rows = rows.filter(ip__in=list(addresses))
    return list(rows.values_list("ip", "vm_id", "scaler_name"))


def read_holders(
    addresses: Iterable[str] | None = None,
    *,
    containers: Iterable[dict] | None = None,
    list_containers: ContainerLister | None = None,
    allocations: AllocationLister | None = None,
) -> dict[str, list[Holder]]:
    """Holders now, from the database (active agent rows, allocations) and the runtime listing.

    ``addresses``: restrict to these (None: all). ``containers``: a listing already made, else
    ``list_containers()`` is called (neither: no containers are consulted, e.g. a Firecracker
    host). A listing that raises makes every address in ``addresses`` held by an ``unknown``
    holder (with ``addresses`` None it re-raises: a full map cannot be built blind).
    ``allocations``: a lister for a non-database allocator, else the ``ip_allocations`` table.
    """
    wanted = None if addresses is None else [a for a in (_norm(x) for x in addresses) if a]
    failure = ""
    if containers is None and list_containers is not None:
        try:
            containers = list(list_containers())
        except Exception as exc:  # an unreadable runtime keeps every rule
            if wanted is None:
                raise
            failure = f"unknown: the container runtime could not be listed ({exc})"
            containers = ()
    allocs = list(allocations()) if allocations is not None else db_allocations(wanted)
    found = holders_by_address(agents=db_agents(wanted), containers=containers or (), allocations=allocs)
    if wanted is not None:
        found = {a: found.get(a, []) for a in wanted}
        if failure:
            for a in wanted:
                found[a].append(Holder(UNKNOWN, "", "", failure))
    return found


def address_holders(
    address: str,
    *,
    exclude: Iterable[str] = (),
    list_containers: ContainerLister | None = None,
    allocations: AllocationLister | None = None,
) -> list[Holder]:
    """Who other than ``exclude`` holds ``address`` now (see :func:`read_holders`); [] = nobody."""
    key = _norm(address)
    if key is None:
        return []
    found = read_holders([key], list_containers=list_containers, allocations=allocations)
    return other_holders(found.get(key, []), exclude)


@contextmanager
def address_lock(*addresses: str) -> Iterator[None]:
    """Hold the per-address advisory lock(s) for the block (in one database transaction).

    Every path that checks holders and then deletes or writes an address's rules runs inside it,
    so the check and the write of two such paths never interleave. Several addresses are locked
    in sorted order (no deadlock between two multi-address holders).
    """
    from django.db import connection, transaction

    keys = sorted({a for a in (_norm(x) for x in addresses) if a})
    with transaction.atomic():
        if keys:
            with connection.cursor() as cur:
                for key in keys:
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"kici-rules:{key}"])
        yield


def remove_unless_held(
    address: str | None,
    remove: Callable[[str], object],
    *,
    exclude: Iterable[str] = (),
    list_containers: ContainerLister | None = None,
    allocations: AllocationLister | None = None,
    why: str = "",
) -> tuple[object, list[Holder]]:
    """Delete ``address``'s rules with ``remove(address)`` unless someone else holds it now.

    Under :func:`address_lock`: read the holders other than ``exclude``; if there are any, log
    that the rules are kept (naming them and ``why``, e.g. "destroy of agent X") and return
    ``(None, holders)`` without calling ``remove``; else return ``(remove(address), [])``. A blank
    address is a no-op ``(None, [])``. Errors from ``remove`` or the database propagate.
    """
    if not address:
        return None, []
    with address_lock(address):
        held = address_holders(address, exclude=exclude, list_containers=list_containers, allocations=allocations)
        if held:
            log.warning(
                "isolation rules of %s kept%s: the address is held by %s",
                address, f" ({why})" if why else "", ", ".join(str(h) for h in held),
            )  # fmt: skip
            return None, held
        return remove(address), []
