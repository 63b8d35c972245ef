"""Schemathesis drives a live console from its own OpenAPI document: a real daphne, rq workers and
sweeper over the suite's PostgreSQL and Redis, whose one scaler spawns container agents on the
suite's private dockerd (``tests.support.soak.run_console``). The document is read from the
console (``/api/v1/openapi.json``), and Schemathesis's state machine follows its links (scale ->
get -> job-complete / release), positive and negative data, within :data:`SCENARIOS` scenarios of
at most :data:`STEPS` calls.

Every answer is held to Schemathesis's checks (no 5xx, status, content type, headers and body as
documented, a refused negative body, an enforced bearer) and to ours: every 400, 413, 415 names
its field, and no ``/scale`` admission ever puts more agents in flight than the scaler's cap. At
the end every agent is released through the API and nothing may be left: no reservation, active
agent, container, nft rule or valid token of an ended agent (``tests.support.soak.find_leaks``).

The agent's own calls run with bearer tokens the fuzzer cannot know: register with an unknown
token (its body is checked before the token is redeemed), the heartbeat with a session token
minted here for the agent the path names, so its body and answers are fuzzed too.
"""

from __future__ import annotations

import time
from collections import Counter

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from agents.choices import ACTIVE_STATES
from agents.models import Agent
from agents.tokens import mint_session_token
from lib.json_body import PRINTABLE_FORMAT
from lib.units import MEMORY_FORMAT
from tests.support.soak import LABELS, find_leaks, run_console, settle

pytestmark = [
    pytest.mark.docker,
    pytest.mark.fuzz,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

#: The scaler's cap: no admission may put more agents in flight.
MAX_AGENTS = 2
#: The run's budget (a few minutes): cases of each operation alone, per mode (positive,
#: negative); then scenarios of the state machine, of at most STEPS calls each.
EXAMPLES = 25
SCENARIOS = 40
STEPS = 8
#: Statuses whose error must name the field at fault.
FIELD_STATUSES = (400, 413, 415)
#: A bearer no console ever issued.
UNKNOWN_TOKEN = "kici-reg-not-a-token"


def _orchestrator_operation(case) -> bool:
    return "orchestrator" in (case.operation.definition.raw.get("tags") or [])


def field_named(ctx, response, case):
    """A 400, 413 or 415 says which field, parameter or header is at fault."""
    if response.status_code in FIELD_STATUSES:
        error = response.json().get("error", {})
        assert error.get("field"), f"{response.status_code} without error.field: {response.text[:500]}"


def not_over_admitted(ctx, response, case):
    """No admission puts more agents of the scaler in flight than its cap."""
    if case.operation.path == "/api/v1/scale" and response.status_code in (200, 201):
        active = Agent.objects.filter(scaler__name=response.json()["scaler"], state__in=ACTIVE_STATES).count()
        assert active <= MAX_AGENTS, f"{active} agents in flight, cap {MAX_AGENTS}"


def _call_kwargs(case, console) -> dict:
    """The bearer of ``case``: the console's API token for the orchestrator's operations; for a
    heartbeat, a session token minted for the agent the path names (when there is one); an
    unknown one otherwise."""
    if _orchestrator_operation(case):
        return {"headers": {"Authorization": f"Bearer {console.api_token}"}}
    if case.operation.path.endswith("/heartbeat"):
        agent = Agent.objects.filter(agent_id=str((case.path_parameters or {}).get("agentId", ""))).first()
        if agent is not None:
            return {"headers": {"Authorization": f"Bearer {mint_session_token(agent)}"}}
    return {"headers": {"Authorization": f"Bearer {UNKNOWN_TOKEN}"}}


def _workflow(schema, console, calls: Counter):
    """The state machine of ``schema`` with this console's bearers and our checks; ``calls``
    counts the answers by operation and status."""

    class Workflow(schema.as_state_machine()):
        def after_call(self, response, case):
            super().after_call(response, case)
            calls[(case.operation.label, response.status_code)] += 1

        def get_call_kwargs(self, case):
            return _call_kwargs(case, console)

        def teardown(self):
            _release_all(console)  # the next scenario starts with the scaler's capacity free
            super().teardown()

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            checks = [field_named, not_over_admitted, *(additional_checks or [])]
            super().validate_response(response, case, additional_checks=checks, **kwargs)

    return Workflow


#: Strings of the ``printable`` format (``lib.json_body.PRINTABLE_FORMAT``): letters, marks, numbers,
#: punctuation, symbols and the space, with something besides the space.
PRINTABLE_TEXT = st.text(
    st.characters(categories=("L", "M", "N", "P", "S"), include_characters=" "), min_size=1, max_size=40
).filter(lambda text: text.strip() and text.isprintable())
schemathesis.openapi.format(PRINTABLE_FORMAT, PRINTABLE_TEXT)
#: Memory strings of the ``memory`` format (``lib.units.MEMORY_FORMAT``) a job may ask for: 6m to 16 TiB.
JOB_MEMORY = st.one_of(
    st.integers(6, 16 * 1024**2).map(lambda n: f"{n}m"), st.integers(1, 16 * 1024).map(lambda n: f"{n}g")
)
schemathesis.openapi.format(MEMORY_FORMAT, JOB_MEMORY)


def _matching_labels(schema):
    """Half of the positive scale bodies ask for the scaler's labels, so jobs are admitted and the
    links from an admission are followed; the other half keep what was generated."""

    @schema.hook("flatmap_body")
    def labels_that_match(context, body):
        if context.operation.path != "/api/v1/scale" or not isinstance(body, dict) or "labels" not in body:
            return st.just(body)
        return st.sampled_from([body, {**body, "labels": list(LABELS)}])


def _existing_agents(schema):
    """Half of the heartbeats name an agent that exists (the bearer minted for it then holds), so
    the heartbeat's body and answers are fuzzed beyond its 401."""

    @schema.hook("flatmap_path_parameters")
    def existing_agent(context, path_parameters):
        if not context.operation.path.endswith("/heartbeat"):
            return st.just(path_parameters)
        known = list(Agent.objects.order_by("-pk").values_list("agent_id", flat=True)[:5])
        return st.sampled_from([path_parameters, *({**path_parameters, "agentId": a} for a in known)])


def _settings(examples: int) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )


#: Operations no malformed request of which can be sent: no input but a path id (an empty one
#: would be another path), or none at all.
NO_NEGATIVE_CASE = {"GET /api/v1/openapi.json", "GET /api/v1/agents/{agentId}"}


def _fuzz_each_operation(schema, call_kwargs, calls: Counter) -> None:
    """Every operation alone, :data:`EXAMPLES` positive and as many negative cases each (none for
    the operations of :data:`NO_NEGATIVE_CASE`, which Hypothesis must find unsatisfiable)."""
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @_settings(EXAMPLES)
            def one(case):
                kwargs = call_kwargs(case)
                response = case.call(**kwargs)
                calls[(case.operation.label, response.status_code)] += 1
                case.validate_response(response, additional_checks=[field_named, not_over_admitted], **kwargs)

            if mode is GenerationMode.NEGATIVE and operation.label in NO_NEGATIVE_CASE:
                with pytest.raises(hypothesis.errors.Unsatisfiable):
                    one()
            else:
                one()


def test_schemathesis_finds_no_fault_in_the_live_api(tmp_path, dockerd, agent_image, settings):
    settings.KICI_NFT_TABLE = "fuzz_kici"
    with run_console(
        tmp_path, backend="container", max_agents=MAX_AGENTS, workers=2, docker_host=dockerd, nft_table="fuzz_kici"
    ) as console:
        schema = schemathesis.openapi.from_url(f"{console.url}/api/v1/openapi.json")
        schema.config.update(base_url=console.url, request_timeout=30)
        schema.config.generation.update(
            modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
            allow_x00=False,  # refused anywhere by one rule (tests/kici_site/test_nul_bytes.py)
            deterministic=True,
            with_security_parameters=False,  # the bearers are ours (_call_kwargs)
        )
        # A 422 (no label set matches, over a cap for good, an unknown credential) and a 410 (the
        # agent ended) refuse a well-formed request for what it asks, not for its form.
        accepted = schema.config.checks.positive_data_acceptance
        accepted.expected_statuses = [*accepted.expected_statuses, "410", "422"]
        # The links the document publishes, not ones guessed from key names: a guessed "jobId ->
        # Job" resource would keep /scale, the source of every link, from starting a scenario.
        schema.config.phases.stateful.inference.algorithms = []
        _matching_labels(schema)
        _existing_agents(schema)
        calls: Counter = Counter()
        started = time.monotonic()
        _fuzz_each_operation(schema, lambda case: _call_kwargs(case, console), calls)
        _release_all(console)
        _workflow(schema, console, calls).run(settings=_settings(SCENARIOS))
        elapsed = time.monotonic() - started
        print(f"fuzz: {sum(calls.values())} calls in {elapsed:.0f} s")
        for (label, status), n in sorted(calls.items()):
            print(f"  {label} {status}: {n}")
        _release_all(console)
        leaks = find_leaks(console)
    # Every operation but the document's own GET, which the loader made (schemathesis does not fuzz it).
    operations = {
        f"{method.upper()} {path}" for path, methods in schema.raw_schema["paths"].items() for method in methods
    }
    assert {label for label, _ in calls} == operations - {"GET /api/v1/openapi.json"}
    # The links were followed: admitted jobs were completed and released, and their agents read.
    for label in ("POST /api/v1/scale", "GET /api/v1/agents/{agentId}", *LINKED_ENDINGS):
        assert calls[(label, 200)] + calls[(label, 201)] > 0, label
    assert not any(leaks.values()), leaks


#: The endings an admission links to.
LINKED_ENDINGS = ("POST /api/v1/agents/{agentId}/job-complete", "POST /api/v1/agents/{agentId}/release")


def _release_all(console) -> None:
    """Release every active agent of the console's scaler through the API and wait until their
    sandboxes are gone and their slots free (at most a minute)."""
    for agent_id in Agent.objects.filter(scaler=console.scaler, state__in=ACTIVE_STATES).values_list(
        "agent_id", flat=True
    ):
        r = requests.post(
            f"{console.url}/api/v1/agents/{agent_id}/release",
            json={"reason": "fuzz scenario ended"},
            headers={"Authorization": f"Bearer {console.api_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    settle(console.scaler, timeout=60)
