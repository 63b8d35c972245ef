"""Group commit for admission: many callers, one decider thread per process, one lock per batch.

A caller queues its request and waits; the decider takes everything queued, decides it in one
transaction under the admission lock and wakes the callers. Why a batch and what one costs:
``docs/admission.md``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, connection

from scalers.metrics import BATCH_SIZE, CAP_LOCK_FAILURES
from scalers.models import ScaleOutcome

from .decide import Admitted, BatchResult, Request, ScaleDecision, decide_batch

log = logging.getLogger("scalers.admission")

QUEUED, TAKEN, CANCELLED = 0, 1, 2

#: Granularity of a coroutine's timeout (seconds): it ends at most this much late.
TIMEOUT_SLOT = 0.1


class AdmissionTimeout(Exception):
    """The request was not taken into a batch within the caller's timeout (nothing was written)."""


class _Pending:
    """One queued request and how its caller waits: a thread on ``event``, or a coroutine on
    ``future`` of event loop ``loop``."""

    __slots__ = ("request", "event", "loop", "future", "decision", "agent", "error", "state", "timeout")

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop | None = None):
        self.request = request
        self.loop = loop
        self.future: asyncio.Future | None = loop.create_future() if loop is not None else None
        self.event = threading.Event() if loop is None else None
        self.decision: ScaleDecision | None = None
        self.agent: Admitted | None = None
        self.error: BaseException | None = None
        self.state = QUEUED
        self.timeout: float | None = None


def _wake(batch: list[_Pending]) -> None:
    """Wake the callers of a decided batch: each waiting thread, and each event loop once for all
    of its coroutines (one cross-thread wake-up per loop, not one per request)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
    for p in batch:
        if p.event is not None:
            p.event.set()
        elif p.loop is not None:
            by_loop.setdefault(p.loop, []).append(p)
    for loop, waiters in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, waiters)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass


def _settle(waiters: list[_Pending]) -> None:
    for p in waiters:
        if p.future is not None and not p.future.done():
            p.future.set_result(None)


class AdmissionQueue:
    """An in-process queue feeding one decider thread (started on first use).

    ``max_batch``: most requests decided per transaction. ``idle_close_seconds``: the decider
    closes its database connection after this long without work (so test databases can be
    dropped and idle consoles hold no connection). ``decide``: the batch function (tests and the
    bench may pass their own instance id through it).
    """

    def __init__(
        self,
        *,
        max_batch: int = 512,
        idle_close_seconds: float = 2.0,
        lock_timeout_ms: int = 10_000,
        decide: Callable[[list[Request]], BatchResult] | None = None,
        name: str = "kici-admission",
    ):
        self.max_batch = max_batch
        self.idle_close_seconds = idle_close_seconds
        self.lock_timeout_ms = lock_timeout_ms
        self._decide = decide or (lambda reqs: decide_batch(reqs))
        self._name = name
        self._cv = threading.Condition()
        self._items: list[_Pending] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._conn_seen = None
        #: Per (event loop, timeout slot): the coroutines whose timeout ends then, and its timer.
        self._slots: dict[tuple[asyncio.AbstractEventLoop, int], tuple[set[_Pending], asyncio.TimerHandle]] = {}
        self.batches = 0
        self.decided = 0

    # ------------------------------------------------------------------ caller side

    def submit(self, request: Request, timeout: float | None = 30.0) -> tuple[ScaleDecision, Admitted | None]:
        """Queue ``request`` and wait for its decision; returns ``(decision, agent or None)``.

        Raises :class:`AdmissionTimeout` when no batch took the request within ``timeout``
        seconds (then it never will), or the database error that failed its batch (then the
        batch's transaction rolled back and nothing was written).
        """
        p = _Pending(request)
        event = p.event
        assert event is not None, "a pending request without a loop has an event"
        self._enqueue(p)
        if not event.wait(timeout):
            if self._withdraw(p):
                raise AdmissionTimeout(f"no admission decision within {timeout}s")
            event.wait()  # taken into a batch: its outcome is real, wait for it
        return self._outcome(p)

    async def submit_async(
        self, request: Request, timeout: float | None = 30.0
    ) -> tuple[ScaleDecision, Admitted | None]:
        """:meth:`submit` for async views: awaits the decision without holding a thread.

        A caller cancelled (its client went away) before a batch took its request withdraws it, so
        it is never decided; once taken, its outcome stands. The timeout ends within
        :data:`TIMEOUT_SLOT` seconds after ``timeout``.
        """
        loop = asyncio.get_running_loop()
        p = _Pending(request, loop)
        future = p.future
        assert future is not None, "a pending request with a loop has a future"
        self._enqueue(p)
        slot = self._expire_later(loop, p, timeout) if timeout is not None else None
        try:
            await future
        except asyncio.CancelledError:
            self._withdraw(p)
            raise
        finally:
            if slot is not None:
                self._forget_expiry(slot, p)
        return self._outcome(p)

    def _expire_later(self, loop: asyncio.AbstractEventLoop, p: _Pending, timeout: float) -> tuple:
        """Put ``p`` with the coroutines of its loop whose timeout ends in the same
        :data:`TIMEOUT_SLOT` (one loop timer per slot, not one per request: a timer per request and
        its cancellation were a few µs of every request's side); returns the slot's key."""
        p.timeout = timeout
        key = (loop, math.ceil((loop.time() + timeout) / TIMEOUT_SLOT))
        entry = self._slots.get(key)
        if entry is None:
            entry = self._slots[key] = (set(), loop.call_at(key[1] * TIMEOUT_SLOT, self._expire_slot, key))
        entry[0].add(p)
        return key

    def _forget_expiry(self, key: tuple, p: _Pending) -> None:
        """``p`` is answered: out of its slot; the slot's timer goes with its last coroutine."""
        entry = self._slots.get(key)
        if entry is not None:
            entry[0].discard(p)
            if not entry[0]:
                del self._slots[key]
                entry[1].cancel()

    def _expire_slot(self, key: tuple) -> None:
        waiting, _timer = self._slots.pop(key, ((), None))
        for p in list(waiting):
            self._expire(p)

    def _expire(self, p: _Pending) -> None:
        """``submit_async``'s timeout (on the caller's loop): give up unless a batch has it."""
        if self._withdraw(p) and p.future is not None and not p.future.done():
            p.future.set_exception(AdmissionTimeout(f"no admission decision within {p.timeout}s"))

    def _enqueue(self, p: _Pending) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("admission queue is shut down")
            self._ensure_thread()
            self._items.append(p)
            self._cv.notify()

    def _withdraw(self, p: _Pending) -> bool:
        """Take back a request no batch has taken yet (its caller gave up waiting); False when a
        batch already has it, so its outcome is real and must be waited for."""
        with self._cv:
            if p.state == QUEUED:
                p.state = CANCELLED
                self._items.remove(p)
                return True
        return False

    @staticmethod
    def _outcome(p: _Pending) -> tuple[ScaleDecision, Admitted | None]:
        if p.error is not None:
            raise p.error
        assert p.decision is not None, "a settled request has its decision or its error"
        return p.decision, p.agent

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ decider side

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._items and not self._stopping:
                        if not self._cv.wait(self.idle_close_seconds) and not self._items:
                            self._close_connection()
                    if not self._items:
                        break
                    batch = self._items[: self.max_batch]
                    del self._items[: self.max_batch]
                    for p in batch:
                        p.state = TAKEN
                self._run_batch(batch)
        finally:
            self._close_connection()

    def _run_batch(self, batch: list[_Pending]) -> None:
        try:
            self._prepare_connection()
            result = self._decide([p.request for p in batch])
        except BaseException as exc:  # every waiter must be woken
            log.warning("admission batch of %d failed: %s", len(batch), exc)
            _count_lock_failure(exc)
            self._close_connection()
            for p in batch:
                p.error = exc
            _wake(batch)
            if not isinstance(exc, Exception):
                raise
            return
        by_id = {a.agent_id: a for a in result.admitted}
        _observe_batch(len(batch))
        self.batches += 1
        self.decided += len(batch)
        for p, decision in zip(batch, result.decisions, strict=True):
            p.decision = decision
            p.agent = by_id.get(decision.agent) if decision.action == ScaleOutcome.SPAWNING and decision.agent else None
        _wake(batch)

    def _prepare_connection(self) -> None:
        """Set up the decider's connection once: its lock timeout, and generic plans for the
        batch's prepared statements (``scalers.admission.ledger.prepare_statements``). Left to
        choose, PostgreSQL planned the batch write anew for every batch that admits nothing (its
        custom plan, leaving out the parts such a batch skips, looks cheaper than the generic one),
        and planning the statement cost more than running it; their plans depend on no parameter's
        value (the rows come as JSON documents, the look-ups are by unique index)."""
        connection.ensure_connection()
        raw = connection.connection
        if raw is not self._conn_seen:
            with connection.cursor() as cur:
                cur.execute(f"SET lock_timeout = {int(self.lock_timeout_ms)}")
                cur.execute("SET plan_cache_mode = force_generic_plan")
            self._conn_seen = raw

    def _close_connection(self) -> None:
        try:
            connection.close()
        except Exception:  # noqa: BLE001
            pass
        self._conn_seen = None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Decide what is queued, stop the decider thread and close its connection."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


def lock_failure_reason(exc: BaseException) -> str | None:
    """``contended`` for a lock timeout (SQLSTATE 55P03), ``unreachable`` for other database
    operational errors, else None (the ``reason`` label of ``cap_lock_failures_total``)."""
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) == "55P03":
        return "contended"
    if isinstance(exc, (OperationalError, InterfaceError)):
        return "unreachable"
    return None


def _count_lock_failure(exc: BaseException) -> None:
    reason = lock_failure_reason(exc)
    if reason:
        CAP_LOCK_FAILURES.labels(reason=reason).inc()


def _observe_batch(n: int) -> None:
    BATCH_SIZE.observe(n)


_QUEUE: AdmissionQueue | None = None
_QUEUE_LOCK = threading.Lock()


def get_queue() -> AdmissionQueue:
    """This process's admission queue (a forked child makes its own: threads do not survive a
    fork). Every request calls this, so the common case takes no lock."""
    global _QUEUE
    q = _QUEUE
    if q is not None:
        return q
    with _QUEUE_LOCK:
        if _QUEUE is None:
            _QUEUE = AdmissionQueue()
        return _QUEUE


def _forget_queue_after_fork() -> None:
    global _QUEUE, _QUEUE_LOCK
    _QUEUE, _QUEUE_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_queue_after_fork)


def shutdown_queue() -> None:
    """Stop this process's decider thread (tests call it so the test database can be dropped)."""
    global _QUEUE
    with _QUEUE_LOCK:
        q, _QUEUE = _QUEUE, None
    if q is not None:
        q.shutdown()
