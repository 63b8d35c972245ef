"""The orchestrator token of a sandbox running the real KiCI agent (label set ``kiciAgent``), for
every backend that runs it (container, Firecracker, bare-metal process): minted per spawn, recorded on the agent row
before anything else is made, revoked when the spawn fails or the agent ends
(``docs/real-kici-agent.md``). The orchestrator's admin interface mints tokens that never expire,
so none is left behind.
"""

from __future__ import annotations

import logging

from agents.choices import EventType
from agents.events import record_event
from agents.models import Agent
from scalers.kici_orchestrator import (
    KiciAgentTarget,
    OrchestratorError,
    mint_agent_token,
    revoke_agent_token,
    token_context,
    token_labels,
    token_to_revoke,
)

log = logging.getLogger(__name__)


def mint_spawn_kici_token(agent: Agent, target: KiciAgentTarget, sandbox: str) -> tuple[str, str]:
    """``(token id, kat_ token)`` for ``agent``'s spawn: a token ``target``'s orchestrator minted for
    the agent's labels and roles, its id and where to revoke it stored on the row at once (so every
    way out finds it), with a ``scaler.provisioning`` event "creating <sandbox> for the KiCI agent
    of <url> (orchestrator token <id>)". Raises ``OrchestratorError`` when minting fails."""
    token_id, token = mint_agent_token(target, token_labels(agent.label_set, agent.scaler.roles))
    context = token_context(target, token_id)
    Agent.objects.filter(pk=agent.pk).update(backend_context=context)
    agent.backend_context = context
    record_event(
        agent,
        EventType.PROVISIONING,
        f"creating {sandbox} for the KiCI agent of {target.ws_url} (orchestrator token {token_id})",
    )
    return token_id, token


def revoke_failed_spawn_kici_token(target: KiciAgentTarget, token_id: str, agent_id: str) -> None:
    """Revoke the orchestrator token of a spawn that failed; a failure is logged (the token never
    reached a running agent, and the agent row names it for the operator)."""
    try:
        revoke_agent_token(target, token_id)
    except OrchestratorError:
        log.warning("could not revoke orchestrator token %s of %s", token_id, agent_id, exc_info=True)


def revoke_recorded_kici_token(agent: Agent) -> None:
    """Revoke the orchestrator token the spawn of ``agent`` recorded (``backend_context``), if any;
    an already revoked one counts as done. Raises ``OrchestratorError`` when the orchestrator cannot
    take it, so the teardown keeps the reservation and is retried."""
    recorded = token_to_revoke(agent.backend_context or {})
    if recorded is not None:
        revoke_agent_token(*recorded)
