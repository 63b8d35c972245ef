"""Two hosts on this machine for the multi-host test (docs/multi-host.md): each a network namespace
with its own private dockerd and its own console processes (daphne, one rq worker on its host
queue, the scaler sweeper), all on the test's PostgreSQL database and Redis.

PostgreSQL and Redis listen on 127.0.0.1 only; a :class:`Forwarder` in the root namespace listens
on the root end of each host's veth and relays to them, so a host reaches them at its gateway
address. Each host's dockerd runs in the namespace with its own data root, exec root, pidfile and
socket, ``--iptables=false --ip-forward=false``; the namespace has no uplink (only ``lo`` and its
veth to the root namespace, a /30 of :data:`NET_BASE` owned by the test), so nothing it sends can
leave the machine. Console processes run with ``ip netns exec``; their nft tables are in the
namespace and go with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import requests

from tests.support.docker import daemon_answers, launch_daemon, log_tail
from tests.support.network_lab import Netns, run
from tests.support.servers import REPO

#: The /24 the test's veths take their /30s from (host N: ``10.231.N.1`` root end, ``.2`` inside).
NET_BASE = "10.231"
WEB_PORT = 8000
START_TIMEOUT_SECONDS = 60.0


def suite_redis() -> tuple[str, int]:
    """``(userinfo, port)`` of the suite's Redis (``settings.REDIS_URL``, on 127.0.0.1): the
    ``:password@`` to put before another host's address (empty without a password), and its port.
    RuntimeError for a Redis the relays cannot reach (not TCP on loopback)."""
    from urllib.parse import urlsplit

    from django.conf import settings

    parts = urlsplit(settings.REDIS_URL)
    if parts.scheme != "redis" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise RuntimeError(
            f"the multi-host tests relay a TCP Redis on 127.0.0.1, not {parts.scheme}://{parts.hostname}"
        )
    userinfo = f":{parts.password}@" if parts.password else ""
    return userinfo, parts.port or 6379


class Forwarder:
    """A TCP relay: listens on ``listen`` (address, port) and copies each connection both ways to
    127.0.0.1:``target``. Threads; :meth:`close` stops accepting (open relays end with their peers)."""

    def __init__(self, listen: tuple[str, int], target: int):
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(listen)
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.stopped = threading.Event()
        self.open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name=f"fwd-{listen[0]}:{listen[1]}").start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            self.open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()
        for s in list(self.open):
            try:
                s.close()
            except OSError:
                pass


class Host:
    """One host: namespace ``kici-mh-<n>``, veth ``kmh<n>r`` (root, ``10.231.<n>.1``) to ``kmh<n>i``
    (inside, ``.2``), its dockerd, and its console processes once :meth:`start_console` ran."""

    def __init__(self, name: str, n: int, workdir: Path):
        self.name, self.n = name, n
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netns = f"kici-mh-{n}"
        self.gateway = f"{NET_BASE}.{n}.1"
        self.address = f"{NET_BASE}.{n}.2"
        self.socket_path = f"/run/kici-mh-{n}-docker.sock"
        self.docker_host = f"unix://{self.socket_path}"
        self.data_root = f"/var/lib/kici-mh-{n}-docker"
        self.exec_root = f"/run/kici-mh-{n}-exec"
        self.pidfile = f"/run/kici-mh-{n}-docker.pid"
        self.dockerd_log = str(self.workdir / "dockerd.log")
        self.nft_table = f"kicimh{n}"
        self.url = f"http://{self.address}:{WEB_PORT}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ns: Netns | None = None
        self.forwarders: list[Forwarder] = []

    # --- the namespace and its dockerd -----------------------------------------------------

    def create(self) -> None:
        """The namespace, its veth and the forwarders of PostgreSQL (5432) and the suite's Redis
        (its port on 127.0.0.1, :func:`suite_redis`)."""
        self.remove()
        self.ns = Netns(self.netns)
        root, inside = f"kmh{self.n}r", f"kmh{self.n}i"
        run(["ip", "link", "add", root, "type", "veth", "peer", "name", inside, "netns", self.netns])
        run(["ip", "addr", "add", f"{self.gateway}/30", "dev", root])
        run(["ip", "link", "set", root, "up"])
        self.ns.ip("addr", "add", f"{self.address}/30", "dev", inside)
        self.ns.ip("link", "set", inside, "up")
        for port in (5432, suite_redis()[1]):
            self.forwarders.append(Forwarder((self.gateway, port), port))

    def start_dockerd(self) -> subprocess.Popen | None:
        """Launch the dockerd (returns None once it answers, else its process, see ``launch_daemon``)."""
        for d in (self.data_root, self.exec_root):
            os.makedirs(d, exist_ok=True)
        argv = [
            "nsenter", f"--net=/run/netns/{self.netns}", "--", shutil.which("dockerd") or "dockerd",
            "--data-root", self.data_root, "--exec-root", self.exec_root, "--pidfile", self.pidfile,
            "-H", self.docker_host, "--iptables=false", "--ip6tables=false", "--ip-forward=false",
            "--ip-masq=false", "--bridge=none",
        ]  # fmt: skip
        return launch_daemon(argv, self.dockerd_log, lambda: daemon_answers(self.docker_host), START_TIMEOUT_SECONDS)

    def dockerd_failure(self) -> str:
        return f"dockerd of {self.name} did not come up:\n{log_tail(self.dockerd_log)}"

    def build_agent_image(self) -> None:
        script = REPO / "sandbox_agent" / "build_image.sh"
        env = {**os.environ, "DOCKER_HOST": self.docker_host}
        proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"agent image on {self.name}: {proc.stdout}\n{proc.stderr}")

    def docker(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.docker_host, version="auto", timeout=60)

    # --- the console -------------------------------------------------------------------------

    def env(self, database: str, redis_db: str, api_token: str, extra: dict[str, str]) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("KICI_", "DATABASE_", "REDIS_", "DOCKER_"))},
            "DJANGO_SETTINGS_MODULE": "kici_site.settings",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "two-hosts-only-not-secret",
            "DATABASE_URL": f"postgres://postgres@{self.gateway}:5432/{database}",
            "REDIS_URL": f"redis://{suite_redis()[0]}{self.gateway}:{suite_redis()[1]}/{redis_db}",
            "DOCKER_HOST": self.docker_host,
            "KICI_HOST_NAME": self.name,
            "KICI_NFT_TABLE": self.nft_table,
            "KICI_API_TOKEN": api_token,
            "KICI_AGENT_LOG_DIR": str(self.workdir / "agents"),
            # The suite's heartbeat (kici_site.settings_test), not the production 30 s: drains and
            # stops reach the agents within seconds.
            "KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS": "5",
            "KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS": os.environ.get("KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS", "90"),
            "KICI_SCALER_CONFIG_PATH": str(self.workdir / "scalers.yaml"),
            "KICI_OPERATOR_LISTEN": f"{self.address}:{WEB_PORT}",
            "ALLOWED_HOSTS": self.address,
            "PGAPPNAME": f"two-hosts:{self.name}",
            "LOG_LEVEL": "INFO",
            **extra,
        }

    def run_in_ns(self, argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {self.name} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def start(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *argv], cwd=REPO, env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_console(self, env: dict) -> None:
        manage = [sys.executable, "manage.py"]
        daphne = [sys.executable, "-m", "daphne", "-e", f"tcp:port={WEB_PORT}:interface={self.address}"]
        self.start("web", [*daphne, "kici_site.asgi:application"], env)
        queue = f"host:{self.name}"
        self.start(
            "worker",
            [*manage, "rqworker", queue, "--with-scheduler", "--worker-class", "kici_site.worker.KiciWorker"],
            env,
        )
        self.start_sweeper(env)

    def start_sweeper(self, env: dict) -> None:
        self.start("sweeper", [sys.executable, "manage.py", "scaler_sweeper", "--no-warm-pools"], env)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        session = requests.Session()
        session.trust_env = False  # no proxy: the console is on our veth
        deadline = time.monotonic() + timeout
        while True:
            try:
                session.get(self.url + "/healthz", timeout=1)
                return
            except (requests.ConnectionError, requests.Timeout):  # a loaded machine answers late
                if self.procs["web"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daphne of {self.name} did not start:\n{self.log('web')}") from None
                time.sleep(0.2)

    def log(self, name: str, chars: int = 4000) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def kill(self, name: str) -> None:
        """SIGKILL the process group of ``name`` (the process and what it forked)."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def stop_console(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name, proc in self.procs.items():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill(name)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (work-horses)
            except ProcessLookupError:
                pass

    # --- teardown ------------------------------------------------------------------------------

    def _dockerd_pid(self) -> int | None:
        try:
            pid = int(Path(self.pidfile).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if self.data_root.encode() in cmdline else None

    def remove(self) -> None:
        """Everything of this host, also what a killed earlier run left: console processes,
        containers, the dockerd, the forwarders, the namespace (its veth and nft tables with it)."""
        self.stop_console()
        if daemon_answers(self.docker_host):
            client = self.docker()
            try:
                for c in client.containers.list(all=True):
                    try:
                        c.remove(force=True)
                    except Exception:  # noqa: BLE001 - gone already
                        pass
            finally:
                client.close()
        pid = self._dockerd_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:
                    pass
                time.sleep(0.1)
            else:
                if Path(f"/proc/{pid}").exists():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        for f in self.forwarders:
            f.close()
        self.forwarders = []
        if Path(f"/run/netns/{self.netns}").exists():
            run(["ip", "netns", "del", self.netns], check=False)
        run(["ip", "link", "del", f"kmh{self.n}r"], check=False)
