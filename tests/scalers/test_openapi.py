"""The OpenAPI document of ``/api/v1``: a valid OpenAPI 3.1 document, holding every route of the URL
map with exactly the methods the views take, served on the operator listener, and in agreement with
what the views accept and answer (its body schemas refuse what the validators refuse)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client
from django.urls import URLResolver, get_resolver
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator

from agents.models import Agent
from kici_site.listeners import AGENT_ROUTES
from lib.json_body import BodyRefused, validate_body
from scalers.admission.validate import validate_kici_scale_up, validate_scale_request
from scalers.api_models import (
    ClaimBody,
    HeartbeatBody,
    JobCompleteBody,
    KiciScaleDownBody,
    RegisterBody,
    ReleaseBody,
)
from scalers.openapi import build_document
from tests.support.scalers import make_scaler

TOKEN = "test-orchestrator-token"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


@pytest.fixture(scope="module")
def document() -> dict:
    return build_document()


def _site_routes(patterns=None, prefix: str = ""):
    """Every route of the site's URL map as a path with ``{name}`` placeholders (walked here, not
    by ``scalers.openapi``, so the document cannot agree with itself by construction)."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _site_routes(pattern.url_patterns, route)
        else:
            yield "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "{" + m.group(1) + "}", route)


def _openapi_form(path: str) -> str:
    return path.replace("{agent_id}", "{agentId}")


def _schema_validator(document: dict, name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": document["components"]})


def test_the_document_is_valid_openapi_3_1(document):
    assert document["openapi"].startswith("3.1.")
    errors = [e.message for e in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []


def test_every_api_v1_route_is_in_the_document_and_nothing_else(document):
    routes = {_openapi_form(p) for p in _site_routes() if p.startswith("/api/v1/")}
    assert len(routes) >= 9
    assert set(document["paths"]) == routes


def _concrete(path: str) -> str:
    return path.replace("{agentId}", "no-such-agent")


@pytest.mark.django_db
def test_each_path_takes_exactly_the_methods_the_document_names(document):
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    for path, operations in document["paths"].items():
        documented = set(operations)
        for method in METHODS:
            response = getattr(client, method)(_concrete(path), content_type="application/json", **headers)
            refused = response.status_code == 405
            assert refused == (method not in documented), (method, path, response.status_code, response.content)
            if refused:
                assert response.json()["reason"] == "method-not-allowed" and response.has_header("Allow")


@pytest.mark.django_db
def test_the_document_is_served_on_the_operator_listener_only(document):
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response.json() == json.loads(json.dumps(document))
    assert AGENT_ROUTES.fullmatch("/api/v1/openapi.json") is None  # the gateway answers it 404


def test_it_names_the_three_bearer_schemes_and_each_operation_uses_one(document):
    schemes = document["components"]["securitySchemes"]
    assert set(schemes) == {"orchestratorToken", "registrationToken", "agentSession"}
    assert all(s["type"] == "http" and s["scheme"] == "bearer" for s in schemes.values())
    used = {
        op["operationId"]: [name for requirement in op["security"] for name in requirement]
        for methods in document["paths"].values()
        for op in methods.values()
    }
    assert used["registerAgent"] == ["registrationToken"] and used["heartbeat"] == ["agentSession"]
    assert used["claimAgent"] == [] and used["openapiDocument"] == []
    orchestrator = {"scale", "listAgents", "getAgent", "jobComplete", "releaseAgent", "kiciScaleUp", "kiciScaleDown"}
    assert all(used[op] == ["orchestratorToken"] for op in orchestrator)


def test_retry_after_and_pagination_are_documented(document):
    scale = document["paths"]["/api/v1/scale"]["post"]["responses"]
    assert "Retry-After" in scale["409"]["headers"] and "Retry-After" in scale["503"]["headers"]
    listing = document["paths"]["/api/v1/agents"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"scaler", "state", "jobId", "limit", "cursor"}
    assert document["components"]["schemas"]["AgentPage"]["required"] == ["agents", "nextCursor"]


VALID_SCALE_BODIES = [
    {"labels": ["linux"], "jobId": "j"},
    {"labels": [" linux ", "docker"], "jobId": "j", "runId": None, "exclude": None, "container": None},
    {"labels": ["linux"], "jobId": "j", "runId": "r", "exclude": ["gpu"], "resources": {}},
    {"labels": ["linux"], "jobId": "j", "resources": {"cpus": 1, "memory": "512m"}},
    {"labels": ["linux"], "jobId": "j", "resources": {"requests": {"cpus": 0.5}, "limits": {"memory": "2g"}}},
    {"labels": ["linux"], "jobId": "j", "container": {"image": "ghcr.io/org/img:1.2", "credentialsRef": "ghcr"}},
]

#: Bodies the validator refuses and the published schema refuses too (each naming ``field``).
INVALID_SCALE_BODIES = [
    ([1, 2], "body"),
    ({"jobId": "j"}, "labels"),
    ({"labels": [], "jobId": "j"}, "labels"),
    ({"labels": "linux", "jobId": "j"}, "labels"),
    ({"labels": ["linux", 3], "jobId": "j"}, "labels[1]"),
    ({"labels": ["linux", "  "], "jobId": "j"}, "labels[1]"),
    ({"labels": ["l"] * 65, "jobId": "j"}, "labels"),
    ({"labels": ["x" * 201], "jobId": "j"}, "labels[0]"),
    ({"labels": ["linux"]}, "jobId"),
    ({"labels": ["linux"], "jobId": ""}, "jobId"),
    ({"labels": ["linux"], "jobId": 7}, "jobId"),
    ({"labels": ["linux"], "jobId": "j" * 201}, "jobId"),
    ({"labels": ["linux"], "jobId": "j", "runId": 5}, "runId"),
    ({"labels": ["linux"], "jobId": "j", "exclude": [""]}, "exclude[0]"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": -1}}, "resources.cpus"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": 100000}}, "resources.cpus"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "4Gi"}}, "resources.memory"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "-5g"}}, "resources.memory"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"requests": {"cpus": "two"}}}, "resources.requests.cpus"),
    ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": 1, "limits": {}}}, "resources"),
    ({"labels": ["linux"], "jobId": "j", "resources": "big"}, "resources"),
    ({"labels": ["linux"], "jobId": "j", "resource": {"cpus": 1}}, "resource"),
    ({"labels": ["linux"], "jobId": "j", "container": "img:1"}, "container"),
    ({"labels": ["linux"], "jobId": "j", "container": {}}, "container.image"),
    ({"labels": ["linux"], "jobId": "j", "container": {"image": ""}}, "container.image"),
    ({"labels": ["linux"], "jobId": "j", "container": {"image": "Not An/Image"}}, "container.image"),
    ({"labels": ["l"], "jobId": "j", "container": {"image": "x", "credentialsRef": 3}}, "container.credentialsRef"),
    ({"labels": ["l"], "jobId": "j", "container": {"image": "x", "credentialsRef": ""}}, "container.credentialsRef"),
    ({"labels": ["l"], "jobId": "j", "container": {"image": "x", "pullPolicy": "Never"}}, "container.pullPolicy"),
]


@pytest.mark.parametrize("body", VALID_SCALE_BODIES)
def test_a_scale_body_the_schema_takes_is_taken(document, body):
    assert _schema_validator(document, "ScaleRequestBody").is_valid(body)
    validate_scale_request(body)


@pytest.mark.parametrize(("body", "field"), INVALID_SCALE_BODIES)
def test_a_scale_body_the_validator_refuses_the_schema_refuses_too(document, body, field):
    with pytest.raises(BodyRefused) as refused:
        validate_scale_request(body)
    assert refused.value.field == field
    assert not _schema_validator(document, "ScaleRequestBody").is_valid(body), body


OTHER_BODIES = [
    (JobCompleteBody, {"jobId": "j"}, None),
    (JobCompleteBody, {}, "jobId"),
    (JobCompleteBody, {"jobId": ""}, "jobId"),
    (JobCompleteBody, {"jobId": "j", "status": "ok"}, "status"),
    (ReleaseBody, {}, None),
    (ReleaseBody, {"reason": "lost it"}, None),
    (ReleaseBody, {"reason": 7}, "reason"),
    (ReleaseBody, {"reason": "x" * 501}, "reason"),
    (ReleaseBody, {"why": "x"}, "why"),
    (RegisterBody, {}, None),
    (RegisterBody, {"agentId": "a", "version": "2"}, None),
    (RegisterBody, {"agentId": 5}, "agentId"),
    (HeartbeatBody, {"activeJobs": 0}, None),
    (HeartbeatBody, {"activeJobs": True}, "activeJobs"),
    (HeartbeatBody, {"activeJobs": 1.5}, "activeJobs"),
    (HeartbeatBody, {"activeJobs": 10_001}, "activeJobs"),
    (ClaimBody, {"claimCode": "c"}, None),
    (ClaimBody, {}, "claimCode"),
    (ClaimBody, {"claimCode": ""}, "claimCode"),
]


@pytest.mark.parametrize(("model", "body", "field"), OTHER_BODIES)
def test_the_other_bodies_agree_with_their_schemas(document, model, body, field):
    schema_takes = _schema_validator(document, model.__name__).is_valid(body)
    if field is None:
        validate_body(model, body)
        assert schema_takes
    else:
        with pytest.raises(BodyRefused) as refused:
            validate_body(model, body)
        assert refused.value.field == field and not schema_takes


SCALE_UP = {
    "scalerName": "cloud",
    "agentId": "scaler-event-0a1b2c3d",
    "labels": ["linux", "kici:agent:event", "kici:role:builder"],
    "orchestratorUrl": "ws://172.30.0.1:8480/ws",
    "claimCode": "ab" * 32,
    "requestId": "r-1",
}
VALID_SCALE_UPS = [
    SCALE_UP,
    SCALE_UP | {"mandatoryLabels": [], "resources": {}, "jobId": "j"},
    SCALE_UP | {"resources": {"cpus": 0.5, "memBytes": 1 << 30}, "orchestratorUrl": "wss://orch.example:443/a/ws"},
    SCALE_UP | {"mandatoryLabels": None, "resources": None, "jobId": None},
]
INVALID_SCALE_UPS = [
    ([SCALE_UP], "body"),
    ({k: v for k, v in SCALE_UP.items() if k != "agentId"}, "agentId"),
    (SCALE_UP | {"agentId": "-leading-dash"}, "agentId"),
    (SCALE_UP | {"agentId": "a" * 101}, "agentId"),
    ({k: v for k, v in SCALE_UP.items() if k != "claimCode"}, "claimCode"),
    (SCALE_UP | {"claimCode": "with space"}, "claimCode"),
    (SCALE_UP | {"claimCode": "x" * 257}, "claimCode"),
    ({k: v for k, v in SCALE_UP.items() if k != "requestId"}, "requestId"),
    (SCALE_UP | {"requestId": "x" * 256}, "requestId"),
    (SCALE_UP | {"requestId": "   "}, "requestId"),
    (SCALE_UP | {"scalerName": ""}, "scalerName"),
    (SCALE_UP | {"labels": []}, "labels"),
    (SCALE_UP | {"labels": ["ok", 3]}, "labels[1]"),
    (SCALE_UP | {"orchestratorUrl": "http://h/ws"}, "orchestratorUrl"),
    (SCALE_UP | {"orchestratorUrl": "ws://h/wsx"}, "orchestratorUrl"),
    (SCALE_UP | {"orchestratorUrl": "ws://h/ws?x=1"}, "orchestratorUrl"),
    (SCALE_UP | {"resources": {"cpus": 0}}, "resources.cpus"),
    (SCALE_UP | {"resources": {"cpus": 0.001}}, "resources.cpus"),
    (SCALE_UP | {"resources": {"cpus": 257}}, "resources.cpus"),
    (SCALE_UP | {"resources": {"memBytes": 1024}}, "resources.memBytes"),
    (SCALE_UP | {"resources": {"memBytes": "1g"}}, "resources.memBytes"),
    (SCALE_UP | {"resources": {"memory": "1g"}}, "resources.memory"),
    (SCALE_UP | {"resources": []}, "resources"),
    (SCALE_UP | {"jobId": ""}, "jobId"),
    (SCALE_UP | {"token": "kat_x"}, "token"),
]


@pytest.mark.parametrize("body", VALID_SCALE_UPS)
def test_a_scale_up_the_schema_takes_is_taken(document, body):
    assert _schema_validator(document, "KiciScaleUpBody").is_valid(body)
    validate_kici_scale_up(body)


@pytest.mark.parametrize(("body", "field"), INVALID_SCALE_UPS)
def test_a_scale_up_the_validator_refuses_the_schema_refuses_too(document, body, field):
    with pytest.raises(BodyRefused) as refused:
        validate_kici_scale_up(body)
    assert refused.value.field == field
    assert not _schema_validator(document, "KiciScaleUpBody").is_valid(body), body


SCALE_DOWN = {"scalerName": "cloud", "agentId": "scaler-event-0a1b2c3d", "reason": "idle", "requestId": "r-2"}
SCALE_DOWNS = [
    (SCALE_DOWN, None),
    *((SCALE_DOWN | {"reason": reason}, None) for reason in ("job-complete", "heartbeat-timeout", "spawn-timeout")),
    (SCALE_DOWN | {"reason": "drain"}, None),
    (SCALE_DOWN | {"reason": "shutdown"}, None),
    (SCALE_DOWN | {"reason": "gone"}, "reason"),
    ({k: v for k, v in SCALE_DOWN.items() if k != "reason"}, "reason"),
    (SCALE_DOWN | {"agentId": "a b"}, "agentId"),
    (SCALE_DOWN | {"requestId": ""}, "requestId"),
    (SCALE_DOWN | {"scalerName": None}, "scalerName"),
    (SCALE_DOWN | {"labels": []}, "labels"),
]


@pytest.mark.parametrize(("body", "field"), SCALE_DOWNS)
def test_a_scale_down_agrees_with_its_schema(document, body, field):
    schema_takes = _schema_validator(document, "KiciScaleDownBody").is_valid(body)
    if field is None:
        validate_body(KiciScaleDownBody, body)
        assert schema_takes
    else:
        with pytest.raises(BodyRefused) as refused:
            validate_body(KiciScaleDownBody, body)
        assert refused.value.field == field and not schema_takes


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")
def test_the_kici_event_answers_conform_to_their_schemas(document):
    make_scaler(
        "real",
        labels=("linux",),
        ls_config={
            "image": "img:1",
            "kiciAgent": {"orchestratorUrl": SCALE_UP["orchestratorUrl"], "adminTokenRef": "o"},
        },
    )
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def post(path, body):
        return client.post(path, json.dumps(body), content_type="application/json", **auth)

    def conforms(response, name):
        errors = [e.message for e in _schema_validator(document, name).iter_errors(response.json())]
        assert errors == [], (name, response.json())

    up = "/api/v1/scale/kici-event/scale-up"
    down = "/api/v1/scale/kici-event/scale-down"
    assert set(document["paths"][up]) == {"post"} and set(document["paths"][down]) == {"post"}
    admitted = post(up, SCALE_UP)
    assert admitted.status_code == 201, admitted.content
    conforms(admitted, "ScaleAdmitted")
    replayed = post(up, SCALE_UP)
    assert replayed.status_code == 200
    conforms(replayed, "ScaleAdmitted")
    mismatch = post(up, SCALE_UP | {"claimCode": "other"})
    assert mismatch.status_code == 422 and "422" in document["paths"][up]["post"]["responses"]
    conforms(mismatch, "ApiError")
    unmatched = post(up, SCALE_UP | {"labels": ["macos"], "requestId": "r-9", "agentId": "b"})
    assert unmatched.status_code == 422
    conforms(unmatched, "NoMatchingLabelSet")
    bad = post(up, SCALE_UP | {"agentId": ""})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "agentId"
    conforms(bad, "ApiError")
    released = post(down, SCALE_DOWN)
    assert released.status_code == 200, released.content
    conforms(released, "ScaleDownDone")
    never = post(down, SCALE_DOWN | {"agentId": "never-here"})
    assert never.status_code == 200 and never.json()["state"] is None
    conforms(never, "ScaleDownDone")
    other = post(down, SCALE_DOWN | {"scalerName": "other"})
    assert other.status_code == 422 and "422" in document["paths"][down]["post"]["responses"]
    conforms(other, "ApiError")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")
def test_the_answers_conform_to_their_schemas(document):
    make_scaler("c", labels=("linux",), max_agents=1)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def post(path, body):
        return client.post(path, json.dumps(body), content_type="application/json", **auth)

    def conforms(response, name):
        errors = [e.message for e in _schema_validator(document, name).iter_errors(response.json())]
        assert errors == [], (name, response.json())

    admitted = post("/api/v1/scale", {"labels": ["linux"], "jobId": "j1"})
    assert admitted.status_code == 201
    conforms(admitted, "ScaleAdmitted")
    again = post("/api/v1/scale", {"labels": ["linux"], "jobId": "j1"})  # the same job asks again
    assert again.status_code == 200 and again.json() == admitted.json()
    replayed = document["paths"]["/api/v1/scale"]["post"]["responses"]["200"]
    assert again["Idempotent-Replayed"] in replayed["headers"]["Idempotent-Replayed"]["schema"]["enum"]
    assert "does not deduplicate" not in json.dumps(document)
    full = post("/api/v1/scale", {"labels": ["linux"], "jobId": "j2"})
    assert full.status_code == 409 and full["Retry-After"]
    conforms(full, "AtCapacity")
    unmatched = post("/api/v1/scale", {"labels": ["macos"], "jobId": "j3"})
    assert unmatched.status_code == 422
    conforms(unmatched, "NoMatchingLabelSet")
    bad = post("/api/v1/scale", {"labels": ["linux"], "jobId": ""})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "jobId"
    conforms(bad, "ApiError")
    agent_id = admitted.json()["agentId"]
    conforms(client.get(f"/api/v1/agents/{agent_id}", **auth), "AgentView")
    conforms(client.get("/api/v1/agents?limit=1", **auth), "AgentPage")
    conforms(post(f"/api/v1/agents/{agent_id}/job-complete", {"jobId": "other"}), "ApiError")
    done = post(f"/api/v1/agents/{agent_id}/job-complete", {"jobId": "j1"})
    assert done.status_code == 200, done.content
    conforms(done, "AgentView")
    assert Agent.objects.get(agent_id=agent_id).state == "destroying"
