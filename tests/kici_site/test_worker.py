"""The console's rq worker decodes jobs as JSON only: a pickled queue entry never runs."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import django_rq
import pytest
from django.conf import settings
from rq import Queue
from rq.serializers import DefaultSerializer

ROOT = Path(__file__).resolve().parents[2]


def write_marker(path: str) -> str:
    """The job a foreign client wants run: leaves a file at ``path``."""
    Path(path).write_text("ran")
    return "ran"


class _Trap:
    """Unpickling it creates the directory ``path``: proof that a worker decoded a pickle at all."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _run_burst_worker(queue_name: str) -> subprocess.CompletedProcess:
    """A real ``manage.py rqworker --burst`` (the worker class the settings name), as make run starts it."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test", "KICI_EXTRA_QUEUES": queue_name}
    return subprocess.run(
        [sys.executable, "manage.py", "rqworker", queue_name, "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def queue_name():
    name = f"foreign-{secrets.token_hex(4)}"
    yield name
    conn = django_rq.get_connection("default")
    Queue(name, connection=conn, serializer=settings.KICI_JOB_SERIALIZER).delete(delete_jobs=True)


def test_a_pickled_job_pushed_by_another_client_never_runs(tmp_path, queue_name):
    conn = django_rq.get_connection("default")
    ran, decoded, console_ran = tmp_path / "ran", tmp_path / "decoded", tmp_path / "console-ran"
    # Another Redis client pushes a job in rq's default (pickle) form on the console's queue.
    foreign = Queue(queue_name, connection=conn, serializer=DefaultSerializer).enqueue(
        write_marker, str(ran), _Trap(str(decoded))
    )
    # The console's own job, behind it: the worker did run and does run JSON jobs.
    own = Queue(queue_name, connection=conn, serializer=settings.KICI_JOB_SERIALIZER).enqueue(
        write_marker, str(console_ran)
    )

    worker = _run_burst_worker(queue_name)

    assert not decoded.exists(), "the worker unpickled the foreign job's arguments"
    assert not ran.exists(), "the worker ran the foreign job"
    assert worker.returncode == 0, worker.stderr
    assert console_ran.read_text() == "ran", f"the worker ran no job: {worker.stderr}"
    assert own.get_status(refresh=True) == "finished"
    failed = Queue(queue_name, connection=conn, serializer=settings.KICI_JOB_SERIALIZER).failed_job_registry
    assert foreign.id in failed.get_job_ids()


def test_every_configured_queue_encodes_jobs_as_json():
    for name in settings.RQ_QUEUES:
        assert django_rq.get_queue(name).serializer.__name__ == "JSONSerializer", name


@pytest.mark.parametrize("name", ["os.mkdir", "scalers.admission.queue.os.mkdir", "agents.models.Agent"])
def test_a_json_job_naming_a_function_outside_the_console_never_runs(tmp_path, queue_name, name):
    made = tmp_path / "made"
    queue = Queue(queue_name, connection=django_rq.get_connection("default"), serializer=settings.KICI_JOB_SERIALIZER)
    job = queue.enqueue(name, str(made))

    worker = _run_burst_worker(queue_name)

    assert not made.exists(), f"the worker ran {name}"
    assert worker.returncode == 0, worker.stderr
    assert job.get_status(refresh=True) == "failed"
    assert "JobRefused" in job.latest_result().exc_string


def test_a_foreign_failure_callback_is_refused_too(tmp_path, queue_name):
    from rq import Callback

    queue = Queue(queue_name, connection=django_rq.get_connection("default"), serializer=settings.KICI_JOB_SERIALIZER)
    job = queue.enqueue(write_marker, 42, on_failure=Callback("shutil.rmtree"))  # write_marker(42) fails

    worker = _run_burst_worker(queue_name)

    assert worker.returncode == 0, worker.stderr
    assert job.get_status(refresh=True) == "failed"
    assert "shutil.rmtree" in worker.stderr + worker.stdout and "JobRefused" in worker.stderr + worker.stdout


def test_a_worker_whose_record_redis_lost_registers_again_and_still_takes_jobs(tmp_path, queue_name):
    """Redis emptied under a running worker (a FLUSHDB, a restart without persistence): within an
    idle heartbeat the worker is listed again, with its queue, and it runs what is queued next."""
    from rq import Worker

    from kici_site.worker import IDLE_HEARTBEAT_SECONDS

    conn = django_rq.get_connection("default")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test", "KICI_EXTRA_QUEUES": queue_name}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "rqworker", queue_name],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        return any(queue_name in w.queue_names() for w in Worker.all(connection=conn))

    def wait(done, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, f"{what} within {seconds:g} s"
            assert proc.poll() is None, "the worker exited"
            time.sleep(0.2)

    try:
        wait(listening, 30, "the worker registered")
        conn.flushdb()
        assert not listening()
        wait(listening, IDLE_HEARTBEAT_SECONDS + 10, "the worker listed again after the flush")
        marker = tmp_path / "ran"
        job = Queue(queue_name, connection=conn, serializer=settings.KICI_JOB_SERIALIZER).enqueue(
            write_marker, str(marker)
        )
        wait(marker.exists, 30, f"the job {job.id} ran after the flush")
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_worker_imports_the_job_modules_before_it_forks_a_work_horse():
    """A work-horse inherits them instead of importing them for every job."""
    code = (
        "import sys, django; django.setup()\n"
        "from kici_site.worker import KiciWorker\n"
        "from rq import Queue\n"
        "from redis import Redis\n"
        "from django.conf import settings\n"
        "spawn = ('scalers.jobs', 'scalers.lifecycle', 'operations.jobs')\n"
        "assert not any(m in sys.modules for m in spawn), [m for m in spawn if m in sys.modules]\n"
        "redis = Redis.from_url(settings.REDIS_URL)\n"
        "KiciWorker([Queue('preload-probe', connection=redis)], connection=redis)\n"
        "assert all(m in sys.modules for m in spawn), [m for m in spawn if m not in sys.modules]\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
