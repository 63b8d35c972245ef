"""A host access approved in the console survives the start-up import and a config reload, every
page that shows it says where the value in force comes from and what the file says, a revert to
the file follows the file again, and every change an import makes to a value is an event."""

from __future__ import annotations

import io
import re
import secrets
import textwrap
from html import unescape

import pytest
from django.core.management import call_command

from agents.choices import EventType
from agents.models import ScalerEvent
from operations.choices import OperationStatus
from operations.models import Operation
from operations.services import create_operation
from scalers.models import LabelSet
from tests.support.operations import approve_and_run, login

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_queues")]

CONFIG = """\
version: 1
globalMaxAgents: 10
scalers:
  - name: {name}
    type: container
    maxAgents: {max_agents}
    labelSets:
      - labels: [linux, ovr]
        image: 'kici-agent:local'
        networkPolicy:
          hostAccess: {host_access}
"""


@pytest.fixture
def config(tmp_path, settings):
    """Write scalers.yaml (the configured file); returns ``write(max_agents, host_access)`` and the name."""
    name = f"ovr-{secrets.token_hex(2)}"
    path = tmp_path / "scalers.yaml"
    settings.KICI_SCALER_CONFIG_PATH = str(path)
    settings.KICI_SCALER_CONFIG_DIR = None

    def write(max_agents: int = 3, host_access: str = "['*:4000']") -> str:
        path.write_text(textwrap.dedent(CONFIG.format(name=name, max_agents=max_agents, host_access=host_access)))
        return str(path)

    write()
    return write, name


def start_up_import(path: str) -> str:
    """What scripts/run.sh runs before it starts the console: ``manage.py import_scalers PATH``."""
    out = io.StringIO()
    call_command("import_scalers", path, stdout=out)
    return out.getvalue()


def set_host_access(label_set, entries, users, run_rq_jobs):
    op = create_operation(
        "host-access-apply", {"label_set": label_set, "params": {"host_access": entries}}, users["operator"]
    )
    # These lists leave out the console's port: the plan warns, and the test confirms it read that.
    op = approve_and_run(op, users["approver"], run_rq_jobs, confirm_warnings=True)
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.log)
    return op


def config_events():
    return list(
        ScalerEvent.objects.filter(type__in=[EventType.CONFIG_CHANGED, EventType.CONFIG_OVERRIDE_KEPT]).order_by("id")
    )


def test_an_approved_host_access_change_survives_the_start_up_import_and_a_reload(config, users, run_rq_jobs):
    write, name = config
    path = write()
    start_up_import(path)
    label_set = LabelSet.objects.get(scaler__name=name)
    assert (label_set.host_access, label_set.host_access_override) == (["*:4000"], False)

    op = set_host_access(label_set, ["*:9000"], users, run_rq_jobs)
    assert any("stays in force over the file" in note for note in op.notes)
    # Lists read as an operator writes them, not as Python reprs.
    assert any(note.startswith("scalers.yaml says hostAccess [*:4000] for this label set:") for note in op.notes)
    assert (
        op.outcomes[f"labelset:{label_set.pk}"]["detail"] == "hostAccess = [*:9000] (console value, kept over the file)"
    )
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.host_access_override
    assert label_set.host_access_override_operation == op.pk
    assert label_set.file_host_access == ["*:4000"], "the file's value is still known"

    # `make run` again: the same file is imported at start-up.
    out = start_up_import(path)
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.host_access_override
    assert "kept from the console" in out and '["*:9000"]' in out and '(file: ["*:4000"])' in out
    assert config_events() == [], "a restart over an unchanged file changes nothing, so records nothing"

    # The file is edited (maxAgents and this label set's hostAccess), then reloaded by an operation.
    write(max_agents=4, host_access="['*:5000']")
    reload = create_operation("config-reload", {}, users["operator"])
    assert any("stays in force" in n and '["*:5000"]' in n for n in reload.notes), reload.notes
    assert any("kept from the console over the file" in n for n in reload.notes), reload.notes
    reload = approve_and_run(reload, users["approver"], run_rq_jobs)
    assert reload.status == OperationStatus.SUCCEEDED, (reload.error, reload.log)
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.host_access_override
    assert label_set.file_host_access == ["*:5000"]
    assert label_set.scaler.max_agents == 4

    changed, kept = config_events()
    assert changed.type == EventType.CONFIG_CHANGED and changed.scaler_name == name
    assert changed.payload == {"value": f"scalers.{name}.maxAgents", "old": 3, "new": 4, "source": path}
    assert kept.type == EventType.CONFIG_OVERRIDE_KEPT
    assert kept.payload == {
        "value": f"scalers.{name}.labelSets[linux,ovr].networkPolicy.hostAccess",
        "old": ["*:4000"],
        "new": ["*:5000"],
        "source": path,
        "kept": ["*:9000"],
        "operation": label_set.host_access_override_operation,
    }
    assert "stays in force" in kept.detail

    # The command-line twin of the page's "Revert to file…".
    call_command(
        "operations",
        "plan",
        "host-access-apply",
        "--label-set",
        str(label_set.pk),
        "--host-access-revert",
        "--user",
        "ops-operator",
        stdout=io.StringIO(),
    )
    revert = Operation.objects.get(kind="host-access-apply", params={"revert_to_file": True})
    assert [(t["action"], t["evidence"]["host_access_to"]) for t in revert.plan] == [
        ("revert hostAccess to the file's value", ["*:5000"])
    ]


def test_a_reload_preview_lists_a_label_sets_host_access_as_an_operator_reads_it(config, users):
    write, name = config
    write(host_access="['172.30.0.1:53', '*:4000']")
    reload = create_operation("config-reload", {}, users["operator"])
    (created,) = [t for t in reload.plan if t["key"] == f"scaler:{name}"]
    assert created["evidence"]["label_sets"] == ["linux,ovr hostAccess=[172.30.0.1:53, *:4000]"]


def test_the_pages_show_the_console_value_in_force_and_the_files_beside_it(config, users, run_rq_jobs, client):
    write, name = config
    start_up_import(write())
    label_set = LabelSet.objects.get(scaler__name=name)
    login(client, users["operator"])
    scaler_page = f"/scalers/{name}/"
    editor = f"/scalers/{name}/label-sets/0/host-access/"

    html = unescape(client.get(scaler_page).content.decode())
    assert 'data-source="file"' in html and "from scalers.yaml" in html and "scalers.yaml says" not in html

    op = set_host_access(label_set, ["*:9000"], users, run_rq_jobs)
    start_up_import(write())
    for url in (scaler_page, editor):
        response = client.get(url)
        assert response.status_code == 200
        html = unescape(response.content.decode())
        source = html[html.index(f'id="ha-source-{label_set.pk}"') :]
        assert 'data-source="console" data-differs' in source, url
        assert "in force: console" in source and f"operation #{op.pk}" in source, url
        text = " ".join(re.sub(r"<[^>]+>", " ", source).split())
        assert "scalers.yaml says: *:4000 (not in force)" in text, url
        assert 'name="host_access_revert"' in source and "Revert to file…" in source, url
    assert "with host access set in the console, 1 differing from the file" in unescape(
        client.get(scaler_page).content.decode()
    )
    nothing = unescape(client.post("/operations/plan/", {"kind": "config-reload"}).content.decode())
    assert "nothing to do" in nothing and "kept from the console over the file" in nothing and "*:9000" in nothing

    # The revert is a previewed operation like any other; afterwards the file is followed again.
    response = client.post(
        "/operations/plan/",
        {"kind": "host-access-apply", "label_set": label_set.pk, "host_access_revert": "1", "request": "1"},
    )
    assert response.status_code == 302
    revert = Operation.objects.exclude(pk=op.pk).get(kind="host-access-apply")
    (target,) = revert.plan
    assert target["action"] == "revert hostAccess to the file's value"
    assert target["evidence"]["host_access_to"] == ["*:4000"] and target["evidence"]["source_from"] == "console"
    revert = approve_and_run(revert, users["approver"], run_rq_jobs, confirm_warnings=True)  # the file's *:4000
    assert revert.status == OperationStatus.SUCCEEDED, (revert.error, revert.log)
    label_set.refresh_from_db()
    assert (label_set.host_access, label_set.host_access_override) == (["*:4000"], False)
    html = unescape(client.get(editor).content.decode())
    assert 'data-source="file"' in html and "scalers.yaml says" not in html

    # Following the file again: the next import applies the file's edit, and records it.
    start_up_import(write(host_access="['*:6000']"))
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:6000"]
    (event,) = config_events()
    assert event.type == EventType.CONFIG_CHANGED
    assert event.payload["value"] == f"scalers.{name}.labelSets[linux,ovr].networkPolicy.hostAccess"
    assert (event.payload["old"], event.payload["new"]) == (["*:4000"], ["*:6000"])
