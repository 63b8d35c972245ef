"""Destroy agents: tear down the sandbox and release the reservation
(``scalers.lifecycle.teardown_agent``), never holding it. A running agent is drained first and
skipped while it still has jobs. Scope, targets and why: docs/operations.md ("agent-destroy").
"""

from __future__ import annotations

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent
from scalers.lifecycle import clear_draining, mark_draining, teardown_agent

from ..choices import OperationKind, TargetOutcome
from .agent_targets import agent_evidence, plan_agents
from .base import Kind, Plan, Scope, Spared, Target, require_agents


def _decide(result: Plan, key: str, agent) -> None:
    agent_id = agent.agent_id
    if agent.state in ACTIVE_STATES:
        result.targets.append(Target(key, "destroy", agent_id, agent_evidence(agent)))
        if agent.active_jobs:
            result.notes.append(
                f"{agent_id} has {agent.active_jobs} active job(s): it is skipped at run time unless they "
                "finish; drain it instead"
            )
    else:
        result.spared.append(Spared(key, agent_id, f"agent is already {agent.state}", agent_evidence(agent)))


class AgentDestroy(Kind):
    name = OperationKind.AGENT_DESTROY
    volatile = frozenset({"age_seconds", "last_heartbeat_seconds"})

    def validate_scope(self, scope: Scope) -> None:
        require_agents(scope, "destroying")

    def plan(self, scope: Scope) -> Plan:
        return plan_agents(scope, _decide)

    def act(self, run, scope, plan, targets) -> None:
        for target in targets:
            agent_id = target.subject
            try:
                agent = Agent.objects.select_related("scaler").get(agent_id=agent_id)
                if agent.state == AgentState.RUNNING:
                    active = mark_draining(agent_id)
                    if active:
                        clear_draining(agent_id)
                        run.report(target.key, TargetOutcome.SKIPPED, f"has {active} active job(s); drain it first")
                        continue
                    agent.refresh_from_db()
                elif agent.state == AgentState.DRAINING and agent.active_jobs:
                    run.report(
                        target.key,
                        TargetOutcome.SKIPPED,
                        f"draining with {agent.active_jobs} active job(s); it is destroyed when they finish",
                    )
                    continue
                teardown_agent(
                    agent, f"destroyed by operation #{run.operation_id}", destroy_reason="shutdown", hold=False
                )
                agent.refresh_from_db()
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if agent.state in (AgentState.DESTROYED, AgentState.FAILED):
                run.report(
                    target.key, TargetOutcome.DONE, f"sandbox destroyed, agent {agent.state}, reservation released"
                )
            else:
                run.report(
                    target.key,
                    TargetOutcome.FAILED,
                    f"the backend could not destroy it; the agent stays {agent.state} and the sweeper retries",
                )
