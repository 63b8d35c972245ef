"""The admin is view only for every project model: configuration comes from scalers.yaml and
changes go through approved operations, so nothing is added, changed or deleted at /admin/. The
one exception, registry credentials (secrets kept out of scalers.yaml), is tested in
tests/scalers/test_credentials.py."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.django_db

PROJECT_APPS = {"scalers", "agents", "network", "operations"}
#: Models an administrator edits at /admin/ on purpose.
EDITABLE = {"scalers.RegistryCredential", "scalers.OrchestratorAdminToken"}


@pytest.fixture
def label_set():
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 5})
    scaler = Scaler.objects.create(name="adm-ci", type="container", max_agents=2)
    return LabelSet.objects.create(
        scaler=scaler, index=0, labels=["linux"], normalized="linux", host_access=["172.30.0.1:53"]
    )


def _project_models():
    return sorted(
        (m for m in admin.site._registry if m._meta.app_label in PROJECT_APPS and m._meta.label not in EDITABLE),
        key=lambda m: m._meta.label,
    )


def test_every_project_model_is_registered_with_the_read_only_base():
    from lib.readonly_admin import ReadOnlyAdmin

    models = _project_models()
    assert {m._meta.app_label for m in models} == PROJECT_APPS
    editable = [m._meta.label for m in models if not isinstance(admin.site._registry[m], ReadOnlyAdmin)]
    assert editable == []


@pytest.mark.parametrize("model", _project_models(), ids=lambda m: m._meta.label)
def test_a_superuser_can_list_but_never_add_a_project_model(admin_client, model):
    opts = model._meta
    add_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
    changelist = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert changelist.status_code == 200
    assert add_url.encode() not in changelist.content
    add = admin_client.get(add_url)
    assert add.status_code == 403


def test_a_label_sets_host_access_cannot_be_changed_or_deleted_there(admin_client, label_set):
    url = reverse("admin:scalers_labelset_change", args=[label_set.pk])
    page = admin_client.get(url)
    assert page.status_code == 200 and b'name="host_access"' not in page.content  # shown, not editable
    posted = admin_client.post(
        url,
        {
            "scaler": label_set.scaler_id,
            "index": 0,
            "labels": '["linux"]',
            "normalized": "linux",
            "host_access": '["example.com:443","*:0"]',
            "config": "{}",
        },
    )
    assert posted.status_code == 403
    deleted = admin_client.post(reverse("admin:scalers_labelset_delete", args=[label_set.pk]), {"post": "yes"})
    assert deleted.status_code == 403
    label_set.refresh_from_db()
    assert label_set.host_access == ["172.30.0.1:53"]


def test_the_scaler_page_shows_its_label_sets_without_forms(admin_client, label_set):
    page = admin_client.get(reverse("admin:scalers_scaler_change", args=[label_set.scaler_id]))
    assert page.status_code == 200
    assert b"172.30.0.1:53" in page.content and b"label_sets-0-host_access" not in page.content


def test_an_agent_cannot_be_bulk_deleted_from_the_list(admin_client, label_set):
    agent = Agent.objects.create(
        agent_id="adm-agent-1", scaler=label_set.scaler, label_set=label_set, state=AgentState.RUNNING
    )
    url = reverse("admin:agents_agent_changelist")
    assert b"delete_selected" not in admin_client.get(url).content
    admin_client.post(url, {"action": "delete_selected", "_selected_action": [agent.pk], "post": "yes"})
    assert Agent.objects.filter(pk=agent.pk).exists()


def test_users_and_groups_stay_editable(admin_client):
    assert admin_client.get(reverse("admin:auth_user_add")).status_code == 200
    assert admin_client.get(reverse("admin:auth_group_add")).status_code == 200
