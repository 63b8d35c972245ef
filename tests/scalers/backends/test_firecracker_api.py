"""The Firecracker API client: real ``firecracker --api-sock``, errors, and cancellation."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from scalers.backends.firecracker.api import FirecrackerApi, FirecrackerApiAborted, FirecrackerApiError
from scalers.backends.firecracker.cancel import CancelSignal
from tests.support.firecracker import real_binaries


@pytest.fixture
def real_api(tmp_path):
    fc, _ = real_binaries()
    sock = tmp_path / "fc.sock"
    proc = subprocess.Popen(
        [str(fc), "--api-sock", str(sock), "--level", "Warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 5
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield FirecrackerApi(str(sock))
    proc.kill()
    proc.wait()


def test_it_reads_instance_info_from_a_real_firecracker(real_api):
    info = real_api.get_info()
    assert info["app_name"] == "Firecracker" and info["vmm_version"] == "1.12.1"
    assert real_api.is_ready()


def test_mmds_round_trips_through_a_real_firecracker(real_api):
    payload = {"latest": {"meta-data": {"kici-agent-id": "scaler-firecracker-0000abcd", "kici-env": {"A": "1"}}}}
    real_api.put_mmds(payload)
    assert real_api.get_mmds() == payload
    real_api.clear_mmds()
    assert real_api.get_mmds() == {"latest": {"meta-data": {}}}


def test_a_non_2xx_answer_raises_with_method_path_status_and_body(real_api):
    # Before a boot, Firecracker refuses Ctrl-Alt-Del with a 400 and a fault message.
    with pytest.raises(FirecrackerApiError) as err:
        real_api.send_ctrl_alt_del()
    e = err.value
    assert (e.method, e.path, e.status) == ("PUT", "/actions", 400)
    assert "not supported before starting the microVM" in e.body
    assert str(e) == f"Firecracker API PUT /actions: 400 {e.body}"


def test_a_missing_socket_is_an_os_error_and_not_ready(tmp_path):
    api = FirecrackerApi(str(tmp_path / "absent.sock"))
    with pytest.raises(FileNotFoundError):
        api.get_info()
    assert api.is_ready() is False


class _SilentServer:
    """Accepts connections on a Unix socket and never answers: an in-flight request hangs."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.accepted = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_cancelling_aborts_an_in_flight_request_and_every_later_one(tmp_path):
    server = _SilentServer(tmp_path / "silent.sock")
    try:
        cancel = CancelSignal()
        api = FirecrackerApi(str(tmp_path / "silent.sock"), cancel=cancel, timeout=30)
        cancel.cancel_after(0.3, "spawn deadline")
        started = time.monotonic()
        with pytest.raises(FirecrackerApiAborted, match="spawn deadline"):
            api.put_mmds({"latest": {"meta-data": {}}})
        assert time.monotonic() - started < 5  # not the 30 s socket timeout
        before = server.accepted
        with pytest.raises(FirecrackerApiAborted):
            api.get_info()
        with pytest.raises(FirecrackerApiAborted):
            api.is_ready()
        assert server.accepted == before  # later requests never connect
    finally:
        server.close()


def test_a_plain_event_is_honoured_before_each_request(tmp_path):
    ev = threading.Event()
    ev.set()
    with pytest.raises(FirecrackerApiAborted):
        FirecrackerApi(str(tmp_path / "x.sock"), cancel=ev).get_info()


def test_cancel_signal_runs_callbacks_once_and_late_ones_immediately():
    sig = CancelSignal()
    calls: list[str] = []
    remove = sig.add_callback(lambda: calls.append("a"))
    sig.add_callback(lambda: calls.append("b"))
    remove()
    assert sig.cancel("first") is True and sig.cancel("second") is False
    assert calls == ["b"] and sig.reason == "first" and sig.is_set()
    sig.add_callback(lambda: calls.append("late"))
    assert calls == ["b", "late"]
