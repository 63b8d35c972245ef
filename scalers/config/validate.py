"""Validating a whole parsed document with every issue collected, and a job's ``resources`` (SPEC (a))."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from lib.units import InvalidMemoryFormat, parse_memory

from .document import ScalersConfig, _TopLevel
from .entries import ScalerEntry
from .fields import _Strict
from .issues import SchemaIssue, _issues_from, describe_value
from .refinements import _cross_issues, scaler_entry_issues
from .resource_shapes import ResourceRequest, Resources


def validate_document(data: Any) -> tuple[ScalersConfig | None, list[SchemaIssue]]:
    """Validate a parsed (merged) ``scalers.yaml`` document, collecting every issue.

    Returns ``(config, [])`` when valid, else ``(None, issues)`` with one
    :class:`SchemaIssue` per problem, paths from the document root. Never raises for
    bad input. Source: SPEC (a.2)-(a.9), overlap rule SPEC (b).
    """
    if not isinstance(data, dict):
        return None, [SchemaIssue((), f"Expected a mapping at the top level, received {describe_value(data)}")]

    issues: list[SchemaIssue] = []
    top_data = {k: v for k, v in data.items() if k != "scalers"}
    top: _TopLevel | None = None
    try:
        top = _TopLevel.model_validate(top_data)
    except ValidationError as exc:
        issues += _issues_from(exc)

    parsed: list[tuple[int, ScalerEntry]] = []
    raw_scalers = data.get("scalers")
    if "scalers" not in data:
        issues.append(SchemaIssue(("scalers",), "Required"))
    elif not isinstance(raw_scalers, list):
        issues.append(SchemaIssue(("scalers",), f"Expected a list, received {describe_value(raw_scalers)}"))
    else:
        for i, raw in enumerate(raw_scalers):
            try:
                entry = ScalerEntry.model_validate(raw)
            except ValidationError as exc:
                issues += _issues_from(exc, ("scalers", i))
                continue
            parsed.append((i, entry))
            issues += [SchemaIssue(("scalers", i, *x.path), x.message) for x in scaler_entry_issues(entry)]

    if top is not None:
        pool_names: list[Any] = [p.name for p in top.machine_pools]
        pools_known = True
    else:
        raw_pools = data.get("machinePools")
        raw_pools = raw_pools if isinstance(raw_pools, list) else []
        pool_names = [p.get("name") if isinstance(p, dict) else None for p in raw_pools]
        # The top level failed elsewhere; references can still be checked if the pools parsed.
        pools_known = not any(i.path[:1] == ("machinePools",) for i in issues)
    issues += _cross_issues(parsed, pool_names, pools_known=pools_known)

    if issues:
        return None, issues
    try:
        return ScalersConfig.model_validate(data), []
    except ValidationError as exc:  # pragma: no cover - both layers check the same rules
        return None, _issues_from(exc)


def parse_resource_request(value: Any) -> ResourceRequest:
    """Validate a job's ``resources`` (same shapes as a label set's, SPEC a.4).

    Accepts ``None`` (⇒ empty request), a nested ``{requests?, limits?}`` or a flat
    ``{cpus?, memory?}`` mapping; memory strings are additionally parsed so that a
    bad one is refused up front. Raises ``ValueError`` whose message names the
    offending path (``resources.requests.cpus: ...``).
    """
    if value is None:
        return ResourceRequest()
    try:
        result = _ResourcesHolder.model_validate({"resources": value}).resources
    except ValidationError as exc:
        raise ValueError("; ".join(str(i) for i in _issues_from(exc))) from None
    request = result or ResourceRequest()
    for side in ("requests", "limits"):
        spec = getattr(request, side)
        if spec is not None and spec.memory is not None:
            try:
                parse_memory(spec.memory)
            except InvalidMemoryFormat as exc:
                raise ValueError(f"resources.{side}.memory: {exc}") from None
    return request


class _ResourcesHolder(_Strict):
    resources: Resources | None = None
