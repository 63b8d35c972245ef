"""The bare-metal backend: agents as host processes, or as containers in container mode. How a
process is started, limited and ended (its pid checked against its start time, so a recycled pid
is left alone), and what container mode shares with the container backend: docs/bare-metal.md."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from agents import tokens
from agents.archive import ARCHIVE_BYTES, archive_parts
from agents.choices import EventType
from agents.events import record_connecting, record_event
from agents.models import Agent
from consolelog.cap import read_end
from consolelog.tail import Opener
from consolelog.times import end_with_times
from lib.safe_open import open_last
from scalers.kici_orchestrator import kici_agent_target, scale_up_claim, token_context
from scalers.resources import EffectiveLimits

from . import exit_record
from .base import SpawnControl, SpawnError, SpawnResult, scaler_option
from .container.backend import ContainerBackend
from .container.orphans import ContainerPlan
from .failure import AGENT_LOG_LINES, CAPTURED_LINES
from .kici_token import mint_spawn_kici_token, revoke_failed_spawn_kici_token, revoke_recorded_kici_token
from .orphans import OrphanTarget
from .spawn_env import kici_process_env, label_set_option, process_env, spawn_limits

TERM_GRACE_SECONDS = 5.0
#: Bytes of the end of a process's output file :meth:`BareMetalBackend.captured_output_for` and
#: :meth:`BareMetalBackend.agent_log_lines` read.
CAPTURED_BYTES = 64 * 1024
_systemd_user_ok: bool | None = None

log = logging.getLogger(__name__)


def build_process_command(
    binary: str, agent_id: str, limits: EffectiveLimits | None, enforce_cgroups: bool, *, platform: str = sys.platform
) -> list[str]:
    """argv for a process-mode agent.

    Without ``enforce_cgroups``, off Linux, or without a positive limit: ``[binary]``. Otherwise
    ``systemd-run --user --scope --quiet --slice=kici-scaler --unit=kici-agent-<id>
    [--property=CPUQuota=<max(1, round(cpus*100))>%] [--property=MemoryMax=<bytes>] <binary>``.
    """
    cpus = limits.cpus if limits else 0
    mem = limits.mem_bytes if limits else 0
    if not enforce_cgroups or not platform.startswith("linux") or (cpus <= 0 and mem <= 0):
        return [binary]
    argv = ["systemd-run", "--user", "--scope", "--quiet", "--slice=kici-scaler", f"--unit=kici-agent-{agent_id}"]
    if cpus > 0:
        argv.append(f"--property=CPUQuota={max(1, round(cpus * 100))}%")
    if mem > 0:
        argv.append(f"--property=MemoryMax={int(mem)}")
    return [*argv, binary]


def systemd_user_scope_available() -> bool:
    """Whether ``systemd-run --user --scope`` works here (probed once per process)."""
    global _systemd_user_ok
    if _systemd_user_ok is None:
        if not shutil.which("systemd-run"):
            _systemd_user_ok = False
        else:
            try:
                proc = subprocess.run(
                    ["systemd-run", "--user", "--scope", "--quiet", "true"], capture_output=True, timeout=10
                )
                _systemd_user_ok = proc.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                _systemd_user_ok = False
    return _systemd_user_ok


def _proc_start_time(pid: int) -> int | None:
    """Field 22 (starttime, clock ticks since boot) of ``/proc/<pid>/stat``; None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _reap_if_child(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _alive(pid: int, start_time: int | None) -> bool:
    _reap_if_child(pid)
    current = _proc_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


def _open_in_log_dir(path: str | os.PathLike, flags: int) -> int:
    """Open a file directly below :func:`agent_log_dir` without following a link in its place."""
    return open_last(path, 1, flags)


def exit_status_path(log_path: Path) -> Path:
    """Where ``exit_record`` writes how a real KiCI agent process ended: beside its output file."""
    return log_path.with_suffix(".exit")


def agent_log_dir() -> Path:
    """Where process-mode agents write stdout/stderr: ``KICI_AGENT_LOG_DIR`` or ``<BASE_DIR>/var/agents``."""
    base = (
        getattr(settings, "KICI_AGENT_LOG_DIR", None)
        or os.environ.get("KICI_AGENT_LOG_DIR")
        or str(Path(settings.BASE_DIR) / "var" / "agents")
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


class BareMetalBackend:
    """``type: bare-metal`` scalers; options as for ``ContainerBackend``, which runs the container mode
    (configured with ``job_image``: job-image env, no bound-job labels)."""

    type = "bare-metal"

    def __init__(self, scaler, **container_options: Any):
        self.scaler = scaler
        # Container mode is always isolated: the entry's networkIsolation is not read.
        container_options.setdefault("network_isolation", bool(settings.KICI_NETWORK_ISOLATION))
        self.containers = ContainerBackend(scaler, job_image=True, **container_options)

    @property
    def network_isolation(self) -> bool:
        """Whether container-mode agents get ``kici-agent-net`` and rules (always, unless
        ``KICI_NETWORK_ISOLATION`` is off console-wide or a test overrode it)."""
        return self.containers.network_isolation

    @property
    def spawns_on_local_host(self) -> bool:
        return True

    def reload(self, scaler) -> None:
        self.scaler = scaler
        self.containers.reload(scaler)

    def ensure_host_ready(self) -> None:
        if any(not label_set_option(ls, "binaryPath") for ls in self.scaler.label_sets.all()):
            self.containers.ensure_host_ready()

    def isolation_target(self):
        """The container mode's (``ContainerBackend.isolation_target``); process-mode agents have
        no address and are skipped by the drift check."""
        return self.containers.isolation_target()

    @staticmethod
    def mode_for(agent) -> str:
        """``process`` when the agent's label set has ``binaryPath``, else ``container``."""
        if (agent.backend_context or {}).get("mode"):
            return agent.backend_context["mode"]
        return "process" if label_set_option(agent.label_set, "binaryPath") else "container"

    # -- spawn ---------------------------------------------------------------------------------

    def spawn(self, agent, control: SpawnControl) -> SpawnResult:
        if self.mode_for(agent) == "container":
            result = self.containers.spawn(agent, control)
            result.context["mode"] = "container"
            return result
        return self._spawn_process(agent, control)

    def _spawn_process(self, agent, control: SpawnControl) -> SpawnResult:
        binary = str(label_set_option(agent.label_set, "binaryPath"))
        control.check("spawn")
        if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
            raise SpawnError(f"binaryPath {binary} is not an executable file", "spawn")
        limits = spawn_limits(agent)
        enforce = bool(scaler_option(self.scaler, "enforceCgroups", False))
        argv = build_process_command(binary, agent.agent_id, limits, enforce)
        note = ""
        if argv[0] == "systemd-run" and not systemd_user_scope_available():
            argv = [binary]
            note = " (cgroup limits NOT enforced: systemd-run --user is unavailable here)"
        kici = kici_agent_target(agent.label_set)
        log_path = agent_log_dir() / f"{agent.agent_id}.log"
        token, kici_token_id, kici_context = "", "", {}
        if kici is None:
            with transaction.atomic():  # one commit for the token and the event
                token = tokens.mint_registration_token(agent)
                record_event(agent, EventType.PROVISIONING, "spawning agent process" + note)
            env = process_env(agent, token)
        else:
            if scale_up_claim(agent) is None:
                kici_token_id, token = mint_spawn_kici_token(agent, kici, "a process")
                kici_context = token_context(kici, kici_token_id)
            if note:
                record_event(agent, EventType.PROVISIONING, "spawning the KiCI agent process" + note)
            env = kici_process_env(agent, token)
            exit_path = exit_status_path(log_path)
            exit_path.unlink(missing_ok=True)
            argv = [sys.executable, "-I", str(Path(exit_record.__file__)), str(exit_path), *argv]

        def undo() -> None:
            if kici is None:
                tokens.revoke_agent_tokens(agent)
            elif kici_token_id:
                revoke_failed_spawn_kici_token(kici, kici_token_id, agent.agent_id)

        control.mark("checked")
        try:
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    cwd="/",
                )
        except OSError as exc:
            undo()
            raise SpawnError(f"spawn failed: {exc}", "spawn") from exc
        # Popen returns once the program is exec'd: from here on it runs (the trace's agent step).
        control.mark("started")
        control.mark("process_started", control.marks["started"])
        start_time = _proc_start_time(proc.pid)
        context = {
            **kici_context,
            "mode": "process",
            "pid": proc.pid,
            "pgid": proc.pid,
            "start_time": start_time,
            "log_path": str(log_path),
            "argv": argv,
        }
        Agent.objects.filter(pk=agent.pk).update(managed_id=str(proc.pid), backend_context=context)
        agent.managed_id, agent.backend_context = str(proc.pid), context
        try:
            control.check("ready")
        except BaseException:
            self._terminate(proc.pid, start_time)
            undo()
            raise
        with transaction.atomic():  # one commit for both events
            record_event(agent, EventType.READY, f"agent process started (PID {proc.pid})")
            record_connecting(
                agent,
                "waiting for agent registration"
                if kici is None
                else f"waiting for the KiCI agent to register with {kici.ws_url}",
            )
        return SpawnResult(managed_id=str(proc.pid), context=context)

    # -- destroy -------------------------------------------------------------------------------

    def _terminate(self, pid: int, start_time: int | None) -> None:
        """SIGTERM to the group, wait up to 5 s, SIGKILL to the group; a recycled pid is left alone."""
        if not _alive(pid, start_time):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + TERM_GRACE_SECONDS
        while time.monotonic() < deadline:
            if not _alive(pid, start_time):
                break
            time.sleep(0.05)
        try:
            os.killpg(pid, signal.SIGKILL)  # the group: children outlive a leader that exited on TERM
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 2.0  # SIGKILL is asynchronous: see it land
        while time.monotonic() < deadline and _alive(pid, start_time):
            time.sleep(0.02)

    def destroy(self, agent, reason: str = "shutdown") -> None:
        """Process mode: SIGTERM → 5 s → SIGKILL to the agent's group; container mode: container destroy."""
        if self.mode_for(agent) == "container":
            self.containers.destroy(agent, reason)
            return
        ctx = agent.backend_context or {}
        pid = ctx.get("pid") or (int(agent.managed_id) if str(agent.managed_id).isdigit() else None)
        if pid:
            self._terminate(int(pid), ctx.get("start_time"))
        self._archive(agent.agent_id, ctx.get("log_path"))
        revoke_recorded_kici_token(agent)

    def sandbox_exit(self, agent) -> str | None:
        """None while the agent's process runs, else how it ended, for the follow of a real KiCI
        agent (``scalers.kici_agents``): ``exited with code N`` or ``was killed by signal N`` from
        its status file (``exit_record``), ``exited (no exit status recorded)`` when the wrapper
        itself was killed, ``has no process`` when the spawn recorded none."""
        ctx = agent.backend_context or {}
        pid = ctx.get("pid")
        if not pid:
            return "has no process"
        if _alive(int(pid), ctx.get("start_time")):
            return None
        try:
            status = exit_status_path(Path(ctx.get("log_path") or "")).read_text().strip()
        except OSError:
            return "exited (no exit status recorded)"
        if status.startswith("signal "):
            return f"was killed by {status}"
        return f"exited with code {status}"

    def sandbox_registered(self, agent) -> None:
        """The real KiCI agent of ``agent`` registered: nothing to do for a process (its
        environment is its own)."""

    @staticmethod
    def _archive(agent_id: str, log_path: str | None) -> None:
        """Keep the end of the process's output file as its archive (``agents.archive``), with the
        times its lines were received (``consolelog.times.end_with_times``); the file itself goes
        with retention. A failure is logged only."""
        if not log_path:
            return
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data, times = end_with_times(fd, ARCHIVE_BYTES, client, agent_id, "console")
                archive_parts(agent_id, [("process output", data)], [times])
            finally:
                os.close(fd)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("could not keep the output of %s: %s", agent_id, exc)
        finally:
            client.close()

    def captured_output_for(self, agent) -> list[str]:
        if self.mode_for(agent) == "container":
            return self.containers.captured_output_for(agent)
        return self._output_end(agent)[-CAPTURED_LINES:]

    def agent_log_lines(self, agent) -> list[str]:
        """The last :data:`~scalers.backends.failure.AGENT_LOG_LINES` lines of the agent process's
        output file (its standard output and error), for the follow of a real KiCI agent
        (``scalers.kici_agents``); [] when there is none."""
        if self.mode_for(agent) == "container":
            return self.containers.agent_log_lines(agent)
        return self._output_end(agent)[-AGENT_LOG_LINES:]

    @staticmethod
    def _output_end(agent) -> list[str]:
        """The lines of the last :data:`CAPTURED_BYTES` of the agent process's output file; [] when
        it has none or it cannot be read."""
        path = (agent.backend_context or {}).get("log_path")
        if not path:
            return []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = read_end(fd, CAPTURED_BYTES)
            finally:
                os.close(fd)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    @staticmethod
    def output_files() -> list[tuple[Path, Opener]]:
        """The process-mode agents' output files on this host (``<KICI_AGENT_LOG_DIR>/<id>.log``),
        each with how to open it (no link followed in the directory), for the output cap
        (``scalers.output_caps``)."""
        return [(path, _open_in_log_dir) for path in sorted(agent_log_dir().glob("*.log"))]

    # -- orphans (container mode only: a host process carries no ownership labels) ------------

    def reap_unowned(self, agent_id: str) -> bool:
        """Reclaims container-mode agents only, by ``kici-agent-id`` + ``kici-scaler-name``: a host
        process carries no ownership labels."""
        return self.containers.reap_unowned(agent_id)

    def plan_containers(self) -> ContainerPlan:
        return self.containers.plan_containers()

    def plan_orphans(self) -> list[OrphanTarget]:
        return self.containers.plan_orphans()

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        return self.containers.apply_orphans(plan)

    def cleanup_orphans(self) -> int:
        return self.containers.cleanup_orphans()
