"""The console's side of a real orchestrator's admin interface (``scalers.kici_orchestrator``),
against a stand-in on loopback that answers as the v0.1.24 routes do; the environment a real
agent's container gets; its default host access."""

from __future__ import annotations

import pytest

from scalers.backends.container.spawn import container_create_config
from scalers.backends.isolation import resolve_kici_host_access
from scalers.credentials import encrypt_secret
from scalers.kici_orchestrator import (
    OrchestratorError,
    connected_agent_ids,
    kici_agent_target,
    mint_agent_token,
    revoke_agent_token,
    token_labels,
    token_last_seen,
)
from scalers.models import OrchestratorAdminToken
from tests.support.kici_stand_in import ADMIN_TOKEN, stand_in_orchestrator
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


@pytest.fixture
def orchestrator():
    with stand_in_orchestrator() as state:
        yield state


def _scaler(port: int, **fields):
    return make_scaler(
        labels=("real-linux", "gpu"),
        ls_config={
            "image": "kici-real-agent:test",
            "kiciAgent": {"orchestratorUrl": f"ws://127.0.0.1:{port}/ws", "adminTokenRef": "orch"},
        },
        **fields,
    )


@pytest.fixture
def admin_token():
    return OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))


def test_it_mints_lists_and_revokes_with_the_stored_admin_token(orchestrator, admin_token):
    target = kici_agent_target(_scaler(orchestrator.port).label_sets.first())
    assert (target.admin_url, target.port) == (f"http://127.0.0.1:{orchestrator.port}", orchestrator.port)
    token_id, token = mint_agent_token(target, ["real-linux", "kici:role:builder"])
    assert (token_id, token) == ("at-1", "kat_at-1")
    assert orchestrator.tokens["at-1"]["labels"] == ["real-linux", "kici:role:builder"]
    assert token_last_seen(target, "at-1") == "never presented"
    orchestrator.connected = ["agent-a"]
    assert connected_agent_ids(target) == {"agent-a"}
    assert revoke_agent_token(target, "at-1") is True
    assert revoke_agent_token(target, "at-1") is False
    assert token_last_seen(target, "at-1") == "not listed (revoked)"
    assert {auth for _, _, auth in orchestrator.calls} == {f"Bearer {ADMIN_TOKEN}"}


def test_a_refusal_names_the_url_and_answer_but_never_the_token(orchestrator, admin_token):
    target = kici_agent_target(_scaler(orchestrator.port).label_sets.first())
    admin_token.secret = encrypt_secret("a-wrong-token")
    admin_token.save()
    with pytest.raises(OrchestratorError) as refused:
        mint_agent_token(target, ["real-linux"])
    message = str(refused.value)
    assert f"POST http://127.0.0.1:{orchestrator.port}/api/v1/agent-tokens answered 401" in message
    assert "Invalid or expired token" in message and "a-wrong-token" not in message


def test_a_missing_admin_token_or_a_closed_port_is_an_orchestrator_error(orchestrator):
    target = kici_agent_target(_scaler(orchestrator.port).label_sets.first())
    with pytest.raises(OrchestratorError, match="no orchestrator admin token named 'orch'"):
        connected_agent_ids(target)
    OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
    closed = kici_agent_target(_scaler(1).label_sets.first())
    with pytest.raises(OrchestratorError, match="GET http://127.0.0.1:1/admin/fleet-topology"):
        connected_agent_ids(closed)


def test_the_token_allows_the_label_sets_labels_and_the_scalers_roles(orchestrator):
    label_set = _scaler(orchestrator.port).label_sets.first()
    assert token_labels(label_set, None) == ["real-linux", "gpu", "kici:role:builder", "kici:role:init-runner"]
    assert token_labels(label_set, ["builder"]) == ["real-linux", "gpu", "kici:role:builder"]
    assert token_labels(label_set, []) == ["real-linux", "gpu"]


@pytest.mark.parametrize(("roles", "sent"), [(None, None), (["all"], None), (["builder"], "builder"), ([], "")])
def test_the_container_gets_exactly_the_real_agents_environment(orchestrator, monkeypatch, roles, sent):
    monkeypatch.setenv("KICI_AGENT_ENV_KICI_DEBUG", "1")  # forwarded to the console's agent, never here
    agent = make_agent(_scaler(orchestrator.port, roles=roles))
    config = container_create_config(
        agent, "kat_x", "kici-real-agent:test", binds=[], extra_hosts=[], network_isolation=True
    )
    expected = [
        f"KICI_ORCHESTRATOR_URL=ws://127.0.0.1:{orchestrator.port}/ws",
        f"KICI_AGENT_ID={agent.agent_id}",
        "KICI_LABELS=real-linux,gpu",
        "KICI_AGENT_TOKEN=kat_x",
        *([] if sent is None else [f"KICI_ROLES={sent}"]),
        "KICI_SCALER_MANAGED=1",
        "KICI_EXECUTION_MODE=bare-metal",
    ]
    assert config["environment"] == expected


def test_the_default_host_access_is_the_orchestrators_port_on_the_gateway_only(orchestrator):
    target = kici_agent_target(_scaler(orchestrator.port).label_sets.first())
    on_gateway = type(target)(f"ws://172.30.0.1:{orchestrator.port}/ws", target.admin_url, "orch")
    assert resolve_kici_host_access(None, on_gateway) == ([f"172.30.0.1:{orchestrator.port}"], False)
    assert resolve_kici_host_access({}, type(target)("wss://ci.example.org/ws", "", "orch")) == ([], False)
    explicit = {"hostAccess": ["172.30.0.1:53"]}
    assert resolve_kici_host_access(explicit, on_gateway) == (["172.30.0.1:53"], True)


def test_the_editor_and_the_host_access_operation_show_the_real_agents_default():
    from front.host_access_editor import effective_host_access
    from operations.kinds.host_access_apply import resolved_host_access

    scaler = make_scaler(
        labels=("real-linux",),
        ls_config={
            "image": "kici-real-agent:test",
            "kiciAgent": {"orchestratorUrl": "ws://172.30.0.1:8480/ws", "adminTokenRef": "orch"},
        },
    )
    label_set = scaler.label_sets.first()
    assert effective_host_access(label_set, None) == ["172.30.0.1:8480"]
    assert resolved_host_access(None, label_set, "172.30.0.1") == ["172.30.0.1:8480"]
    assert effective_host_access(label_set, ["172.30.0.1:53"]) == ["172.30.0.1:53"]
    console_set = make_scaler(labels=("plain",)).label_sets.first()
    assert "172.30.0.1:53" in resolved_host_access(None, console_set, "172.30.0.1")
    # A Firecracker label set: the same default on the VM gateway (the firecracker block's).
    from scalers.models import ConfigState

    ConfigState.objects.update_or_create(pk=1, defaults={"firecracker": {"gateway": "10.9.0.1"}})
    vm_set = make_scaler(
        type="firecracker", labels=("real-vm",),
        ls_config={"kiciAgent": {"orchestratorUrl": "ws://10.9.0.1:8480/ws", "adminTokenRef": "orch"}},
    ).label_sets.first()  # fmt: skip
    assert effective_host_access(vm_set, None) == ["10.9.0.1:8480"]
    assert resolved_host_access(None, vm_set, "10.9.0.1") == ["10.9.0.1:8480"]


def test_a_destroyed_agents_token_is_revoked_where_its_spawn_recorded_it(orchestrator, admin_token):
    from scalers.backends.kici_token import revoke_recorded_kici_token
    from scalers.kici_orchestrator import token_context

    scaler = _scaler(orchestrator.port)
    label_set = scaler.label_sets.first()
    token_id, _ = mint_agent_token(kici_agent_target(label_set), ["real-linux"])
    agent = make_agent(scaler, backend_context=token_context(kici_agent_target(label_set), token_id))
    label_set.config = {"labels": ["real-linux"], "image": "kici-agent:local"}  # a reload dropped kiciAgent
    label_set.save()
    revoke_recorded_kici_token(agent)
    assert orchestrator.tokens == {}
    revoke_recorded_kici_token(agent)  # already revoked: done, no error


def test_the_real_agents_environment_is_one_list_whose_execution_mode_names_the_sandbox(orchestrator):
    from scalers.backends.spawn_env import kici_agent_env, kici_agent_pairs

    agent = make_agent(_scaler(orchestrator.port))
    vm = kici_agent_pairs(agent, "kat_x", execution_mode="firecracker")
    assert [k for k, _ in vm] == [
        "KICI_ORCHESTRATOR_URL", "KICI_AGENT_ID", "KICI_LABELS", "KICI_AGENT_TOKEN", "KICI_SCALER_MANAGED",
        "KICI_EXECUTION_MODE",
    ]  # fmt: skip
    assert vm[-1] == ("KICI_EXECUTION_MODE", "firecracker")
    assert kici_agent_env(agent, "kat_x") == [f"{k}={v}" for k, v in vm[:-1]] + ["KICI_EXECUTION_MODE=bare-metal"]
    with pytest.raises(ValueError, match="execution_mode must be one of"):
        kici_agent_pairs(agent, "kat_x", execution_mode="vm")
