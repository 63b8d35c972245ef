"""A production-shaped dockerd for the isolation packet tests: a SECOND private daemon, started
inside a network namespace the test session creates, that manages its own iptables and ip6tables
there, as a docker host in production does.

The namespace (:data:`NETNS`) has only ``lo`` when the daemon starts: no uplink and no veth to the
root namespace, so nothing a container sends can leave it; the tests add what they route to
(a neighbour namespace) themselves. The daemon runs with its own data root, exec root, pidfile
and socket (a unix socket on the shared filesystem, reachable from the root namespace), with
``--iptables --ip6tables --ip-forward`` (docker writes its NAT and filter rules, sets forwarding
and the FORWARD policy in the namespace) and ``--ipv6`` (its default bridge gets
:data:`DEFAULT_BRIDGE_V6`; dockerd 20.10 offers ``--ip6tables`` only with ``--experimental``).

One daemon per session (``start_prod_dockerd``); ``stop_prod_dockerd`` removes its containers and
networks, terminates it and deletes the namespace. A daemon or namespace left by a killed session
is removed before a new one starts. Raises :class:`ProdDockerdUnavailable` (the fixture fails in CI,
skips elsewhere) when not root, when dockerd is missing or does not come up.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.docker import daemon_answers, launch_daemon, log_tail
from tests.support.network_lab import Netns, run

NETNS = "kici-prodshape"
SOCKET_PATH = "/run/kici-prodshape-docker.sock"
DOCKER_HOST = f"unix://{SOCKET_PATH}"
DATA_ROOT = "/var/lib/kici-prodshape-docker"
EXEC_ROOT = "/run/kici-prodshape-exec"
PIDFILE = "/run/kici-prodshape-docker.pid"
LOGFILE = "/tmp/kici-prodshape-dockerd.log"
LOCKFILE = "/run/kici-prodshape-docker.lock"
START_TIMEOUT_SECONDS = 60.0
#: The default bridge's IPv6 subnet (``--ipv6`` needs one); private to the namespace.
DEFAULT_BRIDGE_V6 = "fd4b:4301:ffff::/64"

DOCKERD_ARGS = [
    "--data-root", DATA_ROOT,
    "--exec-root", EXEC_ROOT,
    "--pidfile", PIDFILE,
    "-H", DOCKER_HOST,
    "--experimental",
    "--iptables=true",
    "--ip6tables=true",
    "--ip-forward=true",
    "--ipv6",
    "--fixed-cidr-v6", DEFAULT_BRIDGE_V6,
]  # fmt: skip


class ProdDockerdUnavailable(RuntimeError):
    """The production-shaped dockerd could not be started; the message says why."""


def docker_client(timeout: float = 120):
    """A docker SDK client for the namespaced daemon (API version negotiated)."""
    import docker

    return docker.DockerClient(base_url=DOCKER_HOST, version="auto", timeout=timeout)


def _ping() -> bool:
    return daemon_answers(DOCKER_HOST)


def _log_tail(lines: int = 20) -> str:
    return log_tail(LOGFILE, lines)


def _our_pid() -> int | None:
    """The pid in the pidfile when it is a live dockerd with our data root, else None."""
    try:
        pid = int(Path(PIDFILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if cmdline and cmdline[0].endswith(b"dockerd") and DATA_ROOT.encode() in cmdline:
        return pid
    return None


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (reaped here when it is this process's child: the session
    started it, and an unreaped child would look alive)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _terminate(pid: int, timeout: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _netns_exists() -> bool:
    return Path(f"/run/netns/{NETNS}").exists()


def start_prod_dockerd() -> Netns:
    """Create :data:`NETNS` (``lo`` up, nothing else) and start the daemon in it; return the
    namespace once the daemon answers on :data:`SOCKET_PATH`. A leftover daemon or namespace of
    an earlier session is removed first. Raises :class:`ProdDockerdUnavailable`."""
    if os.geteuid() != 0:
        raise ProdDockerdUnavailable("the production-shaped dockerd needs root")
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise ProdDockerdUnavailable("dockerd is not installed (apt-get install docker.io)")
    with open(LOCKFILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stop_prod_dockerd()
        ns = Netns(NETNS)
        for d in (DATA_ROOT, EXEC_ROOT):
            os.makedirs(d, exist_ok=True)
        argv = ["nsenter", f"--net=/run/netns/{NETNS}", "--", dockerd, *DOCKERD_ARGS]
        failed = launch_daemon(argv, LOGFILE, _ping, START_TIMEOUT_SECONDS)
        if failed is None:
            return ns
        if failed.poll() is not None:
            ns.delete()
            raise ProdDockerdUnavailable(f"dockerd exited with status {failed.returncode}:\n{_log_tail()}")
        stop_prod_dockerd()
        raise ProdDockerdUnavailable(
            f"dockerd did not answer on {SOCKET_PATH} within {START_TIMEOUT_SECONDS:.0f} s:\n{_log_tail()}"
        )


def stop_prod_dockerd() -> None:
    """Remove the daemon's containers and networks, terminate it, delete :data:`NETNS`. No-op
    for what is not there."""
    if _ping():
        client = docker_client()
        try:
            for c in client.containers.list(all=True):
                try:
                    c.remove(force=True)
                except Exception:  # noqa: BLE001 - gone already
                    pass
            for n in client.networks.list():
                if n.name not in ("bridge", "host", "none"):
                    try:
                        n.remove()
                    except Exception:  # noqa: BLE001 - the namespace goes anyway
                        pass
        finally:
            client.close()
    pid = _our_pid()
    if pid is not None:
        _terminate(pid)
    if _netns_exists():
        run(["ip", "netns", "del", NETNS], check=False)


def build_agent_image(image: str = "kici-agent:local") -> str:
    """Build (or reuse: the script hashes its inputs) the agent image into this daemon with
    ``sandbox_agent/build_image.sh``; returns its name. Raises :class:`ProdDockerdUnavailable` with the
    script's output when it fails."""
    script = Path(__file__).resolve().parents[2] / "sandbox_agent" / "build_image.sh"
    env = {**os.environ, "DOCKER_HOST": DOCKER_HOST}
    proc = subprocess.run(["sh", str(script), image], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ProdDockerdUnavailable(f"sandbox_agent/build_image.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return image
