"""A thread-safe cancellation signal with callbacks, the synchronous stand-in for an AbortSignal.

The spawn path hands one signal to every piece of work it starts (API client, socket wait, jailer
watcher); setting it aborts all of them at once: every in-flight request and every later one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelSignal(threading.Event):
    """A ``threading.Event`` that also runs registered callbacks once, when first set.

    ``cancel(reason)`` sets it and records ``reason`` (text); ``set()`` is ``cancel("cancelled")``.
    Callbacks run in the cancelling thread; one that raises is ignored so the others still run.
    A callback added after cancellation runs immediately.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._cb_lock = threading.Lock()
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> bool:
        """Set the signal; returns True for the call that actually cancelled it, False if already set."""
        with self._cb_lock:
            if self.is_set():
                return False
            self.reason = reason
            super().set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for cb in callbacks:
            try:
                cb()
            except Exception:  # noqa: BLE001 - one failing listener must not stop the others
                pass
        return True

    def set(self) -> None:  # Event API
        self.cancel("cancelled")

    def add_callback(self, cb: Callable[[], None]) -> Callable[[], None]:
        """Register ``cb``; returns a function that unregisters it (a no-op after it ran)."""
        with self._cb_lock:
            if not self.is_set():
                key = self._next
                self._next += 1
                self._callbacks[key] = cb

                def remove() -> None:
                    with self._cb_lock:
                        self._callbacks.pop(key, None)

                return remove
        cb()
        return lambda: None

    def cancel_after(self, seconds: float, reason: str) -> threading.Timer:
        """Cancel with ``reason`` after ``seconds`` (a daemon timer; ``.cancel()`` the timer to disarm)."""
        timer = threading.Timer(max(0.0, seconds), self.cancel, args=(reason,))
        timer.name = "fc-deadline"
        timer.daemon = True
        timer.start()
        return timer
