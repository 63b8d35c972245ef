"""Every ``/api/v1`` error has one shape: ``{"error": {"code", "message", "field"?}, "reason"}``
(plus the scale API's documented top-level keys), and client errors are logged as one line."""

from __future__ import annotations

import json
import logging

import pytest

from agents.tokens import mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("stop_admission_queue")]

TOKEN = "api-errors-token"


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def assert_error_shape(response, status: int, code: str, field: str | None = None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    error = body["error"]
    assert error["code"] == code and body["reason"] == code, body
    assert isinstance(error["message"], str) and error["message"], body
    if field is None:
        assert "field" not in error, body
    else:
        assert error["field"] == field, body
    return body


def post_json(client, url, body, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **headers)


def test_an_unknown_registration_token_is_an_invalid_token(client):
    body = assert_error_shape(post_json(client, "/api/v1/agents/register", {}, token="nope"), 401, "invalid-token")
    assert "wrong-kind" not in json.dumps(body)


def test_a_missing_bearer_token_says_so_with_a_code(client):
    response = post_json(client, "/api/v1/agents/register", {})
    assert_error_shape(response, 401, "missing-token")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "url", ["/api/v1/agents/register", "/api/v1/agents/claim", "/api/v1/agents/a-1/heartbeat", "/api/v1/scale"]
)
def test_a_get_on_a_post_endpoint_is_a_json_405(client, url):
    response = client.get(url)
    assert_error_shape(response, 405, "method-not-allowed")
    assert "POST" in response["Allow"] and "GET" in response.json()["error"]["message"]


def test_an_unknown_api_address_is_a_json_404(client):
    assert_error_shape(client.get("/api/v1/nothing-here"), 404, "not-found")


def test_a_wrongly_typed_agent_id_says_null_and_names_the_field(client):
    agent = make_agent(make_scaler())
    token = mint_registration_token(agent)
    body = assert_error_shape(
        post_json(client, "/api/v1/agents/register", {"agentId": 5}, token=token), 400, "invalid-request", "agentId"
    )
    assert body["error"]["message"] == "agentId must be a string, got 5"


@pytest.mark.django_db(transaction=True)
def test_the_scale_api_keeps_its_documented_top_level_keys(client):
    make_scaler("c", max_agents=1, label_sets=(("linux",),))
    first = post_json(client, "/api/v1/scale", {"labels": ["linux"], "jobId": "j1"}, token=TOKEN)
    assert first.status_code == 201
    body = assert_error_shape(
        post_json(client, "/api/v1/scale", {"labels": ["linux"], "jobId": "j2"}, token=TOKEN), 409, "at-capacity"
    )
    assert body["cap"] == "maxAgents" and body["scaler"] == "c"
    body = assert_error_shape(
        post_json(client, "/api/v1/scale", {"labels": ["macos"], "jobId": "j3"}, token=TOKEN),
        422,
        "no-matching-label-set",
    )
    assert body["labels"] == ["macos"]
    assert_error_shape(post_json(client, "/api/v1/scale", {"labels": ["linux"], "jobId": "j4"}), 401, "unauthorized")


@pytest.mark.django_db(transaction=True)
def test_a_flat_memory_error_names_the_field_as_written_and_says_null(client):
    make_scaler("c", label_sets=(("linux",),))
    body = assert_error_shape(
        post_json(
            client, "/api/v1/scale", {"labels": ["linux"], "jobId": "j", "resources": {"memory": "-5g"}}, token=TOKEN
        ),
        400,
        "invalid-request",
        "resources.memory",
    )
    assert "requests" not in body["error"]["message"]
    body = assert_error_shape(
        post_json(client, "/api/v1/scale", {"labels": ["linux"], "jobId": None}, token=TOKEN),
        400,
        "invalid-request",
        "jobId",
    )
    assert body["error"]["message"].endswith("got null") and "None" not in body["error"]["message"]


def test_a_heartbeat_of_a_finished_agent_is_a_410_that_still_says_stop(client):
    from agents.choices import AgentState
    from agents.models import Agent

    agent = make_agent(make_scaler())
    session = post_json(client, "/api/v1/agents/register", {}, token=mint_registration_token(agent)).json()[
        "sessionToken"
    ]
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED)
    body = assert_error_shape(
        post_json(client, f"/api/v1/agents/{agent.agent_id}/heartbeat", {}, token=session), 410, "agent-finished"
    )
    assert body["stop"] is True and body["state"] == "destroyed"


def test_a_forbidden_page_is_logged_as_one_line_without_a_traceback(client, caplog):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("no-perms"))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.post("/operations/plan/", {"kind": "agent-drain"})
    assert response.status_code == 403
    records = [r for r in caplog.records if r.name == "django.request" and getattr(r, "status_code", None) == 403]
    assert records, caplog.text
    from lib.logfilters import OneLineClientErrors

    handler_filter = OneLineClientErrors()
    for record in records:
        handler_filter.filter(record)
        assert record.exc_info is None and "\n" not in record.getMessage()
        assert "Forbidden" in record.getMessage()


def test_a_server_error_keeps_its_traceback():
    from lib.logfilters import OneLineClientErrors

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord(
            "django.request", logging.ERROR, __file__, 1, "Internal Server Error: %s", ("/x",), sys.exc_info()
        )
    record.status_code = 500
    OneLineClientErrors().filter(record)
    assert record.exc_info is not None


@pytest.mark.parametrize(
    "url", ["/api/v1/scale", "/api/v1/agents/register", "/api/v1/agents/scaler-x-00000000/heartbeat"]
)
def test_json_nested_too_deeply_is_a_400_not_a_server_error(client, url, settings):
    settings.KICI_API_TOKEN = "t"
    body = "[" * 100_000 + "]" * 100_000
    answer = client.post(url, body, content_type="application/json", HTTP_AUTHORIZATION="Bearer t")
    assert answer.status_code in (400, 401)  # a malformed body, or the token refused first
    assert answer.json()["reason"] in ("invalid-request", "invalid-token", "unknown")


NOT_JSON = ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded"]
JSON_POSTS = [
    "/api/v1/scale",
    "/api/v1/agents/register",
    "/api/v1/agents/claim",
    "/api/v1/agents/scaler-container-00000001/heartbeat",
    "/api/v1/agents/scaler-container-00000001/job-complete",
    "/api/v1/agents/scaler-container-00000001/release",
]


@pytest.mark.parametrize("url", JSON_POSTS)
@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_json_body_sent_as_another_content_type_is_a_415_naming_it(client, url, content_type):
    body = json.dumps({"labels": ["linux"], "jobId": "j-1", "agentId": "a", "claimCode": "c"})
    response = client.post(url, data=body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    error = assert_error_shape(response, 415, "unsupported-media-type", field="Content-Type")["error"]
    assert repr(content_type) in error["message"] and "application/json" in error["message"]
    assert response["Accept-Post"] == "application/json"


@pytest.mark.parametrize("url", JSON_POSTS)
def test_a_body_without_a_content_type_is_a_415(client, url):
    response = client.generic("POST", url, b'{"jobId": "j-1"}', content_type="", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert (
        "none is not accepted"
        in assert_error_shape(response, 415, "unsupported-media-type", "Content-Type")["error"]["message"]
    )


def test_json_with_a_charset_is_read_as_json(client):
    scaler = make_scaler("ct-json")
    agent = make_agent(scaler, state="running", bound_job_id="j-ct")
    url = f"/api/v1/agents/{agent.agent_id}/job-complete"
    response = client.post(
        url,
        data=json.dumps({"jobId": "other"}),
        content_type="application/json; charset=utf-8",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )
    assert_error_shape(response, 409, "job-mismatch", "jobId")  # the body was read: its jobId is another job's
    scale = client.post(
        "/api/v1/scale",
        data=json.dumps({"labels": [], "jobId": "j"}),
        content_type="application/json; charset=UTF-8",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )
    assert_error_shape(scale, 400, "invalid-request", field="labels")


def test_an_empty_post_without_a_content_type_is_not_refused_for_it(client):
    url = "/api/v1/agents/a-1/release"
    response = client.generic("POST", url, b"", content_type="", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 404, response.content  # read as {}: the agent is unknown


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/scale",
        "/api/v1/agents/scaler-container-00000001/job-complete",
        "/api/v1/agents/scaler-container-00000001/release",
    ],
)
def test_malformed_json_is_worded_alike_on_every_endpoint(client, url):
    broken = assert_error_shape(post_json(client, url, '{"jobId": ', token=TOKEN), 400, "invalid-request", "body")
    assert broken["error"]["message"].startswith("body is not valid JSON: "), broken
    twice = assert_error_shape(post_json(client, url, '{"a": 1, "a": 2}', token=TOKEN), 400, "invalid-request", "body")
    assert twice["error"]["message"].startswith("body refused: "), twice
