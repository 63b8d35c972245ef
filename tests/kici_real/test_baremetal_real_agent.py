"""The console runs the real KiCI agent as a bare-metal process: a ``kiciAgent`` label set whose
``binaryPath`` starts the cached build's agent, a token the real orchestrator minted for it, and a
real workflow's job run on it to the end; then the agent exits by itself once idle, and the console
ends it with its token revoked and its slot free.

The workflow's builder job runs first on another agent of the test's (labels it alone holds), so
its ``greet`` job, which needs the label set's label, is queued when the console spawns its agent and
is dispatched to it as it registers, as a job waiting for a scaled agent is. (On one agent, the
orchestrator v0.1.24 now and then queues the next job just as the builder job ends and dispatches
it to no agent for longer than the 5 s a scaler-managed agent waits idle: docs/real-kici-agent.md.)

The orchestrator runs in a network namespace of the test's own, and so does the agent: its
``binaryPath`` is a script that enters that namespace (as root, a scaler-managed agent appends an
iptables rule to its namespace's OUTPUT chain, which must not be the host's). The console reaches
the orchestrator's admin interface through a forwarder on the host's loopback (``adminUrl``).
"""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from agents.choices import AgentState
from agents.models import Agent
from front.views.console import LINES_PAGE_MAX
from scalers.backends.baremetal import exit_status_path
from scalers.credentials import encrypt_secret
from scalers.jobs import spawn_agent
from scalers.kici_agents import look_at
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.kici_real import (
    ORCHESTRATOR_PORT,
    add_local_repo,
    console_activity,
    finished_run,
    gateway_forwarder,
    link_sdk,
    own_database,
    private_netns,
    push_webhook,
    run_agent,
    run_job,
    run_orchestrator,
    wait_for,
)
from tests.support.scalers import make_agent, make_scaler

pytestmark = [
    pytest.mark.kici_real,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LABEL = "real-host"
BUILDER_LABEL = "real-host-builder"
GREETING = "hello from the real agent as a bare-metal process"
WORKFLOW = f"""import {{ workflow, job, step, push }} from '@kici-dev/sdk';

export const hostWorkflow = workflow('host', {{
  on: push(),
  jobs: [
    job('greet', {{
      runsOn: '{LABEL}',
      steps: [
        step('say-hello', async ({{ $ }}) => {{
          await $`echo "{GREETING}"`;
          await $`sleep 6`;
        }}),
      ],
    }}),
  ],
}});
"""


@pytest.fixture
def orchestrator_in_netns(kici_real_build, tmp_path):
    """``(orchestrator, admin port on the host's loopback, sha)``: the orchestrator holds the repo
    ``acme/demo`` with the workflow above as its ``local`` source; ``sha`` is its commit."""
    with private_netns() as netns, own_database() as database_url:
        with gateway_forwarder(netns, "127.0.0.1") as port:
            with run_orchestrator(kici_real_build, netns, tmp_path / "orchestrator", database_url) as orch:
                yield orch, port, add_local_repo(orch, tmp_path / "repos", "host", WORKFLOW)


@pytest.fixture
def agent_groups():
    """Process groups of the agents the test spawned: any still alive at the end is killed (a test
    failing before the console ended its agent would leave it reconnecting to a stopped
    orchestrator for ever)."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        if _group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _reload(agent) -> Agent:
    return Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk)


def _follow_until(agent, outcomes: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    outcome = ""
    while time.monotonic() < deadline:
        outcome = look_at(_reload(agent))
        if outcome in outcomes:
            return outcome
        time.sleep(0.5)
    return outcome


def _group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def test_the_console_runs_a_real_job_on_the_real_agent_as_a_process_and_ends_it_with_its_token(
    orchestrator_in_netns, kici_real_build, settings, tmp_path, monkeypatch, admin_client, agent_groups
):
    orchestrator, admin_port, sha = orchestrator_in_netns
    monkeypatch.setattr("scalers.jobs.schedule_follow", lambda agent: None)  # the test looks itself
    # The agent clones the workflow under TMPDIR, which must resolve @kici-dev/sdk.
    agent_tmp = tmp_path / "agent-tmp"
    link_sdk(kici_real_build, agent_tmp)
    monkeypatch.setenv("TMPDIR", str(agent_tmp))
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    OrchestratorAdminToken.objects.create(name="real-orch", secret=encrypt_secret(orchestrator.admin_token))
    binary = tmp_path / "kici-agent"
    binary.write_text(
        "#!/bin/sh\n"
        f"PATH={kici_real_build.path_env()}\nexport PATH\n"
        f"exec ip netns exec {orchestrator.netns} {kici_real_build.node} {kici_real_build.agent}\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    scaler = make_scaler(
        type="bare-metal",
        labels=(LABEL,),
        roles=["builder"],
        ls_config={
            "binaryPath": str(binary),
            "kiciAgent": {
                "orchestratorUrl": f"ws://127.0.0.1:{ORCHESTRATOR_PORT}/ws",
                "adminUrl": f"http://127.0.0.1:{admin_port}",
                "adminTokenRef": "real-orch",
            },
        },
    )
    # The push answers once the builder agent has packed .kici/; the greet job then waits for an
    # agent with the label set's label.
    token = orchestrator.mint_agent_token([BUILDER_LABEL, "kici:role:builder", "kici:role:init-runner"])
    builder_tokens = {t["id"] for t in orchestrator.get("/api/v1/agent-tokens")[1]["tokens"]}
    link_sdk(kici_real_build, tmp_path / "builder" / "tmp")
    with run_agent(orchestrator, tmp_path / "builder", token=token, agent_id="builder", labels=[BUILDER_LABEL]) as b:
        wait_for(lambda: "Agent registered" in orchestrator.log(), 30, "builder registration", orchestrator.log_path, b)
        pushed = push_webhook(orchestrator, "acme", "demo", sha)
        assert pushed[0] in (200, 202), pushed
        queued = wait_for(lambda: run_job(orchestrator), 30, "the greet job", orchestrator.log_path)
    assert queued["status"] == "pending" and not queued.get("agentId"), queued
    agent = make_agent(scaler)
    assert spawn_agent(agent.pk) == "spawned"
    pgid = _reload(agent).backend_context["pgid"]
    agent_groups.append(pgid)
    assert _follow_until(agent, {"running", "failed", "expired"}, 60) == "running", _reload(agent).failure_reason
    status, body = orchestrator.get("/api/v1/agent-tokens")
    [minted] = [t for t in body["tokens"] if t["id"] not in builder_tokens]
    assert minted["id"] == _reload(agent).backend_context["kici_token_id"]
    assert sorted(minted["labels"]) == sorted([LABEL, "kici:role:builder"])

    # The follow's looks, one every 0.5 s: each change of what the row says the agent does, and
    # what it says while the orchestrator says the greet job runs on it.
    seen: list[tuple[int, dict | None]] = []
    while_running: list[tuple[str, tuple[int, dict | None]]] = []
    shown = ""  # the agent's page while the row says it is busy with the greet job
    outcome, freed = "", 0.0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        outcome = look_at(_reload(agent))
        if outcome != "running":
            freed = time.time()
            break
        now = console_activity(agent)
        if not seen or seen[-1] != now:
            seen.append(now)
        greet = run_job(orchestrator)
        if greet.get("status") == "running":
            while_running.append((greet["jobId"], console_activity(agent)))
            if not shown and while_running[-1][1][1] and while_running[-1][1][1]["jobId"] == greet["jobId"]:
                shown = admin_client.get(f"/agents/{agent.agent_id}/").content.decode()
        time.sleep(0.5)

    # The orchestrator's record: the greet job succeeded on this agent.
    run, jobs = finished_run(orchestrator)
    assert (run["workflowName"], run["sha"]) == ("host", sha), run
    assert {(j["jobName"], j["status"], j["agentId"]) for j in jobs} == {
        ("__build__host", "success", "builder"),
        ("greet", "success", agent.agent_id),
    }, jobs
    greet_id, run_id = queued["jobId"], run["runId"]
    # The console's row, from the process's output file: busy with the greet job while it ran (as
    # the orchestrator's record says), idle after it, nothing else ever stored.
    busy_greet = (1, {"state": "busy", "jobId": greet_id, "runId": run_id})
    idle = (0, {"state": "idle", "jobId": "", "runId": ""})
    assert (greet_id, busy_greet) in while_running, while_running
    assert seen[-2:] == [busy_greet, idle], seen
    assert all(a in (idle, busy_greet, (0, None)) for a in seen), seen
    assert f"busy: job <code>{greet_id}</code>" in shown and f"run <code>{run_id}</code>" in shown, shown[-3000:]

    # It exited once idle; the console ended it and nothing of it is left.
    assert outcome == "destroyed", (outcome, _reload(agent).failure_reason)
    agent = _reload(agent)
    assert agent.state == AgentState.DESTROYED
    assert agent.teardown_reason == "the KiCI agent exited with code 0 (it shuts down once idle)"
    assert _group_members(pgid) == []
    status, body = orchestrator.get("/api/v1/agent-tokens")
    assert status == 200 and {t["id"] for t in body["tokens"]} == builder_tokens, body
    assert not Reservation.objects.filter(agent=agent).exists()
    # Its console page (the process's output file is still there: the page loads its lines from
    # the lines URL it names) holds the step's line, which the agent relays to its output.
    page = admin_client.get(f"/agents/{agent.agent_id}/console/")
    lines_url = f"/agents/{agent.agent_id}/console/console/lines"
    assert page.status_code == 200 and lines_url in page.content.decode()
    lines = admin_client.get(lines_url, {"before": LINES_PAGE_MAX + 1, "limit": LINES_PAGE_MAX})  # its first lines
    assert lines.status_code == 200, lines.content
    texts = [row[2] for row in lines.json()["rows"]]
    assert any(GREETING in text for text in texts), texts

    exited = exit_status_path(Path(agent.backend_context["log_path"])).stat().st_mtime
    greet = next(j for j in jobs if j["jobName"] == "greet")
    print(
        f"\nbare-metal real agent figures: spawn -> registered (console) "
        f"{(agent.registered_at - agent.created_at).total_seconds():.1f} s, job start -> end (orchestrator) "
        f"{greet.get('durationMs')} ms (the step sleeps 6 s), agent exit -> slot free {freed - exited:.2f} s"
    )
