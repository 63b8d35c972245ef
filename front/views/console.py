"""``/agents/<agent_id>/console/``: the live console page and the full-log download."""

from __future__ import annotations

import os

from django.http import FileResponse, Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.archive import archive_path
from agents.models import Agent
from lib.tail import Opener, plain_open
from live.consoles import (
    agent_container,
    captured_output,
    console_file_opener,
    console_log_file,
    console_streams_of,
    runs_in_container,
    sandbox_gone,
)

from .common import agent_or_404, viewer_required

_STREAM_TITLES = {"serial": "Serial console", "vmm": "VMM log", "console": "Console"}


def console_streams(agent: Agent) -> list[tuple[str, str]]:
    """``[(stream, label)]`` the console page offers (:func:`live.consoles.console_streams_of`)."""
    return [(name, _STREAM_TITLES[name]) for name in console_streams_of(agent)]


@require_GET
@viewer_required
def agent_console(request, agent_id: str, stream: str | None = None):
    """``/agents/<id>/console/[<stream>/]``: the live console with follow, search, download, links.

    A finished agent whose sandbox is gone (:func:`live.consoles.sandbox_gone`) gets no live
    stream: the page says so and shows what was captured (the last output lines of a failed
    spawn), with links to its timeline."""
    agent = agent_or_404(agent_id)
    streams = console_streams(agent)
    names = [s for s, _ in streams]
    if stream is None:
        stream = names[0]
    elif stream not in names:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}; it has {', '.join(names)}")
    ctx = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "stream": stream,
        "streams": streams,
        "ws_url": f"/ws/agents/{agent.agent_id}/console/{stream}/",
        "download_url": download_url(agent, stream),
        "gone": sandbox_gone(agent, stream),
    }
    if ctx["gone"]:
        ctx["captured"] = captured_output(agent)
    return render(request, "agents/console.html", ctx)


def download_url(agent: Agent, stream: str) -> str:
    return reverse("agent_console_download", args=[agent.agent_id, stream])


def _docker_log_chunks(agent: Agent):
    stream = agent_container(agent).logs(stream=True, follow=False, stdout=True, stderr=True)
    try:
        yield from stream
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _file_download(path, filename: str, opener: Opener = plain_open) -> HttpResponse:
    """``path`` as a text attachment, its bytes as on disk (502 when it cannot be read or
    ``opener`` refuses it); raises FileNotFoundError when it is not there."""
    try:
        handle = os.fdopen(opener(os.fspath(path), os.O_RDONLY), "rb")
    except FileNotFoundError:
        raise
    except OSError as exc:
        return HttpResponse(f"could not read {path}: {exc}\n", status=502, content_type="text/plain; charset=utf-8")
    return FileResponse(handle, as_attachment=True, filename=filename, content_type="text/plain; charset=utf-8")


@require_GET
@viewer_required
def agent_console_download(request, agent_id: str, stream: str):
    """``/agents/<id>/console/<stream>/download``: the whole log as a text attachment.

    File-backed streams are sent as they are on disk (bytes, never decoded); a container's
    ``console`` without a file is its docker logs (stdout and stderr), streamed. A finished agent
    whose sandbox is gone downloads its archive (``agents.archive``), else what was captured when its
    spawn failed (404 when nothing was kept)."""
    agent = agent_or_404(agent_id)
    if stream not in [s for s, _ in console_streams(agent)]:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}")
    filename = f"{agent.agent_id}-{stream}.log"
    if sandbox_gone(agent, stream):
        try:
            return _file_download(archive_path(agent.agent_id), filename)
        except FileNotFoundError:
            pass  # no archive: what a failed spawn captured, if anything
        lines = captured_output(agent)["lines"]
        if not lines:
            raise Http404(
                f"the sandbox of agent {agent.agent_id} is gone ({agent.state}) and none of its output was captured"
            )
        return HttpResponse(
            "\n".join(lines) + "\n",
            content_type="text/plain; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{agent.agent_id}-{stream}-captured.log"'},
        )
    path = console_log_file(agent, stream)
    if path is not None:
        try:
            return _file_download(path, filename, console_file_opener(stream))
        except FileNotFoundError:
            raise Http404(f"{path} does not exist (yet)") from None
    if not runs_in_container(agent):
        raise Http404(f"agent {agent.agent_id} ({agent.scaler.type}) has no console log to download")
    try:
        chunks = _docker_log_chunks(agent)
        first = next(chunks, b"")
    except Exception as exc:  # noqa: BLE001 - docker down or the container is gone
        return HttpResponse(
            f"could not read the container's logs: {exc}\n", status=502, content_type="text/plain; charset=utf-8"
        )

    def body():
        yield first
        yield from chunks

    response = StreamingHttpResponse(body(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
