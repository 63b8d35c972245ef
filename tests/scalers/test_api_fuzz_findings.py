"""What the Schemathesis run (``test_api_fuzz.py``) found, each kept as a plain test:

* an unknown key ``""`` was refused with ``error.field`` ``""`` (naming nothing), and a key holding
  ``.`` named a path that reads as two keys;
* requests the document allowed were refused: a non-printable label or id, cpus under 0.01, a
  memory string out of a job's range (the document now says each), empty list parameters (taken as
  absent, now declared so), and a heartbeat's ``activeJobs: 3.0`` (an integer to JSON Schema, now
  taken as 3).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.models import Agent
from agents.tokens import mint_session_token
from lib.json_body import PRINTABLE_FORMAT
from lib.units import MEMORY_FORMAT
from lib.wording import key_path
from scalers.openapi import build_document
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.django_db

TOKEN = "test-orchestrator-token"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def _post(path: str, body) -> dict:
    response = Client().post(path, json.dumps(body), content_type="application/json", **AUTH)
    assert response.status_code == 400, response.content
    return response.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/scale", {"labels": ["linux"], "jobId": "j", "": 1}, '[""]'),
        ("/api/v1/scale", {"labels": ["linux"], "jobId": "j", "run.id": 1}, '["run.id"]'),
        ("/api/v1/scale", {"labels": ["l"], "jobId": "j", "container": {"image": "x", "": 1}}, 'container[""]'),
        ("/api/v1/agents/a-1/release", {"": "x"}, '[""]'),
        ("/api/v1/agents/a-1/job-complete", {"jobId": "j", "[0]": "x"}, '["[0]"]'),
    ],
)
def test_an_unknown_key_is_named_whatever_it_is(path, body, field):
    error = _post(path, body)
    assert error["field"] == field and error["message"].startswith(f"{field}: unknown field")


def test_an_unnamed_query_parameter_is_named_too():
    response = Client().get("/api/v1/agents?=1", **AUTH)
    assert response.status_code == 400 and response.json()["error"]["field"] == '[""]'


@pytest.mark.parametrize(("parent", "key", "path"), [("", "labels", "labels"), ("a", "b", "a.b"), ("", "", '[""]')])
def test_a_key_path_is_never_empty_and_reads_one_way(parent, key, path):
    assert key_path(parent, key) == path


def test_the_document_says_which_strings_must_be_printable_and_what_memory_is():
    schemas = build_document()["components"]["schemas"]
    scale = schemas["ScaleRequestBody"]["properties"]
    assert scale["labels"]["items"]["format"] == PRINTABLE_FORMAT
    assert scale["jobId"]["format"] == PRINTABLE_FORMAT
    assert scale["runId"]["anyOf"][0]["format"] == PRINTABLE_FORMAT
    assert scale["exclude"]["anyOf"][0]["items"]["format"] == PRINTABLE_FORMAT
    spec = schemas["ResourceSpec"]["properties"]
    assert spec["memory"]["format"] == MEMORY_FORMAT and spec["cpus"]["minimum"] == 0.01


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"labels": ["linux\u200b"], "jobId": "j"}, "labels[0]"),
        ({"labels": ["linux"], "jobId": "j\u2028"}, "jobId"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": 0.001}}, "resources.cpus"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "0k"}}, "resources.memory"),
    ],
)
def test_what_the_document_marks_is_refused_naming_the_field(body, field):
    assert _post("/api/v1/scale", body)["field"] == field


def test_empty_list_parameters_are_as_if_absent_as_the_document_says():
    parameters = build_document()["paths"]["/api/v1/agents"]["get"]["parameters"]
    assert all(p["allowEmptyValue"] for p in parameters)
    response = Client().get("/api/v1/agents?limit=&state=&scaler=&jobId=&cursor=", **AUTH)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(("sent", "kept"), [(3.0, 3), (0.0, 0), (7, 7)])
def test_a_heartbeat_takes_active_jobs_as_json_schema_counts_integers(sent, kept):
    scaler = make_scaler("c")
    agent = Agent.objects.create(agent_id="scaler-container-hb", scaler=scaler, state="running")
    response = Client().post(
        f"/api/v1/agents/{agent.agent_id}/heartbeat",
        json.dumps({"activeJobs": sent}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mint_session_token(agent)}",
    )
    assert response.status_code == 200, response.content
    agent.refresh_from_db()
    assert agent.active_jobs == kept


@pytest.mark.parametrize("sent", [3.5, float("inf"), True, -1.0, 10_001.0])
def test_a_heartbeat_still_refuses_what_is_no_whole_count(sent):
    scaler = make_scaler("c")
    agent = Agent.objects.create(agent_id="scaler-container-hb", scaler=scaler, state="running")
    body = json.dumps({"activeJobs": sent}) if sent != float("inf") else '{"activeJobs": Infinity}'
    response = Client().post(
        f"/api/v1/agents/{agent.agent_id}/heartbeat",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {mint_session_token(agent)}",
    )
    assert response.status_code == 400 and response.json()["error"]["field"] == "activeJobs", response.content


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"cpu": -1}, "resources.cpu", ['Unrecognized key "cpu"', "received -1"]),
        ({"cpus": -1}, "resources.cpus", ["greater than 0", "received -1"]),
        ({"cpus": "two"}, "resources.cpus", ['received "two"']),
        ({"gpus": 1, "memory": "1g"}, "resources.gpus", ['Unrecognized key "gpus"', "received 1"]),
        ({"requests": {"cpu": 2}}, "resources.requests.cpu", ['Unrecognized key "cpu"', "received 2"]),
        ({"limits": {"cpus": 0}}, "resources.limits.cpus", ["greater than 0", "received 0"]),
        ({"memory": "-1g"}, "resources.memory", ['"-1g"']),
        ({"cpus": 1, "limits": {"cpus": 1}}, "resources", ["cannot be mixed", 'received {"cpus": 1']),
    ],
)
def test_a_bad_resource_value_is_refused_naming_its_field_and_value(resources, field, words):
    """Never "the two shapes cannot be mixed" for what is one shape with a bad or unknown key."""
    error = _post("/api/v1/scale", {"labels": ["linux"], "jobId": "j", "resources": resources})
    assert error["field"] == field, error
    assert all(word in error["message"] for word in words), error
    if field != "resources":
        assert "mixed" not in error["message"], error
