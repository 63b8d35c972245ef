"""The one ``HostConfig`` builder for every KiCI agent container: the container backend and the
bare-metal backend's container mode both call :func:`build_agent_container_host_config` and
nothing else builds one, so the two cannot differ. Why only ``NET_RAW`` is dropped and what
``PidsLimit`` and ``Init`` are for: docs/container-spawn.md ("The HostConfig").
"""

from __future__ import annotations

from scalers.resources import EffectiveLimits

#: Maximum processes in one agent container. Not configurable.
AGENT_CONTAINER_PIDS_LIMIT = 4096

#: Capabilities an agent container loses unless its label set says ``netRaw: true``.
AGENT_CAP_DROP = ("NET_RAW",)

#: Docker keeps an agent's output in at most two 8 MiB files (json-file driver, rotated), so a
#: chatty agent cannot fill the disk; ``docker logs`` and the console read them as before.
AGENT_LOG_CONFIG = {"Type": "json-file", "Config": {"max-size": "8m", "max-file": "2"}}


def build_agent_container_host_config(
    limits: EffectiveLimits | None = None,
    binds: list[str] | None = None,
    extra_hosts: list[str] | None = None,
    net_raw: bool = False,
) -> dict:
    """Return the agent container's HostConfig as a Docker Engine API dict: ``Memory`` (bytes) and
    ``NanoCpus`` (``round(cpus * 1e9)``) only for limits above 0, ``Binds`` (``/host:/ctr[:ro]``) and
    ``ExtraHosts`` (``name:ip``) only when non-empty; always ``AutoRemove: false``, ``PidsLimit``,
    ``Init: true``, :data:`AGENT_LOG_CONFIG`, ``CapDrop: ["NET_RAW"]`` unless ``net_raw``; never
    ``SecurityOpt``. Raises ``ValueError`` naming the field for a negative limit or a non-string entry.
    """
    host_config: dict = {
        "AutoRemove": False,
        "PidsLimit": AGENT_CONTAINER_PIDS_LIMIT,
        "Init": True,
        "LogConfig": AGENT_LOG_CONFIG,
    }
    if not isinstance(net_raw, bool):
        raise ValueError(f"net_raw must be true or false, got {net_raw!r}")
    if not net_raw:
        host_config["CapDrop"] = list(AGENT_CAP_DROP)
    if limits is not None:
        if limits.cpus < 0:
            raise ValueError(f"limits.cpus must not be negative, got {limits.cpus!r}")
        if limits.mem_bytes < 0:
            raise ValueError(f"limits.mem_bytes must not be negative, got {limits.mem_bytes!r}")
        if limits.mem_bytes > 0:
            host_config["Memory"] = int(limits.mem_bytes)
        if limits.cpus > 0:
            host_config["NanoCpus"] = int(round(limits.cpus * 1e9))
    for field, values in (("binds", binds), ("extra_hosts", extra_hosts)):
        for value in values or []:
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{field} entries must be non-empty strings, got {value!r}")
    if binds:
        host_config["Binds"] = list(binds)
    if extra_hosts:
        host_config["ExtraHosts"] = list(extra_hosts)
    return host_config
