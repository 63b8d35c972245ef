"""The rounding margin of the resource caps: float sums of cpus drift (0.1 + 0.2 is
0.30000000000000004), and a request that fits a cap exactly must be admitted, while one a
visible amount over it is refused, for every resource cap."""

from __future__ import annotations

import pytest

from scalers.admission.caps import (
    CapName,
    GlobalCaps,
    PoolCaps,
    ScalerCaps,
    Tally,
    Usage,
    cap_exceeded_alone,
    first_refusing_cap,
)

SCALER, POOL = 1, 7


def _usage(cpus: float) -> Usage:
    """0.1 already reserved in every scope (the scaler, the whole console, its machine pool)."""
    usage = Usage(total=Tally(reservations=1, active=1, cpus=cpus))
    usage.scalers[SCALER] = Tally(reservations=1, active=1, cpus=cpus)
    usage.pools[POOL] = Tally(reservations=1, active=1, cpus=cpus)
    return usage


CAPPED_AT_03 = {
    CapName.RESOURCE_CAP_CPU: (GlobalCaps(10), ScalerCaps(SCALER, 10, max_cpu=0.3), None),
    CapName.GLOBAL_RESOURCE_CAP_CPU: (GlobalCaps(10, max_cpu=0.3), ScalerCaps(SCALER, 10), None),
    CapName.MACHINE_POOL_CPU: (
        GlobalCaps(10),
        ScalerCaps(SCALER, 10, machine_pool_id=POOL),
        PoolCaps(POOL, max_cpu=0.3),
    ),
}


@pytest.mark.parametrize("cap", list(CAPPED_AT_03))
def test_a_request_that_sums_to_exactly_the_cap_is_admitted(cap):
    glob, caps, pool = CAPPED_AT_03[cap]
    assert 0.1 + 0.2 > 0.3  # the drift this margin exists for
    assert first_refusing_cap(_usage(0.1), glob, caps, pool, 0.2, 0) is None


@pytest.mark.parametrize("cap", list(CAPPED_AT_03))
def test_a_request_a_visible_amount_over_the_cap_is_refused_by_that_cap(cap):
    glob, caps, pool = CAPPED_AT_03[cap]
    assert first_refusing_cap(_usage(0.1), glob, caps, pool, 0.2 + 1e-6, 0) == cap


@pytest.mark.parametrize("cap", list(CAPPED_AT_03))
def test_a_request_alone_equal_to_the_cap_after_drift_is_not_exceeds_cap(cap):
    glob, caps, pool = CAPPED_AT_03[cap]
    assert cap_exceeded_alone(glob, caps, pool, 0.1 + 0.2, 0) is None
    assert cap_exceeded_alone(glob, caps, pool, 0.3 + 1e-6, 0) == cap
