"""The "Why is this job waiting?" page: each waiting request, the cap that refused it, and the
reservations holding that cap (age, agent, state, owner instance)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from front.views.waiting import waiting_groups
from operations.attention import needs_attention
from scalers.admission.ledger import release
from scalers.models import ScaleRequest
from tests.support.admission import request_scale
from tests.support.scalers import make_pool, make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]

GIB = 2**30
#: A job of 2 cpus and 2 GiB, and for each cap the settings (global, scaler, machine pool) under
#: which one such job fills that cap and a second one is refused by it.
JOB = {"cpus": 2, "memory": "2g"}
CAP_SETTINGS = {
    "globalMaxAgents": ({"max_agents": 1}, {}, None),
    "maxAgents": ({}, {"max_agents": 1}, None),
    "resourceCap.cpu": ({}, {"cpu": 2}, None),
    "resourceCap.memory": ({}, {"memory": 2 * GIB}, None),
    "globalResourceCap.cpu": ({"cpu": 2}, {}, None),
    "globalResourceCap.memory": ({"memory": 2 * GIB}, {}, None),
    "machinePool.cpu": ({}, {}, {"cpu": 2}),
    "machinePool.memory": ({}, {}, {"memory": 2 * GIB}),
}


@pytest.fixture
def browser_client(settings, viewer_client):
    settings.KICI_INSTANCE_ID = "console-a"
    return viewer_client


def test_it_requires_login():
    r = Client().get("/scalers/why-waiting/")
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]


def test_it_refuses_a_signed_in_user_without_view_permission(outsider_client):
    assert outsider_client.get("/scalers/why-waiting/").status_code == 403


def test_it_shows_the_refusing_cap_and_the_reservations_holding_it(browser_client):
    make_scaler("c", max_agents=2)
    held = [request_scale(["linux"], f"run-{i}").agent for i in range(2)]
    request_scale(["linux"], "waiting-job", run_id="run-9")
    request_scale(["windows"], "lost-job")
    r = browser_client.get("/scalers/why-waiting/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "waiting-job" in html and "maxAgents" in html and "maxAgents = 2" in html
    for agent_id in held:
        assert agent_id in html
    assert "console-a" in html and "spawning" in html
    assert "lost-job" in html and "No label set matches" in html
    assert (
        "run-0" not in html.split("Waiting jobs")[1].split("Reservations holding")[0]
    )  # admitted jobs are not waiting


def test_groups_scope_holders_to_the_cap():
    set_global(max_agents=3)
    pool = make_pool("box", cpu=2)
    make_scaler("a", max_agents=5, label_sets=[["a"]], pool=pool)
    make_scaler("b", max_agents=5, label_sets=[["b"]], pool=pool)
    make_scaler("x", max_agents=5, label_sets=[["x"]])
    a1 = request_scale(["a"], "a1", resources={"cpus": 2}).agent
    request_scale(["b"], "b1", resources={"cpus": 1})  # machinePool.cpu on b, held by a's agent
    (pool_group,) = waiting_groups()
    assert (pool_group.cap, pool_group.scaler) == ("machinePool.cpu", "b")
    assert [h.agent_id for h in pool_group.holders] == [a1]
    assert pool_group.requests[0].job_id == "b1"
    x1 = request_scale(["x"], "x1").agent
    x2 = request_scale(["x"], "x2").agent
    request_scale(["x"], "x3")  # globalMaxAgents, held by everyone
    # globalMaxAgents, checked first, now refuses b1 too: it is held by that cap, not the pool's.
    (glob,) = waiting_groups()
    assert (glob.cap, glob.scaler) == ("globalMaxAgents", "")
    assert [r.job_id for r in glob.requests] == ["x3", "b1"]
    assert {h.agent_id for h in glob.holders} == {a1, x1, x2}
    assert glob.holders_total == 3 and glob.limit == "globalMaxAgents = 3"


def test_a_job_admitted_later_stops_waiting():
    make_scaler("c", max_agents=1)
    first = request_scale(["linux"], "first")
    request_scale(["linux"], "second")
    assert [r.job_id for g in waiting_groups() for r in g.requests] == ["second"]
    Agent.objects.filter(agent_id=first.agent).update(state=AgentState.DESTROYED)
    release(first.agent, "done")
    assert request_scale(["linux"], "second").action == "spawning"
    assert waiting_groups() == []


def test_a_request_that_exceeds_a_cap_is_shown_as_never_admittable_without_holders(browser_client):
    set_global(max_agents=10, cpu=4)
    make_scaler("c", max_agents=5)
    held = request_scale(["linux"], "small", resources={"cpus": 1}).agent
    assert request_scale(["linux"], "huge", resources={"cpus": 5}).action == "exceeds-cap"
    (group,) = waiting_groups()
    assert (group.outcome, group.cap, group.scope, group.holders) == ("exceeds-cap", "globalResourceCap.cpu", "", [])
    html = browser_client.get("/scalers/why-waiting/").content.decode()
    assert "can never be admitted: request exceeds cap" in html.lower() and "globalResourceCap.cpu" in html
    assert "huge" in html and "Reservations holding" not in html and held not in html


def test_a_job_its_agent_serves_is_not_waiting_when_it_asks_again():
    make_scaler("c", max_agents=1)
    agent_id = request_scale(["linux"], "job").agent
    # The orchestrator asks again for the same job while its own agent holds the only slot: the
    # answer is that agent (idempotent scale), never a refusal that would count it as waiting.
    again = request_scale(["linux"], "job")
    assert (again.action, again.agent) == ("replayed", agent_id)
    assert ScaleRequest.objects.get(job_id="job").outcome != "at-capacity"
    assert waiting_groups() == [] and needs_attention().counts["waiting"] == 0
    Agent.objects.filter(agent_id=agent_id).update(state=AgentState.DESTROYED, completed_job_id="job")
    assert waiting_groups() == [] and needs_attention().counts["waiting"] == 0  # it ran


def test_a_job_whose_agent_failed_before_it_asked_again_is_waiting():
    make_scaler("c", max_agents=1)
    failed = request_scale(["linux"], "job").agent
    Agent.objects.filter(agent_id=failed).update(state=AgentState.FAILED)  # its reservation still held
    assert request_scale(["linux"], "job").action == "at-capacity"
    assert [r.job_id for g in waiting_groups() for r in g.requests] == ["job"]
    assert needs_attention().counts["waiting"] == 1


def attention_lines() -> list[str]:
    return [item.text for item in needs_attention().items]


def end(agent_id: str) -> None:
    """The agent is gone and its reservation released, as a teardown leaves it."""
    Agent.objects.filter(agent_id=agent_id).update(state=AgentState.DESTROYED)
    release(agent_id, "destroyed")


@pytest.mark.parametrize("cap", CAP_SETTINGS)
def test_the_page_follows_the_cap_that_holds_a_job_and_the_count_does_not_flap(cap, browser_client):
    glob, caps, pool = CAP_SETTINGS[cap]
    set_global(**glob)
    make_scaler("c", **caps, pool=make_pool("box", **pool) if pool is not None else None)
    holder = request_scale(["linux"], "holder", resources=JOB).agent
    refused = request_scale(["linux"], "waiting", resources=JOB)
    assert (refused.action, refused.cap) == ("at-capacity", cap)
    # Still full: held by its cap and the holder's reservation, and it needs a person.
    (group,) = waiting_groups()
    assert (group.cap, group.freed, [h.agent_id for h in group.holders]) == (cap, False, [holder])
    assert attention_lines() == [f"1 job waiting on c: at capacity ({cap})"]
    # The holder ends: the cap would admit the job now. The page says so; the count stays until the
    # orchestrator asks again (admitted) or stops asking (its retry window), so it does not flap.
    end(holder)
    (group,) = waiting_groups()
    assert (group.cap, group.freed, group.holders, group.requests[0].job_id) == (cap, True, [], "waiting")
    assert attention_lines() == [f"1 job waiting on c: at capacity ({cap})"]
    html = browser_client.get("/scalers/why-waiting/").content.decode()
    assert "Capacity freed:" in html and "waits for the orchestrator to ask again" in html and "data-freed" in html
    assert "Reservations holding" not in html
    # Another job takes the room before the orchestrator asks again: held again.
    other = request_scale(["linux"], "other", resources=JOB).agent
    (group,) = waiting_groups()
    assert (group.cap, group.freed, [h.agent_id for h in group.holders]) == (cap, False, [other])
    assert attention_lines() == [f"1 job waiting on c: at capacity ({cap})"]
    # Admitted when it asks again: not waiting.
    end(other)
    assert request_scale(["linux"], "waiting", resources=JOB).action == "spawning"
    assert waiting_groups() == [] and attention_lines() == []


def test_a_job_refused_by_one_cap_is_shown_under_the_cap_that_holds_it_now(browser_client):
    set_global(max_agents=2)
    make_scaler("c", max_agents=1, label_sets=[["c"]])
    make_scaler("d", max_agents=5, label_sets=[["d"]])
    end_first = request_scale(["c"], "c1").agent
    assert request_scale(["c"], "waiting").cap == "maxAgents"
    end(end_first)
    request_scale(["d"], "d1")
    request_scale(["d"], "d2")  # c has room again, but the console is full
    (group,) = waiting_groups()
    assert (group.cap, group.scaler, group.freed, len(group.holders)) == ("globalMaxAgents", "", False, 2)
    assert attention_lines() == ["1 job waiting on c: at capacity (maxAgents)"]  # as its decision named it
    html = browser_client.get("/scalers/why-waiting/").content.decode()
    assert "maxAgents reached on scaler c" in html and "(now held by globalMaxAgents)" in html


@pytest.mark.parametrize("outcome_cap", [("at-capacity", "maxAgents"), ("skipped", "")])
def test_a_job_told_to_ask_again_stops_waiting_once_it_stops_asking(settings, browser_client, outcome_cap):
    """Retry-After 10 s: a job not asked about for three intervals (at least a minute) is no longer
    the orchestrator's current job here; a permanent refusal is shown for the whole window."""
    settings.KICI_SCALE_RETRY_AFTER_SECONDS = 10
    make_scaler("c", max_agents=1)
    request_scale(["linux"], "holder", resources=JOB)
    outcome, cap = outcome_cap
    now = timezone.now()
    ScaleRequest.objects.create(
        job_id="asking",
        labels=["linux"],
        outcome=outcome,
        cap=cap,
        scaler_name="c",
        decided_at=now,
        first_requested_at=now,
    )
    ScaleRequest.objects.create(
        job_id="gone-quiet",
        labels=["linux"],
        outcome=outcome,
        cap=cap,
        scaler_name="c",
        decided_at=now - timedelta(seconds=61),
        first_requested_at=now - timedelta(minutes=5),
    )
    ScaleRequest.objects.create(
        job_id="never",
        labels=["linux"],
        outcome="no-backend",
        scaler_name="",
        decided_at=now - timedelta(hours=5),
        first_requested_at=now - timedelta(hours=5),
    )
    waiting = {r.job_id for g in waiting_groups() for r in g.requests}
    assert waiting == {"asking", "never"}
    assert sum(item.count for item in needs_attention().items if item.kind == "waiting") == 2


def test_a_job_is_answered_first_with_the_reservations_holding_its_cap(browser_client):
    make_scaler("c", max_agents=1)
    holder = request_scale(["linux"], "holder").agent
    request_scale(["linux"], "stuck")
    html = browser_client.get("/scalers/why-waiting/?job=stuck").content.decode()
    answer = html.split('id="job-answer"')[1].split("</section>")[0]
    assert "Waiting for <code" in answer and "maxAgents = 1" in answer and "1 reservation holds it" in answer
    assert html.index(holder) < html.index('aria-label="Waiting jobs"')  # the holders come before the jobs
    served = browser_client.get("/scalers/why-waiting/?job=holder").content.decode()
    assert "Not waiting: agent <a" in served and holder in served.split('id="job-answer"')[1]
    unknown = browser_client.get("/scalers/why-waiting/?job=nobody-asked").content.decode()
    assert "The console decided no request for this job" in unknown


def test_the_page_filters_by_scaler_and_says_how_many_more_a_group_holds(browser_client, settings):
    from front.views.waiting import GROUP_ROWS

    make_scaler("c", max_agents=1, label_sets=[["c"]])
    make_scaler("d", max_agents=1, label_sets=[["d"]])
    request_scale(["c"], "c-holder")
    request_scale(["d"], "d-holder")
    for i in range(GROUP_ROWS + 3):
        request_scale(["c"], f"c-{i}")
    request_scale(["d"], "d-waiting")
    html = browser_client.get("/scalers/why-waiting/?scaler=c").content.decode()
    assert "and 3 more jobs in this group (older)" in html and f"Jobs ({GROUP_ROWS + 3})" in html
    assert "d-waiting" not in html and "c-52" in html and "c-0<" not in html
    everything = browser_client.get("/scalers/why-waiting/").content.decode()
    assert "d-waiting" in everything
    line = next(i for i in needs_attention().items if "on c:" in i.text)
    assert line.url == "/scalers/why-waiting/?scaler=c" and line.count == GROUP_ROWS + 3


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("jobs=x", "jobs: unknown parameter"),
        ("job=a&job=b", "job: takes one value"),
        ("job=" + "x" * 201, "job: at most"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(browser_client, query, message):
    r = browser_client.get(f"/scalers/why-waiting/?{query}")
    assert r.status_code == 400 and message in r.content.decode()


def test_a_job_refused_before_it_was_sized_shows_no_resources_rather_than_zero(browser_client):
    from scalers.pauses import set_pause

    scaler = make_scaler("c", max_agents=2)
    set_pause(scaler=scaler, reason="disk swap", requested_by="op", approved_by="ap", operation=None)
    request_scale(["linux"], "paused-job")
    html = browser_client.get("/scalers/why-waiting/").content.decode()
    row = html[html.index('<td class="mono">paused-job</td>') :]
    row = row[: row.index("</tr>")]
    assert "not sized" in row and ">0<" not in row and "0 B" not in row, row
