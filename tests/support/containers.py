"""Agent containers on the private dockerd: leftovers removed, and an agent that registers while
its spawn is still at the network stage."""

from __future__ import annotations

from tests.support.scalers import PREFIX


def remove_test_containers(client) -> int:
    """Force-remove every kici-managed container of a scaler named ``ctr-t-…`` (a failed test's leftovers)."""
    removed = 0
    for c in client.api.containers(all=True, filters={"label": "kici-managed=true"}):
        if (c.get("Labels") or {}).get("kici-scaler-name", "").startswith(PREFIX):
            client.api.remove_container(c["Id"], force=True)
            removed += 1
    return removed


def register_at_network_stage(monkeypatch, agent) -> None:
    """Make ``agent`` register (real endpoint, with the token its spawn minted) at the moment its
    spawn asks for the container's address: a fast agent, registered before the network stage ends."""
    import json

    from django.test import Client

    import agents.tokens
    import scalers.backends.container.spawn as spawn_module

    minted: list[str] = []
    real_mint, real_facts = agents.tokens.mint_registration_token, spawn_module.container_network_facts

    def mint(a, *args, **kwargs):
        minted.append(real_mint(a, *args, **kwargs))
        return minted[-1]

    def register_then_address(docker, container_id):
        answer = Client().post(
            "/api/v1/agents/register",
            data=json.dumps({"agentId": agent.agent_id}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {minted[-1]}",
        )
        assert answer.status_code == 200, answer.content
        return real_facts(docker, container_id)

    monkeypatch.setattr(agents.tokens, "mint_registration_token", mint)
    monkeypatch.setattr(spawn_module, "container_network_facts", register_then_address)
