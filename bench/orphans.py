#!/usr/bin/env python3
"""Bench: the orphan plan over 5,000 labelled containers, and spawn overhead vs raw docker.

Targets: ``plan_orphans`` over 5,000 labelled (created, never started) containers in
< 2 s with ONE list call; a full backend spawn (token, events, create, start, address, nft rules)
within 1.15x of a raw ``create`` + ``start`` on the same network, measured in the same run.

Runs against the private test dockerd (``tests/support/docker.py``; started if needed) and a throwaway
PostgreSQL database ``bench_kici_ctr``; removes every container it created. Needs root (dockerd,
nft). Usage::

    .venv/bin/python bench/orphans.py [--containers 5000] [--spawns 15]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings_test")
os.environ.setdefault("KICI_TEST_DATABASE", "bench_kici_ctr")


def create_many(api, image: str, n: int, labels_for) -> float:
    """Create ``n`` containers (not started) with 8 threads; returns seconds taken."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create_container(image, command=["true"], labels=labels_for(i)), range(n)))
    return time.perf_counter() - t0


def bench_plan(client, image: str, n: int, run: str) -> dict:
    from scalers.backends.container.backend import ContainerBackend
    from scalers.models import Scaler

    api = client.api
    name = f"ctr-bench-{run}"
    created_s = create_many(
        api,
        image,
        n,
        lambda i: {
            "kici-managed": "true",
            "kici-scaler-name": name,
            "kici-agent-id": f"scaler-container-{i:08x}",
            "ctr-bench": run,
        },
    )
    calls = {"list": 0}
    real = api.containers

    def counted(*a, **kw):
        calls["list"] += 1
        return real(*a, **kw)

    api.containers = counted
    scaler = Scaler(name=name, type="container", max_agents=1)
    backend = ContainerBackend(
        scaler, docker=client, network_isolation=False, tracked_ids=set, is_registered=lambda _id: False
    )
    times = []
    for _ in range(3):
        calls["list"] = 0
        t0 = time.perf_counter()
        plan = backend.plan_orphans()
        times.append(time.perf_counter() - t0)
        per_plan_calls = calls["list"]
    api.containers = real
    return {"containers": n, "create_s": created_s, "plan_s": times, "planned": len(plan), "list_calls": per_plan_calls}


def bench_spawn(client, image: str, spawns: int, run: str, live_publish: bool = True) -> dict:
    from agents.models import Agent
    from network.nft.apply import NftClient
    from scalers.backends.base import SpawnControl
    from scalers.backends.container.backend import ContainerBackend
    from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network
    from scalers.models import LabelSet, Scaler

    api = client.api
    ensure_isolated_network(client)
    table = f"ctr_bench_{run}"
    nft = NftClient(table)
    nft.ensure_table()
    scaler = Scaler.objects.create(name=f"ctr-bench-spawn-{run}", type="container", max_agents=100)
    ls = LabelSet.objects.create(
        scaler=scaler,
        index=0,
        labels=["linux"],
        normalized="linux",
        config={"labels": ["linux"], "image": image, "imagePullPolicy": "Never"},
    )
    backend = ContainerBackend(scaler, docker=client, nft=nft)
    raw, full = [], []
    import agents.events

    real_publish = agents.events._publish_now
    if not live_publish:  # isolate the spawn path from the live-push rendering (live.publish)
        agents.events._publish_now = lambda event: None
    try:
        for i in range(spawns + 1):  # the first round of each is a warm-up, not counted
            # raw: what `docker create` + `docker start` cost on the same network
            t0 = time.perf_counter()
            c = api.create_container(
                image,
                command=["sleep", "60"],
                labels={"ctr-bench": run},
                environment=[f"K{j}=v" for j in range(10)],
                host_config=api.create_host_config(network_mode=ISOLATED_NETWORK_NAME, init=True, pids_limit=4096),
                networking_config={"EndpointsConfig": {ISOLATED_NETWORK_NAME: {}}},
            )
            api.start(c["Id"])
            t_raw = time.perf_counter() - t0
            api.remove_container(c["Id"], force=True)
            # full: the backend's spawn, everything included
            agent = Agent.objects.create(
                agent_id=f"scaler-container-{secrets.token_hex(4)}", scaler=scaler, label_set=ls, labels=["linux"]
            )
            t0 = time.perf_counter()
            backend.spawn(agent, SpawnControl(deadline=time.time() + 60, cancelled=lambda: None))
            t_full = time.perf_counter() - t0
            agent.refresh_from_db()
            backend.destroy(agent)
            # as the destroy job does: the agent is over, so it no longer holds its address
            Agent.objects.filter(pk=agent.pk).update(state="destroyed")
            if i:
                raw.append(t_raw)
                full.append(t_full)
    finally:
        agents.events._publish_now = real_publish
        nft.delete_table()
    return {"raw_ms": [x * 1000 for x in raw], "full_ms": [x * 1000 for x in full]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--containers", type=int, default=5000)
    parser.add_argument("--spawns", type=int, default=15)
    args = parser.parse_args()

    import django

    django.setup()
    from django.test.utils import setup_databases, teardown_databases

    from tests.support.docker import docker_client, ensure_private_dockerd

    host = ensure_private_dockerd()
    os.environ["DOCKER_HOST"] = host
    import subprocess

    subprocess.run(
        ["sh", str(ROOT / "sandbox_agent" / "build_image.sh"), "kici-agent:local"],
        check=True,
        env={**os.environ},
        capture_output=True,
    )
    client = docker_client()
    run = secrets.token_hex(3)
    old = setup_databases(verbosity=0, interactive=False)
    try:
        plan = bench_plan(client, "kici-agent:local", args.containers, run)
        spawn = bench_spawn(client, "kici-agent:local", args.spawns, run)
        quiet = bench_spawn(client, "kici-agent:local", args.spawns, run + "q", live_publish=False)
    finally:
        t0 = time.perf_counter()
        client.api.prune_containers(filters={"label": f"ctr-bench={run}"})
        for c in client.api.containers(all=True, filters={"label": "ctr-bench"}):
            client.api.remove_container(c["Id"], force=True)
        prune_s = time.perf_counter() - t0
        teardown_databases(old, verbosity=0)
    best_plan = min(plan["plan_s"])
    raw_med, full_med = statistics.median(spawn["raw_ms"]), statistics.median(spawn["full_ms"])
    ratio = full_med / raw_med
    print(
        f"orphan plan: {plan['containers']} labelled containers (created in {plan['create_s']:.1f} s, pruned in "
        f"{prune_s:.1f} s)"
    )
    print(
        f"  plan_orphans: {', '.join(f'{t:.3f}' for t in plan['plan_s'])} s (best {best_plan:.3f} s, target < 2 s) "
        f"-> {plan['planned']} targets, {plan['list_calls']} list call(s) per plan (target 1)"
    )
    print(f"spawn overhead over {len(spawn['raw_ms'])} spawns:")
    print(
        f"  raw docker create+start  median {raw_med:.1f} ms (min {min(spawn['raw_ms']):.1f}, max "
        f"{max(spawn['raw_ms']):.1f})"
    )
    print(
        f"  backend spawn (full)     median {full_med:.1f} ms (min {min(spawn['full_ms']):.1f}, max "
        f"{max(spawn['full_ms']):.1f})"
    )
    print(f"  ratio {ratio:.3f}x (target <= 1.15x)")
    q_raw, q_full = statistics.median(quiet["raw_ms"]), statistics.median(quiet["full_ms"])
    print(f"  same, live event push disabled: raw {q_raw:.1f} ms, backend {q_full:.1f} ms, ratio {q_full / q_raw:.3f}x")
    ok = best_plan < 2 and plan["list_calls"] == 1 and ratio <= 1.15
    print("RESULT:", "all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
