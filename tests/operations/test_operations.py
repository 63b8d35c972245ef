"""Operations: plan → preview → approve (or reject, or expire) → run on an rq worker → audit.

Uses the config-reload kind (a real scalers.yaml on disk, the real importer) so every step runs
against real PostgreSQL, Redis and an rq SimpleWorker, with no docker needed.
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from operations.attention import needs_attention
from operations.choices import AuditAction, OperationStatus, TargetOutcome
from operations.kinds.base import Scope
from operations.kinds.config_reload import ConfigReload
from operations.models import AuditEntry, Operation
from operations.services import (
    APPROVE_PERM,
    NoWorkerListening,
    PlanExpired,
    approve_operation,
    create_operation,
    reject_operation,
)
from scalers.config.loader import ConfigInvalid
from scalers.metrics import CONFIG_RELOADS
from scalers.models import MetricCounter, Scaler
from tests.support.operations import listening_worker, login, write_config
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_queues")]

QUEUE = settings.KICI_HOST_QUEUE


def plan_reload(config_file, user):
    return create_operation("config-reload", {}, user)


def actions(op):
    return [a.action for a in AuditEntry.objects.filter(operation=op).order_by("at", "id")]


def test_a_plan_shows_what_the_reload_would_do_and_changes_nothing(users, config_file):
    op = plan_reload(config_file, users["operator"])
    assert op.status == OperationStatus.PLANNED
    assert [(t["key"], t["action"]) for t in op.plan] == [
        ("scaler:ops-reload", "create scaler"),
        ("config:globals", "update global settings"),
    ]
    assert op.plan[0]["evidence"]["type"] == "container"
    assert op.plan[1]["evidence"]["global_max_agents_after"] == 10
    assert re.fullmatch(r"[0-9a-f]{64}", op.plan[0]["evidence"]["config_sha256"])
    assert op.expires_at == op.created_at + timedelta(seconds=settings.KICI_OPERATION_PLAN_TTL_SECONDS)
    assert op.host_queue == QUEUE
    assert not Scaler.objects.filter(name="ops-reload").exists(), "the preview is a rolled-back dry run"
    assert actions(op) == [AuditAction.REQUESTED]


def test_an_identical_open_plan_is_not_duplicated(users, config_file):
    first = plan_reload(config_file, users["operator"])
    second = plan_reload(config_file, users["approver"])
    assert second.pk == first.pk and second.reused
    assert Operation.objects.count() == 1


def test_approval_enqueues_on_commit_and_the_worker_runs_it(
    users, config_file, run_rq_jobs, django_capture_on_commit_callbacks
):
    op = plan_reload(config_file, users["operator"])
    with listening_worker(QUEUE), django_capture_on_commit_callbacks(execute=True) as callbacks:
        approve_operation(op, users["approver"], note="looks right")
        import django_rq

        assert django_rq.get_queue(QUEUE).count == 0, "nothing is enqueued before the commit"
    assert callbacks
    op.refresh_from_db()
    assert (op.status, op.approved_by, op.rq_job_id) == (
        OperationStatus.APPROVED,
        users["approver"],
        f"operation-{op.pk}",
    )
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED, op.log
    assert op.outcomes["scaler:ops-reload"]["outcome"] == TargetOutcome.DONE
    assert Scaler.objects.filter(name="ops-reload", type="container").exists()
    assert op.started_at and op.finished_at and op.decided_at
    assert actions(op) == [AuditAction.REQUESTED, AuditAction.APPROVED, AuditAction.STARTED, AuditAction.SUCCEEDED]
    entry = AuditEntry.objects.get(operation=op, action=AuditAction.APPROVED)
    assert (entry.username, entry.from_status, entry.to_status, entry.detail) == (
        "ops-approver",
        "planned",
        "approved",
        "looks right",
    )


def test_a_run_skips_everything_when_the_file_changed_since_the_preview(
    users, config_file, run_rq_jobs, django_capture_on_commit_callbacks, tmp_path
):
    op = plan_reload(config_file, users["operator"])
    write_config(tmp_path / "scalers.yaml", "ops-reload", label="edited")
    with listening_worker(QUEUE), django_capture_on_commit_callbacks(execute=True):
        approve_operation(op, users["approver"])
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    outcome = op.outcomes["scaler:ops-reload"]
    assert outcome["outcome"] == TargetOutcome.SKIPPED
    assert "evidence changed since the preview" in outcome["detail"] and "config_sha256" in outcome["detail"]
    assert op.status == OperationStatus.SUCCEEDED  # skipping is correct behaviour, not a failure
    assert not Scaler.objects.filter(name="ops-reload").exists()


def _drain_with_skips(users, moved: int):
    """A drain of three running agents, run after ``moved`` of them started draining by themselves
    (the re-plan skips those): the operation, run in this process, and the run's summary."""
    from operations.jobs import run_operation

    scaler = make_scaler(name=f"ops-sk-{secrets.token_hex(2)}", type="event")
    agents = [make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now()) for _ in range(3)]
    op = create_operation("agent-drain", {"agent_ids": [a.agent_id for a in agents]}, users["operator"])
    Agent.objects.filter(pk__in=[a.pk for a in agents[:moved]]).update(state=AgentState.DRAINING)
    approve_operation(op, users["approver"], require_worker=False, enqueue=False)
    summary = run_operation(op.pk)
    op.refresh_from_db()
    return op, summary


@pytest.mark.parametrize(
    ("moved", "name", "text", "shown", "listed"),
    [
        (3, "nothing-done", "Nothing done: 3 skipped", "[nothing-done: 3 skipped]", "3 target(s), 3 skipped  "),
        (
            1,
            "succeeded",
            "Succeeded: 2 done, 1 skipped",
            "[succeeded: 2 done, 1 skipped]",
            "3 target(s), 2 done, 1 skipped  ",
        ),
        (0, "succeeded", "Succeeded", "[succeeded]", "3 target(s)  "),
    ],
)
def test_a_run_that_skipped_targets_says_how_many_wherever_its_status_is_shown(
    users, client, capsys, moved, name, text, shown, listed
):
    from live.consumers import render_update

    op, summary = _drain_with_skips(users, moved)
    assert op.status == OperationStatus.SUCCEEDED  # skipping is not failing: no target failed
    assert op.counts()["skipped"] == moved
    assert summary == f"operation #{op.pk} {name}: {3 - moved} done, {moved} skipped, 0 failed"
    badge = f'data-shown="{name}">{text}</span>'
    login(client, users["viewer"])
    assert badge in client.get(f"/operations/{op.pk}/").content.decode()
    rows = client.get("/operations/").content.decode()
    assert badge in rows.split(f'id="operation-{op.pk}"')[1].split("</tr>")[0]
    assert badge in render_update(op.pk, users["viewer"], snapshot=True)[0]  # the page's live push
    call_command("operations", "show", str(op.pk))
    assert f"operation #{op.pk}: Drain agents {shown}" in capsys.readouterr().out
    call_command("operations", "list")
    (line,) = [row for row in capsys.readouterr().out.splitlines() if row.startswith(f"#{op.pk} ")]
    assert line.split()[1] == name and listed in line


def test_an_expired_plan_cannot_be_approved(users, config_file):
    op = plan_reload(config_file, users["operator"])
    Operation.objects.filter(pk=op.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with listening_worker(QUEUE), pytest.raises(PlanExpired, match="expired"):
        approve_operation(op, users["approver"])
    op.refresh_from_db()
    assert op.status == OperationStatus.EXPIRED and op.approved_by is None and not op.rq_job_id
    assert actions(op) == [AuditAction.REQUESTED, AuditAction.EXPIRED]


def test_a_rejected_operation_never_runs(users, config_file, run_rq_jobs):
    from operations.jobs import run_operation

    op = plan_reload(config_file, users["operator"])
    reject_operation(op, users["approver"], note="not today")
    assert "nothing run" in run_operation(op.pk)
    with listening_worker(QUEUE), pytest.raises(Exception, match="only a planned operation"):
        approve_operation(op, users["approver"])
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    assert (op.status, op.rejected_by, op.outcomes) == (OperationStatus.REJECTED, users["approver"], {})
    assert not Scaler.objects.filter(name="ops-reload").exists()
    assert actions(op) == [AuditAction.REQUESTED, AuditAction.REJECTED]


@pytest.mark.parametrize("who", ["viewer", "operator", "outsider"])
def test_an_approver_without_permission_gets_403_and_nothing_happens(users, config_file, client, who):
    import django_rq

    op = plan_reload(config_file, users["operator"])
    login(client, users[who])
    with listening_worker(QUEUE):
        for verb in ("approve", "reject"):
            assert client.get(f"/operations/{op.pk}/{verb}/").status_code == 403
            assert client.post(f"/operations/{op.pk}/{verb}/").status_code == 403
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED and op.approved_by is None and op.rejected_by is None
    assert actions(op) == [AuditAction.REQUESTED]
    assert django_rq.get_queue(QUEUE).count == 0


def test_approving_needs_the_view_permission_too(users, config_file, client):
    """An approver must see the plan and evidence it approves: the approve permission alone is a 403."""
    op = plan_reload(config_file, users["operator"])
    blind = get_user_model().objects.create_user("ops-blind", password="x")
    app_label, codename = APPROVE_PERM.split(".")
    blind.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client.force_login(blind)
    with listening_worker(QUEUE):
        urls = (f"/operations/{op.pk}/approve/", f"/operations/{op.pk}/reject/", f"/operations/approve/?op={op.pk}")
        for url in urls:
            assert client.get(url).status_code == 403, url
        assert client.post(f"/operations/{op.pk}/approve/").status_code == 403
        assert client.post("/operations/approve/", {"op": [str(op.pk)]}).status_code == 403
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED and op.approved_by is None


def test_a_viewer_cannot_request_and_an_outsider_cannot_even_look(users, config_file, client):
    login(client, users["viewer"])
    assert client.post("/operations/plan/", {"kind": "config-reload"}).status_code == 403
    assert client.get("/operations/").status_code == 200
    login(client, users["outsider"])
    assert client.get("/operations/").status_code == 403
    assert Operation.objects.count() == 0


def _csrf_token(client, url):
    response = client.get(url)
    assert response.status_code == 200
    return response.cookies["csrftoken"].value


def test_csrf_is_enforced_on_every_post(users, config_file, csrf_client):
    import django_rq

    login(csrf_client, users["approver"])
    assert csrf_client.post("/operations/plan/", {"kind": "config-reload"}).status_code == 403
    assert Operation.objects.count() == 0
    op = plan_reload(config_file, users["operator"])
    with listening_worker(QUEUE):
        for verb in ("approve", "reject"):
            assert csrf_client.post(f"/operations/{op.pk}/{verb}/", {"note": "x"}).status_code == 403
        op.refresh_from_db()
        assert op.status == OperationStatus.PLANNED and actions(op) == [AuditAction.REQUESTED]
        token = _csrf_token(csrf_client, f"/operations/{op.pk}/approve/")
        response = csrf_client.post(f"/operations/{op.pk}/approve/", {"note": "ok", "csrfmiddlewaretoken": token})
    assert response.status_code == 302, response.content[:500]
    op.refresh_from_db()
    assert op.status == OperationStatus.APPROVED
    assert django_rq.get_queue(QUEUE).count in (0, 1)  # enqueued on commit (test transaction: deferred)


def test_the_view_refuses_to_approve_when_no_worker_listens(users, config_file, client):
    op = plan_reload(config_file, users["operator"])
    login(client, users["approver"])
    response = client.post(f"/operations/{op.pk}/approve/")
    assert response.status_code == 409
    text = response.content.decode()
    assert "no rq worker listens on queue" in text and QUEUE in text and "nothing was approved" in text
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED and actions(op) == [AuditAction.REQUESTED]
    with pytest.raises(NoWorkerListening):
        approve_operation(op, users["approver"])


def test_the_approver_must_differ_from_the_requester_when_the_setting_says_so(users, config_file, client, settings):
    settings.KICI_REQUIRE_DISTINCT_APPROVER = True
    op = plan_reload(config_file, users["approver"])
    login(client, users["approver"])
    with listening_worker(QUEUE):
        assert client.post(f"/operations/{op.pk}/approve/").status_code == 403
        op.refresh_from_db()
        assert op.status == OperationStatus.PLANNED
        login(client, users["approver2"])
        assert client.post(f"/operations/{op.pk}/approve/").status_code == 302
    op.refresh_from_db()
    assert (op.status, op.approved_by) == (OperationStatus.APPROVED, users["approver2"])


def test_a_preview_is_a_dry_run_that_stores_nothing_and_request_approval_stores_it(
    users, config_file, client, monkeypatch
):
    notices = []
    monkeypatch.setattr("operations.services.schedule_approval_notice", lambda *a, **k: notices.append(a))
    login(client, users["operator"])
    response = client.post("/operations/plan/", {"kind": "config-reload"})
    page = response.content.decode()
    assert response.status_code == 200 and "nothing was changed and nothing was stored" in page
    assert "scaler:ops-reload" in page and "create scaler" in page, "the plan, with its targets"
    assert Operation.objects.count() == 0 and not notices
    assert needs_attention().total == 0, "no badge"
    form = page[page.index('<form method="post" action="/operations/plan/" id="request-approval">') :]
    form = form[: form.index("</form>")]
    assert '<input type="hidden" name="kind" value="config-reload">' in form
    assert '<input type="hidden" name="request" value="1">' in form
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', form).group(1)

    response = client.post("/operations/plan/", {"kind": "config-reload", "request": "1", "digest": digest})
    op = Operation.objects.get()
    assert response.status_code == 302 and op.plan_digest == digest and len(notices) == 1
    assert "The plan changed since your preview" not in client.get(response["Location"]).content.decode()
    Operation.objects.all().delete()
    # A plan that changed since its preview is shown again, never stored unseen.
    response = client.post("/operations/plan/", {"kind": "config-reload", "request": "1", "digest": "0" * 64})
    page = response.content.decode()
    assert response.status_code == 200 and "The plan changed since your preview, so nothing was stored" in page
    assert Operation.objects.count() == 0 and len(notices) == 1
    assert f'name="digest" value="{digest}"' in page, "the new preview, ready to request"


def test_the_plan_form_previews_and_redirects_to_the_operation(users, config_file, client):
    login(client, users["operator"])
    response = client.post("/operations/plan/", {"kind": "config-reload", "request": "1"})
    op = Operation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/operations/{op.pk}/"
    page = client.get(response["Location"]).content.decode()
    assert "Reload scalers.yaml" in page and "scaler:ops-reload" in page and "create scaler" in page
    assert "Approve…" not in page, "an operator cannot decide"
    login(client, users["approver"])
    page = client.get(f"/operations/{op.pk}/").content.decode()
    assert f'href="/operations/{op.pk}/approve/"' in page and 'ws-connect="/ws/operations/' in page


def test_an_invalid_config_is_refused_with_every_problem_and_nothing_stored(users, client, tmp_path, settings):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\nscalers: []\n")
    settings.KICI_SCALER_CONFIG_PATH = str(bad)
    login(client, users["operator"])
    response = client.post("/operations/plan/", {"kind": "config-reload"})
    assert response.status_code == 400
    assert f"{bad}:1: version" in response.content.decode()
    assert Operation.objects.count() == 0


def test_a_reload_reads_only_the_configured_file_whatever_path_is_posted(users, config_file, client, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("KICI_API_TOKEN=do-not-show-me\n")
    login(client, users["operator"])
    response = client.post(
        "/operations/plan/",
        {"kind": "config-reload", "config_path": str(secret), "config_dir": str(tmp_path), "request": "1"},
    )
    assert response.status_code == 302  # planned: from the configured file, the posted path ignored
    op = Operation.objects.get()
    assert op.params == {}
    assert f"read {config_file} " in " ".join(op.notes)
    assert "do-not-show-me" not in client.get(response["Location"]).content.decode()


def test_a_configured_file_that_is_not_yaml_is_refused_without_its_content(users, client, tmp_path, settings):
    secret = tmp_path / "secret"
    secret.write_text("KICI_API_TOKEN=do-not-show-me DATABASE_URL=postgres://u:pw@h/db\n")
    settings.KICI_SCALER_CONFIG_PATH = str(secret)
    login(client, users["operator"])
    response = client.post("/operations/plan/", {"kind": "config-reload"})
    page = response.content.decode()
    assert response.status_code == 400
    assert "Expected a mapping at the top level, received a str" in page
    assert "do-not-show-me" not in page and "pw@h" not in page


def test_the_list_filters_by_status_kind_and_scaler(users, config_file, client, tmp_path, settings):
    op = plan_reload(config_file, users["operator"])
    settings.KICI_SCALER_CONFIG_PATH = write_config(tmp_path / "b.yaml", "ops-other")
    other = create_operation("config-reload", {}, users["operator"])
    reject_operation(other, users["approver"])
    login(client, users["viewer"])
    page = client.get("/operations/?status=planned").content.decode()
    assert f'id="operation-{op.pk}"' in page and f'id="operation-{other.pk}"' not in page
    page = client.get("/operations/?status=rejected&kind=config-reload").content.decode()
    assert f'id="operation-{other.pk}"' in page and f'id="operation-{op.pk}"' not in page
    page = client.get("/operations/?kind=agent-drain").content.decode()
    assert "No operations match these filters" in page
    # An unknown value is refused naming it, never silently dropped (which showed everything).
    for query, field in (("status=bogus", "status"), ("kind=bogus", "kind"), ("page=-1", "page")):
        refused = client.get(f"/operations/?{query}")
        assert refused.status_code == 400 and f"{field}: must be" in refused.content.decode(), query
    # It has no sort, and each filter takes one value: either is refused naming the parameter.
    for query, message in (
        ("sort=bogus", "sort: unknown parameter (accepted: status, kind, scaler, page)"),
        ("status=planned&status=rejected", "status: takes one value, got 2"),
        ("page=abc", "page: must be a whole number within 1..200, got &quot;abc&quot;"),
    ):
        refused = client.get(f"/operations/?{query}")
        assert refused.status_code == 400 and message in refused.content.decode(), query
    partial = client.get("/operations/?status=planned", HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<tbody id="op-rows"')
    assert 'ws-connect="/ws/rows/operations/?status=planned&amp;kind=&amp;scaler=&amp;page=1"' in partial


def test_the_cli_twin_goes_through_the_same_checks(users, config_file, capsys):
    call_command("operations", "plan", "config-reload", "--user", "ops-operator")
    op = Operation.objects.get()
    out = capsys.readouterr().out
    assert f"operation #{op.pk}: Reload scalers.yaml [planned]" in out and "ops-reload: create scaler" in out
    with pytest.raises(CommandError, match="permission denied"):
        call_command("operations", "approve", str(op.pk), "--user", "ops-viewer")
    with pytest.raises(CommandError, match="permission denied"):
        call_command("operations", "plan", "config-reload", "--user", "ops-viewer")
    with pytest.raises(CommandError, match="no rq worker listens"):
        call_command("operations", "approve", str(op.pk), "--user", "ops-approver")
    with pytest.raises(CommandError, match="no user named"):
        call_command("operations", "approve", str(op.pk), "--user", "nobody")
    call_command("operations", "approve", str(op.pk), "--user", "ops-approver", "--run-now")
    assert f"operation #{op.pk} succeeded" in capsys.readouterr().out
    call_command("operations", "show", str(op.pk))
    out = capsys.readouterr().out
    assert "[succeeded]" in out and "ops-approver approved planned -> approved" in out and "=> done" in out
    call_command("operations", "list", "--status", "succeeded")
    assert f"#{op.pk}" in capsys.readouterr().out
    with pytest.raises(CommandError, match="only a planned operation"):
        call_command("operations", "reject", str(op.pk), "--user", "ops-approver")


@pytest.mark.parametrize("who", ["operator", "viewer", "outsider"])
def test_the_cli_refuses_to_decide_for_a_user_who_may_only_plan_or_look(users, config_file, who):
    """``--user`` names whose permission counts: an operator may plan but never approve or reject."""
    op = plan_reload(config_file, users["operator"])
    with listening_worker(QUEUE):
        for verb in ("approve", "reject"):
            with pytest.raises(CommandError, match="permission denied: ops-.* lacks the permission"):
                call_command("operations", verb, str(op.pk), "--user", f"ops-{who}")
        with pytest.raises(CommandError, match="permission denied"):
            call_command("operations", "approve", str(op.pk), "--user", f"ops-{who}", "--run-now")
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED and op.approved_by is None and op.rejected_by is None
    assert actions(op) == [AuditAction.REQUESTED]


def test_the_admin_shows_the_audit_log(users, config_file, admin_client):
    op = plan_reload(config_file, users["operator"])
    reject_operation(op, users["approver"], note="audit me")
    page = admin_client.get("/admin/operations/auditentry/").content.decode()
    assert "ops-approver" in page and "audit me" in page
    assert admin_client.get(f"/admin/operations/operation/{op.pk}/change/").status_code == 200


def test_the_role_groups_exist_with_their_permissions(users):
    assert users["viewer"].has_perm("operations.view_operation") and users["viewer"].has_perm("agents.view_agent")
    assert not users["viewer"].has_perm("operations.request_operation")
    assert users["operator"].has_perm("operations.request_operation") and not users["operator"].has_perm(
        "operations.approve_operation"
    )
    assert users["approver"].has_perm("operations.approve_operation")
    assert not users["outsider"].has_perm("operations.view_operation")


def test_a_remote_docker_host_has_its_own_queue_and_approval_says_when_nothing_serves_it(users, config_file):
    from operations.queues import queue_for_scaler

    assert (
        queue_for_scaler(Scaler(name="r", type="container", max_agents=1, config={"host": "tcp://dockerhost-b:2376"}))
        == "host:dockerhost-b"
    )
    assert queue_for_scaler(Scaler(name="l", type="container", max_agents=1, config={})) == QUEUE
    assert queue_for_scaler(Scaler(name="f", type="firecracker", max_agents=1, config={})) == QUEUE
    assert queue_for_scaler(Scaler(name="o", type="firecracker", max_agents=1, host="vmhost-c")) == "host:vmhost-c"
    op = plan_reload(config_file, users["operator"])
    Operation.objects.filter(pk=op.pk).update(host_queue="host:dockerhost-b")
    with pytest.raises(NoWorkerListening, match="no rq worker listens on queue host:dockerhost-b"):
        approve_operation(op, users["approver"])
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED


def test_a_large_plan_is_shown_a_page_of_rows_at_a_time(users, config_file, client):
    op = plan_reload(config_file, users["operator"])
    plan = [
        {"key": f"container:{i:04d}", "action": "remove", "subject": f"c-{i:04d}", "evidence": {"n": i}}
        for i in range(450)
    ]
    Operation.objects.filter(pk=op.pk).update(plan=plan)
    login(client, users["viewer"])
    page = client.get(f"/operations/{op.pk}/?page=3").content.decode()
    assert "rows 401–450" in page and "page 3 of 3" in page
    assert page.count('<tr id="target-') == 50 and "c-0449" in page and "c-0399" not in page
    for query, message in [
        ("page=abc", "page: must be a whole number within 1..3, got &quot;abc&quot;"),
        ("page=-5", "page: must be a whole number within 1..3, got -5"),
        ("page=4", "page: must be a whole number within 1..3, got 4"),
        ("page=1&page=2", "page: takes one value, got 2"),
        ("rows=2", "rows: unknown parameter (accepted: page)"),
    ]:
        response = client.get(f"/operations/{op.pk}/?{query}")
        assert response.status_code == 400 and message in response.content.decode(), query


def test_a_planner_that_cannot_look_plans_nothing_and_says_why(users, client, settings):
    settings.DOCKER_HOST = "unix:///run/ops-no-such-docker.sock"
    Scaler.objects.create(name="ops-blind", type="container", max_agents=1, config={"networkIsolation": False})
    login(client, users["operator"])
    response = client.post("/operations/plan/", {"kind": "orphan-containers", "scaler": "ops-blind"})
    assert response.status_code == 400
    assert (
        "the planner could not look" in response.content.decode() and "nothing was planned" in response.content.decode()
    )
    assert Operation.objects.count() == 0
    response = client.post("/operations/plan/", {"kind": "orphan-vms", "scaler": "ops-blind"})
    assert response.status_code == 400 and "applies to firecracker scalers" in response.content.decode()


@pytest.mark.django_db
def test_a_job_for_an_operation_this_database_does_not_have_is_dropped_quietly():
    from operations.jobs import run_operation

    assert run_operation(987654321) == "operation #987654321 does not exist; nothing run"


def reloads(result: str) -> float:
    row = MetricCounter.objects.filter(name=CONFIG_RELOADS, labels={"result": result}).first()
    return row.value if row else 0.0


def test_an_applied_reload_counts_as_attempted_and_succeeded(
    users, config_file, run_rq_jobs, django_capture_on_commit_callbacks
):
    op = plan_reload(config_file, users["operator"])
    with listening_worker(QUEUE), django_capture_on_commit_callbacks(execute=True):
        approve_operation(op, users["approver"])
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED, op.log
    assert (reloads("attempted"), reloads("success"), reloads("failed")) == (1, 1, 0)


class RunLog:
    """What ``act`` reports to: the run's log lines and target outcomes, kept in lists."""

    operation_id = 0

    def __init__(self):
        self.lines, self.outcomes = [], []

    def log(self, message, level="info"):
        self.lines.append(message)

    def report(self, key, outcome, detail=""):
        self.outcomes.append((key, outcome, detail))


def test_a_reload_that_cannot_be_committed_counts_as_attempted_and_failed(config_file):
    kind = ConfigReload()
    plan = kind.plan(Scope())
    blocker = make_scaler("ops-reload", type="event", config={"provisioningTargets": ["http://127.0.0.1:9/"]})
    make_agent(blocker)  # a live agent: the type may not change under it
    with pytest.raises(ConfigInvalid, match="cannot change from event to container"):
        kind.act(RunLog(), Scope(), plan, [])
    assert (reloads("attempted"), reloads("success"), reloads("failed")) == (1, 0, 1)
