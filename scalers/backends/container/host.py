"""One scaler's container runtime: the docker client and the container calls the backend makes."""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from typing import Any

from docker.errors import APIError, NotFound

from ..failure import CAPTURED_LINES
from ..runtime import RuntimeInfo, docker_client_for

log = logging.getLogger(__name__)


def agent_filters(scaler_name: str, agent_id: str) -> dict:
    """List filters for one scaler's containers of one agent id (the three ownership labels)."""
    return {"label": ["kici-managed=true", f"kici-scaler-name={scaler_name}", f"kici-agent-id={agent_id}"]}


class DockerHost:
    """The runtime a backend talks to, resolved and connected on first use.

    ``docker``: a ``docker.DockerClient`` (default: one for the runtime). ``runtime``: the
    ``RuntimeInfo`` (default: ``resolve_runtime()``, called once).
    """

    def __init__(
        self, resolve_runtime: Callable[[], RuntimeInfo], *, docker: Any = None, runtime: RuntimeInfo | None = None
    ):
        self._resolve_runtime = resolve_runtime
        self._docker = docker
        self._runtime = runtime

    @property
    def runtime(self) -> RuntimeInfo:
        if self._runtime is None:
            self._runtime = self._resolve_runtime()
        return self._runtime

    @property
    def connected(self) -> bool:
        """Whether a client exists already (injected, or made by an earlier call)."""
        return self._docker is not None

    def connect(self, timeout: float) -> None:
        """Make the client now, its version handshake bounded by ``timeout`` seconds."""
        self._docker = docker_client_for(self.runtime, timeout=timeout)

    @property
    def docker(self):
        if self._docker is None:
            self._docker = docker_client_for(self.runtime)
        return self._docker

    @property
    def api(self):
        return self.docker.api

    def list(self, filters: dict) -> builtins.list[dict]:
        return self.api.containers(all=True, filters=filters) or []

    def list_managed(self) -> builtins.list[dict]:
        """ONE sparse list call: every ``kici-managed=true`` container on the runtime, any scaler."""
        return self.list({"label": ["kici-managed=true"]})

    def find(self, scaler_name: str, agent_id: str) -> str | None:
        """The id of the scaler's container for ``agent_id``, or None."""
        found = self.list(agent_filters(scaler_name, agent_id))
        return found[0]["Id"] if found else None

    def remove(self, container_id: str) -> bool:
        """``remove(force)``; False when it is gone already or being removed by someone else."""
        try:
            self.api.remove_container(container_id, force=True)
            return True
        except NotFound:
            return False
        except APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc):
                return False
            raise

    def output_tail(
        self, container_id: str | None, lines: int = CAPTURED_LINES, *, stderr: bool = True
    ) -> builtins.list[str]:
        """The container's last ``lines`` output lines (stdout, and stderr unless ``stderr`` is
        False); [] when there is none or it is gone."""
        if not container_id:
            return []
        try:
            raw = self.api.logs(container_id, stdout=True, stderr=stderr, tail=lines)
        except Exception:  # noqa: BLE001 - the container may be gone already
            return []
        return raw.decode("utf-8", "replace").splitlines()[-lines:]
