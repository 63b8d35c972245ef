"""Validation of a job's ``/scale`` body (what is refused, and with which field, is
``test_scale_api``'s subject; here: how a parse is reused)."""

from __future__ import annotations

import pytest

from scalers.admission import validate
from scalers.admission.validate import InvalidScaleRequest, validate_resources


def test_a_resources_shape_seen_before_is_not_parsed_again_and_types_stay_apart(monkeypatch):
    """The parse of a job's resources is remembered by its JSON text: a repeated shape skips the
    schema, while values equal in Python but not in JSON (``1``, ``1.0``, ``true``) are told
    apart, and a refusal is given every time."""
    calls = []
    real = validate.parse_resource_request
    monkeypatch.setattr(validate, "parse_resource_request", lambda v: calls.append(v) or real(v))
    validate._parse_resources_text.cache_clear()

    first = validate_resources({"cpus": 1, "memory": "2g"})
    again = validate_resources({"memory": "2g", "cpus": 1})
    assert again == first and len(calls) == 1
    assert validate_resources({"cpus": 1.0, "memory": "2g"}) == first and len(calls) == 2
    for _ in range(2):
        with pytest.raises(InvalidScaleRequest, match="resources.cpus"):
            validate_resources({"cpus": True, "memory": "2g"})
    assert len(calls) == 4
    with pytest.raises(InvalidScaleRequest, match="resources.memory"):
        validate_resources({"cpus": 1, "memory": "17Ti"})
