"""Spawning one agent container: the create config, the pull policy (with the registry
credential, when one is named), start, address and rules, and the cleanup of a failed spawn.
A job bringing its own image runs it with the agent injected from the runtime volume
(:mod:`~scalers.backends.container.job_runtime`). The steps in order, and the start-up gap before the
container's rules are written: ``docs/container-spawn.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import transaction
from docker.errors import APIError, ImageNotFound, NotFound

from agents import tokens
from agents.choices import EventType
from agents.events import record_connecting, record_event
from agents.models import Agent
from network import netlink
from scalers.credentials import CredentialError, auth_config
from scalers.kici_orchestrator import kici_agent_target, scale_up_claim, token_context

from ..base import SpawnAborted, SpawnControl, SpawnError, SpawnResult
from ..docker_net import (
    ISOLATED_NETWORK_GATEWAY,
    ISOLATED_NETWORK_NAME,
    agent_mac,
    container_network_facts,
)
from ..hostconfig import build_agent_container_host_config
from ..isolation import resolve_host_access, resolve_kici_host_access
from ..kici_token import mint_spawn_kici_token, revoke_failed_spawn_kici_token
from ..spawn_env import console_url, container_env, container_labels, label_set_option, network_policy, spawn_limits
from .host import DockerHost
from .job_runtime import AGENT_ENTRYPOINT, RUNTIME_DIR, ensure_runtime_volume
from .ready import AgentNetwork, agent_network, forget_agent_network
from .rules import ContainerRuleWriter

log = logging.getLogger(__name__)

#: Sysctls of an isolated agent container: no IPv6 inside.
IPV6_OFF = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}


def container_binds(label_set, runtime_socket: Callable[[], str | None]) -> list[str]:
    """The label set's ``volumes``, plus the runtime socket when it sets ``containerSocket``
    (``runtime_socket()``: the local runtime's socket path, None for a remote runtime)."""
    binds = [str(v) for v in (label_set_option(label_set, "volumes") or [])]
    if label_set_option(label_set, "containerSocket", False):
        sock = runtime_socket()
        if sock:
            binds.append(f"{sock}:{sock}")
    return binds


def container_create_config(
    agent,
    token: str | None,
    image: str,
    *,
    binds: list[str],
    extra_hosts: list[str],
    network_isolation: bool,
    job_image: bool = False,
    runtime_volume: str | None = None,
    network_id: str = "",
) -> dict:
    """Keyword arguments of ``APIClient.create_container`` for this agent: image, env, labels,
    HostConfig (the one builder), and, when isolation is on, ``kici-agent-net`` as network with the
    agent's MAC (``docker_net.agent_mac``, container-wide and on the endpoint) and IPv6 turned off
    inside (a second wall behind the guard, which drops IPv6 from the bridge anyway).

    ``job_image``: a bare-metal scaler's container mode (job-image env, no bound-job labels).
    ``runtime_volume``: the agent's job image (``agent.job_image``) runs with this volume read-only
    at ``RUNTIME_DIR`` and the injected entrypoint, and gets ``KICI_JOB_IMAGE_AGENT=1``.
    ``network_id``: the agent network's id as the spawn read it, pinned on the endpoint
    (``NetworkID``), so that a network made again under the name since fails the start (the
    create on daemons that check it) instead of attaching to a bridge the spawn has not guarded
    (:mod:`.ready`). The network stays named by its name: a daemon before API 1.44 gives the
    container-wide MAC only to the endpoint of the network ``NetworkMode`` names."""
    if runtime_volume:
        binds = [*binds, f"{runtime_volume}:{RUNTIME_DIR}:ro"]
    net_raw = bool(label_set_option(agent.label_set, "netRaw", False))
    host_config = build_agent_container_host_config(spawn_limits(agent), binds, extra_hosts, net_raw=net_raw)
    kwargs: dict = {
        "image": image,
        "name": agent.agent_id,
        "environment": container_env(agent, token, image=image, job_image=job_image or bool(runtime_volume)),
        "labels": container_labels(agent, bound_job_labels=not job_image),
    }
    if runtime_volume:
        kwargs["entrypoint"] = list(AGENT_ENTRYPOINT)
        kwargs["command"] = []
    if network_isolation:
        host_config["NetworkMode"] = ISOLATED_NETWORK_NAME
        host_config["Sysctls"] = dict(IPV6_OFF)
        mac = agent_mac(agent.agent_id)
        # The endpoint's MacAddress is read from API 1.44 (Docker 25) on; older daemons (Debian's
        # docker.io 20.10) read only the container-wide one and ignore the endpoint's. Both carry
        # the same value, which newer daemons accept.
        kwargs["mac_address"] = mac
        endpoint = {"MacAddress": mac, **({"NetworkID": network_id} if network_id else {})}
        kwargs["networking_config"] = {"EndpointsConfig": {ISOLATED_NETWORK_NAME: endpoint}}
    kwargs["host_config"] = host_config
    return kwargs


def spawn_image(agent) -> tuple[str, str]:
    """``(image, credentialsRef)`` an agent runs: the job's own image and credential when it brought
    one, else the label set's ``image`` (``KICI_AGENT_IMAGE`` when it has none) and its
    ``credentialsRef`` ("" for none)."""
    if agent.job_image:
        return agent.job_image, agent.job_credentials_ref or ""
    ls = agent.label_set
    return (
        str(label_set_option(ls, "image") or settings.KICI_AGENT_IMAGE),
        str(label_set_option(ls, "credentialsRef") or ""),
    )


def _scrub(text: str, auth: dict | None) -> str:
    """``text`` with the credential's password replaced, should a runtime ever echo it."""
    if auth and auth.get("password"):
        text = text.replace(auth["password"], "***")
    return text


def pull_image(api, agent, image: str, credentials_ref: str = "") -> None:
    """Pull ``image``, with the registry credential ``credentials_ref`` resolved now (``""``: none).
    Raises ``SpawnError`` (stage ``pull``) naming the image: an unusable credential, a refused or
    failed pull (an error in the progress stream too). The message never holds the secret."""
    auth = None
    if credentials_ref:
        try:
            auth = auth_config(credentials_ref, image)
        except CredentialError as exc:
            raise SpawnError(f"cannot pull image {image}: {exc}", "pull") from None
    record_event(agent, EventType.PROVISIONING, f"pulling image {image}")
    try:
        for chunk in api.pull(image, auth_config=auth, stream=True, decode=True):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise SpawnError(f"pull of image {image} failed: {_scrub(str(chunk['error']), auth)}", "pull")
    except APIError as exc:
        reason = _scrub(str(exc.explanation or exc), auth)
        raise SpawnError(f"pull of image {image} failed: {reason}", "pull") from None


def create_with_pull(api, agent, kwargs: dict, image: str, policy: str, credentials_ref: str = "") -> dict:
    """``create_container``, pulling first for ``Always`` and on "no such image" for
    ``IfNotPresent`` (the create itself is the presence check: one runtime call saved).
    ``credentials_ref``: the registry credential the pull uses (``pull_image``)."""
    if policy == "Always":
        pull_image(api, agent, image, credentials_ref)
    try:
        return api.create_container(**kwargs)
    except ImageNotFound:
        if policy == "Never":
            raise SpawnError(f"image {image} is not present and imagePullPolicy is Never", "create") from None
        pull_image(api, agent, image, credentials_ref)
        return api.create_container(**kwargs)


class Attachment:
    """A spawn's agent network on ``host`` and, on this host's runtime (``local``), the guard on
    its bridge (``rules``), both as this host recorded them (:mod:`.ready`); nothing when
    ``rules`` has isolation off."""

    def __init__(self, host: DockerHost, rules: ContainerRuleWriter, local: bool):
        self.host = host
        self.rules = rules
        self.local = local
        self.runtime_key = str(getattr(host.api, "base_url", id(host.docker)))
        self.network: AgentNetwork = AgentNetwork("", "")

    def attach(self) -> str | None:
        """Read (or find and record) the network, guard its bridge; the bridge, None when remote
        or without isolation. Raises the SDK's errors, ``IsolatedNetworkError``,
        ``NftUnavailableError`` / ``NftError``."""
        if not self.rules.enabled:
            return None
        self.network = agent_network(self.host.docker, self.runtime_key, local=self.local)
        if not self.local:
            return None
        self.rules.ensure_guard(self.network.bridge)
        return self.network.bridge

    def config_options(self) -> dict:
        """The create config's ``network_id`` option: the agent network's id (none without isolation)."""
        return {"network_id": self.network.id} if self.rules.enabled else {}

    def create_and_start(self, create: Callable[[], str], start: Callable[[str], None]) -> tuple[str, str | None]:
        """``start(create())`` (the create pinning :attr:`network` by id): the container's id and
        the bridge it is on. When the runtime says that network is gone (a daemon before API 1.44
        says so at the start, a later one at the create), the container is removed, the record
        dropped, the network found (or made) and guarded again, and both called once more."""
        container_id = ""
        try:
            container_id = create()
            start(container_id)
            return container_id, self.network.bridge or None
        except NotFound as exc:
            if not self.rules.enabled or not network_missing(exc, self.network.id):
                raise
        log.info("%s %s is gone: finding it again", ISOLATED_NETWORK_NAME, self.network.id[:12])
        if container_id:
            self.host.remove(container_id)
        forget_agent_network(self.runtime_key)
        bridge = self.attach()
        container_id = create()
        start(container_id)
        return container_id, bridge


def network_missing(exc: NotFound, network_id: str) -> bool:
    """Whether the runtime refused a create or start because the network ``network_id`` it names
    does not exist (an image it lacks is ``ImageNotFound``, handled by the pull policy)."""
    return not isinstance(exc, ImageNotFound) and network_id in str(exc.explanation or exc)


def bridge_port(agent, container_id: str, mac: str | None, pid: int | None, bridge: str, netns: str | None) -> str:
    """The port of ``bridge`` the started container (init ``pid``, ``mac`` on the agent network)
    sits on. Raises ``SpawnError`` (stage ``network``) when it has no MAC or process, or a MAC
    other than the one requested: the drift check rebuilds the binding from the agent id, so a
    runtime that ignored it would have the agent cut off at the next round."""
    if not (mac and pid):
        raise SpawnError(f"container {container_id[:12]} has no MAC or process on {ISOLATED_NETWORK_NAME}", "network")
    if mac.lower() != agent_mac(agent.agent_id):
        raise SpawnError(
            f"container {container_id[:12]} got MAC {mac} on {ISOLATED_NETWORK_NAME}, not the "
            f"requested {agent_mac(agent.agent_id)}",
            "network",
        )
    return netlink.bridge_port_of(pid, mac, bridge, netns=netns)


def teach_gateway(pid: int, mac: str, address: str, bridge: str, netns: str | None) -> None:
    """Now that the container's port is bound, give it the gateway's MAC
    (``network.netlink.teach_gateway``) and the bridge the container's (``teach_bridge``): its
    first connection to the console then leaves at once instead of after the kernel's next ARP
    attempt, a second later, and the answers reach it even when its address was another
    sandbox's a moment ago. Only a latency is at stake, so a failure is logged, never raised."""
    try:
        netlink.teach_gateway(pid, mac, ISOLATED_NETWORK_GATEWAY, bridge, netns=netns)
        netlink.teach_bridge(address, mac, bridge, netns=netns)
    except netlink.NetlinkError as exc:
        log.info("could not teach container pid %s and its bridge each other's MAC: %s", pid, exc)


def spawn_container(
    agent,
    control: SpawnControl,
    *,
    host: DockerHost,
    rules: ContainerRuleWriter,
    build_config: Callable[..., dict],
    local: bool = True,
) -> SpawnResult:
    """Provision one agent container on ``host`` (steps: ``docs/container-spawn.md``). Returns its
    id, address and resolved host access. ``rules``: the backend's rule writer (isolation is on
    when ``rules.enabled``). ``build_config(agent, token, image, runtime_volume=...)``: the create
    arguments. The image and its credential are :func:`spawn_image`'s; ``imagePullPolicy`` is
    the label set's, for a job's own image too.
    ``local``: the runtime runs on this host, so the bridge is guarded and the container bound to
    its veth (a remote runtime's bridge is out of this host's reach). Raises
    ``SpawnError`` / ``SpawnAborted`` after removing whatever it created (container, rules); lets
    runtime errors propagate the same way."""
    ls = agent.label_set
    image, credentials_ref = spawn_image(agent)
    policy = str(label_set_option(ls, "imagePullPolicy", "IfNotPresent"))
    container_id: str | None = None
    address: str | None = None
    started = False
    network_isolation = rules.enabled
    if not host.connected:  # even the client's version handshake honours the deadline
        remaining = control.remaining()
        host.connect(timeout=60 if remaining is None else max(1.0, min(60.0, remaining)))
        host.api.timeout = 60
    base_timeout = getattr(host.api, "timeout", None)

    def check(stage: str) -> None:
        # Each runtime call is bounded by what is left of the deadline, so a hung runtime
        # cannot hold a spawn the manager has given up on.
        control.check(stage)
        remaining = control.remaining()
        if remaining is not None and isinstance(base_timeout, int | float):
            host.api.timeout = max(1.0, min(float(base_timeout), remaining))

    bridge: str | None = None
    kici = kici_agent_target(ls)
    kici_token_id = ""
    try:
        check("create")
        attachment = Attachment(host, rules, local)
        bridge = attachment.attach()
        token, kici_token_id = mint_spawn_token(agent, kici)
        control.mark("checked")
        runtime_volume = ensure_runtime_volume(host.api) if agent.job_image else None

        def create() -> str:
            nonlocal container_id
            config = build_config(agent, token, image, runtime_volume=runtime_volume, **attachment.config_options())
            container_id = create_with_pull(host.api, agent, config, image, policy, credentials_ref)["Id"]
            agent.managed_id = container_id
            # At once: a worker killed from here on leaves a container the failure path must find.
            Agent.objects.filter(pk=agent.pk).update(managed_id=container_id)
            control.mark("created")
            return container_id

        def start(created: str) -> None:
            check("start")
            host.api.start(created)

        container_id, bridge = attachment.create_and_start(create, start)
        started = True
        control.mark("started")

        host_access: list[str] | None = None
        explicit = False
        port: str | None = None
        if network_isolation:
            check("network")
            # Until its port is bound (with its rules, in one transaction) the guard drops every
            # frame the container sends: nothing it does before that reaches anything.
            address, mac, pid, process_started = container_network_facts(host.docker, container_id)
            if process_started is not None:
                control.mark("process_started", process_started)
            if bridge and address:
                port = bridge_port(agent, container_id, mac, pid, bridge, rules.isolation.client.netns)
            policy_cfg = network_policy(ls)
            host_access, explicit = (
                resolve_host_access(policy_cfg, console_url(agent.scaler))
                if kici is None
                else resolve_kici_host_access(policy_cfg, kici)
            )
            # Stored before the rules are written, so a concurrent rule sweep counts it as live.
            with transaction.atomic():
                Agent.objects.filter(pk=agent.pk).update(
                    ip=address, host_access=host_access, host_access_explicit=explicit, bridge_port=port or ""
                )
                record_event(agent, EventType.NETWORK, "configuring network isolation")
            if address:
                rules.isolation.apply(address, policy_cfg, host_access, port=port, mac=mac if port else None)
                if port and mac and pid and bridge:
                    teach_gateway(pid, mac, address, bridge, rules.isolation.client.netns)
            else:
                log.warning(
                    "agent %s has no address on %s; no isolation rules written",
                    agent.agent_id,
                    ISOLATED_NETWORK_NAME,
                )
            control.mark("bound")

        check("ready")
        with transaction.atomic():
            record_event(agent, EventType.READY, "container started")
            record_connecting(agent, "waiting for agent registration")
        if base_timeout is not None:
            host.api.timeout = base_timeout
        return SpawnResult(
            managed_id=container_id,
            ip=address,
            host_access=host_access,
            host_access_explicit=explicit,
            context={
                "container_id": container_id,
                "image": image,
                "network": ISOLATED_NETWORK_NAME if network_isolation else None,
                **(token_context(kici, kici_token_id) if kici is not None and kici_token_id else {}),
            },
        )
    except BaseException as exc:
        captured = undo_failed_spawn(
            exc, agent, host, rules, container_id, address, started=started, base_timeout=base_timeout
        )
        if kici is not None and kici_token_id:
            revoke_failed_spawn_kici_token(kici, kici_token_id, agent.agent_id)
        if isinstance(exc, SpawnAborted | SpawnError):
            raise
        stage = control.stages[-1] if control.stages else ""
        raise SpawnError(f"{stage or 'spawn'} failed: {exc}", stage, captured) from exc


def mint_spawn_token(agent, kici) -> tuple[str, str]:
    """``(token, orchestrator token id)`` of a spawn, with its ``creating container`` event: the
    console's one-time registration token (id ``""``), or, for a label set running the real KiCI
    agent (``kici``: its ``KiciAgentTarget``), a token its orchestrator minted for the agent's
    labels, its id stored on the row at once so that a failure from here on revokes it. An agent
    a KiCI scale-up asked for mints nothing: it redeems the scale-up's claim code itself
    (``("", "")``). Raises ``SpawnError`` for a job image on such a label set,
    ``OrchestratorError`` when minting fails."""
    if kici is None:
        with transaction.atomic():  # one commit for the token and the event
            token = tokens.mint_registration_token(agent)
            record_event(agent, EventType.PROVISIONING, "creating container")
        return token, ""
    if agent.job_image:
        raise SpawnError(
            f"label set {agent.label_set.normalized} runs the real KiCI agent in its own image; "
            f"a job image ({agent.job_image}) cannot run it",
            "create",
        )
    if (claim := scale_up_claim(agent)) is not None:
        record_event(
            agent,
            EventType.PROVISIONING,
            f"creating container for the KiCI agent of {claim.orchestrator_url} "
            "(it redeems the claim code of its kici.scaler.scale-up there)",
        )
        return "", ""
    token_id, token = mint_spawn_kici_token(agent, kici, "container")
    return token, token_id


def undo_failed_spawn(
    exc: BaseException,
    agent,
    host: DockerHost,
    rules: ContainerRuleWriter,
    container_id: str | None,
    address: str | None,
    *,
    started: bool,
    base_timeout,
) -> list[str]:
    """After ``exc`` failed a spawn: restore the runtime client's timeout, capture the container's
    output tail (when it started), remove what the spawn created, revoke the agent's tokens, and attach
    the output to a ``SpawnError`` that has none yet or to a ``SpawnAborted``. Returns the output tail."""
    if base_timeout is not None:
        host.api.timeout = base_timeout
    captured = host.output_tail(container_id) if started else []
    cleanup_failed_spawn(host, rules, container_id, address, agent.agent_id)
    try:
        tokens.revoke_agent_tokens(agent)
    except Exception:  # best effort
        log.warning("could not revoke tokens of %s", agent.agent_id, exc_info=True)
    if captured and isinstance(exc, SpawnError) and not exc.captured_output:
        exc.captured_output = captured
    if isinstance(exc, SpawnAborted):
        exc.captured_output = captured  # type: ignore[attr-defined]
    return captured


def cleanup_failed_spawn(
    host: DockerHost, rules: ContainerRuleWriter, container_id: str | None, address: str | None, agent_id: str = ""
) -> None:
    """Remove what a failed spawn created: the address's rules (only while no other sandbox holds
    it; cleaning goes on regardless, the rule reaper is the backstop), then the container."""
    if address:
        rules.remove_quietly(address, (agent_id, container_id or ""), f"failed spawn of {agent_id}")
    if container_id:
        host.remove(container_id)
