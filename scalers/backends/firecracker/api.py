"""Synchronous Firecracker API client over the VM's Unix socket.

Only the calls the backend uses: ``GET /`` (readiness), ``PUT /mmds`` / ``GET /mmds`` (bootstrap
data), ``PUT /actions {"action_type": "SendCtrlAltDel"}`` (graceful shutdown). The VM itself is
booted from ``config.json`` by the jailer, never through per-resource calls or ``InstanceStart``.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from typing import Any

from .cancel import CancelSignal

DEFAULT_TIMEOUT_S = 10.0
#: sun_path size including the terminating NUL.
UNIX_PATH_MAX = 108


class FirecrackerApiError(Exception):
    """A non-2xx answer: ``Firecracker API <METHOD> <path>: <status> <body>``."""

    def __init__(self, method: str, path: str, status: int, body: str):
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__(f"Firecracker API {method} {path}: {status} {body}")


class FirecrackerApiAborted(Exception):
    """The client's cancellation signal fired before or during the request."""

    def __init__(self, method: str, path: str, reason: str | None):
        self.method, self.path, self.reason = method, path, reason
        super().__init__(f"Firecracker API {method} {path}: aborted ({reason or 'cancelled'})")


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            if len(os.fsencode(self._socket_path)) < UNIX_PATH_MAX:
                sock.connect(self._socket_path)
            else:
                # sun_path holds 107 bytes; a deep chroot base exceeds it. Reach the socket through
                # an O_PATH descriptor of its directory instead (a short /proc/self/fd path).
                dirfd = os.open(os.path.dirname(self._socket_path), os.O_PATH | os.O_DIRECTORY)
                try:
                    sock.connect(f"/proc/self/fd/{dirfd}/{os.path.basename(self._socket_path)}")
                finally:
                    os.close(dirfd)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class FirecrackerApi:
    """HTTP/1.1 client for one VM's API socket (``socket_path``: ``<chroot>/run/firecracker.socket``);
    ``timeout``: seconds per socket operation. Once ``cancel`` (a :class:`CancelSignal`) fires, every
    in-flight request is aborted (its socket shut down) and every later one raises
    :class:`FirecrackerApiAborted`; a plain ``threading.Event`` is only checked around each request.
    Raises :class:`FirecrackerApiError` for a non-2xx status, ``OSError`` when the socket does not answer.
    """

    def __init__(self, socket_path: str, cancel: threading.Event | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.socket_path = str(socket_path)
        self.cancel = cancel
        self.timeout = timeout
        self._lock = threading.Lock()
        self._inflight: set[_UnixHTTPConnection] = set()
        if isinstance(cancel, CancelSignal):
            cancel.add_callback(self._abort_inflight)

    def _abort_inflight(self) -> None:
        with self._lock:
            conns = list(self._inflight)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _reason(self) -> str | None:
        return getattr(self.cancel, "reason", None)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; returns the decoded JSON body, the raw text if not JSON, or None if empty.

        ``body`` is JSON-encoded when not None. Raises as described on the class.
        """
        if self._cancelled():
            raise FirecrackerApiAborted(method, path, self._reason())
        conn = _UnixHTTPConnection(self.socket_path, self.timeout)
        with self._lock:
            self._inflight.add(conn)
        try:
            headers = {"Accept": "application/json"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            try:
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                if self._cancelled():
                    raise FirecrackerApiAborted(method, path, self._reason()) from None
                raise
            if self._cancelled():
                raise FirecrackerApiAborted(method, path, self._reason())
            text = raw.decode("utf-8", errors="replace")
            if not 200 <= resp.status < 300:
                raise FirecrackerApiError(method, path, resp.status, text)
            if not text:
                return None
            try:
                return json.loads(text)
            except ValueError:
                return text
        finally:
            with self._lock:
                self._inflight.discard(conn)
            conn.close()

    def get_info(self) -> dict:
        """``GET /``: instance info (``id``, ``state``, ``vmm_version``, ``app_name``)."""
        return self.request("GET", "/")

    def is_ready(self) -> bool:
        """True when ``GET /`` answers 2xx; False on any connection error or error status.

        Raises :class:`FirecrackerApiAborted` when cancelled (a readiness loop must stop then).
        """
        try:
            self.get_info()
            return True
        except FirecrackerApiAborted:
            raise
        except (OSError, http.client.HTTPException, FirecrackerApiError):
            return False

    def put_mmds(self, payload: dict) -> None:
        """``PUT /mmds`` with the whole metadata document (``jail.build_mmds_payload``)."""
        self.request("PUT", "/mmds", payload)

    def get_mmds(self) -> Any:
        """``GET /mmds``: the metadata document as stored."""
        return self.request("GET", "/mmds")

    def clear_mmds(self) -> None:
        """``PUT /mmds`` with ``{"latest": {"meta-data": {}}}``: after the agent registered, the spent
        token leaves the metadata service."""
        self.request("PUT", "/mmds", {"latest": {"meta-data": {}}})

    def send_ctrl_alt_del(self) -> None:
        """``PUT /actions {"action_type": "SendCtrlAltDel"}`` (graceful shutdown on destroy)."""
        self.request("PUT", "/actions", {"action_type": "SendCtrlAltDel"})
