"""Spawn latency: the console's ``/scale`` -> ``running`` against a raw ``docker run -d``, in one run.

    sudo .venv/bin/python bench/spawn.py [--rounds 3] [--sequential 6] [--max-agents 10] [--workers 2]
                                         [--warm-only | --process-only] [--warm-hits N]
                                         [--database-url postgres://127.0.0.1:5432/kici_bench_spawn]
                                         [--redis-url redis://127.0.0.1:6379/13] [--keep]

Root (nft). Creates (drops first) the scratch database of ``--database-url`` and migrates it,
starts the private test dockerd when it is not running (``tests/support/docker.py``; the agent
image ``kici-agent:local`` is built when missing) and a real console on loopback
(``tests.support.soak.run_console``: daphne, ``--workers`` rq workers of the production class, the
sweeper; one container scaler of ``--max-agents`` agents with network isolation on in the nft
table ``kicispawnbench``, its agents reaching the console on the agent gateway).

Each of ``--rounds`` rounds measures, in this order:

- raw: ``docker run -d`` of the agent image on ``kici-agent-net`` (the docker CLI, as an operator
  would), ``--sequential`` times one after the other, then ``--max-agents`` at once;
- console: ``POST /api/v1/scale`` -> ``GET /api/v1/agents/<id>`` answers ``running`` (polled every
  10 ms; every 10 ms x the burst size in a burst), ``--sequential`` times one after the other,
  then a burst of ``--max-agents`` at once.
Then, after the last round, warm hits: a warm pool of 2 turned on, ``--warm-hits`` (default
``--rounds`` x ``--sequential``) /scale -> running that each bind an idle warm agent, timed to
the ``GET`` answering ``running`` and, apart, to the /scale answer; their p50 and p95 are printed
beside the target (p50 < :data:`WARM_TARGET_MS` ms), with the p50 of each of ``--rounds`` groups.
``--warm-only``: the warm hits alone (no raw runs, no cold spawns).

Then, in a second console (``run_console``'s process backend, no runtime), bare-metal process mode:
a bare-metal label set whose ``binaryPath`` runs the console's own agent (:data:`AGENT_PROGRAM`,
behind a wrapper pinning this interpreter, as ``tests/scalers/backends/test_baremetal.py`` does)
as a host process, ``--rounds`` x ``--sequential`` /scale -> running one after the other, their
p50 and p95 beside the target (p50 < :data:`PROCESS_TARGET_MS` ms), each round's p50 and the
step breakdown. ``--process-only``: that mode alone (no runtime, no root needed).

Each agent is ended with job-complete and gone before the next measurement starts.

Prints per round p50/p95 (ms) of each and the ratios console/raw, the median of the rounds, and
the per-step breakdown of the console's spawns (median ms of each step: ``admit``, /scale sent ->
admitted; the steps of ``Agent.spawn_trace``; ``api``, ``running`` committed -> the ``GET``
answering it).
Exits 1 when a spawn failed or the warm pool did not fill. Loopback, the private dockerd and its
agent bridge only; at most ``rounds * (sequential + max-agents)`` containers of each kind, one set
at a time, each removed; in process mode one agent process at a time, each ended.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # the repository, not bench/

from bench.soak import prepare_database, prepare_docker  # noqa: E402

RAW_LABEL = "kici.bench=spawn-raw"
POLL_SECONDS = 0.01
RUNNING_TIMEOUT = 60.0
#: The warm hit's target: /scale -> running p50 below this many milliseconds.
WARM_TARGET_MS = 50.0
#: Bare-metal process mode's target: /scale -> running p50 below this many milliseconds.
PROCESS_TARGET_MS = 300.0
#: The console's own agent program, which process mode runs.
AGENT_PROGRAM = ROOT / "sandbox_agent" / "kici_agent.py"


class Run(NamedTuple):
    """One /scale -> running: the agent, its job, seconds to the ``GET`` answering ``running``,
    seconds to the /scale answer, and the wall-clock times (``time.time()``) the /scale was sent
    and the ``GET`` answered ``running`` (for the steps before the admission and after ``running``)."""

    agent_id: str
    job: str
    seconds: float
    answered: float
    sent_at: float
    seen_at: float


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def raw_run(docker_host: str, image: str, network: str) -> float:
    """Seconds of one ``docker run -d`` (the CLI) of ``image`` on ``network``."""
    started = time.monotonic()
    subprocess.run(
        ["docker", "-H", docker_host, "run", "-d", "--label", RAW_LABEL, "--network", network, image],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def remove_raw(docker_host: str) -> None:
    ids = subprocess.run(
        ["docker", "-H", docker_host, "ps", "-aq", "--filter", f"label={RAW_LABEL}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "-H", docker_host, "rm", "-f", *ids], check=True, capture_output=True)


def at_once(count: int, fn) -> list:
    """``fn(i)`` for i in range(count) on as many threads, started together; their results."""
    results: list = [None] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Scaling:
    """The orchestrator's side: /scale, wait for running, end the agent."""

    def __init__(self, console, labels: list[str]):
        import requests

        self.console = console
        self.labels = labels
        self.local = threading.local()
        self.requests = requests
        self.serial = 0
        self.lock = threading.Lock()

    def session(self):
        if not hasattr(self.local, "s"):
            self.local.s = self.requests.Session()
            self.local.s.headers["Authorization"] = f"Bearer {self.console.api_token}"
        return self.local.s

    def job_id(self) -> str:
        with self.lock:
            self.serial += 1
            return f"bench-spawn-{os.getpid()}-{self.serial}"

    def scale_to_running(self, _: int = 0, poll: float = POLL_SECONDS) -> Run:
        """:class:`Run` of one POST /scale, the agent followed until the API answers running
        (polled every ``poll`` seconds). Raises RuntimeError naming the agent's state when it does
        not run."""
        job = self.job_id()
        url = self.console.url
        sent_at, started = time.time(), time.monotonic()
        answer = self.session().post(f"{url}/api/v1/scale", json={"labels": self.labels, "jobId": job}, timeout=30)
        answered = time.monotonic() - started
        if answer.status_code not in (200, 201):  # 200: an idle warm agent was bound
            raise RuntimeError(f"/scale answered {answer.status_code}: {answer.text[:200]}")
        agent_id = answer.json()["agentId"]
        state = "?"
        while time.monotonic() - started < RUNNING_TIMEOUT:
            state = self.session().get(f"{url}/api/v1/agents/{agent_id}", timeout=30).json()["state"]
            if state == "running":
                return Run(agent_id, job, time.monotonic() - started, answered, sent_at, time.time())
            if state in ("failed", "destroyed"):
                break
            time.sleep(poll)
        raise RuntimeError(f"agent {agent_id} is {state}, not running")

    def end(self, agent_id: str, job: str) -> None:
        """job-complete, then wait (up to a minute) until the agent has ended."""
        from agents.choices import TERMINAL_STATES
        from agents.models import Agent

        self.session().post(
            f"{self.console.url}/api/v1/agents/{agent_id}/job-complete", json={"jobId": job}, timeout=30
        ).raise_for_status()
        deadline = time.monotonic() + 60
        while not Agent.objects.filter(agent_id=agent_id, state__in=TERMINAL_STATES).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"agent {agent_id} did not end within 60 s of job-complete")
            time.sleep(0.1)


def step_breakdown(runs: list[Run]) -> dict[str, float]:
    """Median ms of each step of ``runs``: ``admit`` (/scale sent -> the agent's admission), each
    spawn step of its ``spawn_trace``, and ``api`` (``running`` committed -> the bench's ``GET``
    answered ``running``: the commit, the poll interval and the ``GET`` itself). ``admit`` and
    ``api`` compare the bench's clock with the console's: the same host's."""
    from agents.models import Agent
    from scalers.spawn_trace import STEPS

    per_step: dict[str, list[float]] = {"admit": [], **{step.value: [] for step in STEPS}, "api": []}
    by_id = {r.agent_id: r for r in runs}
    for agent_id, created, trace in Agent.objects.filter(agent_id__in=by_id).values_list(
        "agent_id", "created_at", "spawn_trace"
    ):
        run, admitted = by_id[agent_id], created.timestamp()
        marks = {"admitted": 0.0, **trace}
        per_step["admit"].append(1000 * (admitted - run.sent_at))
        for step, (a, b) in STEPS.items():
            if a in marks and b in marks:
                per_step[step.value].append(1000 * (marks[b] - marks[a]))
        if "running" in marks:
            per_step["api"].append(1000 * (run.seen_at - admitted - marks["running"]))
    return {step: statistics.median(v) for step, v in per_step.items() if v}


def one_round(scaling: Scaling, docker_host: str, sequential: int, burst: int, image: str) -> dict:
    from scalers.backends.docker_net import ISOLATED_NETWORK_NAME

    figures: dict = {}
    try:
        figures["raw"] = [raw_run(docker_host, image, ISOLATED_NETWORK_NAME) for _ in range(sequential)]
        remove_raw(docker_host)
        started = time.monotonic()
        figures["raw_burst"] = at_once(burst, lambda i: raw_run(docker_host, image, ISOLATED_NETWORK_NAME))
        figures["raw_burst_all"] = time.monotonic() - started
    finally:
        remove_raw(docker_host)
    seq_runs = []
    for _ in range(sequential):
        run = scaling.scale_to_running()
        seq_runs.append(run)
        scaling.end(run.agent_id, run.job)
    figures["console"], figures["console_runs"] = [r.seconds for r in seq_runs], seq_runs
    started = time.monotonic()
    # Polled less often by each of the burst, so the polls do not load the console it measures.
    results = at_once(burst, lambda i: scaling.scale_to_running(poll=POLL_SECONDS * burst))
    figures["console_burst_all"] = time.monotonic() - started
    failed = [r for r in results if isinstance(r, Exception)]
    done = [r for r in results if not isinstance(r, Exception)]
    for run in done:
        scaling.end(run.agent_id, run.job)
    if failed:
        raise RuntimeError(f"{len(failed)} of {burst} burst spawns failed: {failed[0]}")
    figures["console_burst"] = [r.seconds for r in done]
    figures["burst_runs"] = done
    return figures


def warm_hits(scaling: Scaling, count: int, size: int = 2) -> list[Run]:
    """Turn a warm pool of ``size`` on and time ``count`` warm hits (/scale -> running), each once
    an idle warm agent is ready (the bench runs the deficit pass itself instead of waiting for
    the sweeper's tick); the pool is turned off again at the end."""
    from agents.models import Agent
    from scalers.models import LabelSet, Scaler
    from scalers.warm_pools import deficit_pass

    scaler = Scaler.objects.filter(pk=scaling.console.scaler.pk)
    # A pool is kept only for a label set with a declared shape (scalers.warm_pools).
    label_sets = LabelSet.objects.filter(scaler_id=scaling.console.scaler.pk)
    for ls in label_sets:
        ls.config = {**ls.config, "resources": {"cpus": 0.25, "memory": "128m"}}
        ls.save(update_fields=["config"])
    scaler.update(warm_pool_enabled=True, warm_pool_size=size)
    idle = Agent.objects.filter(scaler_id=scaling.console.scaler.pk, warm=True, state="running", bound_job_id="")
    hits = []
    try:
        for _ in range(count):
            deadline = time.monotonic() + RUNNING_TIMEOUT
            while idle.count() < size:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the warm pool did not fill to {size} within {RUNNING_TIMEOUT:g} s")
                deficit_pass()
                time.sleep(0.2)
            run = scaling.scale_to_running()
            if not Agent.objects.filter(agent_id=run.agent_id, warm=True).exists():
                raise RuntimeError(f"/scale spawned {run.agent_id} instead of binding an idle warm agent")
            hits.append(run)
            scaling.end(run.agent_id, run.job)
    finally:
        scaler.update(warm_pool_enabled=False, warm_pool_size=0)
    return hits


def warm_report(hits: list[Run], groups: int) -> list[str]:
    """The warm hits' p50 and p95 beside the target, the /scale answer's alone, each group's p50."""
    ms = [1000 * h.seconds for h in hits]
    answered = [1000 * h.answered for h in hits]
    p50 = pct(ms, 0.5)
    verdict = "met" if p50 < WARM_TARGET_MS else "missed"
    size = max(1, len(hits) // groups)
    per_group = [ms[i : i + size] for i in range(0, len(ms), size)]
    return [
        f"warm hit /scale -> GET running, {len(hits)} hits: p50 {p50:.1f} ms, p95 {pct(ms, 0.95):.1f} ms "
        f"(target p50 < {WARM_TARGET_MS:.0f} ms: {verdict})",
        f"  the /scale answer alone: p50 {pct(answered, 0.5):.1f} ms, p95 {pct(answered, 0.95):.1f} ms; "
        "p50 per group: " + ", ".join(f"{pct(g, 0.5):.1f} ms" for g in per_group),
    ]


def process_mode(workdir: Path, rounds: int, sequential: int, workers: int) -> list[list[Run]]:
    """Bare-metal process mode: ``rounds`` groups of ``sequential`` /scale -> running, one after
    the other, in a console of its own whose label set runs :data:`AGENT_PROGRAM` as a process."""
    from tests.support.soak import LABELS, run_console

    workdir.mkdir(parents=True, exist_ok=True)
    wrapper = workdir / "kici-agent"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {AGENT_PROGRAM}\n")
    wrapper.chmod(0o755)
    groups: list[list[Run]] = []
    with run_console(workdir, backend="process", workers=workers, agent_program=wrapper) as console:
        scaling = Scaling(console, LABELS)
        scaling.end(*scaling.scale_to_running()[:2])  # warm-up: the workers' first spawn
        for _ in range(rounds):
            group = []
            for _ in range(sequential):
                run = scaling.scale_to_running()
                group.append(run)
                scaling.end(run.agent_id, run.job)
            groups.append(group)
    return groups


def process_report(groups: list[list[Run]]) -> list[str]:
    """Process mode's p50 and p95 beside the target, each round's p50 and the step breakdown."""
    ms = [1000 * r.seconds for g in groups for r in g]
    p50 = pct(ms, 0.5)
    verdict = "met" if p50 < PROCESS_TARGET_MS else "missed"
    steps = step_breakdown([r for g in groups for r in g])
    return [
        f"bare-metal process /scale -> GET running, {len(ms)} spawns: p50 {p50:.0f} ms, p95 {pct(ms, 0.95):.0f} ms "
        f"(target p50 < {PROCESS_TARGET_MS:.0f} ms: {verdict}); p50 per round: "
        + ", ".join(f"{pct([1000 * r.seconds for r in g], 0.5):.0f} ms" for g in groups),
        "  steps (median ms): " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()),
    ]


def report(rounds: list[dict]) -> list[str]:
    def ms(x: float) -> str:
        return f"{1000 * x:7.0f}"

    lines = [
        "round  raw p50  raw p95  /scale p50  /scale p95  ratio p50  ratio p95 | "
        "burst: raw all  console all  ratio  console p50  console p95"
    ]
    ratios = []
    for i, f in enumerate(rounds, 1):
        raw50, raw95 = pct(f["raw"], 0.5), pct(f["raw"], 0.95)
        c50, c95 = pct(f["console"], 0.5), pct(f["console"], 0.95)
        r = (c50 / raw50, c95 / raw95, f["console_burst_all"] / f["raw_burst_all"])
        ratios.append(r)
        lines.append(
            f"{i:5d}  {ms(raw50)}  {ms(raw95)}     {ms(c50)}     {ms(c95)}     {r[0]:5.2f}x     {r[1]:5.2f}x | "
            f"       {ms(f['raw_burst_all'])}      {ms(f['console_burst_all'])}  {r[2]:4.2f}x      "
            f"{ms(pct(f['console_burst'], 0.5))}      {ms(pct(f['console_burst'], 0.95))}"
        )
    med = [statistics.median(r[k] for r in ratios) for k in range(3)]
    lines.append(
        f"median of {len(rounds)} rounds: /scale -> running p50 {med[0]:.2f}x raw docker run -d, "
        f"p95 {med[1]:.2f}x; burst all running {med[2]:.2f}x the raw burst"
    )
    for label, key in (("sequential", "console_runs"), ("burst", "burst_runs")):
        steps = step_breakdown([r for f in rounds for r in f[key]])
        lines.append(f"steps, {label} (median ms): " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()))
    return lines


def containers(args: argparse.Namespace, workdir: Path) -> int:
    """The container rounds (unless ``--warm-only``) and the warm hits, in a console of their own;
    1 when the warm pool did not fill. Its scaler is retired at the end, so that a later console's
    /scale (process mode, same labels) is not routed to it."""
    from scalers.models import Scaler
    from tests.support.soak import LABELS, run_console

    docker_host = prepare_docker()
    rounds: list[dict] = []
    with run_console(
        workdir,
        backend="container",
        max_agents=args.max_agents,
        workers=args.workers,
        docker_host=docker_host,
        nft_table="kicispawnbench",
    ) as console:
        try:
            scaling = Scaling(console, LABELS)
            scaling.end(*scaling.scale_to_running()[:2])  # warm-up: first imports, network, guard
            if not args.warm_only:
                for _ in range(args.rounds):
                    rounds.append(one_round(scaling, docker_host, args.sequential, args.max_agents, "kici-agent:local"))
                print(f"{args.workers} workers, burst of {args.max_agents}, {args.sequential} sequential per round")
                print("\n".join(report(rounds)), flush=True)
            # Last: an idle warm agent left over would serve the next round's /scale.
            try:
                hits = warm_hits(scaling, args.warm_hits or args.rounds * args.sequential)
            except RuntimeError as exc:
                print(f"warm hits: not measured: {exc}")
                return 1
            print("\n".join(warm_report(hits, args.rounds)), flush=True)
        finally:
            Scaler.objects.filter(pk=console.scaler.pk).update(retiring=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=6, help="spawns one after the other per round")
    parser.add_argument("--max-agents", type=int, default=10, help="the scaler's maxAgents: the burst size")
    parser.add_argument("--workers", type=int, default=2, help="rq workers")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--warm-only", action="store_true", help="the warm hits alone")
    modes.add_argument("--process-only", action="store_true", help="bare-metal process mode alone")
    parser.add_argument("--warm-hits", type=int, default=0, help="warm hits (default rounds x sequential)")
    parser.add_argument("--database-url", default="postgres://127.0.0.1:5432/kici_bench_spawn")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    args = parser.parse_args()
    if not 0 <= args.warm_hits <= 200:
        parser.error(f"--warm-hits must be 0..200, got {args.warm_hits}")
    for name in ("rounds", "sequential", "max_agents", "workers"):
        if not 0 < getattr(args, name) <= 50:
            parser.error(f"--{name.replace('_', '-')} must be 1..50, got {getattr(args, name)}")
    if not args.database_url.startswith("postgres://127.0.0.1:"):
        parser.error(f"--database-url must be a loopback postgres:// URL, got {args.database_url!r}")
    if not args.redis_url.startswith("redis://127.0.0.1:"):
        parser.error(f"--redis-url must be a loopback redis:// URL, got {args.redis_url!r}")
    os.environ.update(
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        DJANGO_SETTINGS_MODULE="kici_site.settings",
        LOG_LEVEL="ERROR",
    )
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    prepare_database(args.database_url)
    import django

    django.setup()
    workdir = Path(tempfile.mkdtemp(prefix="kici-spawn-bench-"))
    try:
        if not args.process_only and containers(args, workdir / "container"):
            return 1
        if not args.warm_only:
            groups = process_mode(workdir / "process", args.rounds, args.sequential, args.workers)
            print("\n".join(process_report(groups)))
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept: database {args.database_url}, logs {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            base, name = args.database_url.rsplit("/", 1)
            subprocess.run(
                ["psql", base + "/postgres", "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
