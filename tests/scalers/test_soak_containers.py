"""The container soak in miniature (``bench/soak.py --backend container`` for the long run): a
real console (daphne on loopback and on the agent gateway, two rq workers, the sweeper) serves at
least 30 jobs through real container agents on the private dockerd, with network isolation on,
while every fault is injected at least once: ``docker kill`` of a running agent, SIGKILL of a
worker mid-spawn, a sweeper restart and a console restart with agents running. Then nothing may
be left: no reservation, container, nft rule or valid token of an ended agent, no active agent."""

from __future__ import annotations

import pytest

from tests.support.soak import FAULTS, drive, group_members, run_console, summary

pytestmark = [pytest.mark.docker, pytest.mark.soak, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MAX_AGENTS = 3
JOBS = 30
#: This seed's first lifecycle ends in a docker kill.
SEED = 0


def test_container_agents_survive_every_fault_and_nothing_leaks(tmp_path, dockerd, agent_image, settings):
    settings.KICI_NFT_TABLE = "soak_kici"
    with run_console(
        tmp_path, backend="container", max_agents=MAX_AGENTS, workers=2, docker_host=dockerd, nft_table="soak_kici"
    ) as console:
        report = drive(console, duration=180, concurrency=MAX_AGENTS + 1, seed=SEED, jobs=JOBS, fault_every=6)
    figures = "\n".join(summary(report))
    print(figures)
    # No process of the console outlives it (a killed worker's scheduler child included).
    assert group_members(console.launcher.groups) == []
    assert report.problems() == [], figures
    served = [lc for lc in report.lifecycles if lc.ending == "job-complete" and not lc.fault]
    assert len(report.lifecycles) >= JOBS and len(served) >= JOBS // 2, figures
    assert "docker-kill" in {lc.ending for lc in report.lifecycles}, figures
    assert {f.kind for f in report.faults if f.detail} == set(FAULTS), figures
    assert set(report.leaks) >= {"leftover containers", "leftover rules", "valid tokens of ended agents"}
    assert not any(report.leaks.values()) and report.new_job == "201", figures
