"""A real workflow, compiled by the real compiler, delivered through the orchestrator's built-in
``local`` source and run to success by the real agent: the path a job takes in production, offline."""

from __future__ import annotations

import json

import pytest

from tests.support.kici_real import commit_workflow, finished_run, link_sdk, push_webhook, run_agent, wait_for

pytestmark = [pytest.mark.kici_real, pytest.mark.root, pytest.mark.slow]

GREETING = "hello from the real agent"
WORKFLOW = f"""import {{ workflow, job, step, push }} from '@kici-dev/sdk';

export const e2eWorkflow = workflow('e2e', {{
  on: push(),
  jobs: [
    job('greet', {{
      runsOn: 'kici:os:linux',
      steps: [
        step('say-hello', async ({{ $ }}) => {{
          await $`echo "{GREETING}"`;
        }}),
      ],
    }}),
  ],
}});
"""


def test_a_pushed_workflow_runs_to_success_on_the_real_agent(kici_orchestrator, tmp_path):
    orchestrator = kici_orchestrator
    repos = tmp_path / "repos"
    link_sdk(orchestrator.build, repos)
    sha = commit_workflow(orchestrator.build, orchestrator.netns, repos / "acme" / "demo", "e2e", WORKFLOW)
    orchestrator.kici_admin("source", "add", "local", "--org", "acme", "--path", str(repos), "--name", "demo")
    # The builder job (packs .kici/ first) needs kici:role:builder: the agent runs with all roles.
    token = orchestrator.mint_agent_token(["e2e-linux", "kici:role:builder", "kici:role:init-runner"])
    link_sdk(orchestrator.build, tmp_path / "agent" / "tmp")

    workdir = tmp_path / "agent"
    with run_agent(orchestrator, workdir, token=token, agent_id="e2e-agent-wf", labels=["e2e-linux"]) as agent:
        log = orchestrator.log_path
        wait_for(lambda: "Agent registered" in orchestrator.log(), 30, "agent registration", log, agent)
        # The webhook answers once the builder job has packed and uploaded .kici/.
        status, body = push_webhook(orchestrator, "acme", "demo", sha)
        assert status in (200, 202), body
        run, jobs = wait_for(lambda: finished_run(orchestrator), 60, "the run's jobs to finish", log, agent)

    assert (run["workflowName"], run["sha"], run["status"]) == ("e2e", sha, "success"), run
    assert {(job["jobName"], job["status"], job["agentId"]) for job in jobs} == {
        ("__build__e2e", "success", "e2e-agent-wf"),
        ("greet", "success", "e2e-agent-wf"),
    }, jobs
    greet = next(job for job in jobs if job["jobName"] == "greet")
    step_logs = f"/api/v1/admin/runs/{run['runId']}/jobs/{greet['jobId']}/steps/0/logs"
    status, logs = orchestrator.get(step_logs)
    assert status == 200 and GREETING in json.dumps(logs), logs
