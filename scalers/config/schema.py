"""The ``scalers.yaml`` schema (pydantic v2), the reference format read unchanged.

Rule source: SPEC (a.2)-(a.11) and the cross-scaler overlap rule of SPEC (b).

Python attributes are snake_case; the YAML keys (camelCase) are the aliases, and only
the aliases are accepted on input (``max_agents:`` in a YAML file is an unknown key,
as in the reference). ``model_dump(by_alias=True, exclude_none=True)`` (or
:meth:`ScalersConfig.to_raw`) gives back a document that validates to an equal object,
which is what the database stores.

Strictness follows the reference: scaler entries, label sets, resource shapes,
resource caps, machine pools and ``platform`` refuse unknown keys
(``unrecognized_keys``); the top level, ``defaults``, ``warmPool``, ``networkPolicy``
and the ``firecracker`` block drop them silently. An explicit YAML ``null`` on an
optional key means "absent".

Validation happens in two layers, so that *every* problem can be reported with its
own path:

1. :func:`validate_document` validates the top level and each scaler entry
   separately, then runs the refinements (per-type requirements, gate reachability,
   machine-pool references, duplicate names, label-set overlaps) on whatever parsed.
   It returns ``(config | None, issues)``; paths are tuples such as
   ``("scalers", 0, "labelSets", 1, "labels")``.
2. :class:`ScalersConfig` re-checks the same refinements in a model validator, so a
   ``ScalersConfig`` object is always a fully valid configuration however it was built.
   (A bare :class:`ScalerEntry` only carries field-level checks; use
   :func:`scaler_entry_issues` for its refinements.)

Modules, one job each (every public name is importable from here):
:mod:`~scalers.config.issues` (:class:`SchemaIssue`, pydantic errors in the reference's words),
:mod:`~scalers.config.fields` (scalar types, strict and loose base objects),
:mod:`~scalers.config.resource_shapes` (requests, caps, machine pools),
:mod:`~scalers.config.entries` (a scaler entry and its parts),
:mod:`~scalers.config.refinements` (rules within and across entries),
:mod:`~scalers.config.document` (the top level, :class:`ScalersConfig`) and
:mod:`~scalers.config.validate` (:func:`validate_document`, :func:`parse_resource_request`).
"""

from __future__ import annotations

from .document import Defaults, FirecrackerNetwork, ScalersConfig
from .entries import SCALER_TYPES, LabelSet, NetworkPolicy, Platform, ScalerEntry, WarmPool
from .issues import SchemaIssue, describe_value
from .refinements import scaler_entry_issues
from .resource_shapes import MachinePool, ResourceCap, ResourceRequest, ResourceSpec
from .validate import parse_resource_request, validate_document

__all__ = [
    "SchemaIssue",
    "ResourceSpec",
    "ResourceRequest",
    "ResourceCap",
    "MachinePool",
    "WarmPool",
    "Platform",
    "NetworkPolicy",
    "LabelSet",
    "ScalerEntry",
    "Defaults",
    "FirecrackerNetwork",
    "ScalersConfig",
    "SCALER_TYPES",
    "validate_document",
    "scaler_entry_issues",
    "parse_resource_request",
    "describe_value",
]
