"""A stand-in for a real KiCI orchestrator's admin interface on loopback, answering as the v0.1.24
routes the console calls do (``scalers.kici_orchestrator``): agent tokens and the fleet topology."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ADMIN_TOKEN = "the-operators-admin-token"


class StandIn:
    """Agent tokens and connected agents, as the orchestrator's admin routes answer them."""

    def __init__(self):
        self.tokens: dict[str, dict] = {}
        self.connected: list[str] = []
        self.calls: list[tuple[str, str, str]] = []


@contextmanager
def stand_in_orchestrator():
    """Yields its :class:`StandIn` state (``port`` set) while it serves on 127.0.0.1."""
    state = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self) -> bool:
            state.calls.append((self.command, self.path, self.headers.get("authorization", "")))
            if self.headers.get("authorization") != f"Bearer {ADMIN_TOKEN}":
                self._answer(401, {"error": "Invalid or expired token"})
                return False
            return True

        def do_POST(self):
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            token_id = f"at-{len(state.tokens) + 1}"
            state.tokens[token_id] = {"id": token_id, "labels": body["labels"], "lastSeenAt": None}
            self._answer(201, {"id": token_id, "token": f"kat_{token_id}", "labels": body["labels"]})

        def do_DELETE(self):
            if not self._authorized():
                return
            token_id = self.path.rsplit("/", 1)[1]
            if state.tokens.pop(token_id, None) is None:
                self._answer(404, {"error": "Agent token not found or already revoked"})
            else:
                self._answer(200, {"kicked": 0})

        def do_GET(self):
            if not self._authorized():
                return
            if self.path == "/admin/fleet-topology":
                nodes = [{"kind": "orchestrator", "id": "orch-1", "parentId": None}]
                nodes += [{"kind": "agent", "id": a, "parentId": "orch-1"} for a in state.connected]
                self._answer(200, {"nodes": nodes})
            else:
                self._answer(200, {"tokens": list(state.tokens.values())})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.port = server.server_address[1]
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
