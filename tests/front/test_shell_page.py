"""The shell page and the transcript download (front.views.shell): approvers only, a terminal only
for a running or held container agent, the link on the agent page under the same rule."""

from __future__ import annotations

import pytest

from agents.archive import shell_transcript_path
from agents.choices import AgentState
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def _agent(state=AgentState.RUNNING, scaler_type="container"):
    return make_agent(make_scaler(type=scaler_type), state=state, managed_id="c0ffee")


@pytest.mark.parametrize("who", ["viewer_client", "operator_client"])
def test_who_is_not_an_approver_gets_no_shell_page_link_or_transcript(request, who):
    client = request.getfixturevalue(who)
    agent = _agent()
    assert client.get(f"/agents/{agent.agent_id}/shell/").status_code == 403
    assert client.get(f"/agents/{agent.agent_id}/shell/transcript").status_code == 403
    shell_transcript_path(agent.agent_id).parent.mkdir(parents=True, exist_ok=True)
    shell_transcript_path(agent.agent_id).write_text("=== shell opened ===\n")
    page = client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert 'id="shell-link"' not in page and 'id="shell-transcripts"' not in page


@pytest.mark.parametrize("state", [AgentState.RUNNING, AgentState.HELD])
def test_an_approver_gets_the_terminal_of_a_running_or_held_container_agent(approver_client, state):
    agent = _agent(state)
    assert 'id="shell-link"' in approver_client.get(f"/agents/{agent.agent_id}/").content.decode()
    page = approver_client.get(f"/agents/{agent.agent_id}/shell/").content.decode()
    assert f'data-ws-url="/ws/agents/{agent.agent_id}/shell/"' in page
    assert 'src="/static/js/shell.js" nonce="' in page  # shell.js hands xterm's <style> the nonce
    assert "vendor/xterm/xterm-5.5.0.min.js" in page and "vendor/xterm/xterm-5.5.0.css" in page


@pytest.mark.parametrize(
    "state, scaler_type, says",
    [
        (AgentState.DRAINING, "container", "is draining: a shell opens only into a running or held agent"),
        (AgentState.DESTROYED, "container", "is destroyed"),
        (AgentState.RUNNING, "firecracker", "the shell needs a container agent"),
    ],
)
def test_an_agent_the_shell_cannot_enter_gets_the_reason_and_no_terminal(approver_client, state, scaler_type, says):
    agent = _agent(state, scaler_type)
    page = approver_client.get(f"/agents/{agent.agent_id}/shell/").content.decode()
    assert says in page and 'id="shell-refused"' in page
    assert "shell-root" not in page and "shell.js" not in page
    if state != AgentState.RUNNING:
        assert 'id="shell-link"' not in approver_client.get(f"/agents/{agent.agent_id}/").content.decode()


def test_the_transcripts_download_once_a_shell_was_opened(approver_client):
    agent = _agent(AgentState.DESTROYED)
    assert approver_client.get(f"/agents/{agent.agent_id}/shell/transcript").status_code == 404
    assert 'id="shell-transcripts"' not in approver_client.get(f"/agents/{agent.agent_id}/").content.decode()
    path = shell_transcript_path(agent.agent_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"=== shell opened ===\n\x1b[1mbold\x1b[0m\n")
    response = approver_client.get(f"/agents/{agent.agent_id}/shell/transcript")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == path.read_bytes()
    assert response["Content-Disposition"] == f'attachment; filename="{agent.agent_id}-shell.log"'
    assert "Download transcripts" in approver_client.get(f"/agents/{agent.agent_id}/shell/").content.decode()
    # A finished agent's page links its transcripts.
    link = f'id="shell-transcripts" href="/agents/{agent.agent_id}/shell/transcript"'
    assert link in approver_client.get(f"/agents/{agent.agent_id}/").content.decode()
