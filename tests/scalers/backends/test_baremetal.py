"""Bare-metal backend: host-process agents (argv, cgroup scope, destroy, failures) and container mode."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from django.test import Client

from agents.archive import archived_lines
from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.backends.baremetal import BareMetalBackend, _proc_start_time, build_process_command
from scalers.backends.docker_net import ISOLATED_NETWORK_NAME
from scalers.backends.runtime import RuntimeInfo
from scalers.jobs import spawn_agent
from scalers.lifecycle import teardown_agent
from scalers.models import Reservation
from scalers.resources import EffectiveLimits
from scalers.spawn_trace import waterfall
from tests.support.containers import remove_test_containers
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, wsgi_server

ROOT = Path(__file__).resolve().parents[3]
ID = "scaler-bare-metal-ab12cd34"
LOCAL = RuntimeInfo(runtime="docker", base_url="unix:///var/run/docker.sock", socket_path="/var/run/docker.sock")


def test_without_cgroups_the_command_is_the_binary_alone():
    assert build_process_command("/opt/kici-agent", ID, EffectiveLimits(1.5, 2 << 30), False, platform="linux") == [
        "/opt/kici-agent"
    ]


def test_with_cgroups_the_binary_runs_in_a_systemd_scope_with_quota_and_memory_max():
    argv = build_process_command("/opt/kici-agent", ID, EffectiveLimits(1.5, 2147483648), True, platform="linux")
    assert argv == [
        "systemd-run",
        "--user",
        "--scope",
        "--quiet",
        "--slice=kici-scaler",
        f"--unit=kici-agent-{ID}",
        "--property=CPUQuota=150%",
        "--property=MemoryMax=2147483648",
        "/opt/kici-agent",
    ]


def test_a_tiny_cpu_limit_rounds_up_to_one_percent_and_no_limit_or_macos_runs_directly():
    argv = build_process_command("/b", ID, EffectiveLimits(0.001, 0), True, platform="linux")
    assert "--property=CPUQuota=1%" in argv and not any("MemoryMax" in a for a in argv)
    assert build_process_command("/b", ID, EffectiveLimits(0, 0), True, platform="linux") == ["/b"]
    assert build_process_command("/b", ID, None, True, platform="linux") == ["/b"]
    assert build_process_command("/b", ID, EffectiveLimits(2, 1 << 30), True, platform="darwin") == ["/b"]


@pytest.mark.django_db
def test_container_mode_is_isolated_even_when_the_entry_turns_network_isolation_off(settings):
    settings.KICI_NETWORK_ISOLATION = True
    scaler = make_scaler(type="bare-metal", ls_config={"image": "i"}, config={"networkIsolation": False})
    backend = BareMetalBackend(scaler, docker=object(), nft=object(), runtime=LOCAL)
    assert backend.network_isolation is True and backend.containers.rules.enabled is True
    kwargs = backend.containers.create_config(make_agent(scaler), None, "job:1")
    assert set(kwargs["networking_config"]["EndpointsConfig"]) == {ISOLATED_NETWORK_NAME}
    assert kwargs["host_config"]["NetworkMode"] == ISOLATED_NETWORK_NAME
    settings.KICI_NETWORK_ISOLATION = False  # the console-wide switch still turns it off
    assert BareMetalBackend(scaler, docker=object(), nft=object(), runtime=LOCAL).network_isolation is False


def write_script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def agent_binary(tmp_path):
    """The project's Python agent (sandbox_agent/kici_agent.py) behind a wrapper that pins this venv's interpreter."""
    return write_script(
        tmp_path, "kici-agent", f"#!/bin/sh\nexec {sys.executable} {ROOT / 'sandbox_agent' / 'kici_agent.py'}\n"
    )


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.django_db(transaction=True)
def test_a_process_agent_registers_and_is_terminated_with_its_group(agent_binary, settings, tmp_path):
    settings.ALLOWED_HOSTS = ["*"]
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    port = free_port()
    with wsgi_server("127.0.0.1", port) as url:
        scaler = make_scaler(
            type="bare-metal",
            orchestrator_url=url,
            config={"enforceCgroups": True},
            ls_config={"binaryPath": agent_binary, "resources": {"cpus": 1, "memory": "512m"}},
        )
        agent = make_agent(scaler)
        assert spawn_agent(agent.pk) == "spawned"
        assert wait_for(lambda: Agent.objects.get(pk=agent.pk).state == AgentState.RUNNING, 10)
        agent.refresh_from_db()
        pid = agent.backend_context["pid"]
        assert os.getpgid(pid) == pid, "the agent leads its own process group"
        types = list(ScalerEvent.objects.filter(agent=agent).order_by("id").values_list("type", "detail"))
        assert types[0][0] == EventType.PROVISIONING and types[0][1].startswith("spawning agent process")
        assert (EventType.READY, f"agent process started (PID {pid})") in types
        # The trace times the agent's own start: from its process's exec to its registration.
        marks = agent.spawn_trace
        assert marks["checked"] <= marks["started"] == marks["process_started"] <= marks["register_received"]
        assert "agent" in [bar.step for bar in waterfall(marks)]
        scraped = Client().get("/metrics").content.decode()
        assert f'kici_scaler_scale_to_registered_seconds_count{{scaler="{scaler.name}"}} 1.0' in scraped
        assert f'kici_scaler_spawn_duration_seconds_count{{result="spawned",scaler="{scaler.name}"}} 1.0' in scraped
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
        assert wait_for(lambda: _proc_start_time(pid) is None, 2)
    assert not Reservation.objects.filter(agent=agent).exists()
    archived = archived_lines(agent.agent_id)
    kept = archived.lines if archived is not None else []
    assert kept and kept[0] == "--- process output ---", "the process's output was not kept at teardown"
    assert any(line.startswith("kici-agent: ") for line in kept)


@pytest.mark.django_db(transaction=True)
def test_a_process_that_ignores_sigterm_is_killed_after_five_seconds_with_its_children(settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    stubborn = write_script(tmp_path, "stubborn", "#!/bin/sh\ntrap '' TERM\nsleep 600 &\necho child $!\nwait\n")
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": stubborn})
    agent = make_agent(scaler)
    assert spawn_agent(agent.pk) == "spawned"
    agent.refresh_from_db()
    pid = agent.backend_context["pid"]
    assert wait_for(lambda: "child" in Path(agent.backend_context["log_path"]).read_text(), 5)
    child = int(Path(agent.backend_context["log_path"]).read_text().split("child ")[1].split()[0])
    t0 = time.monotonic()
    BareMetalBackend(scaler).destroy(agent)
    took = time.monotonic() - t0
    assert 4.5 <= took < 8, took
    assert _proc_start_time(pid) is None
    assert wait_for(lambda: _proc_start_time(child) is None, 2), "the group's children are killed too"


@pytest.mark.django_db(transaction=True)
def test_a_recycled_pid_is_never_signalled(settings, tmp_path):
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true"})
    agent = make_agent(
        scaler, managed_id=str(os.getpid()), backend_context={"mode": "process", "pid": os.getpid(), "start_time": 1}
    )
    BareMetalBackend(scaler).destroy(agent)  # our own pid with another start time: must survive
    assert _proc_start_time(os.getpid()) is not None


@pytest.mark.django_db(transaction=True)
def test_a_missing_binary_fails_the_spawn_and_releases(settings, tmp_path):
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": str(tmp_path / "nope")})
    agent = make_agent(scaler)
    assert spawn_agent(agent.pk) == "failed"
    assert "not an executable file" in ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).detail
    assert not Reservation.objects.filter(agent=agent).exists()


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_exits_at_once_reports_its_output_at_the_deadline(settings, tmp_path):
    from scalers.lifecycle import expire_registration

    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 1
    crash = write_script(tmp_path, "crash", "#!/bin/sh\necho boom\nexit 3\n")
    agent = make_agent(make_scaler(type="bare-metal", ls_config={"binaryPath": crash}))
    assert spawn_agent(agent.pk) == "spawned"
    time.sleep(1.1)
    assert expire_registration(agent.pk)
    assert ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).detail.endswith("--- captured output ---\nboom")


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("entry", [{}, {"networkIsolation": False}], ids=["default", "isolation-off-ignored"])
def test_container_mode_shares_the_network_hostconfig_and_rules(docker_client, agent_image, settings, entry):
    from tests.support.root import require_root

    require_root()
    from network.nft.apply import NftClient

    settings.KICI_NFT_TABLE = "ctr_kici_bm"
    nft = NftClient("ctr_kici_bm")
    try:
        scaler = make_scaler(
            type="bare-metal",
            orchestrator_url="http://127.0.0.1:9/",
            ls_config={"image": agent_image, "imagePullPolicy": "Never", "resources": {"cpus": 1, "memory": "256m"}},
            config=entry,
        )
        agent = make_agent(scaler, bound_job_id="job-1", run_id="run-1")
        assert spawn_agent(agent.pk) == "spawned"
        agent.refresh_from_db()
        info = docker_client.api.inspect_container(agent.managed_id)
        labels = {k: v for k, v in info["Config"]["Labels"].items() if k.startswith("kici-")}
        assert set(labels) == {
            "kici-managed",
            "kici-installation-id",
            "kici-instance-id",
            "kici-scaler-name",
            "kici-agent-id",
            "kici-labels",
        }
        assert list(info["NetworkSettings"]["Networks"]) == ["kici-agent-net"]
        assert "KICI_JOB_IMAGE_AGENT=1" in info["Config"]["Env"]
        hc = info["HostConfig"]
        assert hc["PidsLimit"] == 4096 and hc["Memory"] == 256 << 20 and hc["NanoCpus"] == 10**9
        assert any(str(a) == agent.ip and r.complete for a, r in nft.list_agents().items())
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
        assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
        assert all(str(a) != agent.ip for a in nft.list_agents())
    finally:
        nft.delete_table()
        remove_test_containers(docker_client)
