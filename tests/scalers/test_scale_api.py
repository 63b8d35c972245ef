"""``POST /api/v1/scale``: answers, authentication, bad input, and real concurrency over HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
import requests
from django.test import AsyncClient, Client

from agents.models import Agent
from scalers.admission.ledger import release
from scalers.admission.validate import InvalidScaleRequest, validate_scale_request
from scalers.metrics import REDISPATCH
from scalers.models import MetricCounter, Reservation, ScaleRequest
from tests.support.concurrency import run_threads
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

TOKEN = "test-orchestrator-token"


@pytest.fixture(autouse=True)
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


def post(client: Client, body, token: str | None = TOKEN, raw: bool = False):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = body if raw else json.dumps(body)
    return client.post("/api/v1/scale", data=data, content_type="application/json", **headers)


def assert_nothing_written():
    assert not Agent.objects.exists()
    assert not Reservation.objects.exists()


def test_it_answers_201_with_the_agent_id():
    make_scaler("c", labels=("linux", "docker"), max_agents=2)
    r = post(
        Client(),
        {"labels": ["linux", "docker"], "jobId": "j1", "runId": "r1", "resources": {"cpus": 1, "memory": "1g"}},
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["scaler"] == "c" and body["agentId"].startswith("scaler-container-")
    res = Reservation.objects.get(agent__agent_id=body["agentId"])
    assert (res.cpus, res.memory_bytes) == (1, 1024**3)


def test_it_answers_409_naming_the_cap():
    make_scaler("c", max_agents=1)
    assert post(Client(), {"labels": ["linux"], "jobId": "j1"}).status_code == 201
    r = post(Client(), {"labels": ["linux"], "jobId": "j2"})
    assert r.status_code == 409
    assert r.json()["reason"] == "at-capacity" and r.json()["cap"] == "maxAgents"
    assert Reservation.objects.count() == 1


def test_it_answers_422_when_no_label_set_matches():
    make_scaler("c")
    r = post(Client(), {"labels": ["macos"], "jobId": "j1"})
    assert r.status_code == 422
    body = r.json()
    assert body["reason"] == "no-matching-label-set" and body["labels"] == ["macos"]
    assert body["error"]["code"] == "no-matching-label-set" and "macos" in body["error"]["message"]
    assert_nothing_written()


def test_no_matching_label_set_names_the_labels_as_an_operator_reads_them():
    make_scaler("c")
    body = post(Client(), {"labels": ["linux", "x"], "jobId": "j1"}).json()
    assert body["error"]["message"] == "no label set of any scaler matches labels [linux, x]"
    assert body["labels"] == ["linux", "x"]


def test_it_refuses_resources_over_a_cap_for_good_with_422_exceeds_cap():
    make_scaler("c", cpu=4)
    r = post(Client(), {"labels": ["linux"], "jobId": "j1", "resources": {"cpus": 64}})
    assert r.status_code == 422, r.content
    body = r.json()
    assert (body["reason"], body["cap"], body["scaler"]) == ("exceeds-cap", "resourceCap.cpu", "c")
    assert "even with nothing else running" in body["detail"] and "can never be admitted" in body["detail"]
    assert body["error"]["code"] == "exceeds-cap"
    assert_nothing_written()
    assert ScaleRequest.objects.get(job_id="j1").outcome == "exceeds-cap"


def test_a_request_larger_than_the_global_cap_is_422_even_while_the_console_is_full():
    from tests.support.scalers import set_global

    set_global(max_agents=1, cpu=4)
    make_scaler("c", max_agents=5)
    assert post(Client(), {"labels": ["linux"], "jobId": "small", "resources": {"cpus": 1}}).status_code == 201
    full = post(Client(), {"labels": ["linux"], "jobId": "fits-later", "resources": {"cpus": 1}})
    assert full.status_code == 409 and full.json()["cap"] == "globalMaxAgents"
    never = post(Client(), {"labels": ["linux"], "jobId": "too-big", "resources": {"cpus": 5}})
    assert never.status_code == 422 and never.json()["cap"] == "globalResourceCap.cpu"
    assert Reservation.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", "body"),
        ("[1, 2]", "body"),
        ('{"labels": ["windows"], "labels": ["linux"], "jobId": "dup"}', "body"),
        ('{"labels": ["linux"], "jobId": "j", "resources": {"cpus": 1' + "0" * 5000 + "}}", "body"),
        ({"jobId": "j"}, "labels"),
        ({"labels": [], "jobId": "j"}, "labels"),
        ({"labels": "linux", "jobId": "j"}, "labels"),
        ({"labels": ["linux", 3], "jobId": "j"}, "labels[1]"),
        ({"labels": ["linux", "  "], "jobId": "j"}, "labels[1]"),
        ({"labels": ["linux"]}, "jobId"),
        ({"labels": ["linux"], "jobId": ""}, "jobId"),
        ({"labels": ["linux"], "jobId": 7}, "jobId"),
        ({"labels": ["linux"], "jobId": "j", "runId": 5}, "runId"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": -1}}, "resources.cpus"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": 100000}}, "resources.cpus"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"cpus": 1e-12}}, "resources.cpus"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"limits": {"memory": "1k"}}}, "resources.limits.memory"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "99999999g"}}, "resources.memory"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "4Gi"}}, "resources.memory"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"memory": "-5g"}}, "resources.memory"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"limits": {"memory": "-5g"}}}, "resources.limits.memory"),
        ({"labels": ["linux"], "jobId": "j", "resources": {"requests": {"cpus": "two"}}}, "resources.requests.cpus"),
        ({"labels": ["linux"], "jobId": "j", "resources": "big"}, "resources"),
        ({"labels": ["linux"], "jobId": "j", "resource": {"cpus": 1}}, "resource"),
        ({"labels": ["linux"], "jobId": "j", "container": "img:1"}, "container"),
        ({"labels": ["linux"], "jobId": "j", "container": {}}, "container.image"),
        ({"labels": ["linux"], "jobId": "j", "container": {"image": ""}}, "container.image"),
        ({"labels": ["linux"], "jobId": "j", "container": {"image": "Not An/Image"}}, "container.image"),
        ({"labels": ["l"], "jobId": "j", "container": {"image": "x", "credentialsRef": 3}}, "container.credentialsRef"),
        ({"labels": ["l"], "jobId": "j", "container": {"image": "x", "pullPolicy": "Never"}}, "container.pullPolicy"),
    ],
)
def test_it_refuses_malformed_input_naming_the_field(body, field):
    make_scaler("c")
    r = post(Client(), body, raw=isinstance(body, str))
    assert r.status_code == 400, r.content
    assert r.json()["reason"] == "invalid-request"
    assert r.json()["error"]["code"] == "invalid-request" and r.json()["error"]["field"] == field, r.json()
    assert r.json()["error"]["message"].startswith(field if field != "body" else "")
    assert_nothing_written()
    assert not ScaleRequest.objects.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"resources": {"memory": "99999999g"}}, 'resources.memory: must be at most 16 TiB, got "99999999g"'),
        (
            {"resources": {"cpus": 1e-12}},
            "resources.cpus: below 0.01, the smallest CPU limit the runtime can enforce (docker would round it to "
            "no limit at all), received 1e-12",
        ),
        (
            {"resources": {"limits": {"memory": "4m"}}},
            "resources.limits.memory: below 6m (6291456 bytes), the smallest memory limit the runtime accepts, "
            'received "4m"',
        ),
        (
            {"container": {"image": "Not An/Image"}},
            "container.image: must be an image reference ([registry/]name[:tag][@digest], lower-case name), "
            'got "Not An/Image"',
        ),
        ({"container": {"image": ""}}, 'container.image: must be a non-empty string, got ""'),
        (
            {"container": {"image": "x", "credentialsRef": 3}},
            "container.credentialsRef: must be a non-empty string of at most 200 characters, got 3",
        ),
    ],
)
def test_a_refusal_reads_field_what_is_wrong_and_the_value(body, message):
    with pytest.raises(InvalidScaleRequest) as exc:
        validate_scale_request({"labels": ["linux"], "jobId": "j", **body})
    assert str(exc.value) == message


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_it_answers_401_without_the_token(token):
    make_scaler("c")
    r = post(Client(), {"labels": ["linux"], "jobId": "j"}, token=token)
    assert r.status_code == 401 and r.json()["reason"] == "unauthorized"
    assert_nothing_written()


def test_it_refuses_everything_when_no_token_is_configured(settings):
    settings.KICI_API_TOKEN = None
    make_scaler("c")
    r = post(Client(), {"labels": ["linux"], "jobId": "j"})
    assert r.status_code == 503
    assert_nothing_written()


def test_it_refuses_get():
    assert Client().get("/api/v1/scale", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_100_concurrent_posts_to_daphne_admit_exactly_max_agents(daphne_server):
    make_scaler("c", labels=("linux", "docker"), max_agents=5)
    url = f"{daphne_server}/api/v1/scale"

    def one(i: int):
        r = requests.post(
            url,
            json={"labels": ["linux", "docker"], "jobId": f"job-{i}"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        return r.status_code, r.json()

    results = run_threads(100, one)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    codes = sorted(code for code, _ in results)
    assert codes.count(201) == 5
    assert codes.count(409) == 95
    assert {body["cap"] for code, body in results if code == 409} == {"maxAgents"}
    assert Reservation.objects.count() == 5 == Agent.objects.count()
    assert len({body["agentId"] for code, body in results if code == 201}) == 5


def test_100_concurrent_async_posts_admit_exactly_max_agents():
    make_scaler("c", max_agents=5)

    async def main():
        client = AsyncClient()
        coros = [
            client.post(
                "/api/v1/scale",
                data=json.dumps({"labels": ["linux"], "jobId": f"a-{i}"}),
                content_type="application/json",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            for i in range(100)
        ]
        return await asyncio.gather(*coros)

    responses = asyncio.run(main())
    codes = [r.status_code for r in responses]
    assert codes.count(201) == 5 and codes.count(409) == 95
    assert Reservation.objects.count() == 5


def test_a_skipped_decision_answers_503_with_retry_after():
    make_scaler("c", ls_config={"resources": {"memory": "lots"}})
    r = post(Client(), {"labels": ["linux"], "jobId": "j"})
    message = 'resources of c label set [0] do not resolve: Invalid memory format: "lots". '
    message += 'Expected format like "512m", "2g", or "1024k".'
    assert r.status_code == 503 and r.json() == {
        "error": {"code": "skipped", "message": message},
        "reason": "skipped",
    }
    assert r["Retry-After"]
    assert_nothing_written()


def test_a_job_refused_at_capacity_is_told_when_to_ask_again_and_its_admission_counts_as_a_redispatch(settings):
    settings.KICI_SCALE_RETRY_AFTER_SECONDS = 7
    make_scaler("c", max_agents=1)
    first = post(Client(), {"labels": ["linux"], "jobId": "j1"}).json()["agentId"]
    refused = post(Client(), {"labels": ["linux"], "jobId": "j2"})
    assert refused.status_code == 409 and refused["Retry-After"] == "7" and refused.json()["retryAfterSeconds"] == 7
    assert redispatched() == 0
    Agent.objects.filter(agent_id=first).update(state="destroyed")
    assert release(first, "test")
    assert post(Client(), {"labels": ["linux"], "jobId": "j2"}).status_code == 201, "the retry is admitted"
    assert redispatched() == 1
    Agent.objects.filter(state="spawning").update(state="destroyed")
    for agent_id in Agent.objects.values_list("agent_id", flat=True):
        release(agent_id, "test")
    assert post(Client(), {"labels": ["linux"], "jobId": "j3"}).status_code == 201
    assert redispatched() == 1, "a job admitted at its first request was never waiting"


def redispatched() -> float:
    row = MetricCounter.objects.filter(name=REDISPATCH, labels={"trigger": "sweep"}).first()
    return row.value if row else 0.0


# --- a job's own image ------------------------------------------------------------------------------


def _credential(name="reg", registry="127.0.0.1:5000"):
    from scalers.credentials import encrypt_secret
    from scalers.models import RegistryCredential

    return RegistryCredential.objects.create(name=name, registry=registry, username="ci", secret=encrypt_secret("pw"))


def test_a_job_image_and_its_credential_are_kept_on_the_agent():
    make_scaler("c")
    _credential()
    image = "127.0.0.1:5000/job/tools:1"
    r = post(Client(), {"labels": ["linux"], "jobId": "j1", "container": {"image": image, "credentialsRef": "reg"}})
    assert r.status_code == 201, r.content
    agent = Agent.objects.get(agent_id=r.json()["agentId"])
    assert (agent.job_image, agent.job_credentials_ref) == (image, "reg")


@pytest.mark.parametrize(
    ("ref", "registry", "says"),
    [
        ("nope", "127.0.0.1:5000", "no registry credential named 'nope'"),
        ("reg", "other.example", "is for other.example"),
    ],
)
def test_an_unusable_credentials_ref_is_422_naming_the_field_and_nothing_is_written(ref, registry, says):
    make_scaler("c")
    _credential(registry=registry)
    container = {"image": "127.0.0.1:5000/job/x:1", "credentialsRef": ref}
    r = post(Client(), {"labels": ["linux"], "jobId": "j1", "container": container})
    assert r.status_code == 422, r.content
    assert r.json()["reason"] == "invalid-credentials-ref"
    assert r.json()["error"]["field"] == "container.credentialsRef" and says in r.json()["error"]["message"]
    assert_nothing_written()
    assert not ScaleRequest.objects.exists()


def test_a_job_image_is_not_routed_to_a_label_set_that_cannot_run_it():
    make_scaler("fc", type="firecracker")
    r = post(Client(), {"labels": ["linux"], "jobId": "j1", "container": {"image": "debian:12"}})
    assert r.status_code == 422, r.content
    assert r.json()["reason"] == "no-matching-label-set"
    assert "cannot run a job image" in r.json()["error"]["message"]
    assert_nothing_written()
