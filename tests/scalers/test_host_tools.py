"""Host tools: which ones each scaler type needs, and a scaler short of one is not started until
the tool appears (checked by the sweeper every round, refused by admission naming the tool)."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from agents.choices import EventType
from agents.models import Agent, ScalerEvent
from operations.management.commands.scaler_sweeper import Command
from scalers.admission.decide import Request, decide_batch
from scalers.backends.tools import (
    ToolRequirement,
    check_host_tools,
    missing_tools,
    required_tools_for,
    shebang_interpreter,
)
from scalers.models import ScaleOutcome, Scaler
from scalers.warm_pools import deficit_pass
from tests.support.scalers import make_scaler

TOKEN = "test-orchestrator-token"
REPO = Path(__file__).resolve().parents[2]


def executable(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> str:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def commands(scaler, **kw) -> list[str]:
    return [t.command for t in required_tools_for(scaler, **kw)]


# -- what each type needs -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_firecracker_scaler_needs_its_two_binaries_mkfs_nft_and_ip_and_sudo_only_with_require_sudo():
    config = {"firecrackerPath": "/opt/fc/firecracker", "jailerPath": "/opt/fc/jailer"}
    scaler = make_scaler(type="firecracker", ls_config={"rootfsPath": "/r"}, config=config)
    assert commands(scaler) == ["/opt/fc/firecracker", "/opt/fc/jailer", "mkfs.ext4", "nft", "ip"]
    sudo = make_scaler(type="firecracker", ls_config={"rootfsPath": "/r"}, config={**config, "requireSudo": True})
    assert commands(sudo)[-1] == "sudo"


@pytest.mark.django_db
def test_a_bare_metal_scaler_needs_each_binary_and_the_interpreter_its_shebang_names(tmp_path):
    agent = executable(tmp_path / "agent", "#!/usr/bin/env -S python3 -u\n")
    shell = executable(tmp_path / "agent.sh", "#!/bin/sh -e\n")
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": agent})
    assert commands(scaler, environ={}) == [agent, "python3"]
    assert shebang_interpreter(shell) == "/bin/sh"
    assert shebang_interpreter("/bin/true") is None  # a binary names no interpreter


@pytest.mark.django_db
def test_bwrap_is_needed_when_the_agent_gets_kici_sandbox_true_forwarded_or_from_its_label_set():
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true"})
    assert commands(scaler, environ={}) == ["/bin/true"]
    assert commands(scaler, environ={"KICI_AGENT_ENV_KICI_SANDBOX": "true"}) == ["/bin/true", "bwrap"]
    own = make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true", "env": {"KICI_SANDBOX": "true"}})
    assert "bwrap" in commands(own, environ={})


@pytest.mark.django_db
def test_container_mode_and_container_scalers_need_nft_unless_a_container_scaler_turns_isolation_off(settings):
    settings.KICI_NETWORK_ISOLATION = True
    mixed = make_scaler(
        type="bare-metal",
        label_sets=[["gpu"], ["img"]],
        ls_config={"image": "i"},
        config={"networkIsolation": False},  # ignored for bare-metal
    )
    assert commands(mixed, environ={}) == ["nft"]
    assert commands(make_scaler()) == ["nft"]
    assert commands(make_scaler(config={"networkIsolation": False})) == []
    assert commands(make_scaler(type="event", ls_config={})) == []


def test_a_tool_is_a_file_that_exists_and_is_executable_or_a_name_on_path(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert ToolRequirement(str(tmp_path / "nope"), "jailerPath").problem() == (
        f"{tmp_path / 'nope'} (jailerPath): no such file"
    )
    assert ToolRequirement(str(plain), "jailerPath").problem() == f"{plain} (jailerPath): not executable"
    assert ToolRequirement(str(tmp_path), "jailerPath").problem() == f"{tmp_path} (jailerPath): not a file"
    assert ToolRequirement(executable(tmp_path / "ok"), "jailerPath").problem() is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ToolRequirement("ok", "x").problem() is None
    assert ToolRequirement("mkfs.ext4", "overlay drive").problem() == "mkfs.ext4 (overlay drive): not found on PATH"
    assert ToolRequirement("", "firecrackerPath").problem() == "firecrackerPath: not set"


@pytest.mark.django_db
def test_mkfs_is_also_found_in_sbin_when_path_leaves_it_out(monkeypatch, tmp_path):
    if not Path("/usr/sbin/mkfs.ext4").exists() and not Path("/sbin/mkfs.ext4").exists():
        pytest.skip("no mkfs.ext4 in sbin on this host")
    monkeypatch.setenv("PATH", str(tmp_path))
    fc = make_scaler(
        type="firecracker", ls_config={"rootfsPath": "/r"}, config={"firecrackerPath": "/x", "jailerPath": "/y"}
    )
    assert not any(line.startswith("mkfs.ext4") for line in missing_tools(fc))


# -- not started until the tool appears ---------------------------------------------------------


@pytest.fixture
def ready_calls(monkeypatch):
    """The scalers whose ``ensure_host_ready`` the sweeper called (no runtime touched)."""
    calls: list[str] = []

    class Backend:
        def __init__(self, scaler):
            self.scaler = scaler

        def ensure_host_ready(self):
            calls.append(self.scaler.name)

    monkeypatch.setattr("scalers.backends.factory.get_backend", lambda scaler, **kw: Backend(scaler))
    return calls


def tool_events(name: str) -> list[ScalerEvent]:
    types = (EventType.HOST_TOOLS_MISSING, EventType.HOST_TOOLS_FOUND)
    return list(ScalerEvent.objects.filter(scaler_name=name, type__in=types).order_by("id"))


def scale(labels: list[str], job: str):
    return Client().post(
        "/api/v1/scale",
        data=json.dumps({"labels": labels, "jobId": job}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("stop_admission_queue")
def test_a_scaler_missing_a_tool_is_not_started_until_the_tool_appears(tmp_path, settings, ready_calls, caplog, viewer):
    settings.KICI_API_TOKEN = TOKEN
    binary = tmp_path / "kici-agent"
    scaler = make_scaler("bm-tools", type="bare-metal", labels=("gpu",), ls_config={"binaryPath": str(binary)})
    cmd = Command()
    cmd.hosts_ready = set()

    assert cmd.handle_host_readiness() is True
    row = Scaler.objects.get(pk=scaler.pk)
    assert row.host_tools_missing == [f"{binary} (label set [0] binaryPath): no such file"]
    assert ready_calls == []  # not started: the host is not even readied
    [event] = tool_events("bm-tools")
    assert event.type == EventType.HOST_TOOLS_MISSING and str(binary) in event.detail and "bm-tools" in event.detail
    assert any(str(binary) in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)

    r = scale(["gpu"], "j1")  # admission refuses, naming the scaler and the tool
    assert r.status_code == 503 and r.json()["reason"] == "skipped"
    assert (
        "scaler bm-tools is not started" in r.json()["error"]["message"] and str(binary) in r.json()["error"]["message"]
    )
    assert not Agent.objects.exists()

    page = Client()
    page.force_login(viewer)
    html = page.get("/scalers/bm-tools/").content.decode()
    assert 'id="tools-missing"' in html and str(binary) in html

    assert cmd.handle_host_readiness() is False  # still missing: nothing new, reported once
    assert len(tool_events("bm-tools")) == 1

    executable(binary)
    assert cmd.handle_host_readiness() is True  # the next round starts it, no restart
    assert Scaler.objects.get(pk=scaler.pk).host_tools_missing == []
    assert [e.type for e in tool_events("bm-tools")] == [EventType.HOST_TOOLS_MISSING, EventType.HOST_TOOLS_FOUND]
    assert ready_calls == ["bm-tools"]
    r = scale(["gpu"], "j2")
    assert r.status_code == 201, r.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("stop_admission_queue")
def test_admission_and_warm_pools_refuse_a_scaler_that_is_not_started(tmp_path, caplog):
    scaler = make_scaler(
        "bm-warm",
        type="bare-metal",
        labels=("gpu",),
        ls_config={"binaryPath": str(tmp_path / "gone"), "resources": {"cpus": 1}},
        warm_size=2,
    )
    assert check_host_tools(scaler).missing
    result = decide_batch([Request(labels=("gpu",), job_id="j1")])
    [decision] = result.decisions
    assert decision.action == ScaleOutcome.SKIPPED and "tools" in decision.reason and "gone" in decision.reason
    caplog.set_level("INFO", logger="scalers.warm_pools")
    assert deficit_pass() == 0 and not Agent.objects.exists()
    assert not [r for r in caplog.records if "warm spawns refused" in r.getMessage()]  # not even asked for
    executable(tmp_path / "gone")
    assert check_host_tools(scaler).changed
    assert decide_batch([Request(labels=("gpu",), job_id="j2")]).decisions[0].action == ScaleOutcome.SPAWNING


def test_a_firecracker_scaler_is_not_started_by_a_console_without_cap_net_admin(tmp_path):
    # The nft rules and the bridge/TAP devices are written in-process (libnftables, netlink), which
    # requireSudo cannot wrap: a console without CAP_NET_ADMIN reports it as missing.
    script = (
        "import django; django.setup()\n"
        "from scalers.models import Scaler\n"
        "from scalers.backends.tools import missing_tools\n"
        "fc = Scaler(name='fc', type='firecracker', config={'firecrackerPath': '/bin/true', 'jailerPath': '/bin/true',"
        " 'requireSudo': True})\n"
        "print(repr(missing_tools(fc)))\n"
        "print(repr(missing_tools(Scaler(name='c', type='container', config={'networkIsolation': False}))))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test"}
    runs = {}
    for name, prefix in (("root", []), ("dropped", ["setpriv", "--bounding-set", "-net_admin"])):
        proc = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True, env=env,
                              timeout=60, cwd=REPO)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs[name] = [ast.literal_eval(line) for line in proc.stdout.splitlines()[-2:]]
    needs = (
        "CAP_NET_ADMIN (VM isolation rules and bridge/TAP devices, written by the console itself): "
        "not held; requireSudo does not cover them, run the console as root"
    )
    if os.geteuid() == 0:
        assert needs not in runs["root"][0]
    assert needs in runs["dropped"][0] and runs["dropped"][1] == []
