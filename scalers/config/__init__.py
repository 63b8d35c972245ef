"""``scalers.yaml``: schema, memory strings and loading (SPEC section a).

Public API (re-exported here):

* ``load_scalers_config(path, drop_in_dir=None) -> ScalersConfig`` and
  ``parse_scalers_config_text(text, filename="<string>") -> ScalersConfig``, both
  raising ``ConfigInvalid`` (``.problems``: list of ``ConfigProblem``).
* ``ScalersConfig`` and its parts (``ScalerEntry``, ``LabelSet``, ``ResourceRequest``,
  ``ResourceSpec``, ``ResourceCap``, ``MachinePool``, ``WarmPool``, ``Platform``,
  ``NetworkPolicy``, ``Defaults``, ``FirecrackerNetwork``).
* ``parse_memory(s) -> int`` (bytes), raising ``InvalidMemoryFormat``.
* ``validate_document(data) -> (config | None, [SchemaIssue])`` for already-parsed data.
* ``parse_resource_request(value) -> ResourceRequest`` for a job's ``resources``.
"""

from .loader import ConfigInvalid, ConfigProblem, drop_in_files, load_scalers_config, parse_scalers_config_text
from .schema import (
    Defaults,
    FirecrackerNetwork,
    LabelSet,
    MachinePool,
    NetworkPolicy,
    Platform,
    ResourceCap,
    ResourceRequest,
    ResourceSpec,
    ScalerEntry,
    ScalersConfig,
    SchemaIssue,
    WarmPool,
    parse_resource_request,
    scaler_entry_issues,
    validate_document,
)

__all__ = [
    "ConfigInvalid",
    "ConfigProblem",
    "Defaults",
    "FirecrackerNetwork",
    "LabelSet",
    "MachinePool",
    "NetworkPolicy",
    "Platform",
    "ResourceCap",
    "ResourceRequest",
    "ResourceSpec",
    "ScalerEntry",
    "ScalersConfig",
    "SchemaIssue",
    "WarmPool",
    "drop_in_files",
    "load_scalers_config",
    "parse_resource_request",
    "parse_scalers_config_text",
    "scaler_entry_issues",
    "validate_document",
]
