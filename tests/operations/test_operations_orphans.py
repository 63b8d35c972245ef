"""Orphan reaps as operations, end to end on a real docker host, real nft (in a namespace of our
own), the real database and an rq SimpleWorker: preview, a target registers meanwhile, approve, run."""

from __future__ import annotations

import re
import secrets

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from operations.choices import AuditAction, OperationStatus, TargetOutcome
from operations.models import AuditEntry, Operation
from scalers.backends.docker_net import ISOLATED_NETWORK_NAME, ensure_isolated_network
from scalers.backends.ownership import Owner, current_owner
from scalers.models import Installation
from tests.support.operations import listening_worker
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.usefixtures("empty_queues")]

QUEUE = settings.KICI_HOST_QUEUE
TEST_LABEL = "ops-test-orphans"


@pytest.fixture
def box(docker_client, agent_image):
    """Labelled containers on kici-agent-net, all removed at the end."""
    ensure_isolated_network(docker_client)
    api = docker_client.api
    run = secrets.token_hex(3)

    class Box:
        def make(self, scaler_name: str, agent_id: str, state: str = "running", owner: Owner | None = None) -> str:
            labels = {
                "kici-managed": "true",
                **(owner or current_owner(scaler_name)).labels(),
                "kici-agent-id": agent_id,
                TEST_LABEL: run,
            }
            host_config = api.create_host_config(network_mode=ISOLATED_NETWORK_NAME, init=True)
            command = ["sleep", "600"] if state == "running" else ["true"]
            c = api.create_container(
                agent_image, command=command, labels=labels, host_config=host_config, name=f"ops-{agent_id[-8:]}-{run}"
            )
            api.start(c["Id"])
            if state == "exited":
                api.wait(c["Id"], timeout=30)
            return c["Id"]

        def ids(self) -> set[str]:
            return {c["Id"] for c in api.containers(all=True, filters={"label": f"{TEST_LABEL}={run}"})}

        def address(self, cid: str) -> str:
            return api.inspect_container(cid)["NetworkSettings"]["Networks"][ISOLATED_NETWORK_NAME]["IPAddress"]

    yield Box()
    for c in api.containers(all=True, filters={"label": f"{TEST_LABEL}={run}"}):
        api.remove_container(c["Id"], force=True)


def agent_id() -> str:
    return f"scaler-container-{secrets.token_hex(4)}"


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_target_that_registered_since_the_preview_is_skipped_and_the_rest_removed(users, box, run_rq_jobs):
    scaler = make_scaler(name=f"ops-o-{secrets.token_hex(3)}", config={"networkIsolation": False})
    neighbour = make_scaler(name=scaler.name + "-2", config={"networkIsolation": False})
    late, failed, exited, live = agent_id(), agent_id(), agent_id(), agent_id()
    make_agent(scaler, state=AgentState.FAILED, agent_id=failed, reserve=False)
    live_agent = make_agent(
        scaler, state=AgentState.RUNNING, agent_id=live, registered_at=timezone.now(), reserve=False
    )
    c_late = box.make(scaler.name, late)  # running, no agent row yet: an orphan at preview time
    c_failed = box.make(scaler.name, failed)  # running, its agent failed: an orphan
    c_exited = box.make(scaler.name, exited, state="exited")  # exited and untracked: an orphan
    c_live = box.make(scaler.name, live_agent.agent_id)  # running and registered: spared
    c_neighbour = box.make(neighbour.name, agent_id(), state="exited")  # another scaler's: never ours

    # preview, as an operator, through the page
    response = _client(users["operator"]).post(
        "/operations/plan/", {"kind": "orphan-containers", "scaler": scaler.name, "request": "1"}
    )
    assert response.status_code == 302
    op = Operation.objects.get()
    planned = {t["key"]: t for t in op.plan}
    assert set(planned) == {f"container:{c}" for c in (c_late, c_failed, c_exited)}
    assert planned[f"container:{c_late}"]["evidence"]["container_state"] == "running"
    assert planned[f"container:{c_late}"]["evidence"]["registered"] is False
    assert planned[f"container:{c_failed}"]["evidence"]["agent_row"] == "failed"
    assert planned[f"container:{c_exited}"]["evidence"]["container_state"] == "exited"
    spared = {s["key"]: s["reason"] for s in op.spared}
    assert spared == {f"container:{c_live}": f"tracked: agent {live} is running and registered"}
    page = _client(users["viewer"]).get(f"/operations/{op.pk}/").content.decode()
    assert c_late in page and "stop and remove container" in page and "tracked: agent" in page

    # the late agent registers while the plan awaits approval
    make_agent(scaler, state=AgentState.RUNNING, agent_id=late, registered_at=timezone.now(), reserve=False)

    approver = _client(users["approver"])
    with listening_worker(QUEUE):
        assert approver.get(f"/operations/{op.pk}/approve/").status_code == 200
        response = approver.post(f"/operations/{op.pk}/approve/", {"note": "reap them"})
    assert response.status_code == 302
    assert run_rq_jobs(QUEUE) >= 0
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.log)
    late_outcome = op.outcomes[f"container:{c_late}"]
    assert late_outcome["outcome"] == TargetOutcome.SKIPPED
    assert late_outcome["detail"] == f"spared since the preview: tracked: agent {late} is running and registered"
    assert op.outcomes[f"container:{c_failed}"] == {
        **op.outcomes[f"container:{c_failed}"],
        "outcome": "done",
        "detail": "stopped and removed",
    }
    assert op.outcomes[f"container:{c_exited}"]["outcome"] == TargetOutcome.DONE
    left = box.ids()
    assert c_late in left and c_live in left and c_neighbour in left
    assert c_failed not in left and c_exited not in left
    assert [a.action for a in AuditEntry.objects.filter(operation=op).order_by("at", "id")] == [
        AuditAction.REQUESTED,
        AuditAction.APPROVED,
        AuditAction.STARTED,
        AuditAction.SUCCEEDED,
    ]


def test_a_plan_that_finds_nothing_creates_nothing(users, box):
    scaler = make_scaler(name=f"ops-o-{secrets.token_hex(3)}", config={"networkIsolation": False})
    live = make_agent(scaler, state=AgentState.RUNNING, registered_at=timezone.now(), reserve=False)
    box.make(scaler.name, live.agent_id)
    response = _client(users["operator"]).post(
        "/operations/plan/", {"kind": "orphan-containers", "scaler": scaler.name}
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "nothing to do" in text and "tracked: agent" in text
    assert Operation.objects.count() == 0


def test_the_preview_names_a_containers_owner_from_its_labels_when_no_agent_row_does(users, box):
    scaler = make_scaler(name=f"ops-o-{secrets.token_hex(3)}", config={"networkIsolation": False})
    rowless, failed = agent_id(), agent_id()
    make_agent(scaler, state=AgentState.FAILED, agent_id=failed, reserve=False)  # its row's owner: "test"
    c_rowless = box.make(scaler.name, rowless, state="exited")  # no agent row: only its labels say whose
    c_failed = box.make(scaler.name, failed, state="exited")
    # a dead container of a second console on a restored copy of the database: spared, and whose it is shown
    second = Owner(Installation.current_id(), "console-b", scaler.name)
    c_foreign = box.make(scaler.name, agent_id(), state="exited", owner=second)

    response = _client(users["operator"]).post(
        "/operations/plan/", {"kind": "orphan-containers", "scaler": scaler.name, "request": "1"}
    )
    assert response.status_code == 302
    op = Operation.objects.get()
    planned = {t["key"]: t["evidence"] for t in op.plan}
    assert planned[f"container:{c_rowless}"]["agent_row"] == "none"
    assert planned[f"container:{c_rowless}"]["owner_instance"] == settings.KICI_INSTANCE_ID
    assert planned[f"container:{c_failed}"]["owner_instance"] == "test"
    (spared,) = op.spared
    assert spared["key"] == f"container:{c_foreign}" and spared["evidence"]["owner_instance"] == "console-b"

    page = _client(users["viewer"]).get(f"/operations/{op.pk}/").content.decode()

    def owner_shown(container_id: str) -> str:
        row = page.split(f"container:{container_id}", 1)[1].split("</tr>", 1)[0]
        return re.search(r"<dt>owner</dt><dd>([^<]*)</dd>", row).group(1)

    assert owner_shown(c_rowless) == settings.KICI_INSTANCE_ID
    assert owner_shown(c_failed) == "test"
    assert owner_shown(c_foreign) == "console-b"


def test_stale_rules_are_reaped_but_never_an_address_a_container_holds(users, box, netns_nft, run_rq_jobs):
    from network.nft.spec import AgentSpec

    scaler = make_scaler(name=f"ops-r-{secrets.token_hex(3)}")
    neighbour = make_scaler(name=f"ops-r-{secrets.token_hex(3)}")
    holder = box.make(neighbour.name, agent_id())
    held = box.address(holder)
    netns_nft.ensure_table()
    for address in ("172.30.250.21", "172.30.250.22", held):
        netns_nft.apply_agent(AgentSpec.build(address, "172.30.0.1", host_access=["*:8000"]))

    response = _client(users["operator"]).post(
        "/operations/plan/", {"kind": "stale-isolation-rules", "scaler": scaler.name, "request": "1"}
    )
    assert response.status_code == 302, response.content.decode()[:500]
    op = Operation.objects.get()
    assert sorted(t["subject"] for t in op.plan) == ["172.30.250.21", "172.30.250.22"]
    assert all(t["evidence"]["address_holders"] == [] for t in op.plan)
    (spared,) = op.spared
    assert spared["subject"] == held and "container ops-" in spared["reason"] and neighbour.name in spared["reason"]

    # an agent takes 172.30.250.22 before the approval: its rules must survive
    make_agent(scaler, state=AgentState.RUNNING, ip="172.30.250.22", registered_at=timezone.now(), reserve=False)
    with listening_worker(QUEUE):
        assert _client(users["approver"]).post(f"/operations/{op.pk}/approve/").status_code == 302
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    assert op.status == OperationStatus.SUCCEEDED, (op.error, op.log)
    outcomes = {op.plan[i]["subject"]: op.outcomes[op.plan[i]["key"]] for i in range(2)}
    assert outcomes["172.30.250.21"]["outcome"] == TargetOutcome.DONE
    assert outcomes["172.30.250.22"]["outcome"] == TargetOutcome.SKIPPED
    assert "spared since the preview: held by agent" in outcomes["172.30.250.22"]["detail"]
    assert {str(a) for a in netns_nft.list_agents()} == {"172.30.250.22", held}


def test_a_bare_metal_scaler_in_container_mode_has_its_orphan_containers_reaped_too(users, box, run_rq_jobs):
    scaler = make_scaler(
        name=f"ops-bm-{secrets.token_hex(3)}",
        type="bare-metal",
        config={"networkIsolation": False},
        ls_config={"image": "kici-agent:local"},
    )
    orphan = box.make(scaler.name, agent_id(), state="exited")
    op = Operation.objects.get(
        pk=_client(users["operator"])
        .post("/operations/plan/", {"kind": "orphan-containers", "scaler": scaler.name, "request": "1"})
        .url.split("/")[-2]
    )
    assert [t["key"] for t in op.plan] == [f"container:{orphan}"]
    with listening_worker(QUEUE):
        assert _client(users["approver"]).post(f"/operations/{op.pk}/approve/").status_code == 302
    run_rq_jobs(QUEUE)
    op.refresh_from_db()
    assert op.outcomes[f"container:{orphan}"]["outcome"] == TargetOutcome.DONE, op.outcomes
    assert orphan not in box.ids()


def test_an_orphan_appears_on_the_dashboard_within_one_sweep_with_no_operation_stored(users, box, docker_client):
    from operations.attention import needs_attention
    from operations.management.commands.scaler_sweeper import Command
    from operations.models import Finding

    scaler = make_scaler(name=f"ops-f-{secrets.token_hex(3)}", config={"networkIsolation": False})
    left_behind = box.make(scaler.name, agent_id(), state="exited")  # labelled, untracked: an orphan
    sweeper = Command()
    assert sweeper.handle_findings() is True  # one sweeper round's detection
    finding = Finding.objects.get(scaler=scaler)
    assert finding.key == f"container:{left_behind}" and finding.evidence["container_state"] == "exited"
    assert not Operation.objects.exists() and not AuditEntry.objects.exists(), "no operation: no badge, no notice"

    viewer = _client(users["viewer"])
    dashboard = viewer.get("/").content.decode()
    assert f"1 orphan container found on {scaler.name}, nothing planned: {finding.subject} (" in dashboard
    assert f'href="/scalers/{scaler.name}/#findings"' in dashboard
    assert needs_attention().counts["findings"] == 1
    page = viewer.get(f"/scalers/{scaler.name}/").content.decode()
    section = page[page.index('id="findings"') :]
    assert finding.subject in section and "stop and remove container" in section and "exited" in section

    assert sweeper.handle_findings() is False  # found again: nothing new
    assert Finding.objects.get(scaler=scaler).first_seen_at == finding.first_seen_at
    docker_client.api.remove_container(left_behind, force=True)  # gone: so is its finding, next round
    assert sweeper.handle_findings() is True and not Finding.objects.filter(scaler=scaler).exists()
    assert not Operation.objects.exists()
