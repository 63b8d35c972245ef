"""Spawning one agent container: create config, pull policy, start, address and rules, and the
cleanup of a failed spawn (SPEC (e); see :mod:`scalers.backends.container`)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from docker.errors import ImageNotFound

from agents.choices import EventType
from agents.events import record_connecting, record_event

from ..base import SpawnAborted, SpawnControl, SpawnError, SpawnResult, scaler_option
from ..docker_net import ISOLATED_NETWORK_NAME, cached_isolated_network, container_network_ip
from ..failure import CAPTURED_LINES
from ..hostconfig import build_agent_container_host_config
from ..isolation import resolve_host_access
from ..runtime import docker_client_for
from ..spawn_env import console_url, container_env, container_labels, label_set_option, network_policy, spawn_limits

log = logging.getLogger(__name__)


class SpawnMixin:
    """The spawn half of :class:`~scalers.backends.container.ContainerBackend` (it provides
    ``scaler``, ``runtime``, ``docker``, ``api``, ``isolation``, ``network_isolation`` and the
    container/rule removal helpers)."""

    def _binds(self, label_set) -> list[str]:
        binds = [str(v) for v in (label_set_option(label_set, "volumes") or [])]
        if label_set_option(label_set, "containerSocket", False) and self.spawns_on_local_host:
            sock = self.runtime.socket_path
            if sock:
                binds.append(f"{sock}:{sock}")
        return binds

    def _pull(self, agent, image: str) -> None:
        record_event(agent, EventType.PROVISIONING, f"pulling image {image}")
        self.api.pull(image)

    def _create(self, agent, kwargs: dict, image: str, policy: str) -> dict:
        """``create_container``, pulling first for ``Always`` and on "no such image" for
        ``IfNotPresent`` (the create itself is the presence check: one runtime call saved)."""
        if policy == "Always":
            self._pull(agent, image)
        try:
            return self.api.create_container(**kwargs)
        except ImageNotFound:
            if policy == "Never":
                raise SpawnError(f"image {image} is not present and imagePullPolicy is Never", "create") from None
            self._pull(agent, image)
            return self.api.create_container(**kwargs)

    def create_config(self, agent, token: str | None, image: str) -> dict:
        """Keyword arguments of ``APIClient.create_container`` for this agent (pure apart from the
        token argument): image, env (CTR-01..03), labels (CTR-08), HostConfig (the one builder),
        and ``kici-agent-net`` as network when isolation is on (CTR-16/17)."""
        ls = agent.label_set
        host_config = build_agent_container_host_config(
            spawn_limits(agent), self._binds(ls), [str(h) for h in scaler_option(self.scaler, "extraHosts", []) or []]
        )
        kwargs: dict = {
            "image": image,
            "name": agent.agent_id,
            "environment": container_env(agent, token, image=image),
            "labels": container_labels(agent),
        }
        if self.network_isolation:
            host_config["NetworkMode"] = ISOLATED_NETWORK_NAME
            kwargs["networking_config"] = {"EndpointsConfig": {ISOLATED_NETWORK_NAME: {}}}
        kwargs["host_config"] = host_config
        return kwargs

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        """Provision one agent container; see the module doc for the steps. Returns its id,
        address and resolved host access. Raises ``SpawnError`` / ``SpawnAborted`` after removing
        whatever it created (container, rules); lets runtime errors propagate the same way."""
        from agents.models import Agent
        from agents.tokens import mint_registration_token, revoke_agent_tokens

        ls = agent.label_set
        image = str(label_set_option(ls, "image") or settings.KICI_AGENT_IMAGE)
        policy = str(label_set_option(ls, "imagePullPolicy", "IfNotPresent"))
        container_id: str | None = None
        address: str | None = None
        started = False
        if self._docker is None:  # even the client's version handshake honours the deadline
            remaining = control.remaining()
            self._docker = docker_client_for(
                self.runtime, timeout=60 if remaining is None else max(1.0, min(60.0, remaining))
            )
            self.api.timeout = 60
        base_timeout = getattr(self.api, "timeout", None)

        def check(stage: str) -> None:
            # Each runtime call is bounded by what is left of the deadline, so a hung runtime
            # cannot hold a spawn the manager has given up on.
            control.check(stage)
            remaining = control.remaining()
            if remaining is not None and isinstance(base_timeout, int | float):
                self.api.timeout = max(1.0, min(float(base_timeout), remaining))

        try:
            check("create")
            if self.network_isolation:
                cached_isolated_network(self.docker, str(getattr(self.api, "base_url", id(self.docker))))
            with transaction.atomic():  # one commit for the token and the event
                token = mint_registration_token(agent)
                record_event(agent, EventType.PROVISIONING, "creating container")
            created = self._create(agent, self.create_config(agent, token, image), image, policy)
            container_id = created["Id"]
            agent.managed_id = container_id
            # At once: a worker killed from here on leaves a container the failure path must find.
            Agent.objects.filter(pk=agent.pk).update(managed_id=container_id)

            check("start")
            self.api.start(container_id)
            started = True

            host_access: list[str] | None = None
            explicit = False
            if self.network_isolation:
                check("network")
                address = container_network_ip(self.docker, container_id)
                policy_cfg = network_policy(ls)
                host_access, explicit = resolve_host_access(policy_cfg, console_url(agent.scaler))
                # Stored before the rules are written, so a concurrent rule sweep counts it as live.
                with transaction.atomic():
                    Agent.objects.filter(pk=agent.pk).update(
                        ip=address, host_access=host_access, host_access_explicit=explicit
                    )
                    record_event(agent, EventType.NETWORK, "configuring network isolation")
                if address:
                    self.isolation.apply(address, policy_cfg, host_access)
                else:
                    log.warning(
                        "agent %s has no address on %s; no isolation rules written",
                        agent.agent_id,
                        ISOLATED_NETWORK_NAME,
                    )

            check("ready")
            with transaction.atomic():
                record_event(agent, EventType.READY, "container started")
                record_connecting(agent, "waiting for agent registration")
            if base_timeout is not None:
                self.api.timeout = base_timeout
            return SpawnResult(
                managed_id=container_id,
                ip=address,
                host_access=host_access,
                host_access_explicit=explicit,
                context={
                    "container_id": container_id,
                    "image": image,
                    "network": ISOLATED_NETWORK_NAME if self.network_isolation else None,
                },
            )
        except BaseException as exc:
            if base_timeout is not None:
                self.api.timeout = base_timeout
            captured = self._captured_output(container_id) if started else []
            self._cleanup_failed_spawn(container_id, address, agent.agent_id)
            try:
                revoke_agent_tokens(agent)
            except Exception:  # noqa: BLE001 - best effort
                log.warning("could not revoke tokens of %s", agent.agent_id, exc_info=True)
            if isinstance(exc, SpawnAborted | SpawnError):
                if captured and isinstance(exc, SpawnError) and not exc.captured_output:
                    exc.captured_output = captured
                if isinstance(exc, SpawnAborted):
                    exc.captured_output = captured  # type: ignore[attr-defined]
                raise
            stage = control.stages[-1] if control.stages else ""
            raise SpawnError(f"{stage or 'spawn'} failed: {exc}", stage, captured) from exc

    def _captured_output(self, container_id: str | None) -> list[str]:
        if not container_id:
            return []
        try:
            raw = self.api.logs(container_id, stdout=True, stderr=True, tail=CAPTURED_LINES)
        except Exception:  # noqa: BLE001 - the container may be gone already
            return []
        return raw.decode("utf-8", "replace").splitlines()[-CAPTURED_LINES:]

    def captured_output_for(self, agent) -> list[str]:
        """Last 50 output lines of the agent's container (for a ``scaler.failed`` detail); [] if none."""
        return self._captured_output(agent.managed_id or self._find_container(agent.agent_id))

    def _cleanup_failed_spawn(self, container_id: str | None, address: str | None, agent_id: str = "") -> None:
        if address:  # only while no other sandbox holds it; keep cleaning, the rule reaper is the backstop
            self._remove_rules_quietly(address, (agent_id, container_id or ""), f"failed spawn of {agent_id}")
        if container_id:
            self._remove_container(container_id)
