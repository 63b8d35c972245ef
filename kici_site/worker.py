"""The rq worker class the console runs (``RQ["WORKER_CLASS"]``): jobs decoded as JSON only and
limited to the console's own functions (docs/ARCHITECTURE.md, its opening), the job
modules imported once before the first fork, and a bounded flush of the event publisher after
every job (a work-horse ends with ``os._exit``).
"""

import ctypes
import importlib
import inspect
import logging
import os
import signal

from django.conf import settings
from redis.client import Pipeline
from rq import Worker, worker_registration
from rq.job import Job
from rq.utils import import_attribute

from agents.events import flush_events

log = logging.getLogger(__name__)

#: Seconds an idle worker waits on its queues before it heartbeats again (rq's default is about
#: seven minutes); each heartbeat also writes back a record Redis lost (:meth:`KiciWorker.heartbeat`).
IDLE_HEARTBEAT_SECONDS = 10

#: prctl(2) option: the signal a process gets when its parent thread dies.
_PR_SET_PDEATHSIG = 1
#: The pid of the process about to fork (set before each fork, read in the child).
_forking_pid = 0


def _note_forking_pid() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _die_with(worker_pid: int) -> None:
    """In a child the worker forked itself (its work-horse, its scheduler): be SIGKILLed when the
    worker dies. A worker killed outright (OOM, SIGKILL) would otherwise leave its scheduler running
    for good with the old code, holding the scheduler locks its restarted self needs. Forks made by
    those children are left alone; a worker already gone by now ends the child at once."""
    if _forking_pid != worker_pid:
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != worker_pid:
        os._exit(1)


class JobRefused(Exception):
    """A queued job names a callable that is not one of the console's job functions."""


def job_function(name: str):
    """The function ``name`` (``package.module.function``) when it is the console's own: its name
    starts with a package of ``settings.KICI_JOB_PACKAGES`` (checked before anything is imported)
    and it is a plain function defined in one of them. JobRefused naming it otherwise."""
    packages = tuple(settings.KICI_JOB_PACKAGES)
    if not isinstance(name, str) or name.partition(".")[0] not in packages:
        raise JobRefused(f"job function {name!r} is not in the console's packages ({', '.join(packages)})")
    func = import_attribute(name)
    module = getattr(func, "__module__", None) or ""
    if not inspect.isfunction(func) or module.partition(".")[0] not in packages:
        raise JobRefused(f"job function {name!r} is not a function defined in the console's packages")
    return func


class KiciJob(Job):
    """A job whose function and callbacks resolve only through :func:`job_function`."""

    @property
    def func(self):
        return None if self.func_name is None else job_function(self.func_name)

    @property
    def success_callback(self):
        return job_function(self._success_callback_name) if self._success_callback_name else None

    @property
    def failure_callback(self):
        return job_function(self._failure_callback_name) if self._failure_callback_name else None

    @property
    def stopped_callback(self):
        return job_function(self._stopped_callback_name) if self._stopped_callback_name else None


#: The modules whose functions the console enqueues, imported by the worker before it forks.
JOB_MODULES = ("scalers.jobs", "scalers.lifecycle", "operations.jobs", "operations.notify")


_armed: set[int] = set()


def _arm_children_once(worker_pid: int) -> None:
    """Have every child this process forks die with it (:func:`_die_with`), registered once."""
    if worker_pid not in _armed:
        _armed.add(worker_pid)
        os.register_at_fork(before=_note_forking_pid, after_in_child=lambda: _die_with(worker_pid))


class KiciWorker(Worker):
    def __init__(self, *args, **kwargs):
        kwargs["serializer"] = settings.KICI_JOB_SERIALIZER
        kwargs["job_class"] = KiciJob
        super().__init__(*args, **kwargs)
        for name in JOB_MODULES:
            importlib.import_module(name)
        _arm_children_once(os.getpid())

    @property
    def dequeue_timeout(self) -> int:
        return min(IDLE_HEARTBEAT_SECONDS, super().dequeue_timeout)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        """rq's heartbeat, and when Redis no longer lists this worker (it was emptied, or restarted
        without its data) its record written again: the worker still serves its queues, and the
        console's health check and pages must see it."""
        super().heartbeat(timeout, pipeline)
        if pipeline is None and not self.connection.sismember(self.redis_workers_keys, self.key):
            log.warning("worker %s: Redis lost its record; registering it again", self.name)
            with self.connection.pipeline() as p:
                p.hset(self.key, mapping={**self.serialize(), "state": self.get_state()})
                worker_registration.register(self, p)
                p.expire(self.key, self.worker_ttl + 60)
                p.execute()

    def perform_job(self, job, queue):
        try:
            return super().perform_job(job, queue)
        finally:
            flush_events(timeout=5.0)
