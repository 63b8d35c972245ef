"""A destroyed or failed agent can still be investigated: its console page says the sandbox is gone
and shows what was captured, and its page reads back no rules for an address that may belong to
another agent by now."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from scalers.backends.failure import failure_detail
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def no_nft(monkeypatch):
    """Reading the kernel's rules for a finished agent is the bug: fail the test if it happens."""
    import network.nft.apply

    class Refuse:
        def __init__(self, *a, **k):
            raise AssertionError("the rules of a finished agent were read back")

    monkeypatch.setattr(network.nft.apply, "NftClient", Refuse)


def _failed_agent():
    agent = make_agent(make_scaler(), state=AgentState.FAILED, ip="172.30.0.2", finished_at=timezone.now())
    detail = failure_detail(
        RuntimeError("network failed: hostAccess[0] is not an address"),
        ["booting", "agent: dial 172.30.0.1:8000", "exit 1"],
    )
    agent.failure_reason = detail
    agent.save(update_fields=["failure_reason"])
    record_event(agent, EventType.FAILED, detail, {"reason": "spawn-failed"})
    return agent


def test_a_failed_agents_console_says_the_sandbox_is_gone_and_shows_the_captured_lines(viewer_client):
    agent = _failed_agent()
    html = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert 'id="sandbox-gone"' in html and "The sandbox of this agent is gone" in html
    assert "data-ws-url=" not in html and "console.js" not in html  # no live stream to a removed container
    assert "agent: dial 172.30.0.1:8000" in html and "exit 1" in html and "last 3 lines" in html
    assert "network failed: hostAccess[0]" in html
    assert "404 Client Error" not in html and "--- captured output ---" not in html


def test_the_captured_output_downloads_and_nothing_captured_is_a_404_that_says_so(viewer_client):
    agent = _failed_agent()
    response = viewer_client.get(f"/agents/{agent.agent_id}/console/console/download")
    assert response.status_code == 200 and response.content == b"booting\nagent: dial 172.30.0.1:8000\nexit 1\n"
    assert "captured.log" in response["Content-Disposition"]

    destroyed = make_agent(make_scaler("c2"), state=AgentState.DESTROYED, ip="172.30.0.3")
    page = viewer_client.get(f"/agents/{destroyed.agent_id}/console/").content.decode()
    assert "Nothing of its output was kept" in page and "data-ws-url=" not in page
    missing = viewer_client.get(f"/agents/{destroyed.agent_id}/console/console/download")
    assert missing.status_code == 404 and b"none of its output was captured" in missing.content


def test_a_finished_agent_reads_back_no_rules_for_its_old_address(viewer_client, no_nft):
    agent = _failed_agent()
    fragment = viewer_client.get(f"/agents/{agent.agent_id}/isolation/", **HTMX).content.decode()
    assert 'id="rules-removed"' in fragment and "removed with it" in fragment and "172.30.0.2" in fragment
    assert 'badge b-green">in force' not in fragment and "No isolation rules in force" not in fragment
    page = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert "Rules in force" not in page and "Isolation rules" in page


def test_a_live_agents_console_still_streams(viewer_client):
    agent = make_agent(make_scaler(), state=AgentState.RUNNING, ip="172.30.0.4")
    html = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert f'data-ws-url="/ws/agents/{agent.agent_id}/console/console/"' in html and "sandbox-gone" not in html


def test_the_isolation_address_opened_directly_is_a_full_page(viewer_client, no_nft):
    agent = _failed_agent()
    html = viewer_client.get(f"/agents/{agent.agent_id}/isolation/").content.decode()
    assert html.lstrip().lower().startswith("<!doctype html>") and "kici.css" in html and 'class="topbar"' in html
    assert 'id="isolation-rules"' in html and f'href="/agents/{agent.agent_id}/"' in html


def test_a_vanished_container_is_said_in_words_on_the_live_stream(monkeypatch):
    import docker.errors

    import live.consoles as consoles

    agent = make_agent(make_scaler(), state=AgentState.DESTROYED)

    def gone(*a, **k):
        raise docker.errors.NotFound("404 Client Error: Not Found (No such container: 0cc889)")

    monkeypatch.setattr(consoles, "agent_container", gone)
    with pytest.raises(consoles.SandboxGone, match="is gone .*destroyed.*ended with it"):
        consoles._container_or_gone(agent)
