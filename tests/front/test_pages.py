"""Operator pages with the Django test client: access rules, what each page shows, htmx partials,
and the live-update HTML rendered from the same partials as the pages."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from front.views.event_feed import EVENTS_PAGE_SIZE
from live.render import render_live_update
from live.rows import row_view
from scalers.models import ConfigState, LabelSet, Reservation, Scaler

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def _user(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw-" + username)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


@pytest.fixture
def scaler():
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 20, "global_max_cpu": 16.0})
    s = Scaler.objects.create(
        name="ci-containers", type="container", max_agents=5, max_cpu=4.0, max_memory_bytes=8 * 2**30
    )
    LabelSet.objects.create(
        scaler=s, index=0, labels=["linux", "docker"], normalized="docker,linux", config={"image": "kici-agent:local"}
    )
    LabelSet.objects.create(
        scaler=s, index=1, labels=["linux", "big"], normalized="big,linux", host_access=["172.30.0.1:53", "*:8000"]
    )
    return s


def _agent(scaler, n: int, state=AgentState.RUNNING, **kw) -> Agent:
    ls = scaler.label_sets.get(index=kw.pop("ls_index", 0))
    agent = Agent.objects.create(
        agent_id=f"scaler-container-{n:08x}",
        scaler=scaler,
        label_set=ls,
        state=state,
        labels=[*ls.labels, "kici:agent:container", f"kici:scaler:{scaler.name}"],
        ip=kw.pop("ip", f"172.30.0.{10 + n}"),
        owner_instance="test",
        **kw,
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=1.0, memory_bytes=2**30, owner_instance="test")
    return agent


# --- access -----------------------------------------------------------------------------------

PAGES = [
    "/",
    "/agents/",
    "/events/",
    "/scalers/",
    "/scalers/ci-containers/",
    "/scalers/ci-containers/label-sets/0/host-access/",
]


@pytest.mark.parametrize("url", PAGES)
def test_it_sends_anonymous_users_to_the_login_page(client, scaler, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/?next=")


@pytest.mark.parametrize("url", PAGES)
def test_it_refuses_users_without_the_view_permission(client, outsider, scaler, url):
    client.force_login(outsider)
    assert client.get(url).status_code == 403


@pytest.mark.parametrize("url", PAGES)
def test_it_shows_each_page_to_a_viewer(viewer_client, scaler, url):
    response = viewer_client.get(url)
    assert response.status_code == 200
    assert b"<!doctype html>" in response.content
    assert b"vendor/htmx/htmx-2.0.11.min.js" in response.content


def test_the_agent_pages_require_the_permission_too(client, outsider, scaler):
    agent = _agent(scaler, 1)
    client.force_login(outsider)
    for url in (
        f"/agents/{agent.agent_id}/",
        f"/agents/{agent.agent_id}/console/",
        f"/agents/{agent.agent_id}/isolation/",
    ):
        assert client.get(url).status_code == 403, url


def test_the_login_page_renders_and_signs_in(client, viewer):
    page = client.get("/accounts/login/?next=/agents/")
    assert page.status_code == 200 and b'name="username"' in page.content
    response = client.post(
        "/accounts/login/", {"username": viewer.username, "password": "pw-viewer", "next": "/agents/"}
    )
    assert response.status_code == 302 and response.url == "/agents/"


def test_the_page_frame_carries_the_csrf_header_for_htmx(viewer_client, scaler):
    html = viewer_client.get("/").content.decode()
    assert re.search(r"hx-headers='\{\"x-csrftoken\": \"[^\"]+\"\}'", html)


# --- dashboard --------------------------------------------------------------------------------


def test_the_dashboard_shows_capacity_agents_and_events(viewer_client, scaler):
    running = _agent(scaler, 1)
    _agent(scaler, 2, state=AgentState.SPAWNING)
    _agent(scaler, 3, state=AgentState.DESTROYED)  # terminal: not a live agent, still holds its row here
    record_event(running, EventType.READY, "container started")
    html = viewer_client.get("/").content.decode()
    card = html[html.index('id="cap-scaler-') :]
    card = card[: card.index("</div>\n</div>") if "</div>\n</div>" in card else 2000]
    assert "<b>3</b> / 5" in html  # three reservations against maxAgents 5
    assert "1 running" in html and "1 spawning" in html
    assert "<b>3</b> / 4" in html  # three reserved CPUs against resourceCap.maxCpu 4
    assert "3 GiB" in html and "8 GiB" in html
    assert 'id="cap-global"' in html and "/ 20" in html
    assert f'id="agent-{running.agent_id}"' in html
    assert "scaler-container-00000003" not in html.split('id="agent-rows"')[1].split("</tbody>")[0]
    assert "container started" in html
    assert 'ws-connect="/ws/events/"' in html and 'hx-ext="ws,kici-live"' in html


def test_the_dashboard_answers_a_resync_with_the_table_body_only(viewer_client, scaler):
    agent = _agent(scaler, 1)
    response = viewer_client.get("/?part=agents", **HTMX)
    html = response.content.decode().strip()
    assert html.startswith('<tbody id="agent-rows"')
    assert f'id="agent-{agent.agent_id}"' in html
    assert "<html" not in html


def _pushed_agent_row(html: str) -> str:
    """The agent row a live push carries in its ``data-upsert`` tbody."""
    start = html.index(">", html.index("data-upsert")) + 1
    return html[start : html.index("</tbody>", start)].strip()


def test_a_page_row_and_a_live_row_are_the_same_markup(viewer_client, scaler):
    agent = _agent(scaler, 1)
    page = viewer_client.get("/").content.decode()
    frames, shown = row_view("agents", {"state": "active"}).update({agent.agent_id}, set())
    row = _pushed_agent_row(frames[0])
    assert row.startswith(f'<tr id="agent-{agent.agent_id}"')
    assert row in page and shown == {agent.agent_id}


def test_the_live_update_carries_the_event_and_the_capacity_but_no_agent_row(scaler):
    agent = _agent(scaler, 1, state=AgentState.SPAWNING)
    event = record_event(agent, EventType.PROVISIONING, "creating container")
    html = render_live_update(event.pk)
    assert '<tbody hx-swap-oob="afterbegin:#event-rows">' in html
    assert f'id="event-{event.pk}"' in html and "creating container" in html
    # agent rows come from each page's own row view (live.rows), filtered for that page
    assert "agent-rows" not in html
    assert f'id="cap-scaler-{scaler.pk}" hx-swap-oob="outerHTML"' in html
    assert 'id="cap-global" hx-swap-oob="outerHTML"' in html
    assert "data-server-time=" in html


def test_the_live_update_of_a_vanished_event_is_empty(db):
    assert render_live_update(987654321) == ""


def test_the_live_update_of_an_event_without_an_agent_has_only_the_event_row(scaler):
    event = record_event(
        None, EventType.FAILED, "spawn refused", agent_ref="scaler-container-deadbeef", scaler_name=scaler.name
    )
    html = render_live_update(event)
    assert "spawn refused" in html and "agent-rows" not in html


# --- agents list ------------------------------------------------------------------------------


def test_the_agents_list_filters_by_state_scaler_and_search(viewer_client, scaler):
    other = Scaler.objects.create(name="other", type="container", max_agents=1)
    LabelSet.objects.create(scaler=other, index=0, labels=["x"], normalized="x")
    a1 = _agent(scaler, 1)
    a2 = _agent(scaler, 2, state=AgentState.FAILED, failure_reason="image pull failed\n--- captured output ---\nboom")
    a3 = _agent(other, 3, bound_job_id="job-4711")

    def ids(query):
        html = viewer_client.get("/agents/" + query).content.decode()
        return set(re.findall(r'<tr id="agent-([^"]+)"', html))

    assert ids("") == {a1.agent_id, a3.agent_id}  # default: active only
    assert ids("?state=all") == {a1.agent_id, a2.agent_id, a3.agent_id}
    assert ids("?state=failed") == {a2.agent_id}
    assert ids("?scaler=other") == {a3.agent_id}
    assert ids("?q=job-4711") == {a3.agent_id}
    assert ids("?q=172.30.0.11&state=all") == {a1.agent_id}
    assert ids("?q=docker&state=all") == {a1.agent_id, a2.agent_id}  # an exact label
    # An unknown state is refused naming it, never silently widened to every state.
    bogus = viewer_client.get("/agents/?state=bogus")
    assert bogus.status_code == 400 and "state: must be one of active, all, " in unescape(bogus.content.decode())
    assert 'got "bogus"' in unescape(bogus.content.decode())


def test_the_agents_list_answers_htmx_with_the_results_partial(viewer_client, scaler):
    _agent(scaler, 1)
    html = viewer_client.get("/agents/?state=all", **HTMX).content.decode().strip()
    assert html.startswith('<div id="results">') and "<html" not in html


# --- agent page -------------------------------------------------------------------------------


def test_the_agent_page_shows_state_labels_host_access_and_timeline(viewer_client, scaler):
    agent = _agent(
        scaler, 1, host_access=["172.30.0.1:53", "*:8000"], host_access_explicit=False, registered_at=timezone.now()
    )
    record_event(agent, EventType.PROVISIONING, "creating container")
    record_event(agent, EventType.READY, "container started")
    html = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert agent.agent_id in html and "st-running" in html
    assert "kici:agent:container" in html  # full labels, automatic ones included
    assert "172.30.0.1:53" in html and "*:8000" in html and ">default<" in html
    assert html.index("container started") < html.index("creating container")  # newest first
    assert f'ws-connect="/ws/agents/{agent.agent_id}/events/"' in html
    assert f'hx-get="/agents/{agent.agent_id}/isolation/"' in html


def test_the_agent_page_says_when_the_list_is_explicit_and_when_the_label_set_changed(viewer_client, scaler):
    agent = _agent(scaler, 1, ls_index=1, host_access=["172.30.0.1:53"], host_access_explicit=True)
    html = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert "explicit list" in html
    assert "changed since this agent was set up" in html  # label set now says 172.30.0.1:53, *:8000


def test_an_unknown_agent_is_a_404(viewer_client, db):
    assert viewer_client.get("/agents/scaler-container-nothere/").status_code == 404


def test_the_isolation_fragment_explains_an_agent_without_an_address(viewer_client, scaler):
    agent = _agent(scaler, 1, ip=None)
    html = viewer_client.get(f"/agents/{agent.agent_id}/isolation/", **HTMX).content.decode()
    assert "has no address yet" in html and "<html" not in html


def test_the_isolation_fragment_reports_an_absent_table_without_failing(viewer_client, scaler, settings):
    settings.KICI_NFT_TABLE = "ui_test_absent_table"
    agent = _agent(scaler, 1)
    response = viewer_client.get(f"/agents/{agent.agent_id}/isolation/", **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    # Either nft answered "no such table" (no rules) or could not run here: both are said plainly.
    assert "No isolation rules in force" in html or "could not read table inet ui_test_absent_table" in html


def test_the_selftest_is_post_only_and_needs_the_operator_permission(client, viewer, scaler):
    agent = _agent(scaler, 1)
    client.force_login(viewer)
    assert client.get(f"/agents/{agent.agent_id}/isolation/selftest").status_code == 405
    response = client.post(f"/agents/{agent.agent_id}/isolation/selftest", **HTMX)
    assert response.status_code == 403
    assert b"operations.request_operation" in response.content


def test_the_selftest_refuses_a_finished_agent_plainly(client, scaler):
    agent = _agent(scaler, 1, state=AgentState.DESTROYED)
    client.force_login(_user("op", "agents.view_agent", "agents.change_agent"))
    html = client.post(f"/agents/{agent.agent_id}/isolation/selftest", **HTMX).content.decode()
    assert f"agent {agent.agent_id} is destroyed and has" in html and "nothing to probe" in html


# --- console ----------------------------------------------------------------------------------


def test_the_console_page_connects_to_the_agents_stream(viewer_client, scaler):
    agent = _agent(scaler, 1)
    html = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert f'data-ws-url="/ws/agents/{agent.agent_id}/console/console/"' in html
    assert 'id="console-lines"' in html and "js/console.js" in html
    assert f"/agents/{agent.agent_id}/console/console/download" in html


def test_a_vm_console_has_serial_and_vmm_tabs(viewer_client, db):
    vm = Scaler.objects.create(name="fc", type="firecracker", max_agents=2)
    LabelSet.objects.create(scaler=vm, index=0, labels=["kvm"], normalized="kvm")
    agent = Agent.objects.create(agent_id="scaler-firecracker-00000001", scaler=vm, state=AgentState.RUNNING)
    html = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert "/console/serial/" in html and f'href="/agents/{agent.agent_id}/console/vmm/"' in html
    vmm = viewer_client.get(f"/agents/{agent.agent_id}/console/vmm/").content.decode()
    assert f'data-ws-url="/ws/agents/{agent.agent_id}/console/vmm/"' in vmm
    assert viewer_client.get(f"/agents/{agent.agent_id}/console/bogus/").status_code == 404


# --- events -----------------------------------------------------------------------------------


def test_the_events_feed_filters_and_goes_quiet_while_searching(viewer_client, scaler):
    agent = _agent(scaler, 1)
    record_event(agent, EventType.PROVISIONING, "pulling image")
    record_event(agent, EventType.FAILED, "image pull failed\n--- captured output ---\nline 1")
    html = viewer_client.get("/events/").content.decode()
    assert "pulling image" in html and "image pull failed" in html and "line 1</pre>" in html
    assert 'ws-connect="/ws/events/"' in html
    failed = viewer_client.get("/events/?type=scaler.failed").content.decode()
    assert "pulling image" not in failed and "image pull failed" in failed
    assert 'data-accept="[data-type=&quot;scaler.failed&quot;]"' in failed
    searched = viewer_client.get("/events/?q=pulling").content.decode()
    assert "pulling image" in searched and 'ws-connect="/ws/events/"' not in searched
    bogus = viewer_client.get("/events/?type=bogus")
    assert bogus.status_code == 400 and "type: must be one of scaler." in unescape(bogus.content.decode())
    # A repeated filter or an unknown parameter is refused, not ignored.
    for query, message in (
        ("type=scaler.failed&type=scaler.spawned", "type: takes one value, got 2"),
        ("sort=-created_at", "sort: unknown parameter (accepted: type, scaler, q, page)"),
    ):
        refused = viewer_client.get(f"/events/?{query}")
        assert refused.status_code == 400 and message in unescape(refused.content.decode()), query


def test_an_empty_events_feed_says_whether_its_filters_found_nothing(viewer_client, scaler):
    agent = _agent(scaler, 1)
    record_event(agent, EventType.PROVISIONING, "pulling image")
    assert "No events match these filters." in viewer_client.get("/events/?type=scaler.failed").content.decode()
    unknown = viewer_client.get("/events/?scaler=nosuch").content.decode()
    assert "No events match these filters (no scaler is named “nosuch” now)." in unknown
    assert "No events yet." not in unknown
    assert "No events match" not in viewer_client.get("/events/").content.decode()


def test_the_events_feed_pages_back_to_older_events_keeping_its_filters(viewer_client, scaler):
    agent = _agent(scaler, 1)
    newest = timezone.now()
    failures = ScalerEvent.objects.bulk_create(
        ScalerEvent(agent=agent, agent_ref=agent.agent_id, scaler_name=scaler.name, type=EventType.FAILED)
        for _ in range(EVENTS_PAGE_SIZE + 5)
    )
    for i, event in enumerate(failures):  # "failure 000" the newest, one second apart
        ScalerEvent.objects.filter(pk=event.pk).update(
            detail=f"failure {i:03d}", created_at=newest - timedelta(seconds=i)
        )
    record_event(agent, EventType.PROVISIONING, "pulling image")  # the newest, of another type
    first = viewer_client.get("/events/?type=scaler.failed").content.decode()
    assert "failure 000" in first and f"failure {EVENTS_PAGE_SIZE - 1:03d}" in first
    assert f"failure {EVENTS_PAGE_SIZE:03d}" not in first and "pulling image" not in first
    assert 'href="?type=scaler.failed&amp;page=2" rel="next"' in first and "page 1 of 2" in first
    assert 'ws-connect="/ws/events/"' in first  # the first page is live
    second = viewer_client.get("/events/?type=scaler.failed&page=2").content.decode()
    assert f"failure {EVENTS_PAGE_SIZE:03d}" in second and f"failure {EVENTS_PAGE_SIZE + 4:03d}" in second
    assert f"failure {EVENTS_PAGE_SIZE - 1:03d}" not in second and "pulling image" not in second
    assert 'href="?type=scaler.failed&amp;page=1" rel="prev"' in second and 'rel="next"' not in second
    assert 'ws-connect="/ws/events/"' not in second and "Live updates are on the first page only." in second
    unfiltered = viewer_client.get("/events/?page=2").content.decode()
    assert f"failure {EVENTS_PAGE_SIZE - 1:03d}" in unfiltered  # one page down: the other type's row
    for query, message in (
        ("page=abc", 'page: must be a whole number within 1..200, got "abc"'),
        ("type=scaler.failed&page=0", "page: must be a whole number within 1..200"),
        ("page=2&page=3", "page: takes one value, got 2"),
    ):
        refused = viewer_client.get(f"/events/?{query}")
        assert refused.status_code == 400 and message in unescape(refused.content.decode()), query


# --- scalers ----------------------------------------------------------------------------------


def test_the_scaler_page_lists_label_sets_with_their_host_access(viewer_client, scaler):
    _agent(scaler, 1)
    html = viewer_client.get("/scalers/ci-containers/").content.decode()
    assert 'id="label-set-0"' in html and 'id="label-set-1"' in html
    assert "kici-agent:local" in html
    assert "*:8000" in html and ">default<" in html and ">explicit<" in html
    assert "/scalers/ci-containers/label-sets/1/host-access/" in html
    assert 'data-accept="[data-scaler=&quot;ci-containers&quot;]"' in html


def test_the_scaler_page_warns_about_a_label_set_that_keeps_net_raw(viewer_client, scaler):
    html = viewer_client.get("/scalers/ci-containers/").content.decode()
    assert "CAP_NET_RAW" not in html and 'id="net-raw-' not in html
    scaler.label_sets.filter(index=1).update(config={"image": "kici-agent:local", "netRaw": True})
    html = viewer_client.get("/scalers/ci-containers/").content.decode()
    assert 'id="net-raw-1"' in html and 'id="net-raw-0"' not in html
    assert "Label set 1 gives its agents CAP_NET_RAW" in html
    assert 'title="its agents keep CAP_NET_RAW">netRaw</span>' in html


def test_a_scaler_named_like_the_why_waiting_page_is_not_captured(viewer_client, db):
    from django.urls import Resolver404, resolve

    try:
        match = resolve("/scalers/why-waiting/")
    except Resolver404:
        return
    assert match.url_name != "scaler_detail"


# --- live isolation self-test ------------------------------------------------------------------


@pytest.fixture
def empty_netns():
    """A network namespace with no interface up: every probe from it fails locally, nothing leaves."""
    import secrets
    import subprocess

    from tests.support.root import require_root

    require_root()
    name = f"ui-st-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_the_selftest_sends_nothing_when_its_route_check_cannot_be_set_up(client, empty_netns, settings):
    """No probe without the route guard. The reachability table itself, probed and
    rule-verified rows, is checked with real packets in tests/network/test_isolation_packets.py."""
    settings.KICI_FIRECRACKER_NETNS = empty_netns  # the "host" side: no interface holds the gateway
    ConfigState.objects.update_or_create(pk=1, defaults={"firecracker": {"table": "ui_st", "gateway": "10.213.249.1"}})
    vm = Scaler.objects.create(name="fc-st", type="firecracker", max_agents=1)
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-000000e1", scaler=vm, state=AgentState.RUNNING, ip="10.213.249.5",
        host_access=["10.213.249.1:53"], backend_context={"netns": empty_netns},
    )  # fmt: skip
    client.force_login(_user("op", "agents.view_agent", "operations.request_operation"))
    response = client.post(f"/agents/{agent.agent_id}/isolation/selftest", **HTMX)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert "no probe is sent without a route check" in html
    assert f"no interface in namespace {empty_netns} holds the gateway address 10.213.249.1" in html
    assert "selftest-rows" not in html


def test_the_dashboard_reports_the_last_recovery_counts(viewer_client, scaler):
    from scalers.models import RecoveryReport

    RecoveryReport.objects.create(instance_id="host-a", trigger="boot", spawning_dropped=2, reservations_dropped=1)
    html = viewer_client.get("/").content.decode()
    box = html[html.index('id="recovery"') :]
    box = box[: box.index("</div>")]
    assert "boot" in box and "host-a" in box
    assert "spawns given up <b>2</b>" in box and "reservations dropped <b>1</b>" in box
    assert "alert-warn" in html[html.index('id="recovery"') - 60 : html.index('id="recovery"')]


def test_the_full_log_downloads_as_an_attachment_byte_for_byte(viewer_client, db, tmp_path):
    vm = Scaler.objects.create(name="fc-dl", type="firecracker", max_agents=1)
    serial = tmp_path / "serial-console.log"
    serial.write_bytes(b"line 1\nbad \xff byte\n" + b"x" * 70000 + b"\n")
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-000000d1",
        scaler=vm,
        state=AgentState.RUNNING,
        backend_context={"console_logs": {"serial": str(serial)}},
    )
    response = viewer_client.get(f"/agents/{agent.agent_id}/console/serial/download")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{agent.agent_id}-serial.log"'
    assert b"".join(response.streaming_content) == serial.read_bytes()
    assert viewer_client.get(f"/agents/{agent.agent_id}/console/vmm/download").status_code == 404  # no vmm.log yet
    assert viewer_client.get(f"/agents/{agent.agent_id}/console/console/download").status_code == 404


def test_a_bare_metal_agents_console_is_its_output_file_or_in_container_mode_its_docker_logs(viewer_client, tmp_path):
    from live.consoles import console_log_file, console_source, runs_in_container

    bm = Scaler.objects.create(name="bm", type="bare-metal", max_agents=2)
    LabelSet.objects.create(scaler=bm, index=0, labels=["linux"], normalized="linux")
    out = tmp_path / "agent.log"
    out.write_bytes(b"registered\nworking\n")
    process = _agent(bm, 1, backend_context={"mode": "process", "log_path": str(out)})
    assert console_log_file(process, "console") == out and not runs_in_container(process)
    console_source(process, "console")  # a file source, no LookupError
    download = viewer_client.get(f"/agents/{process.agent_id}/console/console/download")
    assert download.status_code == 200 and b"".join(download.streaming_content) == out.read_bytes()
    boxed = _agent(bm, 2, backend_context={"mode": "container"})
    assert console_log_file(boxed, "console") is None and runs_in_container(boxed)


def test_the_download_needs_the_view_permission(client, outsider, scaler):
    agent = _agent(scaler, 1, backend_context={"log_path": "/dev/null"})
    client.force_login(outsider)
    assert client.get(f"/agents/{agent.agent_id}/console/console/download").status_code == 403


def test_operators_get_the_selftest_button_and_viewers_a_disabled_one(client, viewer, scaler):
    agent = _agent(scaler, 1)
    url = f"/agents/{agent.agent_id}/"
    client.force_login(viewer)
    html = client.get(url).content.decode()
    assert f'hx-post="/agents/{agent.agent_id}/isolation/selftest"' not in html and "Run self-test</button>" in html
    client.force_login(_user("op", "agents.view_agent", "operations.request_operation"))
    assert f'hx-post="/agents/{agent.agent_id}/isolation/selftest"' in client.get(url).content.decode()


# --- text an agent supplied --------------------------------------------------------------------


def test_invisible_and_bidi_characters_an_agent_supplied_are_shown_escaped(viewer_client, scaler):
    """A right-to-left override (or a zero-width space) in an event's detail, a failure reason or
    a reported job id must not reorder or hide what a page shows: it is written as its escape."""
    sneaky = "exit 0 \u202egpj.exe\u200b"
    agent = _agent(scaler, 1, state=AgentState.FAILED, failure_reason=f"spawn failed: {sneaky}\nmore {sneaky}")
    Agent.objects.filter(pk=agent.pk).update(completed_job_id=f"job-{sneaky}")
    event = record_event(agent, EventType.FAILED, f"agent said: {sneaky}\nsecond line {sneaky}")
    escaped = "exit 0 \\u202egpj.exe\\u200b"
    pages = {
        "agent page": viewer_client.get(f"/agents/{agent.agent_id}/").content.decode(),
        "events list": viewer_client.get("/events/").content.decode(),
        "dashboard": viewer_client.get("/").content.decode(),
        "events stream": render_live_update(event.pk),
        "console page": viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode(),
    }
    for name, html in pages.items():
        assert "\u202e" not in html and "\u200b" not in html, name
        assert escaped in unescape(html), name
    # Line breaks are the text's own layout: kept.
    assert f"second line {escaped}" in unescape(pages["events list"])
