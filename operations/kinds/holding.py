"""Hold an agent's sandbox for debugging (``agent-hold``), and release a hold early
(``hold-release``), over ``scalers.holds``. Parameters, targets and what is spared:
docs/operations.md ("agent-hold and hold-release").
"""

from __future__ import annotations

from agents.choices import AgentState
from agents.models import Agent
from scalers.config.schema import DEFAULT_HOLD_SECONDS
from scalers.holds import ARMABLE_STATES, arm_hold, hold_wording, reason_problem, seconds_problem
from scalers.lifecycle import release_hold

from ..choices import OperationKind, TargetOutcome
from ..models import Operation
from .agent_targets import agent_evidence, plan_agents
from .base import Kind, Plan, Scope, ScopeInvalid, Spared, Target, require_agents


def _who(operation_id: int) -> tuple[str, str]:
    """The requester's and the approver's user names of an operation."""
    op = Operation.objects.select_related("requested_by", "approved_by").get(pk=operation_id)
    requested = op.requested_by.get_username() if op.requested_by else "system"
    approved = "policy" if op.auto_approved else (op.approved_by.get_username() if op.approved_by else "")
    return requested, approved


def _evidence(agent) -> dict:
    return agent_evidence(agent) | {"held_until": agent.held_until.isoformat() if agent.held_until else None}


class AgentHold(Kind):
    name = OperationKind.AGENT_HOLD
    params = ("reason", "seconds")
    volatile = frozenset({"age_seconds", "active_jobs", "last_heartbeat_seconds"})

    def validate_scope(self, scope: Scope) -> None:
        require_agents(scope, "a hold")
        if problem := reason_problem(scope.params.get("reason")):
            raise ScopeInvalid("reason", problem)
        if problem := seconds_problem(scope.params.get("seconds", DEFAULT_HOLD_SECONDS)):
            raise ScopeInvalid("seconds", problem)

    def plan(self, scope: Scope) -> Plan:
        seconds = scope.params.get("seconds", DEFAULT_HOLD_SECONDS)

        def decide(result: Plan, key: str, agent) -> None:
            evidence = _evidence(agent)
            if agent.hold:
                result.spared.append(Spared(key, agent.agent_id, "already " + hold_wording(agent), evidence))
            elif agent.state not in ARMABLE_STATES:
                result.spared.append(Spared(key, agent.agent_id, f"agent is {agent.state}: nothing to hold", evidence))
            else:
                action = f"hold its sandbox for {seconds} s when it ends"
                result.targets.append(Target(key, action, agent.agent_id, evidence))

        result = plan_agents(scope, decide)
        if result.targets:
            result.notes.append(
                "a held agent keeps its sandbox, isolation rules and reservation (it counts against the caps) "
                "until the hold expires or a hold-release ends it"
            )
        return result

    def act(self, run, scope, plan, targets) -> None:
        requested, approved = _who(run.operation_id)
        seconds = int(scope.params.get("seconds", DEFAULT_HOLD_SECONDS))
        for target in targets:
            try:
                armed = arm_hold(
                    target.subject,
                    reason=scope.params["reason"],
                    seconds=seconds,
                    requested_by=requested,
                    approved_by=approved,
                    operation=run.operation_id,
                )
            except Exception as exc:  # noqa: BLE001 - one agent failing does not stop the others
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if armed:
                run.report(target.key, TargetOutcome.DONE, f"hold armed: its sandbox is kept {seconds} s when it ends")
            else:
                run.report(target.key, TargetOutcome.SKIPPED, "it ended or got a hold since the re-check")


class HoldRelease(Kind):
    name = OperationKind.HOLD_RELEASE
    volatile = frozenset({"age_seconds", "active_jobs", "last_heartbeat_seconds"})

    def validate_scope(self, scope: Scope) -> None:
        require_agents(scope, "a hold release")

    def plan(self, scope: Scope) -> Plan:
        def decide(result: Plan, key: str, agent) -> None:
            evidence = _evidence(agent)
            if agent.state == AgentState.HELD:
                result.targets.append(Target(key, "tear down its held sandbox now", agent.agent_id, evidence))
            elif agent.hold:
                result.spared.append(
                    Spared(key, agent.agent_id, f"not held yet ({hold_wording(agent)}); it is {agent.state}", evidence)
                )
            else:
                result.spared.append(Spared(key, agent.agent_id, f"agent is {agent.state}, not held", evidence))

        return plan_agents(scope, decide)

    def act(self, run, scope, plan, targets) -> None:
        requested, _ = _who(run.operation_id)
        for target in targets:
            try:
                ended = release_hold(target.subject, f"{requested} (operation #{run.operation_id})")
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            if not ended:
                run.report(target.key, TargetOutcome.SKIPPED, "no longer held (expired or released meanwhile)")
                continue
            state = Agent.objects.filter(agent_id=target.subject).values_list("state", flat=True).first()
            if state in (AgentState.DESTROYED, AgentState.FAILED):
                run.report(target.key, TargetOutcome.DONE, f"sandbox torn down, agent {state}, reservation released")
            else:
                run.report(
                    target.key,
                    TargetOutcome.FAILED,
                    f"the backend could not destroy it; the agent stays {state} and the sweeper retries",
                )
