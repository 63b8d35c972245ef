"""Resource mirroring, the job → label set → defaults cascade and backend limits."""

from __future__ import annotations

import pytest

from lib.units import InvalidMemoryFormat
from scalers.config.schema import parse_resource_request, validate_document
from scalers.resources import (
    EffectiveLimits,
    ResourceAmount,
    effective_limits,
    has_declared_shape,
    mirror_request,
    resolve_resources,
)

GIB = 1024**3


def req(value):
    """A ResourceRequest as the schema produces it (flat shapes become nested)."""
    return parse_resource_request(value)


# ----------------------------------------------------------------------------- mirroring


def test_res01_requests_only_is_mirrored_to_limits():
    m = mirror_request(req({"requests": {"cpus": 1}}))
    assert (m.requests.cpus, m.limits.cpus) == (1, 1)
    assert m.limits.memory is None


def test_res01_limits_only_is_mirrored_to_requests():
    m = mirror_request(req({"limits": {"memory": "4g"}}))
    assert (m.requests.memory, m.limits.memory) == ("4g", "4g")


def test_res01_both_sides_are_kept():
    m = mirror_request(req({"requests": {"cpus": 1}, "limits": {"cpus": 2}}))
    assert (m.requests.cpus, m.limits.cpus) == (1, 2)


@pytest.mark.parametrize("value", [None, {}, {"requests": None}])
def test_res01_neither_side_is_undeclared(value):
    m = mirror_request(value if value is None else req(value))
    assert not m.declared
    assert (m.requests, m.limits) == (None, None)


def test_mirroring_accepts_plain_mappings_of_either_shape():
    assert mirror_request({"cpus": 2}).limits.cpus == 2
    assert mirror_request({"limits": {"cpus": 3}}).requests.cpus == 3


# ----------------------------------------------------------------------------- cascade


def test_res02_cascade_job_over_label_set_over_defaults():
    defaults = req({"requests": {"cpus": 1, "memory": "1g"}, "limits": {"cpus": 2, "memory": "2g"}})
    label_set = req({"cpus": 4, "memory": "8g"})
    job = req({"limits": {"memory": "16g"}})
    resolved = resolve_resources(job, label_set, defaults)
    assert resolved.requests == ResourceAmount(cpus=4, mem_bytes=17179869184)
    assert resolved.limits == ResourceAmount(cpus=4, mem_bytes=17179869184)


def test_cascade_is_per_field_and_per_side():
    defaults = req({"requests": {"cpus": 1, "memory": "1g"}, "limits": {"cpus": 2, "memory": "2g"}})
    label_set = req({"requests": {"cpus": 3}, "limits": {"memory": "6g"}})
    resolved = resolve_resources(None, label_set, defaults)
    assert resolved.requests == ResourceAmount(cpus=3, mem_bytes=1 * GIB)
    assert resolved.limits == ResourceAmount(cpus=2, mem_bytes=6 * GIB)


def test_a_layer_is_mirrored_before_cascading():
    # The label set declares only requests.cpus; mirrored, it also sets limits.cpus,
    # which therefore beats the defaults' limits.cpus.
    defaults = req({"requests": {"cpus": 1}, "limits": {"cpus": 2}})
    resolved = resolve_resources(None, req({"requests": {"cpus": 3}}), defaults)
    assert (resolved.requests.cpus, resolved.limits.cpus) == (3, 3)


def test_defaults_alone_apply():
    resolved = resolve_resources(None, None, req({"memory": "2g", "cpus": 2}))
    assert resolved.requests == resolved.limits == ResourceAmount(2, 2 * GIB)


# ----------------------------------------------------------------------------- limits


def test_res03_nothing_declared_anywhere():
    resolved = resolve_resources(None, None, None)
    assert resolved.requests == ResourceAmount(0, 0)
    assert resolved.limits == ResourceAmount(0, 0)
    assert not effective_limits(resolved.limits.cpus, resolved.limits.mem_bytes).is_set


def test_res04_zero_fields_are_dropped_from_limits():
    assert effective_limits(2, 0) == EffectiveLimits(cpus=2.0, mem_bytes=0)
    assert effective_limits(0, GIB) == EffectiveLimits(cpus=0.0, mem_bytes=GIB)
    assert effective_limits(None, None) == EffectiveLimits() and not EffectiveLimits().is_set


def test_memory_is_parsed_only_when_used():
    config, issues = validate_document(
        {
            "version": 1,
            "scalers": [
                {
                    "name": "c",
                    "type": "container",
                    "maxAgents": 1,
                    "labelSets": [{"labels": ["x"], "image": "i", "resources": {"memory": "4Gi"}}],
                }
            ],
        }
    )
    assert issues == []
    with pytest.raises(InvalidMemoryFormat, match='"4Gi"'):
        resolve_resources(None, config.scalers[0].label_sets[0].resources, None)


def test_a_job_layer_can_override_a_bad_lower_layer():
    # First defined wins, so a lower layer's unparseable memory is never read.
    resolved = resolve_resources(req({"memory": "1g"}), {"memory": "4Gi"}, None)
    assert resolved.requests.mem_bytes == GIB


# ----------------------------------------------------------------------------- declared shape (warm pools)


@pytest.mark.parametrize(
    "label_set, defaults, declared",
    [
        (None, None, False),
        ({}, None, False),
        ({"cpus": 1}, None, True),
        (None, {"limits": {"memory": "1g"}}, True),  # limits alone count
        ({"requests": {}}, None, False),
    ],
)
def test_has_declared_shape(label_set, defaults, declared):
    ls = None if label_set is None else req(label_set)
    d = None if defaults is None else req(defaults)
    assert has_declared_shape(ls, d) is declared
