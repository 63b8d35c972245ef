#!/usr/bin/env python3
"""A stand-in for ``jailer`` + ``firecracker`` for hosts where a guest cannot boot (tests only).

Invoked exactly like the real jailer::

    fake_firecracker.py --id <id> --exec-file <fc> --uid <uid> --gid <gid> --chroot-base-dir <base>
        --new-pid-ns -- --config-file /config.json --log-path /vmm.log --level Warning

Like the jailer it forks: the parent writes the child's pid to ``<chroot>/firecracker.pid`` and
exits 0; the child renames its ``comm`` to ``firecracker`` (prctl PR_SET_NAME), chroots into
``<base>/<basename(exec-file)>/<id>/root``, drops to uid/gid, reads ``/config.json`` and serves
the real Firecracker HTTP API on ``/run/firecracker.socket``: ``GET /``, ``PUT``/``GET``/``PATCH
/mmds``, ``PUT /actions`` (``SendCtrlAltDel`` ⇒ the "guest" reboots: the process exits 0).
Errors answer ``400 {"fault_message": ...}`` as Firecracker does. stdout (the serial console the
backend redirects to ``serial-console.log``) receives the "guest" output.

The "kernel" file drives the guest, one directive per line:
``serial <text>`` print a serial line at boot; ``api off`` never bind the socket;
``exit <seconds> <code>`` exit with ``code`` after ``seconds``; ``ignore-ctrl-alt-del`` keep running;
``panic-after-ready <text>`` once ``GET /`` has answered, print ``<text>`` and exit 0 at once (a guest
that dies right after its API socket came up: the next API call is refused).
Env ``FAKE_JAILER_EXIT=<code>``: the jailer itself fails before forking (prints to stderr).
"""

from __future__ import annotations

import ctypes
import json
import os
import socketserver
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler

PR_SET_NAME = 15


def parse_jailer_argv(argv: list[str]) -> tuple[dict, dict]:
    """(jailer options, firecracker options) from a real jailer command line."""
    if "--" not in argv:
        raise SystemExit("fake jailer: missing '--' before firecracker arguments")
    split = argv.index("--")
    jail, fc = argv[:split], argv[split + 1 :]
    opts: dict = {"new_pid_ns": False}
    i = 0
    while i < len(jail):
        a = jail[i]
        if a == "--new-pid-ns":
            opts["new_pid_ns"] = True
            i += 1
            continue
        if a in ("--id", "--exec-file", "--uid", "--gid", "--chroot-base-dir"):
            opts[a[2:].replace("-", "_")] = jail[i + 1]
            i += 2
            continue
        raise SystemExit(f"fake jailer: unknown argument {a!r}")
    for key in ("id", "exec_file", "uid", "gid", "chroot_base_dir"):
        if key not in opts:
            raise SystemExit(f"fake jailer: missing --{key.replace('_', '-')}")
    fc_opts = {}
    for j in range(0, len(fc) - 1, 2):
        fc_opts[fc[j].lstrip("-").replace("-", "_")] = fc[j + 1]
    return opts, fc_opts


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A request cut off as the VMM exits (the console's last API call racing the panic) must
        # not print a traceback: this process's output is the guest's serial console, which a
        # real firecracker never writes API errors to. It goes to the trace file instead.
        trace(f"request failed: {traceback.format_exc()}")


#: In the chroot (``run/`` is the VM uid's): what the fake did and when, for a failing test's message.
TRACE_PATH = "/run/fake-vmm-trace.log"


def trace(line: str) -> None:
    try:
        with open(TRACE_PATH, "a") as f:
            f.write(f"{time.monotonic():.3f} {line}\n")
    except OSError:
        pass


class VmmApiHandler(BaseHTTPRequestHandler):
    """The Firecracker API over ``state`` (a subclass per VMM sets it: :func:`make_handler`)."""

    protocol_version = "HTTP/1.1"
    state: dict

    def log_message(self, *args):  # no client address on a Unix socket
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else None

    def _send(self, status: int, obj=None):
        data = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:  # a zero-length write to a caller that already read its answer and left is EPIPE
            self.wfile.write(data)

    def _fault(self, msg: str):
        self._send(400, {"fault_message": msg})

    def _die_if_dying(self):
        # A guest that died answers nothing more: a request after the last answer is refused,
        # whichever thread serves it and however late os._exit runs in the dying one.
        if self.state.get("dying"):
            self.state["panicked"].wait(5)  # the panic text is in the serial log first
            os._exit(0)

    def do_GET(self):
        self._die_if_dying()
        if self.path == "/":
            if self.state["panic_after_ready"] is not None:
                self.state["dying"] = True  # before the answer: the caller's next request comes after it
            self._send(
                200, {"id": self.state["id"], "state": "Running", "vmm_version": "1.12.1", "app_name": "Firecracker"}
            )
            if self.state["panic_after_ready"] is not None:
                self.wfile.flush()
                self.state["log"](self.state["panic_after_ready"])
                self.state["panicked"].set()
                os._exit(0)
        elif self.path == "/mmds":
            self._send(200, self.state["mmds"])
        else:
            self._fault(f"Invalid request method and/or path: GET {self.path}")

    def do_PUT(self):
        self._die_if_dying()
        try:
            body = self._body()
        except ValueError as e:
            return self._fault(f"An error occurred when deserializing the json body of a request: {e}")
        if self.path == "/mmds":
            self.state["mmds"] = body if body is not None else {}
            return self._send(204)
        if self.path == "/actions":
            action = (body or {}).get("action_type")
            if action == "SendCtrlAltDel":
                trace("SendCtrlAltDel received")
                # Like Firecracker, the action is taken whether or not the answer reaches the caller.
                if not self.state["ignore_cad"]:
                    self.state["log"]("reboot: Restarting system")
                    threading.Timer(0.05, lambda: os._exit(0)).start()
                    trace("reboot logged, exit in 0.05 s")
                self._send(204)
                trace("SendCtrlAltDel answered")
                return None
            return self._fault(f"Unsupported action type: {action}")
        return self._fault(f"Invalid request method and/or path: PUT {self.path}")

    def do_PATCH(self):
        self._die_if_dying()
        if self.path != "/mmds":
            return self._fault(f"Invalid request method and/or path: PATCH {self.path}")
        body = self._body() or {}
        self.state["mmds"].update(body)
        return self._send(204)


def make_handler(state: dict) -> type[VmmApiHandler]:
    """The handler class for one VMM: :class:`VmmApiHandler` serving ``state`` (config, mmds, directives)."""
    return type("Handler", (VmmApiHandler,), {"state": state})


def run_vmm(opts: dict, fc_opts: dict) -> None:
    """The child: become ``firecracker`` in the chroot and serve the API until told to stop."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, b"firecracker", 0, 0, 0)
    os.setsid()
    chroot = os.path.join(opts["chroot_base_dir"], os.path.basename(opts["exec_file"]), opts["id"], "root")
    os.chroot(chroot)
    os.chdir("/")
    os.setgid(int(opts["gid"]))
    os.setuid(int(opts["uid"]))
    out = sys.stdout

    def log(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    with open(fc_opts.get("config_file", "/config.json")) as f:
        config = json.load(f)
    kernel = config["boot-source"]["kernel_image_path"]
    directives = []
    with open(kernel, errors="replace") as f:
        for line in f:
            parts = line.strip().split(" ", 1)
            if parts and parts[0]:
                directives.append((parts[0], parts[1] if len(parts) > 1 else ""))
    if fc_opts.get("log_path"):
        with open(fc_opts["log_path"], "a") as f:
            f.write(f"[{opts['id']}:main] Running Firecracker v1.12.1 (fake)\n")
    state = {
        "id": opts["id"],
        "mmds": {},
        "log": log,
        "ignore_cad": any(d == "ignore-ctrl-alt-del" for d, _ in directives),
        "panic_after_ready": next((a for d, a in directives if d == "panic-after-ready"), None),
        "panicked": threading.Event(),
    }
    api = not any(d == "api" and a.strip() == "off" for d, a in directives)
    server = None
    if api:
        os.makedirs("/run", exist_ok=True)
        sock = "/run/firecracker.socket"
        if os.path.exists(sock):
            os.unlink(sock)
        server = _Server(sock, make_handler(state))
        threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"Linux version 6.1.0-fake (kernel {kernel}) boot_args: {config['boot-source'].get('boot_args', '')}")
    for d, a in directives:
        if d == "serial":
            log(a)
        elif d == "exit":
            seconds, code = a.split()
            time.sleep(float(seconds))
            os._exit(int(code))
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> int:
    opts, fc_opts = parse_jailer_argv(argv)
    if os.environ.get("FAKE_JAILER_EXIT"):
        sys.stderr.write("2026-01-01T00:00:00 [jailer] Jailer error: fake failure requested\n")
        return int(os.environ["FAKE_JAILER_EXIT"])
    chroot = os.path.join(opts["chroot_base_dir"], os.path.basename(opts["exec_file"]), opts["id"], "root")
    if not os.path.isdir(chroot):
        sys.stderr.write(f"Jailer error: chroot {chroot} missing\n")
        return 1
    pid = os.fork()
    if pid == 0:
        try:
            run_vmm(opts, fc_opts)
        except BaseException as e:  # noqa: BLE001 - report like a crashing VMM, then die
            sys.stderr.write(f"fake firecracker: {e!r}\n")
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    with open(os.path.join(chroot, "firecracker.pid"), "w") as f:
        f.write(str(pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
