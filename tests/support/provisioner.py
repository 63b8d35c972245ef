"""A provisioning target on loopback: a real ``http.server`` in a thread that receives the event
backend's signed deliveries, checks each signature and records it; it can refuse the first N."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Provisioner:
    """``url`` to put in ``provisioningTargets``; ``requests`` every POST as received (headers,
    body bytes); the first ``fail_first`` are answered ``status``, the rest 204. With ``secret``,
    ``signed`` records whether each body's ``X-Kici-Signature-256`` is right."""

    def __init__(self, fail_first: int = 0, status: int = 503, secret: str | None = None):
        self.requests: list[dict] = []
        self.signed: list[bool] = []
        self.fail_first, self.status, self.secret = fail_first, status, secret
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests.append({"headers": dict(self.headers), "body": body})
                    if receiver.secret is not None:
                        good = "sha256=" + hmac.new(receiver.secret.encode(), body, hashlib.sha256).hexdigest()
                        receiver.signed.append(hmac.compare_digest(good, self.headers["X-Kici-Signature-256"]))
                    code = receiver.status if len(receiver.requests) <= receiver.fail_first else 204
                self.send_response(code)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def deliveries(self) -> list[dict]:
        """Every body received, decoded: ``{event, deliveryId, timestampMs, payload}``."""
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests]

    def events(self, event: str) -> list[dict]:
        """The payloads of the deliveries of ``event`` (``kici.scaler.scale-up`` / ``-down``)."""
        return [d["payload"] for d in self.deliveries() if d["event"] == event]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
