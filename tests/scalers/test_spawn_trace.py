"""The spawn trace: marks merged from the spawn job and the registration in any order, each step
observed once in its histogram, and the waterfall on the agent page."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agents.models import Agent
from scalers.choices import SpawnStep
from scalers.metrics import SPAWN_STEP
from scalers.models import MetricCounter
from scalers.spawn_trace import STEPS, record_marks, waterfall
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def at(agent, seconds: float):
    return agent.created_at + timedelta(seconds=seconds)


def observed(step: str) -> tuple[float, float]:
    """(count, sum) of the step's histogram rows."""
    rows = MetricCounter.objects.filter(name__startswith=SPAWN_STEP, labels__step=step)
    count = sum(r.value for r in rows if r.name.endswith("_bucket"))
    total = sum(r.value for r in rows if r.name.endswith("_sum"))
    return count, total


JOB = {
    "picked_up": 0.05,
    "checked": 0.08,
    "created": 0.3,
    "started": 0.35,
    "process_started": 0.34,
    "bound": 0.4,
    "connecting": 0.42,
}
REGISTRATION = {"register_received": 0.5, "running": 0.51}


@pytest.mark.parametrize("order", ["job first", "registration first"])
def test_every_step_is_observed_once_whichever_writer_comes_second(order):
    agent = make_agent(make_scaler())
    writes = [JOB, REGISTRATION] if order == "job first" else [REGISTRATION, JOB]
    for marks in writes:
        record_marks(agent, {name: at(agent, s) for name, s in marks.items()})
    trace = Agent.objects.get(pk=agent.pk).spawn_trace
    assert trace == {**JOB, **REGISTRATION}
    for step, (start, end) in STEPS.items():
        count, total = observed(step.value)
        assert count == 1, step
        assert total == pytest.approx(trace[end] - (trace.get(start) or 0.0), abs=1e-3), step
    assert observed(SpawnStep.AGENT)[1] == pytest.approx(0.16, abs=1e-3)


def test_a_mark_it_does_not_know_is_refused_by_name():
    agent = make_agent(make_scaler())
    with pytest.raises(ValueError, match="spawn trace mark 'booted' is not one of admitted"):
        record_marks(agent, {"booted": at(agent, 1)})


def test_a_backend_without_rules_leaves_those_steps_out():
    agent = make_agent(make_scaler())
    record_marks(agent, {"picked_up": at(agent, 0.1), "connecting": at(agent, 0.3)})
    assert observed(SpawnStep.QUEUE)[0] == 1
    assert observed(SpawnStep.RULES)[0] == 0 and observed(SpawnStep.CONNECTING)[0] == 0
    assert [bar.step for bar in waterfall(Agent.objects.get(pk=agent.pk).spawn_trace)] == ["queue"]


def test_the_waterfall_places_each_step_on_the_admission_to_running_axis():
    bars = {bar.step: bar for bar in waterfall({**JOB, **REGISTRATION})}
    # In the order the steps started: the agent's own start (0.34 s) before the rules (0.35 s).
    assert list(bars) == ["queue", "checks", "create", "start", "agent", "rules", "connecting", "register"]
    assert [bar.start for bar in bars.values()] == sorted(bar.start for bar in bars.values())
    assert bars["create"].start == 0.08 and bars["create"].ms == 220
    assert bars["register"].left_pct + bars["register"].width_pct == pytest.approx(100)
    assert bars["queue"].left_pct == 0 and waterfall({}) == []


def test_the_agent_page_shows_the_waterfall(viewer_client):
    agent = make_agent(make_scaler())
    record_marks(agent, {name: at(agent, s) for name, s in {**JOB, **REGISTRATION}.items()})
    page = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert 'id="spawn-trace"' in page
    for step in STEPS:
        assert f'data-step="{step.value}"' in page
    assert '<td class="num">220</td>' in page  # create: 0.08 s -> 0.3 s


def test_an_agent_without_a_trace_shows_none(viewer_client):
    agent = make_agent(make_scaler())
    assert 'id="spawn-trace"' not in viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()
