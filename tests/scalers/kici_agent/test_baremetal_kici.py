"""The real KiCI agent as a bare-metal process (label set ``binaryPath`` + ``kiciAgent``), against a
stand-in of the orchestrator's admin interface: the process gets exactly the agent's environment
with a token minted for its spawn, the follow learns its exit, and its token ends with it."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.backends.spawn_env import PROCESS_ENV_ALLOWLIST
from scalers.credentials import encrypt_secret
from scalers.jobs import spawn_agent
from scalers.kici_agents import look_at
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.kici_stand_in import ADMIN_TOKEN, stand_in_orchestrator
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def orchestrator():
    with stand_in_orchestrator() as state:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        yield state


@pytest.fixture(autouse=True)
def no_follow_queue(monkeypatch):
    """The spawn schedules the follow on rq; the tests look themselves."""
    monkeypatch.setattr("scalers.jobs.schedule_follow", lambda agent: None)


def stand_in_agent(tmp_path: Path, body: str) -> str:
    """An executable standing in for the real agent: writes its environment as JSON, then ``body``."""
    path = tmp_path / "kici-agent"
    path.write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\n"
        f"json.dump(dict(os.environ), open({str(tmp_path / 'env.json')!r}, 'w'))\n{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def real_agent_scaler(orchestrator, binary: str):
    return make_scaler(
        type="bare-metal",
        labels=("real-host",),
        roles=["builder"],
        ls_config={
            "binaryPath": binary,
            "kiciAgent": {"orchestratorUrl": f"ws://127.0.0.1:{orchestrator.port}/ws", "adminTokenRef": "orch"},
        },
    )


def _reload(agent) -> Agent:
    return Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk)


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_the_process_gets_exactly_the_agents_environment_and_ends_with_its_token(
    orchestrator, settings, tmp_path, monkeypatch
):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    monkeypatch.setenv("KICI_AGENT_ENV_STRAY", "forwarded to the console's agent only")
    monkeypatch.setenv("KICI_TRUSTED_ENV", "true")
    monkeypatch.setenv("HOME", "/home/operator")
    go = tmp_path / "go"
    binary = stand_in_agent(tmp_path, f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('idle, bye')")
    agent = make_agent(real_agent_scaler(orchestrator, binary))
    assert spawn_agent(agent.pk) == "spawned"
    agent = _reload(agent)
    assert agent.state == AgentState.CONNECTING
    assert wait_for((tmp_path / "env.json").exists, 10)
    time.sleep(0.1)
    env = json.loads((tmp_path / "env.json").read_text())
    [(token_id, token)] = orchestrator.tokens.items()
    assert token["labels"] == ["real-host", "kici:role:builder"]
    expected = {k: v for k, v in os.environ.items() if k in PROCESS_ENV_ALLOWLIST}
    expected |= {
        "KICI_ORCHESTRATOR_URL": f"ws://127.0.0.1:{orchestrator.port}/ws",
        "KICI_AGENT_ID": agent.agent_id,
        "KICI_LABELS": "real-host",
        "KICI_AGENT_TOKEN": f"kat_{token_id}",
        "KICI_ROLES": "builder",
        "KICI_SCALER_MANAGED": "1",
        "KICI_EXECUTION_MODE": "bare-metal",
    }
    assert env == expected
    assert env["HOME"] == "/home/operator"
    assert agent.backend_context["kici_token_id"] == token_id
    assert "kat_" not in json.dumps(agent.backend_context), "the token itself is never stored"

    assert look_at(agent) == "watching"
    orchestrator.connected = [agent.agent_id]
    assert look_at(_reload(agent)) == "running"
    go.touch()
    assert wait_for(lambda: look_at(_reload(agent)) == "destroyed", 10)
    agent = _reload(agent)
    assert agent.state == AgentState.DESTROYED
    assert agent.teardown_reason == "the KiCI agent exited with code 0 (it shuts down once idle)"
    assert orchestrator.tokens == {}, "the agent's token is revoked with it"
    assert not Reservation.objects.filter(agent=agent).exists()


def test_a_process_that_exits_before_registering_fails_with_its_code_and_words(orchestrator, settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    binary = stand_in_agent(tmp_path, "print('Unknown KICI_* env var(s) detected', flush=True)\nsys.exit(1)")
    agent = make_agent(real_agent_scaler(orchestrator, binary))
    assert spawn_agent(agent.pk) == "spawned"
    assert wait_for(lambda: look_at(_reload(agent)) == "failed", 10)
    agent = _reload(agent)
    assert agent.failure_reason.startswith(
        f"the KiCI agent exited with code 1 without registering with ws://127.0.0.1:{orchestrator.port}/ws; "
        f"the orchestrator lists no agent {agent.agent_id} among those registered with it"
    ), agent.failure_reason
    failed = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED)
    assert "Unknown KICI_* env var(s) detected" in str(failed.payload) + failed.detail
    assert orchestrator.tokens == {}
    assert not Reservation.objects.filter(agent=agent).exists()


def test_a_binary_that_cannot_start_fails_the_spawn_with_code_127_and_the_reason(orchestrator, settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    binary = tmp_path / "kici-agent"
    binary.write_text("#!/nonexistent/interpreter\n")
    binary.chmod(0o755)
    agent = make_agent(real_agent_scaler(orchestrator, str(binary)))
    assert spawn_agent(agent.pk) == "spawned"
    assert wait_for(lambda: look_at(_reload(agent)) == "failed", 10)
    agent = _reload(agent)
    assert agent.failure_reason.startswith("the KiCI agent exited with code 127 without registering"), (
        agent.failure_reason
    )
    failed = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED)
    assert f"could not start {binary}" in str(failed.payload) + failed.detail
    assert [c[0] for c in orchestrator.calls if c[0] != "GET"] == ["POST", "DELETE"]
    assert orchestrator.tokens == {}
