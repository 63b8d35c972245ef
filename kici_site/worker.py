"""The rq worker class the console runs (``rqworker --worker-class kici_site.worker.KiciWorker``).

A forked work-horse ends with ``os._exit``: anything still queued on the event publisher
thread would be lost, so every job is followed by a bounded flush.
"""

from rq import Worker

from agents.events import flush_events


class KiciWorker(Worker):
    def perform_job(self, job, queue):
        try:
            return super().perform_job(job, queue)
        finally:
            flush_events(timeout=5.0)
