"""The container backend: agent containers on ``kici-agent-net`` through the docker SDK.

One :class:`ContainerBackend` is composed of its parts: the runtime (:class:`~.host.DockerHost`),
the rule writer (:class:`~.rules.ContainerRuleWriter` over the isolation object), the create-config
builders and the spawn steps (:mod:`~scalers.backends.container.spawn`), and the sweeps
(:mod:`~scalers.backends.container.sweep`, by the one orphan rule of
:mod:`~scalers.backends.container.orphans`). The failure detail is :mod:`scalers.backends.failure`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from docker.errors import APIError, NotFound

from agents.archive import write_archive
from consolelog.dockerlogs import RedisCheckpoints, container_output

from ..base import SpawnControl, SpawnResult, scaler_option
from ..docker_net import (
    ISOLATED_NETWORK_SUBNET,
    agent_mac,
    cached_isolated_network,
    container_network_ip,
    ensure_isolated_network,
    network_bridge_name,
)
from ..failure import AGENT_LOG_LINES
from ..isolation import ContainerIsolation, IsolationTarget, nft_table_for
from ..kici_token import revoke_recorded_kici_token
from ..orphans import OrphanTarget
from ..ownership import Owner, current_owner
from ..runtime import RuntimeInfo, runtime_for_scaler
from ..spawn_env import network_policy
from . import sweep
from .host import DockerHost
from .orphans import ContainerPlan, TrackedAgent
from .rules import ContainerRuleWriter
from .spawn import cleanup_failed_spawn, container_binds, container_create_config, spawn_container
from .tracked import FROM_DATABASE, db_tracked_agents

log = logging.getLogger(__name__)

STOP_TIMEOUT_SECONDS = 10


class ContainerBackend:
    """``type: container`` scalers, and the container mode of ``bare-metal`` ones.

    ``docker``: a ``docker.DockerClient`` (default: the scaler's runtime, see ``runtime``).
    ``nft``: an ``NftClient`` (default: one for the scaler's table). ``network_isolation``:
    override of the entry's ``networkIsolation`` (default true; ``settings.KICI_NETWORK_ISOLATION``
    false turns it off everywhere). ``tracked_ids``: ``() -> set[str]`` (default: the database).
    ``is_registered``: ``(agent_id) -> bool``, ``None`` = unwired (assume registered), default:
    the database registry. ``job_image``: a bare-metal scaler's container mode (job-image env,
    no bound-job labels; ``type`` is then ``bare-metal``).
    """

    def __init__(
        self,
        scaler,
        *,
        docker: Any = None,
        nft: Any = None,
        network_isolation: bool | None = None,
        tracked_ids: Callable[[], set[str]] | None = None,
        is_registered: Any = FROM_DATABASE,
        runtime: RuntimeInfo | None = None,
        job_image: bool = False,
    ):
        self.scaler = scaler
        self.type = "bare-metal" if job_image else "container"
        self.job_image = job_image
        if network_isolation is None:
            network_isolation = (
                bool(scaler_option(scaler, "networkIsolation", True)) and settings.KICI_NETWORK_ISOLATION
            )
        self.network_isolation = network_isolation
        self.host = DockerHost(lambda: runtime_for_scaler(self.scaler), docker=docker, runtime=runtime)
        self.rules = ContainerRuleWriter(
            lambda: ContainerIsolation(nft_table_for(self.scaler), nft), self.host.list_managed, network_isolation
        )
        self._tracked_ids = tracked_ids
        self._is_registered = is_registered

    # -- parts ---------------------------------------------------------------------------------

    @property
    def runtime(self) -> RuntimeInfo:
        return self.host.runtime

    @property
    def docker(self):
        return self.host.docker

    @property
    def api(self):
        return self.host.api

    @property
    def isolation(self) -> ContainerIsolation:
        return self.rules.isolation

    @property
    def spawns_on_local_host(self) -> bool:
        """Whether the runtime is this host's (its ``host``, else ``DOCKER_HOST``, resolved by
        ``runtime_for_scaler``): only then is the agent bridge this host's to guard."""
        return self.runtime.spawns_on_local_host

    def tracked(self) -> dict[str, TrackedAgent]:
        """The agent ids this console tracks for the scaler (the database, or ``tracked_ids()``)."""
        if self._tracked_ids is None:
            return db_tracked_agents(self.scaler)
        return {agent_id: TrackedAgent() for agent_id in self._tracked_ids()}

    def owner(self) -> Owner:
        """This console's claim on the scaler's containers (``ownership.current_owner``), read at
        every sweep. Raises database errors."""
        return current_owner(self.scaler.name)

    def reload(self, scaler) -> None:
        """Replace the entry read at every spawn."""
        self.scaler = scaler

    def ensure_host_ready(self) -> None:
        """With isolation on: ensure the network, then fail closed unless nft works and the guard
        on its bridge is in place (a remote runtime's bridge is not this host's to guard)."""
        if self.network_isolation:
            self.isolation.client.check_available()
            net_id = ensure_isolated_network(self.docker)
            if self.spawns_on_local_host:
                self.rules.ensure_guard(network_bridge_name(self.docker, net_id), write=True)

    def isolation_target(self) -> IsolationTarget | None:
        """The guarded bridge of ``kici-agent-net`` and each agent's rules from its row, for the
        drift check; None without isolation or for a remote runtime. Raises the SDK's errors."""
        if not self.network_isolation or not self.spawns_on_local_host:
            return None
        key = str(getattr(self.api, "base_url", id(self.docker)))
        bridge = network_bridge_name(self.docker, cached_isolated_network(self.docker, key))

        def spec_for(agent):
            if not agent.ip:
                return None
            policy = network_policy(agent.label_set)
            port = agent.bridge_port or None
            mac = agent_mac(agent.agent_id) if port else None
            return self.isolation.spec(agent.ip, policy, agent.host_access or [], port, mac)

        return IsolationTarget(self.isolation.client, [bridge], [ISOLATED_NETWORK_SUBNET], spec_for)

    # -- spawn ---------------------------------------------------------------------------------

    def create_config(
        self,
        agent,
        token: str | None,
        image: str,
        runtime_volume: str | None = None,
        network_id: str = "",
    ) -> dict:
        """Keyword arguments of ``APIClient.create_container`` for this agent
        (``spawn.container_create_config``; ``runtime_volume`` for a job's own image, ``network_id``
        the agent network's id to pin)."""

        def local_socket() -> str | None:
            return self.runtime.socket_path if self.spawns_on_local_host else None

        return container_create_config(
            agent,
            token,
            image,
            binds=container_binds(agent.label_set, local_socket),
            extra_hosts=[str(h) for h in scaler_option(self.scaler, "extraHosts", []) or []],
            network_isolation=self.network_isolation,
            job_image=self.job_image,
            runtime_volume=runtime_volume,
            network_id=network_id,
        )

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        """Provision one agent container (``spawn.spawn_container``)."""
        return spawn_container(
            agent, control, host=self.host, rules=self.rules, build_config=self.create_config,
            local=self.spawns_on_local_host,
        )  # fmt: skip

    def cleanup_failed_spawn(self, container_id: str | None, address: str | None, agent_id: str = "") -> None:
        """Remove the rules (unless held) and the container a failed spawn left (``spawn.cleanup_failed_spawn``)."""
        cleanup_failed_spawn(self.host, self.rules, container_id, address, agent_id)

    def sandbox_exit(self, agent) -> str | None:
        """None while the agent's container runs, else how it ended (``exited with code N``,
        ``was killed (OOM)``, ``has no container``), for the follow of a real KiCI agent
        (``scalers.kici_agents``). Raises the SDK's errors other than NotFound."""
        container_id = agent.managed_id or self.host.find(self.scaler.name, agent.agent_id)
        if not container_id:
            return "has no container"
        try:
            state = self.api.inspect_container(container_id).get("State") or {}
        except NotFound:
            return "has no container"
        if state.get("Running") or state.get("Status") in ("created", "restarting"):
            return None
        if state.get("OOMKilled"):
            return "was killed (out of memory)"
        return f"exited with code {state.get('ExitCode')}"

    def captured_output_for(self, agent) -> list[str]:
        """Last 50 output lines of the agent's container (for a ``scaler.failed`` detail); [] if none."""
        return self.host.output_tail(agent.managed_id or self.host.find(self.scaler.name, agent.agent_id))

    def agent_log_lines(self, agent) -> list[str]:
        """The last :data:`~scalers.backends.failure.AGENT_LOG_LINES` lines the agent's container
        wrote on its standard output, where the real KiCI agent logs (a forked step's output it
        relays goes to its standard error), for the follow (``scalers.kici_agents``); [] if none."""
        container_id = agent.managed_id or self.host.find(self.scaler.name, agent.agent_id)
        return self.host.output_tail(container_id, AGENT_LOG_LINES, stderr=False)

    # -- destroy -------------------------------------------------------------------------------

    def destroy(self, agent, reason: str = "shutdown") -> None:
        """Remove rules, ``stop(t=10)``, keep its output (``agents.archive``), ``remove(force)``.

        The rules go only while no other sandbox holds the agent's address: a dead agent's
        address may already belong to a new container, whose rules share the address key
        (``holders.remove_unless_held``; the agent and its own container are left out).
        Idempotent: an unknown id or an already-removed container is not an error.
        A real KiCI agent's orchestrator token is revoked last (``kici_token.revoke_recorded_kici_token``:
        raises ``OrchestratorError`` when the orchestrator cannot take it, so the teardown is retried).
        """
        self._remove_container(agent)
        revoke_recorded_kici_token(agent)

    def sandbox_registered(self, agent) -> None:
        """The real KiCI agent of ``agent`` registered with its orchestrator: nothing to do for a
        container (its environment is its own)."""

    def _remove_container(self, agent) -> None:
        container_id = agent.managed_id or self.host.find(self.scaler.name, agent.agent_id)
        address = agent.ip
        if container_id and not address and self.network_isolation:
            address = container_network_ip(self.docker, container_id)
        if address and self.network_isolation:
            self.rules.remove_unless_held(address, (agent.agent_id, container_id or ""), f"destroy of {agent.agent_id}")
        if not container_id:
            return
        try:
            self.api.stop(container_id, timeout=STOP_TIMEOUT_SECONDS)
        except NotFound:
            return
        except APIError as exc:
            log.warning("stop of %s failed: %s", container_id[:12], exc)
        self._archive(agent.agent_id, container_id)
        self.host.remove(container_id)

    def _archive(self, agent_id: str, container_id: str) -> None:
        """Keep the container's output (``agents.archive``) before it goes, its lines numbered as
        its console numbered them, with docker's times (``consolelog.dockerlogs.container_output``);
        a failure is logged, never a reason to keep the container."""
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            checkpoints = RedisCheckpoints(client, agent_id)
            lines_before, output, times = container_output(self.docker.containers.get(container_id), checkpoints)
            write_archive(agent_id, output, lines_before=lines_before, times=times)
        except Exception as exc:  # noqa: BLE001 - the teardown goes on without the archive
            log.warning("could not keep the output of %s: %s", agent_id, exc)
        finally:
            client.close()

    # -- sweeps --------------------------------------------------------------------------------

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-remove this scaler's containers for one agent id (``sweep.reap_unowned``)."""
        return sweep.reap_unowned(self.host, self.rules, self.owner(), agent_id)

    def list_managed(self) -> list[dict]:
        """ONE sparse list call: every ``kici-managed=true`` container on the runtime, any scaler."""
        return self.host.list_managed()

    def plan_containers(self) -> ContainerPlan:
        """The sweep's plan now, with one list call; changes nothing: the verdict on each of this
        scaler's containers (targets with evidence, the spared with their reasons) and, isolation
        on, the rule sets for addresses no kici-managed container holds. Raises
        ``OrphanSweepRefused`` for a blank scaler name; a failed runtime listing raises (nothing
        can be planned blind)."""
        summaries = self.list_managed()
        plan = sweep.plan_containers(summaries, self.owner(), self.tracked(), self._is_registered)
        if self.network_isolation:
            plan.rules = self.plan_rule_orphans(summaries)
        return plan

    def plan_orphans(self) -> list[OrphanTarget]:
        """What the sweep would remove now (:meth:`plan_containers`): containers, then rule sets."""
        plan = self.plan_containers()
        return plan.targets + plan.rules

    def plan_rule_orphans(self, summaries: list[dict] | None = None) -> list[OrphanTarget]:
        """Rule sets on ``kici-agent-net`` addresses that nothing holds (``sweep.plan_rules``)."""
        return sweep.plan_rules(self.host, self.rules, self.scaler.name, summaries)

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        """Remove what ``plan`` names, re-checking each target first (``sweep.apply_orphans``);
        returns containers + rule sets removed."""
        return sweep.apply_orphans(self.host, self.rules, self.owner(), plan, self.tracked(), self._is_registered)

    def cleanup_orphans(self) -> int:
        """``apply_orphans(plan_orphans())``: containers + rule sets removed."""
        return self.apply_orphans(self.plan_orphans())

    def reap_unowned_isolation_rules(self) -> int:
        """Delete rules for addresses nothing holds (``sweep.reap_unowned_isolation_rules``)."""
        return sweep.reap_unowned_isolation_rules(self.host, self.rules)
