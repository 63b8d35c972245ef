"""A private dockerd for the test session (and the benches), never the host's own daemon.

Its data root, exec root, pidfile and socket are its own, and it runs with
``--iptables=false --ip6tables=false --ip-forward=false --bridge=none``: it writes no NAT or
filter rules, does not enable forwarding and creates no default bridge, so a container it starts
can reach only the bridges the tests create themselves (``kici-agent-net``), never the network
beyond this machine.

``ensure_private_dockerd()`` reuses a daemon already listening on the socket (another test
session, or ``make test`` run twice) and otherwise starts one, detached, under a file lock so
two sessions starting at once do not race. It is left running afterwards so that parallel test
sessions can share it; every process that asked for it holds a shared lock on
``USERS_LOCKFILE`` until it exits, and ``python -m tests.support.docker stop`` (the end of ``make
test``, ``make run``'s start) stops the daemon only when no such process remains, first removing
its containers and networks, because dockerd leaves a user network's bridge behind when
it stops, and a stale bridge holding 172.30.0.1 would collide with ``make run``'s own
``kici-agent-net``. For the same reason the daemon refuses to serve a session while another
interface (``make run``'s dockerd) already holds the agent-network gateway.

Installs nothing. When ``dockerd`` is missing or does not come up, ``DockerdUnavailable`` is
raised with the daemon's last log lines; the ``dockerd`` fixture turns that into a failure in CI
(``CI=true``) and a skip elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SOCKET_PATH = "/run/kici-test-docker.sock"
DOCKER_HOST = f"unix://{SOCKET_PATH}"
DATA_ROOT = "/var/lib/kici-test-docker"
EXEC_ROOT = "/run/kici-test-docker-exec"
PIDFILE = "/run/kici-test-docker.pid"
LOGFILE = "/tmp/kici-test-dockerd.log"
LOCKFILE = "/run/kici-test-docker.lock"
#: Shared-locked by every process using the daemon (a test session, a bench) until it exits.
USERS_LOCKFILE = "/run/kici-test-docker.users"
_users_hold = None  # this process's open file holding the shared lock
START_TIMEOUT_SECONDS = 60.0

DOCKERD_ARGS = [
    "--data-root",
    DATA_ROOT,
    "--exec-root",
    EXEC_ROOT,
    "--pidfile",
    PIDFILE,
    "-H",
    DOCKER_HOST,
    "--iptables=false",
    "--ip6tables=false",
    "--ip-forward=false",
    "--bridge=none",
]


class DockerdUnavailable(RuntimeError):
    """The private dockerd could not be reached or started; the message says why."""


def daemon_answers(docker_host: str) -> bool:
    """True when a dockerd answers a ping on ``docker_host`` (``unix://…``) within 5 s."""
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host, version="auto", timeout=5)
    except Exception:  # noqa: BLE001 - not listening (yet)
        return False
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001
        return False
    finally:
        client.close()


def log_tail(path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of a daemon's log file, or "(no log)"."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def launch_daemon(argv: list[str], log_path: str, answers, timeout: float) -> subprocess.Popen | None:
    """Start a daemon (``argv``, its output appended to ``log_path``, in its own session) and wait
    up to ``timeout`` s, polling every 0.2 s, until ``answers()`` is true. Returns None once it
    answers, else its process: exited first when ``poll()`` is not None, still silent otherwise."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            close_fds=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers():
            return None
        if proc.poll() is not None:
            return proc
        time.sleep(0.2)
    return proc


def _ping() -> bool:
    return daemon_answers(DOCKER_HOST)


def _log_tail(lines: int = 20) -> str:
    return log_tail(LOGFILE, lines)


def ensure_private_dockerd() -> str:
    """Reuse or start the private dockerd; return its ``DOCKER_HOST`` URL (``unix://…``).

    Raises ``DockerdUnavailable`` when not root, when ``dockerd`` is not installed, or when the
    daemon does not answer a ping within ``START_TIMEOUT_SECONDS`` (60 s).
    """
    _hold_as_user()
    if _ping():
        _check_gateway_owner()
        return DOCKER_HOST
    if os.geteuid() != 0:
        raise DockerdUnavailable("the private dockerd needs root")
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise DockerdUnavailable("dockerd is not installed (apt-get install docker.io; `make run` does this)")
    with open(LOCKFILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ping():
            return DOCKER_HOST
        _stop_stale()
        for d in (DATA_ROOT, EXEC_ROOT):
            os.makedirs(d, exist_ok=True)
        failed = launch_daemon([dockerd, *DOCKERD_ARGS], LOGFILE, _ping, START_TIMEOUT_SECONDS)
        if failed is None:
            _check_gateway_owner()
            return DOCKER_HOST
        if failed.poll() is not None:
            raise DockerdUnavailable(f"dockerd exited with status {failed.returncode}:\n{_log_tail()}")
        raise DockerdUnavailable(
            f"dockerd did not answer on {SOCKET_PATH} within {START_TIMEOUT_SECONDS:.0f} s:\n{_log_tail()}"
        )


def _hold_as_user() -> None:
    """Take this process's shared lock on ``USERS_LOCKFILE`` (kept until the process exits), so
    no ``stop`` from another session ends the daemon under it."""
    global _users_hold
    if _users_hold is None and os.geteuid() == 0:
        hold = open(USERS_LOCKFILE, "a")  # held open for the process's lifetime
        fcntl.flock(hold, fcntl.LOCK_SH)
        _users_hold = hold


def in_use_by_another_process() -> bool:
    """Whether a process other than this one holds the daemon (a test session or bench still running)."""
    if _users_hold is not None:  # ours would block a second open file: convert it and back
        return not _exclusive_for_a_moment(_users_hold, keep=fcntl.LOCK_SH)
    if not os.path.exists(USERS_LOCKFILE):
        return False
    with open(USERS_LOCKFILE, "a") as probe:
        return not _exclusive_for_a_moment(probe, keep=fcntl.LOCK_UN)


def _exclusive_for_a_moment(file, keep: int) -> bool:
    """Whether ``file``'s lock can be made exclusive now (no other holder); then set to ``keep``."""
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(file, keep)
    return True


AGENT_GATEWAY = "172.30.0.1"


def _interfaces_holding(address: str) -> list[str]:
    """Names of the host interfaces that carry ``address`` (read with ``ip -j addr``)."""
    import json

    try:
        out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        link["ifname"]
        for link in json.loads(out or "[]")
        if any(a.get("local") == address for a in link.get("addr_info", []))
    ]


def _other_dockerd_running() -> bool:
    """True when a dockerd other than the private one is running (its bridges are its own)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"dockerd") and DATA_ROOT.encode() not in cmdline:
            return True
    return False


def _is_stale_docker_bridge(name: str) -> bool:
    """A ``br-<12 hex>`` bridge with no ports, left behind by a dockerd that is no longer running."""
    import re

    if not re.fullmatch(r"br-[0-9a-f]{12}", name) or _other_dockerd_running():
        return False
    return (
        not any(Path(f"/sys/class/net/{name}/brif").iterdir())
        if Path(f"/sys/class/net/{name}/brif").exists()
        else False
    )


def _check_gateway_owner() -> None:
    """Refuse when an interface that is not one of this daemon's bridges holds 172.30.0.1.

    That is ``make run``'s dockerd, or a bridge a stopped dockerd left behind: two bridges with
    one gateway address would route the test agents' packets to the wrong one. A left-behind
    bridge (``br-<id>``, no ports, no other dockerd running) is deleted; a live one is refused.
    """
    holders = _interfaces_holding(AGENT_GATEWAY)
    if not holders:
        return
    client = docker_client()
    try:
        ours = {f"br-{n.id[:12]}" for n in client.networks.list()}
        ours |= {n.attrs.get("Options", {}).get("com.docker.network.bridge.name") for n in client.networks.list()}
    finally:
        client.close()
    foreign = [h for h in holders if h not in ours]
    for name in [h for h in foreign if _is_stale_docker_bridge(h)]:
        print(f"removing bridge {name}: it holds {AGENT_GATEWAY} and no running dockerd owns it", file=sys.stderr)
        subprocess.run(["ip", "link", "del", name], check=False, timeout=10)
        foreign.remove(name)
    if foreign:
        raise DockerdUnavailable(
            f"interface {', '.join(foreign)} already holds {AGENT_GATEWAY}, the gateway of kici-agent-net: "
            "another dockerd owns the agent network, most likely the one `make run` started, kept running "
            "for the agents a console restart leaves running. End them and it with `make stop-agents` "
            "(or stop `make run` first if it runs, then `make stop-agents`), or remove a stale bridge with "
            f"`ip link del {foreign[0]}`, then run the tests again."
        )


def _read_pid() -> int | None:
    try:
        return int(Path(PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _stop_stale() -> None:
    """Stop a daemon whose pidfile names a live process that does not answer (a hung start)."""
    pid = _read_pid()
    if pid is None:
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if not cmdline or not cmdline[0].endswith(b"dockerd") or DATA_ROOT.encode() not in cmdline:
        return  # a recycled pid: not ours
    _terminate(pid)


def _terminate(pid: int, timeout: float = 20.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def stop_private_dockerd() -> bool:
    """Stop the private dockerd (no-op when not running), first removing its kici-managed
    containers and its networks so that no bridge is left holding the agent gateway. Returns
    False, stopping nothing, while another process uses it (see ``USERS_LOCKFILE``)."""
    if in_use_by_another_process():
        return False
    if _ping():
        client = docker_client()
        try:
            for c in client.containers.list(all=True, filters={"label": "kici-managed=true"}):
                try:
                    c.remove(force=True)
                except Exception:  # noqa: BLE001 - gone already
                    pass
            for n in client.networks.list():
                if n.name not in ("bridge", "host", "none"):
                    try:
                        n.remove()
                    except Exception as exc:  # noqa: BLE001 - still in use: reported, not fatal
                        print(f"could not remove network {n.name}: {exc}", file=sys.stderr)
        finally:
            client.close()
    pid = _read_pid()
    if pid is not None:
        _stop_stale()
    return True


def docker_client():
    """A docker SDK client for the private daemon (API version negotiated)."""
    import docker

    return docker.DockerClient(base_url=DOCKER_HOST, version="auto", timeout=120)


def run_script(client, image: str, script: str, name: str, **kwargs):
    """A detached container of ``image`` running ``sh -c script`` with no network, named
    ``<name>-<8 hex>`` and labelled ``kici.test=tail`` (the suite's clean-up removes those);
    ``kwargs`` go to ``containers.run``."""
    import uuid

    return client.containers.run(
        image,
        ["sh", "-c", script],
        name=f"{name}-{uuid.uuid4().hex[:8]}",
        detach=True,
        network_mode="none",
        labels={"kici.test": "tail"},
        **kwargs,
    )


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "start"
    if cmd == "stop":
        if not stop_private_dockerd():
            print("the suite's private dockerd is left running: another test session or bench uses it", file=sys.stderr)
            sys.exit(3)
    else:
        print(ensure_private_dockerd())
