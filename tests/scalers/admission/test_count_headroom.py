"""The count caps' headroom: one function says how many more agents ``maxAgents`` and
``globalMaxAgents`` admit, for admission and for the warm pass alike."""

from __future__ import annotations

import pytest

from scalers.admission.caps import CapName, GlobalCaps, ScalerCaps, Tally, Usage, count_headroom, first_refusing_cap


@pytest.mark.parametrize(
    ("active", "reservations", "max_agents", "left"),
    [(0, 0, 3, 3), (2, 1, 3, 1), (1, 3, 3, 0), (5, 5, 3, 0), (4, 0, 3, 0)],
)
def test_headroom_is_the_cap_less_the_occupied_slots_never_negative(active, reservations, max_agents, left):
    assert count_headroom(Tally(reservations=reservations, active=active), max_agents) == left


@pytest.mark.parametrize(("scaler_count", "total_count", "refused"), [
    (1, 1, None),
    (2, 2, CapName.MAX_AGENTS),
    (1, 4, CapName.GLOBAL_MAX_AGENTS),
    (3, 9, CapName.GLOBAL_MAX_AGENTS),
])  # fmt: skip
def test_admission_refuses_exactly_where_the_headroom_is_gone(scaler_count, total_count, refused):
    usage = Usage(total=Tally(reservations=total_count, active=total_count))
    usage.scalers[1] = Tally(reservations=scaler_count, active=scaler_count)
    caps = ScalerCaps(scaler_id=1, max_agents=2)
    assert first_refusing_cap(usage, GlobalCaps(max_agents=4), caps, None, 0.0, 0) == refused
