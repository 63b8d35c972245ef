"""Label logic: canonical forms, auto-injected labels, gates, routing and overlaps.

Pure functions over plain values (no Django, no database). Rule sources: SPEC (a.7),
(a.10), (a.11) and (b); ENG label helpers as restated there.

Vocabulary:

* *declared* labels: a label set's ``labels`` as written in ``scalers.yaml``,
  canonicalised (trimmed, lower-cased).
* *enriched* label set: declared labels plus the auto labels a scaler's agents carry
  (``kici:os:*``, ``kici:arch:*``, plain platform taints, ``kici:agent:<type>``,
  ``kici:scaler:<name>``, ``kici:role:*``). Routing matches job labels against these.
* *gate*: labels a job must carry to be routed to a label set at all
  (``mandatoryLabels`` plus platform taints), SPEC (b).

Modules, one job each (every name is importable from ``scalers.labels``):
:mod:`~scalers.labels.canonical`, :mod:`~scalers.labels.roles`, :mod:`~scalers.labels.platforms`,
:mod:`~scalers.labels.gates` (gates and auto labels), :mod:`~scalers.labels.routing` and
:mod:`~scalers.labels.overlaps`.
"""

from .canonical import RESERVED_PREFIX, canonicalize_labels, is_reserved_label, normalize_label_set
from .gates import agent_labels, enrich_label_set, label_set_gate, scaler_identity_labels, unreachable_gate_labels
from .overlaps import LabelSetOverlap, find_label_set_overlaps
from .platforms import (
    PLAIN_TAINT_LABELS,
    PlatformLike,
    host_arch,
    host_os,
    os_arch_labels,
    plain_taints,
    platform_to_taints,
)
from .roles import ROLE_ALL, ROLE_BUILDER, ROLE_INIT_RUNNER, JobKind, normalize_roles, role_labels, roles_allow
from .routing import (
    BackendMatch,
    RoutingEntry,
    build_routing_entries,
    find_backend_for_labels,
    routing_entry_for_scaler,
)

__all__ = [
    "RESERVED_PREFIX",
    "PLAIN_TAINT_LABELS",
    "ROLE_BUILDER",
    "ROLE_INIT_RUNNER",
    "ROLE_ALL",
    "canonicalize_labels",
    "normalize_label_set",
    "is_reserved_label",
    "normalize_roles",
    "role_labels",
    "roles_allow",
    "host_os",
    "host_arch",
    "os_arch_labels",
    "platform_to_taints",
    "plain_taints",
    "label_set_gate",
    "unreachable_gate_labels",
    "enrich_label_set",
    "scaler_identity_labels",
    "agent_labels",
    "RoutingEntry",
    "BackendMatch",
    "routing_entry_for_scaler",
    "build_routing_entries",
    "find_backend_for_labels",
    "LabelSetOverlap",
    "find_label_set_overlaps",
]
