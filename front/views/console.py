"""``/agents/<agent_id>/console/``: the live console page and the full-log download."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import redis
from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.archive import archive_path, archived_lines, archived_times
from agents.models import Agent
from consolelog.dockerlogs import RedisCheckpoints, container_lines
from consolelog.dockerlogs import read_lines_before as read_container_lines
from consolelog.search import Found, compile_query, file_lines, search_lines, search_regex_bounded
from consolelog.tail import Opener, plain_open, read_lines_before
from consolelog.times import line_times
from lib.query import check_parameters, choice, whole_number
from live.consoles import (
    agent_container,
    captured_output,
    console_file_opener,
    console_log_file,
    console_streams_of,
    runs_in_container,
    sandbox_gone,
)
from live.rows import agent_page_version
from live.streams import LEVEL_DEBUG, LEVEL_ERROR, Line, console_row, failure_indexes

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
    ctx: dict[str, Any] = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "stream": stream,
        "streams": streams,
        "ws_url": f"/ws/agents/{agent.agent_id}/console/{stream}/",
        "download_url": download_url(agent, stream),
        "lines_url": reverse("agent_console_lines", args=[agent.agent_id, stream])
        if console_log_file(agent, stream) is not None or runs_in_container(agent)
        else "",
        "search_url": reverse("agent_console_search", args=[agent.agent_id, stream]),
        "gone": sandbox_gone(agent, stream),
        "page_version": agent_page_version(agent),
    }
    if ctx["gone"]:
        captured = captured_output(agent)
        ctx["captured"] = captured
        ctx["captured_rows"] = [(captured["first"] + i, text) for i, text in enumerate(captured["lines"])]
        ctx["captured_last"] = captured["first"] + len(captured["lines"]) - 1
        # The archive's lines as the console's rows ([number, ms, text], with the times kept
        # beside it): the page's virtual list starts from them and loads earlier ones from it.
        rows = ctx["captured_rows"] if captured["archived"] else []
        times = archived_times(agent.agent_id, rows[0][0], rows[-1][0] + 1) if rows else {}
        ctx["archived_rows"] = [[n, times.get(n, 0), text] for n, text in rows]
        ctx["lines_url"] = reverse("agent_console_lines", args=[agent.agent_id, stream])
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


def _file_download(path, filename: str, opener: Opener = plain_open) -> HttpResponse | FileResponse:
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


#: Default and largest ``limit`` of :func:`agent_console_lines`.
LINES_PAGE = 500
LINES_PAGE_MAX = 1000

#: Largest ``before`` of :func:`agent_console_lines`: 2**53 - 1, the largest line number the page's
#: JavaScript holds exactly (``Number.MAX_SAFE_INTEGER``), far above any stream's line count.
BEFORE_MAX = 2**53 - 1


@require_GET
@viewer_required
def agent_console_lines(request, agent_id: str, stream: str):
    """``/agents/<id>/console/<stream>/lines?before=N&limit=500``: the lines numbered below ``N``
    (1 to :data:`BEFORE_MAX`; at most ``limit``, 1 to 1,000) as JSON ``{"oldest", "first", "rows"}``
    (rows of ``live.streams.console_row``), from the file, a container's docker logs or a finished
    agent's archive, with their times (docs/live-streams.md, "Line numbers and times"). 400 naming a
    bad, unknown or repeated parameter, 404 for a stream with nothing behind it or no file (yet), 502
    when it cannot be read.
    """
    agent = agent_or_404(agent_id)
    if stream not in [s for s, _ in console_streams(agent)]:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}")
    try:
        check_parameters(request.GET, single=("before", "limit"))
        before = whole_number("before", request.GET.get("before"), 1, BEFORE_MAX)
        limit = whole_number("limit", request.GET.get("limit"), 1, LINES_PAGE_MAX, default=LINES_PAGE)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if sandbox_gone(agent, stream):
        return _archive_lines(agent, before, limit)
    path = console_log_file(agent, stream)
    if path is None:
        if runs_in_container(agent):
            return _container_lines(agent, before, limit)
        return JsonResponse({"error": f"the {stream} stream of {agent.agent_id} has no output to read"}, status=404)
    try:
        fd = console_file_opener(stream)(os.fspath(path), os.O_RDONLY)
    except FileNotFoundError:
        return JsonResponse({"error": f"{path} does not exist (yet)"}, status=404)
    except OSError as exc:
        return JsonResponse({"error": f"could not read {path}: {exc}"}, status=502)
    try:
        oldest, first, texts = read_lines_before(fd, before, limit)
    except OSError as exc:
        return JsonResponse({"error": f"could not read {path}: {exc}"}, status=502)
    finally:
        os.close(fd)
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        times = line_times(client, agent.agent_id, stream, first, first + len(texts))
    finally:
        client.close()
    errors = set(failure_indexes(texts)) if stream == "serial" else set()
    rows = [
        console_row(
            Line(text, first + i, LEVEL_ERROR if i in errors else LEVEL_DEBUG, ts=times.get(first + i, 0) / 1000)
        )
        for i, text in enumerate(texts)
    ]
    return JsonResponse({"oldest": oldest, "first": first, "rows": rows})


def _container_lines(agent: Agent, before: int, limit: int) -> JsonResponse:
    """:func:`agent_console_lines` of a container's docker logs (``consolelog.dockerlogs``)."""
    import docker.errors

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        container = agent_container(agent)
        page = read_container_lines(container, RedisCheckpoints(client, agent.agent_id), before, limit)
    except docker.errors.NotFound:
        return JsonResponse({"error": f"the container of {agent.agent_id} is gone"}, status=404)
    except Exception as exc:  # noqa: BLE001 - docker down, or a log it cannot read
        return JsonResponse({"error": f"could not read the container's logs: {exc}"}, status=502)
    finally:
        client.close()
    rows = [console_row(Line(line.text, line.n, ts=line.ms / 1000)) for line in page.lines]
    return JsonResponse({"oldest": page.oldest, "first": page.first, "rows": rows})


def _archive_lines(agent: Agent, before: int, limit: int) -> JsonResponse:
    """:func:`agent_console_lines` of a finished agent's archive (``agents.archive``)."""
    archived = archived_lines(agent.agent_id, limit, before=before)
    if archived is None:
        return JsonResponse(
            {"error": f"the sandbox of {agent.agent_id} is gone and none of its output was kept"}, status=404
        )
    first = archived.first
    times = archived_times(agent.agent_id, first, first + len(archived.lines))
    rows = [
        console_row(Line(text, first + i, ts=times.get(first + i, 0) / 1000)) for i, text in enumerate(archived.lines)
    ]
    return JsonResponse({"oldest": archived.oldest, "first": first, "rows": rows})


#: Default and largest ``limit`` of :func:`agent_console_search`, in hits.
SEARCH_HITS = 200
SEARCH_HITS_MAX = 1000
#: Time budget of one search, in seconds: past it the search answers what it found so far.
SEARCH_SECONDS = 10.0


@require_GET
@viewer_required
def agent_console_search(request, agent_id: str, stream: str):
    """``/agents/<id>/console/<stream>/search?q=&regex=&case=&after=&limit=``: the lines of the stream's
    whole kept output (what the lines endpoint reads) containing ``q`` (``case=1``, ``regex=1``: cost
    bounded by ``consolelog.search``), numbered above ``after``, at most ``limit`` (1 to 1,000; 200),
    as JSON ``{"hits": [[number, ms, excerpt, [[start, end], ...]], ...], "more", "first", "last",
    "scanned", "stopped"}``. 400 naming a bad parameter, 404 for a stream with nothing behind it, 502
    when it cannot be read.
    """
    agent = agent_or_404(agent_id)
    if stream not in [s for s, _ in console_streams(agent)]:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}")
    try:
        check_parameters(request.GET, single=("q", "regex", "case", "after", "limit"))
        regex = choice("regex", request.GET.get("regex"), ("0", "1")) == "1"
        case = choice("case", request.GET.get("case"), ("0", "1")) == "1"
        after = whole_number("after", request.GET.get("after"), 0, BEFORE_MAX, default=0)
        limit = whole_number("limit", request.GET.get("limit"), 1, SEARCH_HITS_MAX, default=SEARCH_HITS)
        query = request.GET.get("q", "")
        pattern = compile_query(query, regex=regex, case=case)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)

    def run(lines) -> Found:
        if regex:
            return search_regex_bounded(lines, query, case=case, after=after, limit=limit, seconds=SEARCH_SECONDS)
        return search_lines(lines, pattern, after=after, limit=limit, seconds=SEARCH_SECONDS)

    try:
        if sandbox_gone(agent, stream):
            found, times = _search_archive(agent, run)
        elif (path := console_log_file(agent, stream)) is not None:
            found, times = _search_file(agent, stream, path, run)
        elif runs_in_container(agent):
            found, times = _search_container(agent, run)
        else:
            return JsonResponse({"error": f"the {stream} stream of {agent.agent_id} has no output to read"}, status=404)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except LookupError as exc:
        return JsonResponse({"error": str(exc)}, status=404)
    except (OSError, RuntimeError) as exc:
        return JsonResponse({"error": f"could not search the {stream} output of {agent.agent_id}: {exc}"}, status=502)
    return JsonResponse(
        {
            "hits": [[hit.n, times.get(hit.n, 0), hit.excerpt, hit.marks] for hit in found.hits],
            "more": found.more,
            "first": found.first,
            "last": found.last,
            "scanned": found.scanned,
            "stopped": found.stopped,
        }
    )


def _search_file(agent: Agent, stream: str, path, run) -> tuple[Found, dict[int, int]]:
    """:func:`agent_console_search` of a log file, with the receive times of its hits (the
    stream's ``times`` key). LookupError when the file is not there (yet)."""
    try:
        fd = console_file_opener(stream)(os.fspath(path), os.O_RDONLY)
    except FileNotFoundError:
        raise LookupError(f"{path} does not exist (yet)") from None
    try:
        with contextlib.closing(file_lines(fd)) as lines:  # its numbering lock goes with it
            found = run(lines)
    finally:
        os.close(fd)
    if not found.hits:
        return found, {}
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        times = line_times(client, agent.agent_id, stream, found.hits[0].n, found.hits[-1].n + 1)
    finally:
        client.close()
    return found, times


def _search_container(agent: Agent, run) -> tuple[Found, dict[int, int]]:
    """:func:`agent_console_search` of a container's docker logs, with docker's times.
    LookupError when the container is gone, OSError when docker cannot be read."""
    import docker.errors

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        lines = container_lines(agent_container(agent), RedisCheckpoints(client, agent.agent_id))
    except docker.errors.NotFound:
        raise LookupError(f"the container of {agent.agent_id} is gone") from None
    except (docker.errors.DockerException, ValueError) as exc:
        raise OSError(f"could not read the container's logs: {exc}") from None
    finally:
        client.close()
    found = run((line.n, line.text) for line in lines)
    hits = {hit.n for hit in found.hits}
    return found, {line.n: line.ms for line in lines if line.n in hits}


def _search_archive(agent: Agent, run) -> tuple[Found, dict[int, int]]:
    """:func:`agent_console_search` of a finished agent's archive, with the times kept beside it.
    LookupError when none of its output was kept."""
    try:
        fd = os.open(archive_path(agent.agent_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        raise LookupError(f"the sandbox of {agent.agent_id} is gone and none of its output was kept") from None
    try:
        with contextlib.closing(file_lines(fd)) as lines:  # its numbering lock goes with it
            found = run(lines)
    finally:
        os.close(fd)
    if not found.hits:
        return found, {}
    return found, archived_times(agent.agent_id, found.hits[0].n, found.hits[-1].n + 1)
