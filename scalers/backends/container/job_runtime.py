"""The runtime volume that carries the agent into a job's own image, which need not have a shell,
``wget`` or the agent: mounted read-only at :data:`RUNTIME_DIR`, run with :data:`AGENT_ENTRYPOINT`,
named by the agent image's id and filled idempotently from it, so concurrent spawns and consoles
may fill the same volume. Design: docs/registry-credentials.md.
"""

from __future__ import annotations

import threading

from django.conf import settings
from docker.errors import APIError, ImageNotFound, NotFound

from ..base import SpawnError

#: Where the runtime volume is mounted in a job-image container.
RUNTIME_DIR = "/kici-runtime"
#: The injected entrypoint: the volume's tools first on PATH, then the agent.
AGENT_ENTRYPOINT = [
    f"{RUNTIME_DIR}/sh",
    "-c",
    f'PATH="{RUNTIME_DIR}${{PATH:+:$PATH}}"; export PATH; exec {RUNTIME_DIR}/sh {RUNTIME_DIR}/kici_agent.sh',
]
#: The fill, run in the agent image with the volume at RUNTIME_DIR.
FILL_SCRIPT = (
    f"set -e; d={RUNTIME_DIR}; "
    "cp /bin/busybox $d/.busybox.$$; chmod 0755 $d/.busybox.$$; mv -f $d/.busybox.$$ $d/busybox; "
    "cp /kici_agent.sh $d/.agent.$$; chmod 0755 $d/.agent.$$; mv -f $d/.agent.$$ $d/kici_agent.sh; "
    'for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sfn busybox "$d/$a"; done'
)
FILL_TIMEOUT_SECONDS = 60
FILL_LABEL = "kici-job-runtime-fill"

_filled: set[tuple[str, str]] = set()
_lock = threading.Lock()


def runtime_volume_name(agent_image_id: str) -> str:
    """``kici-job-runtime-<first 12 hex of the image id>``."""
    return f"kici-job-runtime-{agent_image_id.removeprefix('sha256:')[:12]}"


def ensure_runtime_volume(api) -> str:
    """The name of the filled runtime volume on ``api``'s runtime (a docker ``APIClient``),
    filling it first when this process has not yet. Raises ``SpawnError`` (stage ``runtime``)
    when the agent image is missing there or the fill fails; the helper container is removed
    either way."""
    agent_image = settings.KICI_AGENT_IMAGE
    try:
        image_id = api.inspect_image(agent_image)["Id"]
    except ImageNotFound:
        raise SpawnError(
            f"agent image {agent_image} is not on the runtime: a job image needs it for the agent "
            "(sandbox_agent/build_image.sh builds it)",
            "runtime",
        ) from None
    name = runtime_volume_name(image_id)
    key = (str(getattr(api, "base_url", id(api))), name)
    with _lock:
        filled = key in _filled
    if filled and _volume_exists(api, name):  # a volume removed since is filled again
        return name
    _fill(api, image_id, name)
    with _lock:
        _filled.add(key)
    return name


def _volume_exists(api, name: str) -> bool:
    try:
        api.inspect_volume(name)
    except NotFound:
        return False
    return True


def _fill(api, image_id: str, volume: str) -> None:
    api.create_volume(name=volume, labels={FILL_LABEL: "volume"})
    helper = None
    try:
        helper = api.create_container(
            image_id,
            command=["/bin/sh", "-c", FILL_SCRIPT],
            entrypoint=[],
            network_disabled=True,
            labels={FILL_LABEL: "helper"},
            host_config=api.create_host_config(binds=[f"{volume}:{RUNTIME_DIR}"], network_mode="none"),
        )["Id"]
        api.start(helper)
        status = api.wait(helper, timeout=FILL_TIMEOUT_SECONDS).get("StatusCode")
        if status != 0:
            output = api.logs(helper, tail=20).decode(errors="replace").strip()
            raise SpawnError(f"filling the job runtime volume {volume} exited {status}: {output}", "runtime")
    except APIError as exc:
        reason = exc.explanation or exc
        raise SpawnError(f"filling the job runtime volume {volume} failed: {reason}", "runtime") from exc
    finally:
        if helper:
            try:
                api.remove_container(helper, force=True)
            except APIError:
                pass
