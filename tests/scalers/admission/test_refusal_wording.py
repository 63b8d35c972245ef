"""Refusal texts state memory in binary units, as the pages do (never raw byte counts)."""

from __future__ import annotations

import pytest

from tests.support.admission import request_scale
from tests.support.scalers import make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


def test_a_request_over_a_memory_cap_says_how_much_in_gib():
    set_global(max_agents=50)
    make_scaler("c", max_agents=10, memory=4 * 1024**3)
    decision = request_scale(["linux"], "j", resources={"memory": "8g"})
    assert decision.cap == "resourceCap.memory"
    assert "8 GiB of memory" in decision.reason and "(4 GiB)" in decision.reason
    assert "bytes" not in decision.reason
