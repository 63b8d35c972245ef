"""Test helpers for the Firecracker guest (sandbox_agent/build_guest.sh): the built artifacts, an
MMDS-shaped server, a console that records registrations, busybox's applets as the guest's PATH.

The guest is built once into ``var/test-guest`` (gitignored); ``build_guest.sh`` hashes its inputs
and rebuilds only when they change. The build downloads the kernel package from the machine's apt
mirror; a failing build fails the test (never a skip): the guest is part of the product.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.network_lab import in_netns

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = REPO / "var" / "test-guest"
BUSYBOX = "/bin/busybox"
#: The ELF note Firecracker's PVH boot looks for: owner "Xen", XEN_ELFNOTE_PHYS32_ENTRY.
XEN_ELFNOTE_PHYS32_ENTRY = 18


def build_guest(out: Path = GUEST_DIR, agent_tree: Path | None = None) -> Path:
    """Run sandbox_agent/build_guest.sh into ``out`` (with ``agent_tree`` as its ``KICI_GUEST_AGENT_TREE``);
    raises AssertionError with its output when it fails."""
    env = {**os.environ, "KICI_GUEST_AGENT_TREE": str(agent_tree or "")}
    script = REPO / "sandbox_agent" / "build_guest.sh"
    proc = subprocess.run(["sh", str(script), str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"sandbox_agent/build_guest.sh failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
    return out


def busybox_path(tmp: Path) -> str:
    """A directory of busybox applet links (as the guest's /bin), for PATH: the guest scripts must
    run on busybox's wget, nc, ip, sed, not the host's."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        (bindir / applet).symlink_to(BUSYBOX)
    return str(bindir)


# ---- ELF and cpio readers ------------------------------------------------------------------------


def elf_notes(data: bytes) -> list[tuple[str, int, bytes]]:
    """``(owner, type, desc)`` of every note in the PT_NOTE segments of a 64-bit little-endian ELF."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit little-endian ELF"
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    notes = []
    for i in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            pos += 12
            name = data[pos : pos + namesz].rstrip(b"\0").decode()
            pos += (namesz + 3) & ~3
            notes.append((name, ntype, data[pos : pos + descsz]))
            pos += (descsz + 3) & ~3
    return notes


def elf_load_ranges(data: bytes) -> list[tuple[int, int]]:
    """``(paddr, paddr + memsz)`` of every PT_LOAD segment of a 64-bit little-endian ELF."""
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    out = []
    for i in range(phnum):
        p_type, _f, _off, _vaddr, paddr, _filesz, memsz = struct.unpack_from("<IIQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            out.append((paddr, paddr + memsz))
    return out


def read_cpio(path: Path) -> dict[str, tuple[int, bytes]]:
    """``{name: (mode, content)}`` of a gzip'd newc cpio archive (a link's content is its target)."""
    data = gzip.decompress(path.read_bytes())
    out: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701", f"bad cpio header at {pos}"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos = (pos + namesize + 3) & ~3
        content = data[pos : pos + filesize]
        pos = (pos + filesize + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name.removeprefix("./")] = (mode, content)


def module_depends(ko: bytes) -> list[str]:
    """The ``depends=`` field of a kernel module's .modinfo."""
    for entry in ko.split(b"\0"):
        if entry.startswith(b"depends="):
            return [d for d in entry[len(b"depends=") :].decode().split(",") if d]
    return []


# ---- servers -------------------------------------------------------------------------------------


@dataclass
class Mmds:
    """An HTTP server with Firecracker MMDS's guest-side semantics, on port 80.

    ``version`` "V2": ``PUT /latest/api/token`` with ``X-metadata-token-ttl-seconds`` (1..21600)
    answers a session token, and a ``GET`` without a valid ``X-metadata-token`` is 401. "V1": a PUT
    is 405 and GETs are not checked. A GET of ``/latest/meta-data/<path>`` answers a string value as
    is, a map as its keys one a line (a map's key with a trailing "/"), anything missing 404: the
    IMDS format Firecracker serves by default. ``data`` is the document the backend PUTs to
    ``/mmds`` (``{"latest": {"meta-data": {...}}}``).
    """

    version: str = "V2"
    data: dict = field(default_factory=lambda: {"latest": {"meta-data": {}}})
    tokens: set = field(default_factory=set)
    requests: list = field(default_factory=list)

    def handler(self):
        mmds = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: str = "") -> None:
                raw = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_PUT(self):
                mmds.requests.append(("PUT", self.path, dict(self.headers)))
                if mmds.version == "V1":
                    return self._answer(405, "Not allowed HTTP method.")
                if self.path != "/latest/api/token":
                    return self._answer(400, "Invalid request.")
                try:
                    ttl = int(self.headers.get("X-metadata-token-ttl-seconds", ""))
                except ValueError:
                    return self._answer(400, "Token time to live value not found.")
                if not 1 <= ttl <= 21600:
                    return self._answer(400, "Invalid time to live value provided for token.")
                token = secrets.token_urlsafe(32)
                mmds.tokens.add(token)
                self._answer(200, token)

            def do_GET(self):
                mmds.requests.append(("GET", self.path, dict(self.headers)))
                token = self.headers.get("X-metadata-token")
                if mmds.version == "V2" and token not in mmds.tokens:
                    return self._answer(401, "No MMDS token provided. Use `X-metadata-token` header.")
                node = mmds.data
                for part in [p for p in self.path.split("/") if p]:
                    if not isinstance(node, dict) or part not in node:
                        return self._answer(404, "Resource not found.")
                    node = node[part]
                if isinstance(node, dict):
                    return self._answer(200, "\n".join(k + "/" if isinstance(v, dict) else k for k, v in node.items()))
                if isinstance(node, str):
                    return self._answer(200, node)
                self._answer(501, "Cannot retrieve value. The value has an unsupported type.")

        return Handler


@dataclass
class Console:
    """The agent API of the console as far as the reference agent uses it: register answers a
    session token (when the bearer is ``token`` and the body names ``agent_id``), the first
    heartbeat with that session answers ``{"stop": true}``. Every request is recorded."""

    agent_id: str
    token: str
    session: str = field(default_factory=lambda: secrets.token_hex(8))
    requests: list = field(default_factory=list)

    def handler(self):
        console = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                bearer = self.headers.get("Authorization", "")
                console.requests.append((self.path, bearer, body.decode()))
                if self.path == "/api/v1/agents/register":
                    ok = bearer == f"Bearer {console.token}" and json.loads(body).get("agentId") == console.agent_id
                    answer = {"sessionToken": console.session, "heartbeatIntervalSeconds": 1} if ok else {}
                    code = 200 if ok else 401
                elif self.path == f"/api/v1/agents/{console.agent_id}/heartbeat":
                    code = 200 if bearer == f"Bearer {console.session}" else 401
                    answer = {"stop": True}
                else:
                    code, answer = 404, {}
                raw = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        return Handler


def serve_in_netns(netns: str, host: str, port: int, handler) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``handler`` bound to ``host:port`` inside network namespace
    ``netns`` (the socket is made there; the serving thread needs no namespace). Call
    ``shutdown()`` and ``server_close()`` when done."""
    server = in_netns(netns, lambda: ThreadingHTTPServer((host, port), handler))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def has_hardware_virtualization() -> bool:
    """Whether /proc/cpuinfo shows the vmx (Intel VT-x) or svm (AMD-V) flag."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and {"vmx", "svm"} & set(line.split(":", 1)[1].split()):
            return True
    return False


def environ_for_guest(path: str, **extra: str) -> dict[str, str]:
    """A clean environment with ``path`` as PATH and ``extra`` on top (no host variable leaks in)."""
    return {"PATH": path, "HOME": "/root", **extra}
