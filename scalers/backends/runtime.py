"""Which container runtime a scaler talks to, and a docker SDK client for it."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from .base import scaler_option

#: Probed in this order; podman's per-user socket only when XDG_RUNTIME_DIR is set.
DOCKER_SOCKET = "/var/run/docker.sock"
PODMAN_SOCKET = "/run/podman/podman.sock"
NO_RUNTIME_MESSAGE = "No container runtime found. Install Docker or Podman, or configure host."


class NoContainerRuntime(RuntimeError):
    """No usable runtime socket and no ``host`` configured; ``str()`` is :data:`NO_RUNTIME_MESSAGE`."""


@dataclass(frozen=True)
class RuntimeInfo:
    """``socket_path`` (None for a remote ``host``), ``runtime`` (docker|podman), ``base_url`` for the SDK."""

    runtime: str
    base_url: str
    socket_path: str | None = None

    @property
    def spawns_on_local_host(self) -> bool:
        """Whether the daemon's containers sit on bridges of this host (so this host guards them):
        a unix socket, or a TCP endpoint on a loopback address; any other host is remote."""
        return self.socket_path is not None or endpoint_is_local(self.base_url)


def endpoint_is_local(url: str) -> bool:
    """True for ``unix://…`` and for ``tcp://``/``http(s)://`` endpoints on ``localhost`` or a
    loopback address; False for every other host (a name is not resolved: it may be anywhere)."""
    parts = urlsplit(url)
    if parts.scheme in ("unix", "npipe"):
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _accessible(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.R_OK | os.W_OK)


def probe_paths(hint: str | None = None, environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(path, runtime)`` candidates in probe order, filtered by ``hint`` (docker|podman|auto)."""
    environ = os.environ if environ is None else environ
    paths = [(DOCKER_SOCKET, "docker"), (PODMAN_SOCKET, "podman")]
    if environ.get("XDG_RUNTIME_DIR"):
        paths.append((os.path.join(environ["XDG_RUNTIME_DIR"], "podman", "podman.sock"), "podman"))
    if hint in ("docker", "podman"):
        paths = [p for p in paths if p[1] == hint]
    return paths


def detect_container_runtime(
    host: str | None = None,
    socket_path: str | None = None,
    hint: str | None = None,
    *,
    accessible: Callable[[str], bool] = _accessible,
    environ: dict | None = None,
) -> RuntimeInfo:
    """Resolve the runtime for a scaler entry.

    ``host`` (``tcp://h:2376``): remote, no probing, runtime podman only when ``hint == "podman"``.
    ``socket_path``: that socket, runtime inferred from the path (``podman`` in it ⇒ podman).
    Otherwise the first readable+writable socket of :func:`probe_paths`. Raises
    :class:`NoContainerRuntime` (:data:`NO_RUNTIME_MESSAGE`) when nothing is found.
    """
    if host:
        return RuntimeInfo(runtime="podman" if hint == "podman" else "docker", base_url=host)
    if socket_path:
        return RuntimeInfo(
            runtime="podman" if "podman" in socket_path else "docker",
            base_url=f"unix://{socket_path}",
            socket_path=socket_path,
        )
    for path, runtime in probe_paths(hint, environ):
        if accessible(path):
            return RuntimeInfo(runtime=runtime, base_url=f"unix://{path}", socket_path=path)
    raise NoContainerRuntime(NO_RUNTIME_MESSAGE)


def runtime_for_scaler(scaler: Any) -> RuntimeInfo:
    """The runtime of a scaler entry: its ``host``/``socketPath``/``runtime`` fields, else
    ``settings.DOCKER_HOST`` (the console's own daemon), else socket probing."""
    host = scaler_option(scaler, "host")
    socket_path = scaler_option(scaler, "socketPath")
    hint = scaler_option(scaler, "runtime")
    if not host and not socket_path and settings.DOCKER_HOST:
        url = settings.DOCKER_HOST
        if url.startswith("unix://"):
            path = url[len("unix://") :]
            return RuntimeInfo(runtime="podman" if "podman" in path else "docker", base_url=url, socket_path=path)
        return RuntimeInfo(runtime="podman" if hint == "podman" else "docker", base_url=url)
    return detect_container_runtime(host, socket_path, hint if hint != "auto" else None)


def docker_client_for(info: RuntimeInfo, timeout: float = 60):
    """A ``docker.DockerClient`` for ``info`` (API version negotiated with the daemon)."""
    import docker

    return docker.DockerClient(base_url=info.base_url, version="auto", timeout=timeout)
