"""Reading the real KiCI agent's own log (``scalers.kici_agent_log``), on output captured from the
real agent v0.1.24 in a console container (``data/``, docker timestamps cut off):

- ``real-agent-job.log``: standard output and error of an agent that registered, ran the builder
  job and the ``greet`` job of a real workflow (its step sleeps 6 s) and shut down once idle; the
  lines holding a signed storage URL are left out;
- ``real-agent-refused.log``: the output of an agent whose token leaves out its role labels, which
  the orchestrator closed with 4010 (as the failure detail kept it).
"""

from __future__ import annotations

from pathlib import Path

from scalers.kici_agent_log import BUSY, IDLE, Activity, latest_activity, log_record, refusal

DATA = Path(__file__).parent / "data"
JOB_LOG = (DATA / "real-agent-job.log").read_text().splitlines()
REFUSED_LOG = (DATA / "real-agent-refused.log").read_text().splitlines()
RUN = "24c3da3b-a6e9-470a-acb1-d34a4545ee19"
BUILDER_JOB = "5ed4ab57-fd7b-4d67-9753-b427b1c83421"
GREET_JOB = "58dbbfa2-00ba-44f2-aa14-524e18fa213b"


def _index(text: str) -> int:
    return next(i for i, line in enumerate(JOB_LOG) if text in line)


def test_the_agents_log_says_idle_then_each_job_then_idle_again():
    seen: list[Activity] = []
    for end in range(1, len(JOB_LOG) + 1):
        activity = latest_activity(JOB_LOG[:end])
        if activity is not None and (not seen or seen[-1] != activity):
            seen.append(activity)
    assert seen == [
        Activity(IDLE),  # registered: "Scaler-managed agent reconnected and idle"
        Activity(BUSY, BUILDER_JOB, RUN),
        Activity(IDLE),
        Activity(BUSY, GREET_JOB, RUN),
        Activity(IDLE),
    ]


def test_the_job_it_started_stands_while_its_step_runs():
    started = _index(f'"jobId":"{GREET_JOB}","level":"info","message":"Accepting job dispatch"')
    during = JOB_LOG[: _index("hello from the real agent") + 1]
    assert latest_activity(during) == Activity(BUSY, GREET_JOB, RUN)
    # A window holding no marking line (the step's own output) says nothing: the row keeps its value.
    assert latest_activity(JOB_LOG[started + 1 : _index("hello from the real agent") + 1]) is None


def test_only_the_agents_own_records_count():
    relayed = next(line for line in JOB_LOG if line.startswith("[workflow-runner:stdout] {"))
    assert log_record(relayed) is None
    # The runner's record without its prefix is still not the agent's (no service "agent").
    assert log_record(relayed.removeprefix("[workflow-runner:stdout] ")) is None
    assert log_record("hello from the real agent in a console sandbox") is None
    own = JOB_LOG[_index("Accepting job dispatch")]
    assert log_record(own)["jobId"] == BUILDER_JOB
    assert log_record("\r" + own + "\r")["jobId"] == BUILDER_JOB  # a serial console's line


def test_a_refusal_is_read_from_the_close_code_4010():
    assert refusal(REFUSED_LOG) == (
        "closed the connection with code 4010: "
        "Agent labels exceed token-bound scope: kici:role:builder,kici:role:init-runner"
    )
    # The agent's own close at its shutdown (code 1000) is no refusal.
    assert "Orchestrator connection closed" in "\n".join(JOB_LOG)
    assert refusal(JOB_LOG) is None
    assert latest_activity(REFUSED_LOG) is None


def test_an_activity_keeps_its_form_on_the_agent_row():
    busy = Activity(BUSY, GREET_JOB, RUN)
    assert busy.as_context() == {"state": "busy", "jobId": GREET_JOB, "runId": RUN}
    assert Activity.from_context(busy.as_context()) == busy
    assert Activity.from_context(Activity(IDLE).as_context()) == Activity(IDLE)
    assert Activity.from_context(None) is None
    assert Activity.from_context({"state": "sleeping"}) is None
    assert busy.text == f"busy: job {GREET_JOB} (run {RUN})" and Activity(IDLE).text == "idle"
