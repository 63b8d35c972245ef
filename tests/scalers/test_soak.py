"""The soak in miniature (``bench/soak.py`` for the long run): a real console on loopback (daphne,
two rq workers, the sweeper) takes lifecycles of bare-metal process agents that end in every way
(job complete, release, crash, orchestrator lost, drain) for 20 s, pushing on ``maxAgents``; then
no slot may be held by anything, every agent ended as its ending says, and a new job is admitted."""

from __future__ import annotations

import pytest

from tests.support.soak import ENDINGS, drive, group_members, run_console, summary

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MAX_AGENTS = 3
#: The random mix of this seed starts with the five endings, one each: every ending is exercised
#: even on a machine slow enough to finish only a few lifecycles.
SEED = 21


def test_capacity_never_leaks_over_many_lifecycles(tmp_path):
    with run_console(tmp_path, max_agents=MAX_AGENTS, workers=2) as console:
        report = drive(console, duration=20, concurrency=MAX_AGENTS + 2, seed=SEED)
    figures = "\n".join(summary(report))
    print(figures)
    # No process of the console outlives it (a killed worker's scheduler child included).
    assert group_members(console.launcher.groups) == []
    assert report.problems() == [], figures
    assert {lc.ending for lc in report.lifecycles} == set(ENDINGS), figures
    assert all(lc.final_state in ("destroyed", "failed") for lc in report.lifecycles), figures
    assert report.max_slots == MAX_AGENTS and report.refused > 0, "the soak must push on maxAgents\n" + figures
    assert not any(report.leaks.values()) and report.new_job == "201", figures
