"""What needs a person (operations.attention.needs_attention): the dashboard's "Needs attention"
panel, the nav badge on every page, and the number of queries they cost."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from operations.attention import FAILING_AFTER, needs_attention
from operations.choices import OperationStatus
from operations.models import Finding, Operation
from scalers.models import Scaler, ScaleRequest
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def panel(client) -> str:
    """The dashboard's "Needs attention" list."""
    html = client.get("/").content.decode()
    return html.split('id="attention-items"', 1)[1].split("</section>", 1)[0]


def badge(client, path: str = "/agents/") -> str:
    """The nav badge's count on ``path``."""
    html = client.get(path).content.decode()
    return html.split('id="attention-badge"', 1)[1].split('data-count="', 1)[1].split('"', 1)[0]


def plan(scaler_name: str = "", **fields) -> Operation:
    return Operation.objects.create(
        kind=fields.pop("kind", "orphan-containers"),
        scaler_name=scaler_name,
        host_queue="host:test",
        scope_key=f"k-{scaler_name}",
        plan_digest="d",
        expires_at=fields.pop("expires_at", timezone.now() + timedelta(hours=1)),
        **fields,
    )


def find(scaler: Scaler, key: str, subject: str, kind: str = "orphan-containers", **evidence) -> Finding:
    """A finding as a detection round stores it (operations.findings)."""
    now = timezone.now()
    evidence = evidence or {"why": "no agent row", "container_state": "exited"}
    return Finding.objects.create(
        kind=kind,
        scaler=scaler,
        key=key,
        subject=subject,
        action="stop and remove container",
        evidence=evidence,
        first_seen_at=now,
        last_seen_at=now,
    )


def lose(agent: Agent, lost_by: str = "heartbeat") -> None:
    """The mark the lost-agents sweep leaves (operations.kinds.lost_agents)."""
    beat = timezone.now() - timedelta(minutes=5)
    Agent.objects.filter(pk=agent.pk).update(
        last_heartbeat=beat,
        lost={
            "at": timezone.now().isoformat(),
            "heartbeat_at": beat.isoformat(),
            "lost_by": lost_by,
            "sandbox": "running",
            "reasons": ["no heartbeat for 300s"],
            "operation": None,
        },
    )


def refuse(job_id: str, scaler: str = "c", cap: str = "maxAgents", outcome: str = "at-capacity", **fields):
    now = timezone.now()
    return ScaleRequest.objects.create(
        job_id=job_id,
        outcome=outcome,
        cap=cap,
        scaler_name=scaler,
        first_requested_at=fields.pop("first_requested_at", now),
        decided_at=fields.pop("decided_at", now),
        **fields,
    )


def test_nothing_needs_you_and_the_badge_is_hidden(viewer_client):
    make_scaler("c")
    assert "Nothing needs you." in panel(viewer_client)
    html = viewer_client.get("/scalers/").content.decode()
    assert 'id="attention-badge"' in html and 'data-count="0"' in html and "hidden>0" in html
    assert 'ws-connect="/ws/attention/"' in html and 'ws-connect="/ws/attention/?panel=1"' not in html
    assert 'ws-connect="/ws/attention/?panel=1"' in viewer_client.get("/").content.decode()


def test_the_badge_and_panel_need_the_view_permission(outsider_client):
    html = outsider_client.get("/").content.decode()
    assert "attention-badge" not in html and "/ws/attention/" not in html


def test_an_operation_awaiting_approval_appears_and_goes_when_decided(viewer_client):
    older = plan("c")
    Operation.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(minutes=20))
    newer = plan("d", kind="lost-agents")
    shown = panel(viewer_client)
    assert "2 operations await approval" in shown and 'href="/operations/?status=planned"' in shown
    assert f'href="/operations/{older.pk}/"' in shown and f"#{older.pk} Reap orphan containers (c)" in shown
    assert f'href="/operations/{newer.pk}/"' in shown and "oldest" in shown
    assert badge(viewer_client) == "2"
    Operation.objects.filter(pk=older.pk).update(status=OperationStatus.REJECTED)
    Operation.objects.filter(pk=newer.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert "Nothing needs you." in panel(viewer_client) and badge(viewer_client) == "0"


def test_lost_agents_appear_by_scaler_and_go_when_they_heartbeat(viewer_client):
    a, b = make_scaler("a"), make_scaler("b")
    lost_a = [make_agent(a, AgentState.RUNNING) for _ in range(2)]
    lost_b = make_agent(b, AgentState.DRAINING)
    for agent in lost_a:
        lose(agent)
    lose(lost_b, lost_by="sandbox")
    shown = panel(viewer_client)
    assert "2 lost agents on a (2 silent)" in shown and 'href="/scalers/a/"' in shown
    assert "1 lost agent on b (1 sandbox gone)" in shown
    assert badge(viewer_client) == "3"
    Agent.objects.filter(pk__in=[x.pk for x in lost_a]).update(last_heartbeat=timezone.now())  # heard again
    Agent.objects.filter(pk=lost_b.pk).update(state=AgentState.DESTROYED)  # released
    assert "Nothing needs you." in panel(viewer_client)


def test_a_lost_mark_with_an_unreadable_time_still_counts_and_the_readable_one_dates_the_item():
    scaler = make_scaler("a")
    garbled, dated = make_agent(scaler, AgentState.RUNNING), make_agent(scaler, AgentState.RUNNING)
    lose(garbled)
    lose(dated)
    Agent.objects.filter(pk=garbled.pk).update(lost={**Agent.objects.get(pk=garbled.pk).lost, "at": "not a time"})
    [item] = [i for i in needs_attention().items if i.kind == "lost"]
    assert item.count == 2
    assert item.since == datetime.fromisoformat(Agent.objects.get(pk=dated.pk).lost["at"])


def test_jobs_waiting_on_caps_appear_by_scaler_and_cap_and_go_when_admitted(viewer_client):
    refuse("j1")
    refuse("j2")
    refuse("j3", cap="machinePool.cpu")
    refuse("j4", scaler="", cap="", outcome="no-backend")
    refuse("old", decided_at=timezone.now() - timedelta(hours=7))  # out of the why-waiting window
    shown = panel(viewer_client)
    assert "2 jobs waiting on c: at capacity (maxAgents)" in shown
    assert "1 job waiting on c: at capacity (machinePool.cpu)" in shown
    assert "1 job refused by every scaler: no matching label set" in shown
    assert 'href="/scalers/why-waiting/"' in shown and badge(viewer_client) == "4"
    ScaleRequest.objects.exclude(job_id="old").update(outcome="spawning", cap="")
    assert "Nothing needs you." in panel(viewer_client)


def test_spawns_waiting_long_for_a_slot_appear_and_go_once_started(viewer_client):
    c = make_scaler("c", max_concurrent_spawns=2)
    waiting = [make_agent(c, AgentState.SPAWNING) for _ in range(3)]
    assert "Nothing needs you." in panel(viewer_client)  # queued for seconds: the semaphore working
    Agent.objects.filter(pk__in=[a.pk for a in waiting]).update(created_at=timezone.now() - timedelta(minutes=2))
    shown = panel(viewer_client)
    assert "3 admitted spawns on c waiting for a slot (maxConcurrentSpawns = 2)" in shown
    assert 'href="/scalers/c/"' in shown
    Agent.objects.filter(pk__in=[a.pk for a in waiting]).update(rq_job_id="spawn-x")
    assert "Nothing needs you." in panel(viewer_client)


def test_a_scaler_whose_host_is_not_ready_appears_and_goes_once_ready(viewer_client):
    make_scaler("fc", type="firecracker")
    Scaler.objects.filter(name="fc").update(
        host_error="BridgePortIsolationUnavailable: bridge port isolation is not available on kici-br0\nmore",
        host_checked_at=timezone.now(),
    )
    shown = panel(viewer_client)
    assert "scaler fc: host not ready" in shown and "not available on kici-br0)" in shown and "more" not in shown
    assert badge(viewer_client) == "1"
    Scaler.objects.filter(name="fc").update(host_error="")
    assert "Nothing needs you." in panel(viewer_client)


def test_a_failing_scaler_appears_after_consecutive_failures_and_goes_on_a_registration(viewer_client):
    c = make_scaler("c")
    agents = [make_agent(c, AgentState.FAILED) for _ in range(FAILING_AFTER)]
    for agent in agents[:-1]:
        record_event(agent, EventType.FAILED, "image pull failed")
    assert "Nothing needs you." in panel(viewer_client)  # one short of failing
    record_event(agents[-1], EventType.FAILED, "image pull failed")
    shown = panel(viewer_client)
    assert f"scaler c is failing: {FAILING_AFTER} spawn failures in a row" in shown
    assert 'href="/events/?type=scaler.failed&amp;scaler=c"' in shown
    record_event(make_agent(c, AgentState.RUNNING), EventType.REGISTERED, "registered")
    assert "Nothing needs you." in panel(viewer_client)


def test_isolation_repairs_of_the_last_hour_appear_and_age_out(viewer_client):
    make_scaler("c")
    record_event(None, EventType.NETWORK, "isolation rules re-applied: 3 chains were missing", scaler_name="c")
    record_event(None, EventType.NETWORK, "isolation base of table kici was rewritten", scaler_name="c")
    record_event(None, EventType.NETWORK, "rules written for 10.0.0.2", scaler_name="c")  # a spawn's, not a repair
    shown = panel(viewer_client)
    assert "isolation repaired 2 times in the last 60 min on c" in shown
    assert 'href="/events/?type=scaler.network&amp;scaler=c"' in shown and badge(viewer_client) == "2"
    ScalerEvent.objects.update(created_at=timezone.now() - timedelta(minutes=61))
    assert "Nothing needs you." in panel(viewer_client)


def hold(agent: Agent, by: str = "", minutes: int = 120) -> None:
    """The hold ``scalers.holds.take_hold`` leaves: an operator's (``by``) or the label set's."""
    now = timezone.now()
    until = now + timedelta(minutes=minutes)
    source = {"source": "operator", "by": by} if by else {"source": "label-set", "by": "scalers.yaml"}
    Agent.objects.filter(pk=agent.pk).update(
        state=AgentState.HELD,
        held_until=until,
        hold=source
        | {"reason": "look inside", "seconds": minutes * 60, "since": now.isoformat(), "until": until.isoformat()},
    )


def test_held_agents_appear_per_scaler_with_who_holds_each_until_they_end(viewer_client):
    c, d = make_scaler("c"), make_scaler("d")
    a = make_agent(c, AgentState.RUNNING, agent_id="held-a", managed_id="ca")
    b = make_agent(c, AgentState.RUNNING, agent_id="held-b", managed_id="cb")
    hold(a, by="alice", minutes=30)
    hold(b)
    make_agent(d, AgentState.RUNNING, agent_id="busy-d", managed_id="cd")  # running: needs nobody
    shown = panel(viewer_client)
    assert "2 held agents on c: their sandboxes kept for debugging and counted against its caps" in shown
    assert 'href="/agents/?state=held&amp;scaler=c"' in shown and 'href="/agents/held-a/"' in shown
    assert "held-a (held by alice, until " in shown and "held-b (debugHold.onFailure, until " in shown
    # The soonest to end first.
    assert shown.index("held-a (") < shown.index("held-b (")
    assert " on d" not in shown and badge(viewer_client) == "2"
    assert needs_attention().summary == "2 held agents"
    Agent.objects.filter(pk=a.pk).update(state=AgentState.DESTROYED)
    assert "1 held agent on c: its sandbox kept" in panel(viewer_client) and badge(viewer_client) == "1"
    assert needs_attention().summary == "1 held agent"  # the badge's title: one is not "agents"
    Agent.objects.filter(pk=b.pk).update(state=AgentState.FAILED)
    assert "Nothing needs you." in panel(viewer_client)


def _many(n: int, tag: str) -> None:
    """``n`` of every kind, spread over three scalers."""
    scalers = [make_scaler(f"{tag}-{i}") for i in range(3)]
    for i in range(n):
        s = scalers[i % 3]
        plan(s.name)
        lose(make_agent(s, AgentState.RUNNING))
        refuse(f"{tag}-job-{i}", scaler=s.name, cap=("maxAgents", "resourceCap.cpu")[i % 2])
        spawn = make_agent(s, AgentState.SPAWNING)
        Agent.objects.filter(pk=spawn.pk).update(created_at=timezone.now() - timedelta(minutes=5))
        record_event(None, EventType.NETWORK, f"isolation rules re-applied ({i})", scaler_name=s.name)
        failed = make_agent(s, AgentState.FAILED)
        record_event(failed, EventType.FAILED, "failed")
        find(s, f"container:{tag}-{i}", f"kici-{tag}-{i}")
        hold(make_agent(s, AgentState.HELD, managed_id=f"c-{tag}-{i}"), by="alice")
    Scaler.objects.filter(name__startswith=tag).update(host_error="RuntimeError: no bridge")


def test_the_summary_costs_the_same_queries_however_many_rows(viewer_client):
    _many(6, "few")
    viewer_client.get("/")  # the first page creates the config row and the session
    with CaptureQueriesContext(connection) as few:
        first = needs_attention()
    with CaptureQueriesContext(connection) as page_few:
        viewer_client.get("/")
    _many(60, "many")
    needs_attention()  # new scalers: the caps' config rows are read again, once (the shared world cache)
    with CaptureQueriesContext(connection) as many:
        second = needs_attention()
    with CaptureQueriesContext(connection) as page_many:
        viewer_client.get("/")
    assert (
        first.counts["lost"] == 6 and second.counts["lost"] == 66 and second.counts["not_ready"] == 6 + 3
    )  # hosts, and the "many" scalers failing
    # Every refused job still asking counts, under the cap its decision named, and every slot wait.
    assert first.counts["waiting"] == 6 + 6 and second.counts["waiting"] == 66 + 66
    assert first.counts["findings"] == 6 and second.counts["findings"] == 66
    assert first.counts["held"] == 6 and second.counts["held"] == 66
    assert len(few) == len(many) == 11
    assert len(page_few) == len(page_many)


def test_findings_appear_with_their_evidence_until_an_operation_plans_them(viewer_client):
    c = make_scaler("c")
    for n in range(5):
        find(c, f"container:{n}", f"kici-orphan-{n}", why="its agent row is failed", container_state="running")
    find(c, "rules:172.30.0.9", "172.30.0.9", kind="stale-isolation-rules", why="no agent holds this address")
    shown = panel(viewer_client)
    assert (
        "5 orphan containers found on c, nothing planned: kici-orphan-0 (its agent row is failed; running); "
        "kici-orphan-1 (its agent row is failed; running); kici-orphan-2 (its agent row is failed; running); "
        "and 2 more" in shown
    )
    assert "1 stale isolation rule set found on c, nothing planned: 172.30.0.9 (no agent holds this address)" in shown
    assert 'href="/scalers/c/#findings"' in shown and badge(viewer_client) == "6"
    Operation.objects.create(
        kind="orphan-containers",
        scaler=c,
        scaler_name="c",
        host_queue="host:test",
        scope_key="k",
        plan_digest="d",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    shown = panel(viewer_client)
    assert "orphan containers found" not in shown and "1 awaiting approval" in viewer_client.get("/").content.decode()
    assert badge(viewer_client) == "2"  # the operation, and the rule set nobody planned
