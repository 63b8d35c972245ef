"""The container backend: agent containers on ``kici-agent-net`` through the docker SDK (SPEC (e)).

Spawn, in order (each step preceded by ``control.check(stage)``, so a spawn past its deadline or
cancelled stops issuing runtime calls): mint the token, ``create`` (pulling per
``imagePullPolicy``: first for ``Always``, on "no such image" for ``IfNotPresent``) (labels, env, the one HostConfig builder, attached to ``kici-agent-net``), ``start``,
then the network stage: read the container's address and write its forward and input rules
(address known only after start; job code runs only after the agent registers, which it can
only do through those rules), then ``scaler.ready`` and ``agent.connecting``. Any failure removes
the rules and the container and re-raises; ``scalers.jobs`` records ``scaler.failed`` and
releases the reservation.

The start-up gap, stated honestly: docker assigns the address when the container starts, so the
rules can only be written after ``start``, roughly 50 ms later (one inspect, one database write,
one nft transaction). During that gap the container's packets are not filtered by this console:
``kici-agent-net`` has no guard rule, because the bridge is shared with other consoles' agents,
and an unmapped address falls through to the hooks' accept policy. What bounds the damage: job
code cannot run yet (it arrives only after the agent registers, through the rules); the forward
chain has no conntrack shortcut, so every packet of a flow opened in the gap (to the LAN, to
169.254.169.254) is re-checked once the rules exist; and the input chain accepts conntrack state
only in the reply direction, so a connection the image's entrypoint opened to a host port in the
gap stops at its next packet (``network.nft.render``; tests/test_isolation_packets.py). What is
NOT covered: packets sent and answered entirely within the gap (one short request to a host port,
the LAN or a metadata service, or a UDP datagram). Closing it needs the address before ``start``
(a static address per container), which this backend does not do yet.

Ownership on a shared docker host: see ``orphans`` for the sweep's rules.

Modules: :mod:`~scalers.backends.container.backend` (:class:`ContainerBackend`, destroy),
:mod:`~scalers.backends.container.spawn`, :mod:`~scalers.backends.container.sweep`,
:mod:`~scalers.backends.container.registry` (database reads); the failure detail is
:mod:`scalers.backends.failure`. The names below are importable from ``scalers.backends.container``.
"""

from ..docker_net import ISOLATED_NETWORK_GATEWAY
from ..failure import CAPTURED_LINES, failure_detail
from .backend import STOP_TIMEOUT_SECONDS, ContainerBackend
from .registry import REGISTRY, db_registered_ids, db_tracked_ids
from .sweep import ORPHAN_STOP_TIMEOUT_SECONDS

__all__ = ["ContainerBackend", "failure_detail", "ISOLATED_NETWORK_GATEWAY"]
