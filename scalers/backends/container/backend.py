"""The container backend object: its runtime and rules plumbing, and destroy (SPEC (e)).

Spawning is :class:`~scalers.backends.container.spawn.SpawnMixin`, sweeping
:class:`~scalers.backends.container.sweep.SweepMixin`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from docker.errors import APIError, NotFound

from ..base import scaler_option
from ..docker_net import container_network_ip, ensure_isolated_network
from ..isolation import ContainerIsolation, nft_table_for
from ..runtime import RuntimeInfo, docker_client_for, runtime_for_scaler
from .registry import REGISTRY, db_tracked_ids
from .spawn import SpawnMixin
from .sweep import SweepMixin

log = logging.getLogger(__name__)

STOP_TIMEOUT_SECONDS = 10


class ContainerBackend(SpawnMixin, SweepMixin):
    """``type: container`` scalers (SPEC (e)).

    ``docker``: a ``docker.DockerClient`` (default: the scaler's runtime, see ``runtime``).
    ``nft``: an ``NftClient`` (default: one for the scaler's table). ``network_isolation``:
    override of the entry's ``networkIsolation`` (default true; ``settings.KICI_NETWORK_ISOLATION``
    false turns it off everywhere). ``tracked_ids``: ``() -> set[str]`` (default: the database).
    ``is_registered``: ``(agent_id) -> bool``, ``None`` = unwired (assume registered), default:
    the database registry.
    """

    type = "container"

    def __init__(
        self,
        scaler,
        *,
        docker: Any = None,
        nft: Any = None,
        network_isolation: bool | None = None,
        tracked_ids: Callable[[], set[str]] | None = None,
        is_registered: Any = REGISTRY,
        runtime: RuntimeInfo | None = None,
    ):
        self.scaler = scaler
        self._docker = docker
        self._runtime = runtime
        if network_isolation is None:
            network_isolation = (
                bool(scaler_option(scaler, "networkIsolation", True)) and settings.KICI_NETWORK_ISOLATION
            )
        self.network_isolation = network_isolation
        self._nft = nft
        self._isolation: ContainerIsolation | None = None
        self._tracked_ids = tracked_ids or (lambda: db_tracked_ids(self.scaler))
        self._is_registered = is_registered

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def runtime(self) -> RuntimeInfo:
        if self._runtime is None:
            self._runtime = runtime_for_scaler(self.scaler)
        return self._runtime

    @property
    def docker(self):
        if self._docker is None:
            self._docker = docker_client_for(self.runtime)
        return self._docker

    @property
    def api(self):
        return self.docker.api

    @property
    def spawns_on_local_host(self) -> bool:
        return not scaler_option(self.scaler, "host")

    @property
    def isolation(self) -> ContainerIsolation:
        if self._isolation is None:
            self._isolation = ContainerIsolation(nft_table_for(self.scaler), self._nft)
        return self._isolation

    def reload(self, scaler) -> None:
        """Replace the entry read at every spawn (SPEC c.8)."""
        self.scaler = scaler

    def ensure_host_ready(self) -> None:
        """Fail closed when isolation is on and nft is unusable (CTR-18), then ensure the network."""
        if self.network_isolation:
            self.isolation.check()
            ensure_isolated_network(self.docker)

    def _remove_container(self, container_id: str) -> bool:
        try:
            self.api.remove_container(container_id, force=True)
            return True
        except NotFound:
            return False
        except APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc):
                return False
            raise

    # -- destroy -------------------------------------------------------------------------------

    def destroy(self, agent, reason: str = "shutdown") -> None:
        """Remove rules, ``stop(t=10)``, ``remove(force)`` (SPEC (e) Destroy, CTR-19).

        The rules go only while no other sandbox holds the agent's address: a dead agent's
        address may already belong to a new container, whose rules share the address key
        (``holders.remove_unless_held``; the agent and its own container are left out).
        Idempotent: an unknown id or an already-removed container is not an error.
        """
        container_id = agent.managed_id or self._find_container(agent.agent_id)
        address = agent.ip
        if container_id and not address and self.network_isolation:
            address = container_network_ip(self.docker, container_id)
        if address and self.network_isolation:
            self._remove_rules_unless_held(
                address, (agent.agent_id, container_id or ""), f"destroy of {agent.agent_id}"
            )
        if not container_id:
            return
        try:
            self.api.stop(container_id, timeout=STOP_TIMEOUT_SECONDS)
        except NotFound:
            return
        except APIError as exc:
            log.warning("stop of %s failed: %s", container_id[:12], exc)
        self._remove_container(container_id)

    def _agent_filters(self, agent_id: str) -> dict:
        """List filters for this scaler's containers of one agent id (the three ownership labels)."""
        return {"label": ["kici-managed=true", f"kici-scaler-name={self.scaler.name}", f"kici-agent-id={agent_id}"]}

    def _find_container(self, agent_id: str) -> str | None:
        found = self._list(self._agent_filters(agent_id))
        return found[0]["Id"] if found else None

    def _list(self, filters: dict) -> list[dict]:
        return self.api.containers(all=True, filters=filters) or []
