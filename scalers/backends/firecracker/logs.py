"""Forwarding a VM's serial console and VMM log, line by line, to a sink.

One daemon thread per VM tails both files (``consolelog.tail.tail_file``) in its own event loop and
hands every line on as ``sink(agent_id, source, record)``: ``firecracker-serial`` (record from
:func:`failure.wrap_serial_line`; the last 50 kept for failure details) or ``firecracker-vmm``
(``{"level": "info", "message": line}``). Both files are opened only through ``jail.open_vm_file``
(docs/firecracker-adapter.md, "The chroot's files").
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from consolelog.cap import read_end
from consolelog.tail import FileTail, shown_text, split_lines

from .failure import wrap_serial_line
from .jail import AGENT_ID_RE, ChrootLayout, open_vm_file

log = logging.getLogger(__name__)

SERIAL_SOURCE = "firecracker-serial"
VMM_SOURCE = "firecracker-vmm"
KEEP_LINES = 50
#: Most bytes of a log file :func:`forward_remaining` reads (from its end).
REMAINING_MAX_BYTES = 1024 * 1024

LogSink = Callable[[str, str, dict], None]


def _record(source: str, line: str) -> dict:
    return wrap_serial_line(line) if source == SERIAL_SOURCE else {"level": "info", "message": line}


class LogForwarder:
    """Tails ``serial_log`` and ``vmm_log`` until :meth:`stop`; see the module doc.

    ``sink`` may be None (lines are then only kept in :attr:`recent`). A sink that raises is
    logged and the line dropped; the tail goes on.
    """

    def __init__(self, agent_id: str, serial_log: Path, vmm_log: Path, sink: LogSink | None):
        self.agent_id = agent_id
        self.files = ((SERIAL_SOURCE, Path(serial_log)), (VMM_SOURCE, Path(vmm_log)))
        self.sink = sink
        self.recent: deque[str] = deque(maxlen=KEEP_LINES)
        self.lines = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._tails: list[tuple[FileTail, Path, int]] = []
        self._thread = threading.Thread(target=self._run, name=f"fc-logs:{agent_id}", daemon=True)

    def start(self) -> LogForwarder:
        self._thread.start()
        self._started.wait(5)
        return self

    def _emit(self, source: str, line: str) -> None:
        if source == SERIAL_SOURCE:
            self.recent.append(line)
        self.lines += 1
        if self.sink is not None:
            try:
                self.sink(self.agent_id, source, _record(source, line))
            except Exception:
                log.warning("log sink failed for %s", self.agent_id, exc_info=True)

    async def _follow(self, source: str, path: Path, stop: asyncio.Event) -> None:
        tail = FileTail(path, create=False, opener=open_vm_file)
        try:
            # Held open until the forwarder ends, so what the tail leaves unread can still be
            # read after destroy removed the VM's directory (see _forward_unread).
            keep = open_vm_file(path, os.O_RDONLY)
        except OSError as e:
            log.warning("cannot tail %s for %s: %s", path, self.agent_id, e)
            return
        self._tails.append((tail, path, keep))
        try:
            async for batch in tail.batches(stop):
                for entry in batch:
                    if (text := shown_text(entry)) is not None:
                        self._emit(source, text)
        except OSError as e:
            log.warning("cannot tail %s for %s: %s", path, self.agent_id, e)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        await asyncio.gather(*(self._follow(s, p, self._stop) for s, p in self.files))
        # The tails stopped: their last act is forwarding what they had not read yet (a tail
        # starved on a loaded host), done here in this thread so no line is emitted twice.
        self._forward_unread()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._started.set()

    def caught_up(self) -> bool:
        """Whether every tail has read its file up to the file's current size."""
        for tail, _, keep in list(self._tails):
            try:
                if tail.offset < os.fstat(keep).st_size:
                    return False
            except OSError:
                continue
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Let the tails read what is already written (≤ 1 s), then stop them; waits up to ``timeout`` s."""
        deadline = time.monotonic() + 1.0
        while self._thread.is_alive() and not self.caught_up() and time.monotonic() < deadline:
            time.sleep(0.02)
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "log forwarder of %s did not stop within %.1f s; its last lines may be late", self.agent_id, timeout
                )

    def _forward_unread(self) -> None:
        """Emit what the tails had not read when they stopped (a starved tail on a loaded host),
        so a VM's last console lines are never lost at destroy; at most the last 1 MiB per file.
        Reads through the descriptors held since the start; closes them."""
        source_of = {path: source for source, path in self.files}
        tails, self._tails = list(self._tails), []
        for tail, path, keep in tails:
            try:
                st = os.fstat(keep)
                if tail.identity in (None, (st.st_dev, st.st_ino)):  # not a file it rotated away from
                    for line in split_lines([read_end(keep, REMAINING_MAX_BYTES, tail.offset)]):
                        self._emit(source_of[path], line)
            except OSError:
                pass
            finally:
                os.close(keep)


def forward_remaining(agent_id: str, serial_log: Path, vmm_log: Path, sink: LogSink | None) -> int:
    """Send what a dead VM's logs still hold (the last 1 MiB of each) to ``sink``; returns the line count.

    Used by ``reap_unowned`` and the orphan passes, which find VMs no tail is following.
    """
    count = 0
    for source, path in ((SERIAL_SOURCE, Path(serial_log)), (VMM_SOURCE, Path(vmm_log))):
        try:
            fd = open_vm_file(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning("cannot forward the remaining logs of %s: %s", agent_id, e)
            continue
        try:
            data = read_end(fd, REMAINING_MAX_BYTES)
        except OSError as e:
            log.warning("cannot forward the remaining logs of %s: %s", agent_id, e)
            continue
        finally:
            os.close(fd)
        for line in split_lines([data]):
            count += 1
            if sink is not None:
                try:
                    sink(agent_id, source, _record(source, line))
                except Exception:
                    log.warning("log sink failed for %s", agent_id, exc_info=True)
    return count


def vm_log_files(base: str | os.PathLike) -> list[Path]:
    """The serial console and VMM log of every VM directory under ``<base>/firecracker`` (existing
    or not: callers open them through ``jail.open_vm_file``), for the output cap
    (``scalers.output_caps``). A directory whose name is not a jailer id is left out."""
    try:
        names = sorted(os.listdir(Path(base) / "firecracker"))
    except FileNotFoundError:
        return []
    files: list[Path] = []
    for name in names:
        if AGENT_ID_RE.match(name):
            layout = ChrootLayout.for_agent(base, name)
            files += [layout.serial_log, layout.vmm_log]
    return files
