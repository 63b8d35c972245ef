"""The isolation rules of one backend's containers: written at spawn, removed only while no other
sandbox holds the address (a dead container's address may already be a new container's)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ..isolation import ContainerIsolation
from .ready import GUARD_CHECK_SECONDS, guard_in_force, guard_written

log = logging.getLogger(__name__)


class ContainerRuleWriter:
    """The rule writer of a container backend (the Firecracker backend's twin is
    :class:`~scalers.backends.firecracker.rules.RuleWriter`; what the kernel holds for one agent is
    :class:`network.nft.apply.AgentRules`).

    ``make_isolation``: builds the :class:`~scalers.backends.isolation.ContainerIsolation` on first
    use. ``list_containers``: the runtime's kici-managed containers (for the holder check).
    ``enabled``: network isolation is on; when off, nothing is written or removed.
    """

    def __init__(
        self, make_isolation: Callable[[], ContainerIsolation], list_containers: Callable[[], list[dict]], enabled: bool
    ):
        self._make_isolation = make_isolation
        self._isolation: ContainerIsolation | None = None
        self.list_containers = list_containers
        self.enabled = enabled

    @property
    def isolation(self) -> ContainerIsolation:
        if self._isolation is None:
            self._isolation = self._make_isolation()
        return self._isolation

    def ensure_guard(self, bridge: str, *, write: bool = False) -> None:
        """Fail closed unless nft works and the guard on ``bridge`` is in place: written by the
        first spawn of this host and again once :data:`~.ready.GUARD_CHECK_SECONDS` have passed
        or the tables were made again (``ready.guard_in_force``; the drift check repairs it in
        between), else taken as written; ``write``: written now whatever the record says. Raises
        ``NftUnavailableError`` / ``NftError``."""
        client = self.isolation.client
        handles = client.table_handles()
        if not write and guard_in_force(client.table, client.netns, bridge, handles):
            client.trust_base()
            return
        self.isolation.check(bridge)
        guard_written(client.table, client.netns, bridge, client.table_handles(), GUARD_CHECK_SECONDS)

    def remove_unless_held(self, address: str, exclude: Iterable[str], why: str) -> bool:
        """Delete ``address``'s rules unless a sandbox other than ``exclude`` (ids of the one
        going away) holds it now: any active agent row, any kici-managed container on this
        runtime, any VM allocation (``scalers.backends.holders``). True when deleted."""
        removed, _ = self.isolation.remove_unless_held(
            address, exclude=exclude, list_containers=self.list_containers, why=why
        )
        return removed

    def remove_quietly(self, address: str, exclude: Iterable[str] = (), why: str = "") -> bool:
        """:meth:`remove_unless_held` when isolation is on, logging instead of raising (the rule
        reaper is the backstop)."""
        if not self.enabled:
            return False
        try:
            return self.remove_unless_held(address, exclude, why)
        except Exception:
            log.warning("could not remove rules for %s", address, exc_info=True)
            return False
