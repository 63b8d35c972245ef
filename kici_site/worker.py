"""The rq worker class the console runs (``rqworker``; ``RQ["WORKER_CLASS"]`` names it).

A forked work-horse ends with ``os._exit``: anything still queued on the event publisher
thread would be lost, so every job is followed by a bounded flush.

Jobs are decoded with ``settings.KICI_JOB_SERIALIZER`` (JSON) whatever ``--serializer`` says: a
pickled job runs code while it is being decoded, so an entry another Redis client pushed in
pickle form fails to decode (the job fails) and never runs.
"""

from django.conf import settings
from rq import Worker

from agents.events import flush_events


class KiciWorker(Worker):
    def __init__(self, *args, **kwargs):
        kwargs["serializer"] = settings.KICI_JOB_SERIALIZER
        super().__init__(*args, **kwargs)

    def perform_job(self, job, queue):
        try:
            return super().perform_job(job, queue)
        finally:
            flush_events(timeout=5.0)
