"""Named API tokens of the orchestrator's API: created once and kept hashed, scoped, expiring,
revocable; managed by administrators on ``/tokens/`` and with ``manage.py api_tokens``; each
admission, job-complete and release logged with the caller's token name."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers import api_tokens
from scalers.api_tokens import TokenError, create_token, hash_token, revoke_token, token_state
from scalers.models import ApiToken
from tests.support.scalers import make_scaler

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("stop_admission_queue", "no_enqueue", "fresh_verdicts"),
]

ENV_TOKEN = "env-orchestrator-token"


@pytest.fixture
def fresh_verdicts(settings):
    settings.KICI_API_TOKEN = ENV_TOKEN
    api_tokens.forget_verdicts()
    yield
    api_tokens.forget_verdicts()


def scale(token: str | None, job: str = "j1"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    body = json.dumps({"labels": ["linux"], "jobId": job})
    return Client().post("/api/v1/scale", data=body, content_type="application/json", **headers)


def get_agent(token: str, agent_id: str):
    return Client().get(f"/api/v1/agents/{agent_id}", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_token_is_shown_once_and_kept_only_as_its_hash():
    token, raw = create_token("ci-prod", ["scale", "read"], expires_days=30, created_by="root")
    assert raw.startswith("kct_") and len(raw) > 40
    row = ApiToken.objects.get(name="ci-prod")
    assert row.token_hash == hash_token(raw) and raw not in (row.token_hash, row.prefix) and raw.startswith(row.prefix)
    assert timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("CI Prod", ["scale"]), "name"),
        (("", ["scale"]), "name"),
        (("kici_api_token", ["scale"]), "name"),
        (("ok", []), "scopes"),
        (("ok", ["scale", "admin"]), "scopes"),
    ],
)
def test_a_bad_token_request_names_its_field_and_writes_nothing(args, field):
    with pytest.raises(TokenError) as info:
        create_token(*args)
    assert info.value.field == field
    with pytest.raises(TokenError, match="expires_days"):
        create_token("ok", ["read"], expires_days=0)
    assert not ApiToken.objects.exists()


def test_a_name_is_never_reused_even_after_its_revocation():
    create_token("ci", ["scale"])
    revoke_token("ci")
    with pytest.raises(TokenError, match="exists"):
        create_token("ci", ["scale"])


def test_a_scale_token_admits_and_a_read_token_only_reads():
    make_scaler("c", max_agents=5)
    _, scaler_token = create_token("scaler", ["scale"])
    _, reader = create_token("dashboard", ["read"])
    admitted = scale(scaler_token)
    assert admitted.status_code == 201, admitted.content
    agent_id = admitted.json()["agentId"]
    refused = scale(reader, "j2")
    assert refused.status_code == 403 and refused.json()["reason"] == "forbidden"
    assert "token dashboard lacks the scope" in refused.json()["error"]["message"]
    assert get_agent(reader, agent_id).status_code == 200
    assert get_agent(scaler_token, agent_id).status_code == 403
    assert Agent.objects.count() == 1


def test_an_expired_or_revoked_token_is_refused_and_the_environment_token_still_works():
    make_scaler("c", max_agents=5)
    _, expired = create_token("old", ["scale"], expires_days=1)
    ApiToken.objects.filter(name="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert scale(expired).status_code == 401
    _, revoked = create_token("leaked", ["scale"])
    assert scale(revoked, "j-before").status_code == 201
    revoke_token("leaked", revoked_by="root")
    assert scale(revoked, "j-after").status_code == 401
    assert scale(ENV_TOKEN, "j-env").status_code == 201


def test_a_revocation_by_another_process_takes_effect_within_the_verdict_time(monkeypatch):
    monkeypatch.setattr(api_tokens, "VERDICT_SECONDS", 0.3)
    make_scaler("c", max_agents=5)
    _, raw = create_token("ci", ["scale"])
    assert scale(raw, "j1").status_code == 201
    ApiToken.objects.filter(name="ci").update(revoked_at=timezone.now())  # another process's revocation
    time.sleep(0.4)
    assert scale(raw, "j2").status_code == 401


def test_with_no_token_at_all_the_api_is_unavailable_and_a_record_token_makes_it_available(settings):
    settings.KICI_API_TOKEN = None
    make_scaler("c", max_agents=5)
    assert scale("anything").status_code == 503
    _, raw = create_token("only", ["scale"])
    assert scale("anything").status_code == 401
    assert scale(raw).status_code == 201


def test_use_is_recorded_and_every_call_is_logged_with_the_token_name(caplog):
    make_scaler("c", max_agents=5)
    _, raw = create_token("ci", ["scale", "read"])
    with caplog.at_level(logging.INFO, logger="kici.audit"):
        agent_id = scale(raw).json()["agentId"]
        Agent.objects.filter(agent_id=agent_id).update(state=AgentState.RUNNING, registered_at=timezone.now())
        done = Client().post(
            f"/api/v1/agents/{agent_id}/release",
            data="{}",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {raw}",
        )
    assert done.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "kici.audit"]
    assert lines == [f"scale by token ci: job j1 -> {agent_id} (spawning)", f"release by token ci: {agent_id}"]
    assert ApiToken.objects.get(name="ci").last_used_at is not None


@pytest.fixture
def root_client():
    user = get_user_model().objects.create_superuser("root", password="pw-root")
    client = Client()
    client.force_login(user)
    return client


def test_an_administrator_creates_sees_once_and_revokes_a_token_in_the_console(root_client):
    page = root_client.post("/tokens/", {"name": "ci", "scopes": ["scale"], "expires_days": "90"})
    assert page.status_code == 200
    html = page.content.decode()
    raw = html.split('id="token-raw">')[1].split("<")[0]
    assert raw.startswith("kct_") and ApiToken.objects.get(name="ci").token_hash == hash_token(raw)
    listed = root_client.get("/tokens/").content.decode()
    assert raw not in listed and 'id="token-ci"' in listed and ">active</span>" in listed
    assert 'href="/tokens/ci/revoke/">Revoke…</a>' in listed and "/audit/?who=KICI_API_TOKEN" in listed
    confirm = root_client.get("/tokens/ci/revoke/")  # a confirmation step, changing nothing
    assert (
        confirm.status_code == 200
        and "401" in confirm.content.decode()
        and token_state(ApiToken.objects.get()) == "active"
    )
    assert root_client.post("/tokens/ci/revoke/").status_code == 302
    assert ">revoked</span>" in root_client.get("/tokens/").content.decode()
    bad = root_client.post("/tokens/", {"name": "Bad Name", "scopes": ["scale"]})
    assert bad.status_code == 400 and "name: 1-63 characters" in bad.content.decode()
    # Each told the range it missed, the value written as typed (a string quoted, as JSON writes it).
    for days, got in (("-1", "got -1"), ("0", "got 0"), ("x", "got &quot;x&quot;")):
        bad = root_client.post("/tokens/", {"name": "ci2", "scopes": ["scale"], "expires_days": days})
        text = bad.content.decode()
        assert bad.status_code == 400 and f"expires_days: a whole number of days within 1..3650, {got}" in text, text
    assert ApiToken.objects.count() == 1


def test_only_administrators_reach_the_token_page(viewer_client, admin_client):
    assert viewer_client.get("/tokens/").status_code == 403
    assert viewer_client.post("/tokens/", {"name": "x", "scopes": ["scale"]}).status_code == 403
    assert Client().get("/tokens/").status_code == 302
    assert not ApiToken.objects.exists()


def test_the_cli_creates_lists_and_revokes_for_an_administrator(capsys, users):
    get_user_model().objects.create_superuser("root", password="pw-root")
    call_command("api_tokens", "create", "ci", "--scopes", "scale", "--expires-days", "7", "--user", "root")
    out = capsys.readouterr().out
    raw = out.strip().splitlines()[-1]
    assert "shown once" in out and ApiToken.objects.get(name="ci").token_hash == hash_token(raw)
    call_command("api_tokens", "list")
    listed = capsys.readouterr().out
    assert "ci [active]" in listed and raw not in listed
    with pytest.raises(CommandError, match="not an active administrator"):
        call_command("api_tokens", "revoke", "ci", "--user", "ops-operator")
    call_command("api_tokens", "revoke", "ci", "--user", "root")
    assert "revoked" in capsys.readouterr().out and ApiToken.objects.get(name="ci").revoked_by == "root"
    with pytest.raises(CommandError, match="scopes"):
        call_command("api_tokens", "create", "x", "--scopes", "admin", "--user", "root")
