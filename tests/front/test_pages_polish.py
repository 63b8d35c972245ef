"""Operator-facing wording and layout details: the Job column, the quiet recovery line, the
scaler's own settings only, byte sizes in binary units, no spec citations in the UI."""

from __future__ import annotations

import pytest

from agents.choices import AgentState
from agents.models import Agent
from scalers.config.schema import ScalerEntry
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.django_db


def _container_scaler(name: str = "polish-ci") -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    entry = ScalerEntry.model_validate(
        {
            "name": name,
            "type": "container",
            "maxAgents": 3,
            "labelSets": [{"labels": ["linux"], "image": "kici-agent:local"}],
        }
    )
    scaler = Scaler.objects.create(name=name, type="container", max_agents=3, config=entry.to_raw())
    LabelSet.objects.create(
        scaler=scaler, index=0, labels=["linux"], normalized="linux", config={"image": "kici-agent:local"}
    )
    return scaler


def _row(html: str, agent_id: str) -> str:
    start = html.index(f'<tr id="agent-{agent_id}"')
    return html[start : html.index("</tr>", start)]


def test_the_job_column_names_the_bound_job_and_counts_running_jobs_apart(viewer_client):
    scaler = _container_scaler()
    ls = scaler.label_sets.get()
    Agent.objects.create(
        agent_id="polish-a1", scaler=scaler, label_set=ls, state=AgentState.RUNNING, bound_job_id="job-1"
    )
    Agent.objects.create(
        agent_id="polish-a2", scaler=scaler, label_set=ls, state=AgentState.RUNNING, bound_job_id="job-2", active_jobs=2
    )
    Agent.objects.create(agent_id="polish-a3", scaler=scaler, label_set=ls, state=AgentState.RUNNING, warm=True)
    html = viewer_client.get("/").content.decode()
    idle = _row(html, "polish-a1")
    assert "job-1" in idle and " running</span>" not in idle and ">0<" not in idle and "0 job-1" not in idle
    assert "2 running" in _row(html, "polish-a2") and "job-2" in _row(html, "polish-a2")
    assert "unbound" in _row(html, "polish-a3")
    assert ">Job</th>" in html


def test_an_uneventful_recovery_is_one_quiet_line(viewer_client):
    from scalers.models import RecoveryReport

    _container_scaler()
    RecoveryReport.objects.create(instance_id="host-q", trigger="boot")
    html = viewer_client.get("/").content.decode()
    start = html.index('id="recovery"')
    line = html[html.rindex("<", 0, start) : html.index("\n", start)]
    assert line.startswith('<p class="small muted"') and "nothing to give up or drop" in line
    assert "alert" not in line and "spawns given up" not in html


def test_an_eventful_recovery_lists_only_what_happened(viewer_client):
    from scalers.models import RecoveryReport

    _container_scaler()
    RecoveryReport.objects.create(instance_id="host-r", trigger="boot", reservations_rehydrated=3)
    html = viewer_client.get("/").content.decode()
    box = html[html.index('id="recovery"') :]
    box = box[: box.index("</div>")]
    assert "reservations kept <b>3</b>" in box and "spawns given up" not in box
    assert "alert-ok" in html[html.index('id="recovery"') - 60 : html.index('id="recovery"')]


def test_a_container_scaler_shows_its_own_settings_once(viewer_client):
    scaler = _container_scaler()
    html = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    panel = html[html.index('id="h-config"') : html.index('id="h-ls"')]
    assert panel.count("<dt>maxConcurrentSpawns</dt>") == 1
    for firecracker_field in (
        "vcpuCount",
        "chrootBaseDir",
        "memSizeMib",
        "requireSudo",
        "claimTtlSeconds",
        "enforceCgroups",
    ):
        assert firecracker_field not in panel, firecracker_field
    assert "<dt>runtime</dt>" in panel and "<dt>networkIsolation</dt>" in panel


def test_a_firecracker_scaler_shows_its_vm_settings():
    from front.views.scalers import _config_items

    entry = ScalerEntry.model_validate(
        {
            "name": "vm",
            "type": "firecracker",
            "maxAgents": 1,
            "labelSets": [{"labels": ["kvm"], "rootfsPath": "/r.ext4"}],
        }
    )
    keys = [k for k, _ in _config_items(Scaler(name="vm", type="firecracker", max_agents=1, config=entry.to_raw()))]
    assert (
        "vcpuCount" in keys and "chrootBaseDir" in keys and "runtime" not in keys and "maxConcurrentSpawns" not in keys
    )


def test_why_waiting_states_memory_caps_in_binary_units():
    from front.views.waiting import _limit_text

    scaler = Scaler(name="m", type="container", max_agents=1, max_memory_bytes=4 * 2**30)
    cfg = ConfigState(global_max_memory_bytes=256 * 2**20)
    assert _limit_text("resourceCap.memory", scaler, cfg) == "resourceCap.maxMemory = 4 GiB"
    assert _limit_text("globalResourceCap.memory", scaler, cfg) == "globalResourceCap.maxMemory = 256 MiB"


def test_the_scaler_page_cites_no_spec_section(viewer_client):
    scaler = _container_scaler()
    html = viewer_client.get(f"/scalers/{scaler.name}/").content.decode()
    assert "SPEC" not in html


def test_the_agent_page_and_the_host_access_editor_cite_no_spec_section(viewer_client):
    scaler = _container_scaler("polish-spec")
    agent = Agent.objects.create(
        agent_id="polish-spec-a", scaler=scaler, label_set=scaler.label_sets.get(), state=AgentState.RUNNING
    )
    for url in (
        f"/agents/{agent.agent_id}/",
        f"/scalers/{scaler.name}/label-sets/0/host-access/",
        "/",
        "/agents/",
        "/events/",
    ):
        html = viewer_client.get(url).content.decode()
        assert "SPEC" not in html, url


def test_staff_reach_the_rq_dashboard_from_the_nav_and_others_do_not_see_it(client, viewer_client, django_user_model):
    assert 'href="/admin/rq/"' not in viewer_client.get("/").content.decode()
    staff = django_user_model.objects.create_user("ops-staff", password="pw-staff", is_staff=True, is_superuser=True)
    client.force_login(staff)
    assert 'href="/admin/rq/"' in client.get("/").content.decode()
    assert client.get("/admin/rq/").status_code == 200


def test_absolute_times_say_utc_and_a_default_host_access_reads_as_default():
    from datetime import UTC, datetime

    from front.templatetags.kici_ui import abs_time
    from operations.presenters import evidence_items

    assert abs_time(datetime(2026, 12, 1, 15, 0, 37, tzinfo=UTC)).endswith(">2026-12-01 15:00:37 UTC</time>")
    shown = dict(evidence_items({"host_access_from": None, "file_host_access": None, "container": None}))
    assert shown["host access from"] == "default" and shown["file host access"] == "default"
    assert shown["container"] == "—"
