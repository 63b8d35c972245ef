"""A NUL byte (``\\x00``) anywhere a view would read it is a 400 naming the field, never a 500.

PostgreSQL text cannot hold NUL, so before ``kici_site.middleware.NulByteMiddleware`` each of
these URLs reached the database and failed with a psycopg DataError (HTTP 500)."""

from __future__ import annotations

import json

import pytest

from operations.choices import OperationStatus
from operations.services import create_operation
from tests.support.operations import login

pytestmark = pytest.mark.django_db


def assert_page_400(response, field: str):
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("text/html")
    text = response.content.decode()
    assert f"{field} contains a NUL byte" in text, text[:2000]
    assert 'class="topbar"' in text and "kici.css" in text  # the styled frame, not a bare page


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/agents/?q=%00", "q"),
        ("/events/?q=%00", "q"),
        ("/agents/a%00b/", "path"),
        ("/agents/a%00b/console/", "path"),
        ("/agents/a%00b/isolation/", "path"),
        ("/scalers/a%00b/", "path"),
        ("/agents/?scaler=a%00b", "scaler"),
        ("/operations/?scaler=a%00b", "scaler"),
        ("/events/?scaler=x&type=a%00", "type"),
    ],
)
def test_a_nul_in_a_page_address_is_a_400_naming_the_field(approver_client, url, field):
    assert_page_400(approver_client.get(url), field)


@pytest.mark.parametrize("field", ["agent", "scaler", "label_set", "kind"])
def test_a_nul_in_a_plan_form_field_is_a_400_naming_it(client, users, field):
    login(client, users["operator"])
    data = {"kind": "agent-drain", "agent": "scaler-container-00000001", "scaler": "ci"}
    data[field] = "a\x00b"
    assert_page_400(client.post("/operations/plan/", data), field)


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_a_nul_in_an_approval_note_is_a_400_and_the_plan_stays_planned(client, users, config_file, verb):
    op = create_operation("config-reload", {}, users["operator"])
    login(client, users["approver"])
    assert_page_400(client.post(f"/operations/{op.pk}/{verb}/", {"note": "fine\x00"}), "note")
    op.refresh_from_db()
    assert op.status == OperationStatus.PLANNED and op.approved_by is None and op.rejected_by is None


def _post_json(client, url, body, token="x"):
    return client.post(
        url, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/scale", {"labels": ["linux", "a\x00"], "jobId": "j"}, "labels[1]"),
        ("/api/v1/scale", {"labels": ["linux"], "jobId": "j\x00"}, "jobId"),
        ("/api/v1/scale", {"labels": ["linux"], "jobId": "j", "resources": {"memory": "1g\x00"}}, "resources.memory"),
        ("/api/v1/scale", {"labels": ["linux"], "jobId": "j", "run\x00Id": "r"}, "run\\u0000Id"),
        ("/api/v1/agents/register", {"agentId": "scaler-\x00"}, "agentId"),
        ("/api/v1/agents/claim", {"claimCode": "\x00"}, "claimCode"),
        ("/api/v1/agents/scaler-container-1/heartbeat", {"activeJobs": 1, "note": ["ok", "\x00"]}, "note[1]"),
    ],
)
def test_a_nul_in_any_json_field_is_a_400_naming_its_path(client, url, body, field):
    response = _post_json(client, url, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid-request", field)
    assert "NUL" in error["message"] and response.json()["reason"] == "invalid-request"


def test_a_nul_in_an_api_path_is_a_json_400(client):
    response = _post_json(client, "/api/v1/agents/a%00b/heartbeat", {})
    assert response.status_code == 400 and response.json()["error"]["field"] == "path"


def test_an_escaped_backslash_u0000_is_ordinary_text(client):
    # "\\u0000" in JSON is the six characters \u0000, not a NUL: the view decides (a bad token here).
    response = client.post(
        "/api/v1/agents/register",
        data='{"agentId": "a\\\\u0000"}',
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer nope",
    )
    assert response.status_code == 401 and response.json()["reason"] == "invalid-token"


def test_without_the_guard_these_addresses_reach_the_database(approver_client, settings):
    """Without the guard the first URL above is a 500 (psycopg DataError): the tests above test it."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.endswith("NulByteMiddleware")]
    approver_client.raise_request_exception = False
    assert approver_client.get("/agents/?q=%00").status_code == 500
