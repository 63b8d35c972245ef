"""The group-commit queue's waiting side: how coroutines and threads are woken, time out, give up,
and which queue a forked process gets. The batches are decided by a stand-in that records them
(what a batch writes is the admission tests' subject)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from scalers.admission.decide import BatchResult, Request, ScaleDecision
from scalers.admission.queue import AdmissionQueue, AdmissionTimeout, get_queue
from scalers.models import ScaleOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


class Recorder:
    """A batch function answering no-backend to every request, recording each batch's job ids;
    the first batch waits for ``release`` (so later requests pile up behind it)."""

    def __init__(self):
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, requests: list[Request]) -> BatchResult:
        if not self.batches:
            self.started.set()
            assert self.release.wait(30)
        self.batches.append([r.job_id for r in requests])
        return BatchResult(decisions=[ScaleDecision(ScaleOutcome.NO_BACKEND) for _ in requests])


def request(job_id: str) -> Request:
    return Request(labels=("linux",), job_id=job_id)


@pytest.fixture
def recorder():
    rec = Recorder()
    q = AdmissionQueue(decide=rec, name="adm-queue-test")
    rec.queue = q
    yield rec
    rec.release.set()
    q.shutdown()


def _block(rec: Recorder) -> threading.Thread:
    """Put a first request in, decided only when ``rec.release`` is set."""
    t = threading.Thread(target=rec.queue.submit, args=(request("blocker"),), daemon=True)
    t.start()
    assert rec.started.wait(10)
    return t


def _decided_after_release(rec: Recorder, blocker: threading.Thread) -> list[str]:
    """Let the blocker's batch finish, decide one more request, and return every job id decided."""
    rec.release.set()
    blocker.join(10)
    rec.queue.submit(request("after"))
    return [job for batch in rec.batches for job in batch]


def test_a_batch_wakes_each_event_loop_once_for_all_its_coroutines(recorder):
    blocker = _block(recorder)

    async def main():
        loop = asyncio.get_running_loop()
        wakes = []
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wakes.append(threading.current_thread().name)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        tasks = [asyncio.create_task(recorder.queue.submit_async(request(f"j{i}"))) for i in range(20)]
        await asyncio.sleep(0.05)  # all 20 queued behind the blocker
        recorder.release.set()
        results = await asyncio.gather(*tasks)
        return wakes, results

    wakes, results = asyncio.run(main())
    blocker.join(10)
    assert recorder.batches[1] == [f"j{i}" for i in range(20)]
    assert [d.action for d, _agent in results] == [ScaleOutcome.NO_BACKEND] * 20
    assert wakes == ["adm-queue-test"]  # one wake-up, from the decider, for the batch of 20


def test_a_coroutine_no_batch_takes_in_time_gives_up_and_is_never_decided(recorder):
    blocker = _block(recorder)

    async def main():
        with pytest.raises(AdmissionTimeout, match="within 0.2s"):
            await recorder.queue.submit_async(request("late"), timeout=0.2)

    asyncio.run(main())
    assert _decided_after_release(recorder, blocker) == ["blocker", "after"]


def test_coroutines_whose_timeouts_end_together_share_one_timer(recorder):
    """A timer per request (and its cancellation when the answer comes) was a few µs of every
    request: the queue keeps one per loop and TIMEOUT_SLOT instead."""
    blocker = _block(recorder)

    async def main():
        loop = asyncio.get_running_loop()
        timers = []
        original = loop.call_at

        def counting(when, callback, *args, **kwargs):
            if getattr(callback, "__self__", None) is recorder.queue:
                timers.append(when)
            return original(when, callback, *args, **kwargs)

        loop.call_at = counting
        tasks = [asyncio.create_task(recorder.queue.submit_async(request(f"j{i}"), timeout=30)) for i in range(20)]
        await asyncio.sleep(0.05)
        recorder.release.set()
        await asyncio.gather(*tasks)
        return timers

    timers = asyncio.run(main())
    blocker.join(10)
    assert 1 <= len(timers) <= 2, timers  # the 20 deadlines fall in one slot, or two
    assert recorder.queue._slots == {}  # all answered: no slot, and no timer, is left behind


def test_a_coroutine_taken_into_a_batch_waits_past_its_timeout_for_the_outcome():
    entered = threading.Event()

    def slow(requests):
        entered.set()
        threading.Event().wait(0.5)
        return BatchResult(decisions=[ScaleDecision(ScaleOutcome.NO_BACKEND) for _ in requests])

    q = AdmissionQueue(decide=slow, name="adm-queue-slow")

    async def main():
        return await q.submit_async(request("taken"), timeout=0.1)

    try:
        decision, _agent = asyncio.run(main())
    finally:
        q.shutdown()
    assert entered.is_set()
    assert decision.action == ScaleOutcome.NO_BACKEND


def test_a_cancelled_coroutine_withdraws_its_queued_request(recorder):
    """A caller that goes away (its client disconnected) before any batch took its request takes
    it back: no agent is admitted for an answer nobody reads."""
    blocker = _block(recorder)

    async def main():
        task = asyncio.create_task(recorder.queue.submit_async(request("gone")))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _decided_after_release(recorder, blocker) == ["blocker", "after"]


def test_a_forked_child_gets_a_queue_of_its_own():
    """The decider thread does not survive a fork, so a child (an rq work-horse) must not queue
    on its parent's queue object, whose thread it does not have."""
    parent = get_queue()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        try:
            os.write(write, b"own" if get_queue() is not parent else b"shared")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"own"


def test_the_deciders_connection_runs_the_batch_statements_on_one_plan_each():
    """Refusal batches on the decider's connection: the prepared batch write, and the check that
    no refused job has a live agent (each batch after the first, decided from the held snapshot),
    run on their generic plans, never planned anew for a batch."""
    from django.db import connection

    from scalers.admission.decide import decide_batch
    from scalers.admission.ledger import NO_LIVE_STATEMENT, WRITE_STATEMENT
    from tests.support.scalers import make_agent, make_scaler

    make_agent(make_scaler("full", max_agents=1), state="running")
    plans: dict[str, tuple[int, int]] = {}

    def decide_and_look(requests: list[Request]) -> BatchResult:
        result = decide_batch(requests)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE name = ANY(%s)",
                [[WRITE_STATEMENT, NO_LIVE_STATEMENT]],
            )
            plans.update({name: (generic, custom) for name, generic, custom in cur.fetchall()})
        return result

    q = AdmissionQueue(decide=decide_and_look, name="adm-queue-plans")
    try:
        for _ in range(8):
            decision, _agent = q.submit(request("j-refused"), timeout=10)
            assert decision.action == ScaleOutcome.AT_CAPACITY
    finally:
        q.shutdown()
    assert plans == {WRITE_STATEMENT: (8, 0), NO_LIVE_STATEMENT: (7, 0)}, "(generic plans, custom plans)"
