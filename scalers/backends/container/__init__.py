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

Modules: :mod:`~scalers.backends.container.backend` (:class:`ContainerBackend`, destroy),
:mod:`~scalers.backends.container.spawn`, :mod:`~scalers.backends.container.sweep`,
:mod:`~scalers.backends.container.registry` (database reads); the failure detail is
:mod:`scalers.backends.failure`. The names below are importable from ``scalers.backends.container``.
"""

from ..docker_net import ISOLATED_NETWORK_GATEWAY
from ..failure import CAPTURED_LINES, failure_detail
from .backend import STOP_TIMEOUT_SECONDS, ContainerBackend
from .registry import REGISTRY, db_registered_ids, db_tracked_ids, tracked_addresses
from .sweep import ORPHAN_STOP_TIMEOUT_SECONDS

__all__ = ["ContainerBackend", "failure_detail", "ISOLATED_NETWORK_GATEWAY"]
