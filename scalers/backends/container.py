"""The container backend: agent containers on ``kici-agent-net`` through the docker SDK (SPEC (e)).

Spawn, in order (each step preceded by ``control.check(stage)``, so a spawn past its deadline or
cancelled stops issuing runtime calls): mint the token, ``create`` (pulling per
``imagePullPolicy``: first for ``Always``, on "no such image" for ``IfNotPresent``) (labels, env, the one HostConfig builder, attached to ``kici-agent-net``), ``start``,
then the network stage: read the container's address and write its forward and input rules
(address known only after start; job code runs only after the agent registers, which it can
only do through those rules), then ``scaler.ready`` and ``agent.connecting``. Any failure removes
the rules and the container and re-raises; ``scalers.jobs`` records ``scaler.failed`` and
releases the reservation.

Ownership on a shared docker host: see ``orphans`` for the sweep's rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from docker.errors import APIError, ImageNotFound, NotFound

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event

from .base import SpawnAborted, SpawnControl, SpawnError, SpawnResult, scaler_option
from .docker_net import (
    ISOLATED_NETWORK_GATEWAY,
    ISOLATED_NETWORK_NAME,
    cached_isolated_network,
    container_network_ip,
    ensure_isolated_network,
)
from .hostconfig import build_agent_container_host_config
from .isolation import ContainerIsolation, nft_table_for, resolve_host_access
from .orphans import ALIVE_STATES, OrphanTarget, live_addresses, plan_container_orphans, plan_rule_orphans
from .runtime import RuntimeInfo, docker_client_for, runtime_for_scaler
from .spawn_env import console_url, container_env, container_labels, label_set_option, network_policy, spawn_limits

log = logging.getLogger(__name__)

#: Lines of container output attached to a ``scaler.failed`` detail (SPEC (d)).
CAPTURED_LINES = 50
STOP_TIMEOUT_SECONDS = 10
ORPHAN_STOP_TIMEOUT_SECONDS = 5

#: Sentinel: wire ``is_registered`` to the agent registry in the database.
REGISTRY = object()


def db_tracked_ids(scaler) -> set[str]:
    """Agent ids this console tracks for ``scaler``: rows in spawning/running/draining/destroying."""
    from agents.models import Agent

    return set(Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).values_list("agent_id", flat=True))


def db_registered_ids(agent_ids: list[str]) -> set[str]:
    """Of ``agent_ids``, those registered: ``registered_at`` set and state running or draining."""
    from agents.models import Agent

    return set(
        Agent.objects.filter(
            agent_id__in=agent_ids, registered_at__isnull=False, state__in=[AgentState.RUNNING, AgentState.DRAINING]
        ).values_list("agent_id", flat=True)
    )


def tracked_addresses() -> set[str]:
    """Addresses of every active agent row (any scaler): live even before the runtime lists them."""
    from agents.models import Agent

    return {ip for ip in Agent.objects.active().exclude(ip=None).values_list("ip", flat=True) if ip}


def failure_detail(error: BaseException, captured: list[str]) -> str:
    """``scaler.failed`` detail: the message, plus ``\\n--- captured output ---\\n<lines>`` when any (CTR-26)."""
    detail = str(error) or type(error).__name__
    if captured:
        detail += "\n--- captured output ---\n" + "\n".join(captured[-CAPTURED_LINES:])
    return detail


class ContainerBackend:
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
            network_isolation = bool(scaler_option(scaler, "networkIsolation", True)) and settings.KICI_NETWORK_ISOLATION
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

    # -- spawn ---------------------------------------------------------------------------------

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
            self._docker = docker_client_for(self.runtime, timeout=60 if remaining is None else max(1.0, min(60.0, remaining)))
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
                    Agent.objects.filter(pk=agent.pk).update(ip=address, host_access=host_access, host_access_explicit=explicit)
                    record_event(agent, EventType.NETWORK, "configuring network isolation")
                if address:
                    self.isolation.apply(address, policy_cfg, host_access)
                else:
                    log.warning("agent %s has no address on %s; no isolation rules written", agent.agent_id, ISOLATED_NETWORK_NAME)

            check("ready")
            with transaction.atomic():
                record_event(agent, EventType.READY, "container started")
                record_event(agent, EventType.CONNECTING, "waiting for agent registration")
            if base_timeout is not None:
                self.api.timeout = base_timeout
            return SpawnResult(
                managed_id=container_id,
                ip=address,
                host_access=host_access,
                host_access_explicit=explicit,
                context={"container_id": container_id, "image": image, "network": ISOLATED_NETWORK_NAME if self.network_isolation else None},
            )
        except BaseException as exc:
            if base_timeout is not None:
                self.api.timeout = base_timeout
            captured = self._captured_output(container_id) if started else []
            self._cleanup_failed_spawn(container_id, address)
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

    def _cleanup_failed_spawn(self, container_id: str | None, address: str | None) -> None:
        if address and self.network_isolation:
            try:
                self.isolation.remove(address)
            except Exception:  # noqa: BLE001 - keep cleaning; the rule reaper is the backstop
                log.warning("could not remove rules for %s", address, exc_info=True)
        if container_id:
            self._remove_container(container_id)

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

        Idempotent: an unknown id or an already-removed container is not an error.
        """
        container_id = agent.managed_id or self._find_container(agent.agent_id)
        address = agent.ip
        if container_id and not address and self.network_isolation:
            address = container_network_ip(self.docker, container_id)
        if address and self.network_isolation:
            self.isolation.remove(address)
        if not container_id:
            return
        try:
            self.api.stop(container_id, timeout=STOP_TIMEOUT_SECONDS)
        except NotFound:
            return
        except APIError as exc:
            log.warning("stop of %s failed: %s", container_id[:12], exc)
        self._remove_container(container_id)

    def _find_container(self, agent_id: str) -> str | None:
        found = self._list({"label": ["kici-managed=true", f"kici-scaler-name={self.scaler.name}", f"kici-agent-id={agent_id}"]})
        return found[0]["Id"] if found else None

    def _list(self, filters: dict) -> list[dict]:
        return self.api.containers(all=True, filters=filters) or []

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-remove this scaler's containers for one agent id (a refused registration).

        Lists by ``kici-managed=true``, own ``kici-scaler-name`` and ``kici-agent-id`` (CTR-22);
        True when one was removed; a listing error answers False.
        """
        if not agent_id or not self.scaler.name.strip():
            return False
        try:
            found = self._list({"label": ["kici-managed=true", f"kici-scaler-name={self.scaler.name}", f"kici-agent-id={agent_id}"]})
        except Exception:  # noqa: BLE001
            log.warning("reap_unowned(%s): listing failed", agent_id, exc_info=True)
            return False
        removed = False
        for summary in found:
            labels = summary.get("Labels") or {}
            if labels.get("kici-scaler-name") != self.scaler.name or labels.get("kici-agent-id") != agent_id:
                continue
            for address in self._addresses(summary):
                self._remove_rules_quietly(address)
            removed = self._remove_container(summary["Id"]) or removed
        return removed

    # -- orphans -------------------------------------------------------------------------------

    def _registry(self) -> Callable[[str], bool] | None:
        if self._is_registered is REGISTRY:
            return None  # replaced per plan by a batched lookup
        return self._is_registered

    def list_managed(self) -> list[dict]:
        """ONE sparse list call: every ``kici-managed=true`` container on the runtime, any scaler."""
        return self._list({"label": ["kici-managed=true"]})

    def plan_orphans(self) -> list[OrphanTarget]:
        """What the sweep would remove now, with evidence; changes nothing (one list call).

        Containers per ``orphans.plan_container_orphans``; then (isolation on) rule sets for
        addresses no kici-managed container holds (``reap_unowned_isolation_rules``). Raises
        ``OrphanSweepRefused`` for a blank scaler name; a failed runtime listing raises (nothing
        can be planned blind).
        """
        summaries = self.list_managed()
        tracked = self._tracked_ids()
        probe = self._registry()
        if self._is_registered is REGISTRY:
            candidates = [
                (s.get("Labels") or {}).get("kici-agent-id", "")
                for s in summaries
                if (s.get("Labels") or {}).get("kici-scaler-name") == self.scaler.name
                and str(s.get("State", "")).lower() in ALIVE_STATES
            ]
            registered = db_registered_ids([c for c in candidates if c])
            probe = registered.__contains__
        plan = plan_container_orphans(summaries, self.scaler.name, tracked, probe)
        if self.network_isolation:
            plan += self.plan_rule_orphans(summaries)
        return plan

    def plan_rule_orphans(self, summaries: list[dict] | None = None) -> list[OrphanTarget]:
        """Rule sets on ``kici-agent-net`` addresses that no kici-managed container holds.

        ``summaries``: a listing already made, else one is made; a failed listing plans nothing.
        """
        if summaries is None:
            try:
                summaries = self.list_managed()
            except Exception:  # noqa: BLE001
                log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
                return []
        live = live_addresses(summaries) | tracked_addresses()
        return plan_rule_orphans(self.isolation.addresses_with_rules(), live, self.scaler.name, self.isolation.table)

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        """Remove what ``plan`` names, re-checking each target first; returns containers + rule sets removed.

        A container is removed only if it still carries this scaler's name and the same agent
        id, that id is still untracked, and (when alive) still unregistered; one that vanished
        meanwhile is skipped without error. A rule set is deleted only if no kici-managed
        container holds its address now (a fresh listing; a failed listing deletes none).
        """
        count = 0
        tracked = self._tracked_ids()
        for target in (t for t in plan if t.kind == "container"):
            if target.scaler != self.scaler.name:
                continue
            count += self._apply_container_target(target, tracked)
        rule_targets = [t for t in plan if t.kind == "rule"]
        if rule_targets and self.network_isolation:
            try:
                live = live_addresses(self.list_managed()) | tracked_addresses()
            except Exception:  # noqa: BLE001
                log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
                return count
            for target in rule_targets:
                if target.target in live:
                    continue
                try:
                    if self.isolation.remove(target.target):
                        count += 1
                except Exception:  # noqa: BLE001
                    log.warning("could not remove rules for %s", target.target, exc_info=True)
        return count

    def _apply_container_target(self, target: OrphanTarget, tracked: set[str]) -> int:
        try:
            info = self.api.inspect_container(target.target)
        except NotFound:
            return 0
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get("kici-managed") != "true" or labels.get("kici-scaler-name") != self.scaler.name:
            return 0
        agent_id = labels.get("kici-agent-id") or ""
        if agent_id != target.agent_id or (agent_id and agent_id in tracked):
            return 0
        state = info.get("State") or {}
        alive = bool(state.get("Running") or state.get("Paused") or state.get("Restarting"))
        if alive:
            if not agent_id:
                return 0
            if self._is_registered is REGISTRY:
                if db_registered_ids([agent_id]):
                    return 0
            elif self._is_registered is None or self._is_registered(agent_id):
                return 0
        addresses = [
            ep.get("IPAddress")
            for name, ep in ((info.get("NetworkSettings") or {}).get("Networks") or {}).items()
            if name == ISOLATED_NETWORK_NAME and ep.get("IPAddress")
        ]
        if alive:
            try:
                self.api.stop(target.target, timeout=ORPHAN_STOP_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - stop errors are ignored (SPEC (e))
                pass
        try:
            removed = self._remove_container(target.target)
        except APIError:
            log.warning("could not remove orphan %s", target.target[:12], exc_info=True)
            return 0
        for address in addresses:
            self._remove_rules_quietly(address)
        return 1 if removed else 0

    def _addresses(self, summary: dict) -> list[str]:
        from .orphans import container_addresses

        return container_addresses(summary)

    def _remove_rules_quietly(self, address: str) -> None:
        if not self.network_isolation:
            return
        try:
            self.isolation.remove(address)
        except Exception:  # noqa: BLE001
            log.warning("could not remove rules for %s", address, exc_info=True)

    def cleanup_orphans(self) -> int:
        """``apply_orphans(plan_orphans())`` (SPEC (e) ``cleanupOrphans``): containers + rule sets removed."""
        return self.apply_orphans(self.plan_orphans())

    def reap_unowned_isolation_rules(self) -> int:
        """Delete rules for ``kici-agent-net`` addresses no kici-managed container holds (ALL
        scalers and consoles); reaps nothing when the runtime cannot be listed. Returns the count."""
        if not self.network_isolation:
            return 0
        try:
            live = live_addresses(self.list_managed())
        except Exception:  # noqa: BLE001
            log.warning("rule reap skipped: the runtime could not be listed", exc_info=True)
            return 0
        live |= tracked_addresses()
        return len(self.isolation.reap(live))


__all__ = ["ContainerBackend", "failure_detail", "ISOLATED_NETWORK_GATEWAY"]
