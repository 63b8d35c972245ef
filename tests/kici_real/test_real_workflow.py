"""A real workflow, compiled by the real compiler, delivered through the orchestrator's built-in
``local`` source and run to success by the real agent: the path a job takes in production, offline."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.support.kici_real import compile_workflows, link_sdk, run_agent, wait_for

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


def _commit_repo(repo, build, netns) -> str:
    """A git repo at ``repo`` holding the workflow and its compiled lock file; returns HEAD's sha."""
    (repo / ".kici" / "workflows").mkdir(parents=True)
    (repo / ".kici" / "workflows" / "e2e.ts").write_text(WORKFLOW)
    lock = compile_workflows(build, netns, repo)
    assert [w["name"] for w in lock["workflows"]] == ["e2e"]

    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
        return result.stdout.strip()

    git("init", "-q", "-b", "main")
    git("add", ".")
    git("-c", "user.name=e2e", "-c", "user.email=e2e@localhost", "commit", "-q", "-m", "e2e workflow")
    return git("rev-parse", "HEAD")


def test_a_pushed_workflow_runs_to_success_on_the_real_agent(kici_orchestrator, tmp_path):
    orchestrator = kici_orchestrator
    repos = tmp_path / "repos"
    link_sdk(orchestrator.build, repos)
    sha = _commit_repo(repos / "acme" / "demo", orchestrator.build, orchestrator.netns)
    orchestrator.kici_admin("source", "add", "local", "--org", "acme", "--path", str(repos), "--name", "demo")
    # The builder job (packs .kici/ first) needs kici:role:builder: the agent runs with all roles.
    token = orchestrator.mint_agent_token(["e2e-linux", "kici:role:builder", "kici:role:init-runner"])
    link_sdk(orchestrator.build, tmp_path / "agent" / "tmp")

    workdir = tmp_path / "agent"
    with run_agent(orchestrator, workdir, token=token, agent_id="e2e-agent-wf", labels=["e2e-linux"]) as agent:
        log = orchestrator.log_path
        wait_for(lambda: "Agent registered" in orchestrator.log(), 30, "agent registration", log, agent)
        # The webhook answers once the builder job has packed and uploaded .kici/.
        status, body = orchestrator.post(
            "/webhook/acme/generic/demo",
            {
                "ref": "refs/heads/main",
                "after": sha,
                "repository": {"full_name": "acme/demo", "default_branch": "main"},
            },
            headers={"x-event-type": "push", "x-delivery-id": str(uuid.uuid4())},
            timeout=90,
        )
        assert status in (200, 202), body
        run, jobs = wait_for(lambda: _finished_run(orchestrator), 60, "the run's jobs to finish", log, agent)

    assert (run["workflowName"], run["sha"], run["status"]) == ("e2e", sha, "success"), run
    assert {(job["jobName"], job["status"], job["agentId"]) for job in jobs} == {
        ("__build__e2e", "success", "e2e-agent-wf"),
        ("greet", "success", "e2e-agent-wf"),
    }, jobs
    greet = next(job for job in jobs if job["jobName"] == "greet")
    step_logs = f"/api/v1/admin/runs/{run['runId']}/jobs/{greet['jobId']}/steps/0/logs"
    status, logs = orchestrator.get(step_logs)
    assert status == 200 and GREETING in json.dumps(logs), logs


def _finished_run(orchestrator) -> tuple[dict, list[dict]] | None:
    """The one run and its jobs once its workflow job has been created and no job is pending or
    running any more, else None. (The run itself reads success as soon as the builder job is.)"""
    status, body = orchestrator.get("/api/v1/admin/runs")
    assert status == 200, body
    runs = body["runs"]
    assert len(runs) <= 1, runs
    if not runs:
        return None
    status, body = orchestrator.get(f"/api/v1/admin/runs/{runs[0]['runId']}/jobs")
    assert status == 200, body
    jobs = body["jobs"]
    if "greet" not in {job["jobName"] for job in jobs}:
        return None
    if any(job["status"] in ("pending", "running") for job in jobs):
        return None
    status, body = orchestrator.get("/api/v1/admin/runs")
    return body["runs"][0], jobs
