"""Threads started together, each on its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


def run_threads(n: int, target: Callable[[int], object]) -> list:
    """Run ``target(i)`` in ``n`` threads started together; each closes its own DB connection.
    Returns the results in order; an exception in a thread is returned in its slot."""
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results
