"""Drain agents: no new jobs are dispatched to them; each is torn down once its jobs finish (the
sweeper's ``scalers.lifecycle.drain_idle_agents``, once a heartbeat reports no active job).

Scope: one or more agent ids (of one scaler). Target: a ``running`` agent
(``scalers.lifecycle.mark_draining`` drains only those). Spared: agents still spawning
(destroy those instead), already draining, being destroyed, or gone. ``active_jobs`` is volatile:
a job that starts or ends between the preview and the run does not change the decision to drain.
"""

from __future__ import annotations

from agents.choices import UNREGISTERED_STATES, AgentState
from scalers.lifecycle import mark_draining

from ..choices import OperationKind, TargetOutcome
from .agent_targets import agent_evidence, plan_agents
from .base import Kind, Plan, Scope, Spared, Target, require_agents

DRAINABLE = (AgentState.RUNNING,)


def _decide(result: Plan, key: str, agent) -> None:
    agent_id = agent.agent_id
    if agent.state in DRAINABLE:
        result.targets.append(Target(key, "drain", agent_id, agent_evidence(agent)))
    elif agent.state in UNREGISTERED_STATES:
        result.spared.append(
            Spared(key, agent_id, f"still {agent.state}: nothing to drain (destroy it instead)", agent_evidence(agent))
        )
    else:
        result.spared.append(Spared(key, agent_id, f"agent is {agent.state}", agent_evidence(agent)))


class AgentDrain(Kind):
    name = OperationKind.AGENT_DRAIN
    volatile = frozenset({"age_seconds", "active_jobs", "last_heartbeat_seconds"})

    def validate_scope(self, scope: Scope) -> None:
        require_agents(scope, "draining")

    def plan(self, scope: Scope) -> Plan:
        return plan_agents(scope, _decide)

    def act(self, run, scope, plan, targets) -> None:
        for target in targets:
            agent_id = target.subject
            try:
                active = mark_draining(agent_id)
            except Exception as exc:  # noqa: BLE001 - one agent failing does not stop the others
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if active is None:
                run.report(target.key, TargetOutcome.SKIPPED, "the agent is no longer running")
            else:
                run.report(
                    target.key,
                    TargetOutcome.DONE,
                    (
                        f"draining; torn down once its {active} active job(s) finish"
                        if active
                        else "draining; no active job: torn down at the next sweep"
                    ),
                )
