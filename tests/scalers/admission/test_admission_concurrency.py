"""Admission under real concurrency: 200 simultaneous requests per round against randomised caps,
spread over four independent decider queues (four connections contending for the lock, as four
console processes would) plus requests decided inline on their own connection. No cap is ever
exceeded, and every refusal is still justified by the final state (usage only grows in a round)."""

from __future__ import annotations

import random

import pytest
from django.db import connection

from agents.choices import AgentState
from agents.models import Agent
from scalers.admission.caps import ScalerCaps  # noqa: F401 - documents the cap model under test
from scalers.admission.decide import Request, decide_batch
from scalers.admission.matching import WORLD_CACHE
from scalers.admission.queue import AdmissionQueue
from scalers.models import ConfigState, LabelSet, MachinePool, Reservation, Scaler, ScaleRequest
from tests.support.concurrency import run_threads
from tests.support.scalers import make_pool, make_scaler, set_global

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("stop_admission_queue"),
]

GiB = 1024**3
ROUNDS = 6
REQUESTS = 200


def _random_config(rng: random.Random):
    set_global(
        max_agents=rng.randint(10, 60),
        cpu=rng.choice([None, rng.uniform(8, 40)]),
        memory=rng.choice([None, rng.randint(8, 64) * GiB]),
    )
    pool = make_pool(
        "box", cpu=rng.choice([None, rng.uniform(4, 20)]), memory=rng.choice([None, rng.randint(4, 32) * GiB])
    )
    for i, name in enumerate(["s0", "s1", "s2"]):
        make_scaler(
            name,
            max_agents=rng.randint(1, 25),
            label_sets=[["linux", name]],
            max_concurrent_spawns=rng.randint(2, 30),
            cpu=rng.choice([None, rng.uniform(2, 16)]),
            memory=rng.choice([None, rng.randint(2, 24) * GiB]),
            pool=pool if i < 2 else None,
        )


def _random_request(rng: random.Random, i: int) -> Request:
    label = rng.choice(["s0", "s1", "s2", "s2", "nowhere"])
    resources = rng.choice(
        [
            None,
            {"cpus": rng.choice([0.5, 1, 1.5, 2, 3])},
            {"cpus": 1, "memory": f"{rng.randint(1, 4)}g"},
            {"limits": {"memory": f"{rng.randint(256, 2048)}m"}},
        ]
    )
    return Request(labels=("linux", label), job_id=f"job-{i}", resources=resources, raw_resources=resources)


def _check_round(outcomes):
    cfg = ConfigState.load()
    res = list(Reservation.objects.select_related("scaler"))
    agents = list(Agent.objects.all())
    assert len(res) == len(agents), "every admitted agent has exactly one reservation"
    total = len(res)
    assert total <= cfg.global_max_agents
    cpus = sum(r.cpus for r in res)
    mem = sum(r.memory_bytes for r in res)
    eps = 1e-6
    if cfg.global_max_cpu is not None:
        assert cpus <= cfg.global_max_cpu + eps
    if cfg.global_max_memory_bytes is not None:
        assert mem <= cfg.global_max_memory_bytes
    per = {}
    for s in Scaler.objects.select_related("machine_pool"):
        mine = [r for r in res if r.scaler_id == s.pk]
        per[s.name] = (s, len(mine), sum(r.cpus for r in mine), sum(r.memory_bytes for r in mine))
        assert len(mine) <= s.max_agents, s.name
        if s.max_cpu is not None:
            assert per[s.name][2] <= s.max_cpu + eps, s.name
        if s.max_memory_bytes is not None:
            assert per[s.name][3] <= s.max_memory_bytes, s.name
    pool = MachinePool.objects.first()
    in_pool = [r for r in res if r.machine_pool_id == pool.pk]
    pool_cpu = sum(r.cpus for r in in_pool)
    pool_mem = sum(r.memory_bytes for r in in_pool)
    if pool.max_cpu is not None:
        assert pool_cpu <= pool.max_cpu + eps
    if pool.max_memory_bytes is not None:
        assert pool_mem <= pool.max_memory_bytes

    # Every refusal is still justified: usage only grew after it.
    for d, req_cpus, req_mem in outcomes:
        if d.action != "at-capacity":
            continue
        s, n, s_cpu, s_mem = per[d.scaler]
        justified = {
            "globalMaxAgents": total >= cfg.global_max_agents,
            "maxAgents": n >= s.max_agents,
            "resourceCap.cpu": s.max_cpu is not None and s_cpu + req_cpus > s.max_cpu - eps,
            "resourceCap.memory": s.max_memory_bytes is not None and s_mem + req_mem > s.max_memory_bytes,
            "globalResourceCap.cpu": cfg.global_max_cpu is not None and cpus + req_cpus > cfg.global_max_cpu - eps,
            "globalResourceCap.memory": cfg.global_max_memory_bytes is not None
            and mem + req_mem > cfg.global_max_memory_bytes,
            "machinePool.cpu": pool.max_cpu is not None and pool_cpu + req_cpus > pool.max_cpu - eps,
            "machinePool.memory": pool.max_memory_bytes is not None and pool_mem + req_mem > pool.max_memory_bytes,
        }[d.cap]
        assert justified, (d, req_cpus, req_mem)
    return total


def _reset():
    Reservation.objects.all().delete()
    Agent.objects.all().delete()
    ScaleRequest.objects.all().delete()
    LabelSet.objects.all().delete()
    Scaler.objects.all().delete()
    MachinePool.objects.all().delete()
    WORLD_CACHE.clear()


def test_200_concurrent_requests_never_admit_past_any_cap_over_many_rounds():
    rng = random.Random(20261129)
    queues = [AdmissionQueue(name=f"adm-test-{i}", idle_close_seconds=1) for i in range(4)]
    admitted_total = refused_total = 0
    try:
        for _round in range(ROUNDS):
            _reset()
            _random_config(rng)
            requests = [_random_request(rng, i) for i in range(REQUESTS)]

            def one(i: int, requests=requests):
                req = requests[i]
                if i % 10 == 0:  # decided inline: its own connection, its own transaction
                    d = decide_batch([req]).decisions[0]
                else:
                    d, _agent = queues[i % 4].submit(req, timeout=60)
                return d

            results = run_threads(REQUESTS, one)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert not errors, errors[:3]
            outcomes = []
            for req, d in zip(requests, results, strict=True):
                from scalers.resources import resolve_resources

                resolved = resolve_resources(req.resources, None, None)
                outcomes.append((d, float(resolved.requests.cpus), int(resolved.requests.mem_bytes)))
            total = _check_round(outcomes)
            assert total == sum(1 for d in results if d.action == "spawning")
            assert Agent.objects.filter(state=AgentState.SPAWNING).count() == total
            for scaler in Scaler.objects.all():  # slots are taken by the deciders too, under one lock
                flying = Agent.objects.filter(scaler=scaler, state=AgentState.SPAWNING).exclude(rq_job_id="")
                assert flying.count() <= scaler.max_concurrent_spawns
            admitted_total += total
            refused_total += sum(1 for d in results if d.action == "at-capacity")
    finally:
        for q in queues:
            q.shutdown()
        connection.close()
    assert admitted_total > 0 and refused_total > 0  # the rounds did exercise both outcomes
