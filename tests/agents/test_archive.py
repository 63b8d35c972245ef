"""An agent's kept output (agents.archive): bounded, shown and downloadable once its sandbox is
gone, deleted with the agent by retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import agents.archive
from agents.archive import (
    archive_dir,
    archive_parts,
    archive_path,
    archived_lines,
    archived_times,
    times_path,
    write_archive,
)
from agents.choices import AgentState
from agents.models import Agent
from agents.retention import prune_old_records
from tests.support.scalers import make_agent, make_scaler


@pytest.fixture(autouse=True)
def _log_dir(settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path)


def test_the_archive_keeps_the_end_of_the_output_from_a_line_start(monkeypatch):
    monkeypatch.setattr(agents.archive, "ARCHIVE_BYTES", 20)
    path = write_archive("scaler-container-0000a1a1", b"".join(b"line %d\n" % i for i in range(10)))
    assert path.read_bytes() == b"line 8\nline 9\n"  # the last 20 bytes, from the first whole line
    assert archived_lines("scaler-container-0000a1a1").lines == ["line 8", "line 9"]
    assert archived_lines("scaler-container-00000000") is None


@pytest.mark.parametrize("agent_id", ["", ".", "..", "a/b"])
def test_an_agent_id_that_is_not_one_path_component_names_no_archive(agent_id):
    with pytest.raises(ValueError, match="cannot name an archive directory"):
        archive_dir(agent_id)


@pytest.mark.django_db
def test_a_finished_agents_console_shows_and_downloads_its_kept_output(viewer_client):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    write_archive(agent.agent_id, "".join(f"output {i}\n" for i in range(600)).encode())
    page = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert "Below are the last 500 lines of the output kept when its container was removed" in page
    assert "output 599" in page and "output 99<" not in page
    download = viewer_client.get(f"/agents/{agent.agent_id}/console/console/download")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == archive_path(agent.agent_id).read_bytes()


@pytest.mark.django_db
def test_retention_deletes_the_kept_output_with_the_agent(settings, tmp_path):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    write_archive(agent.agent_id, b"bye\n")
    (tmp_path / f"{agent.agent_id}.log").write_bytes(b"bare-metal output\n")
    then = timezone.now() - timedelta(days=settings.KICI_RETENTION_DAYS + 1)
    Agent.objects.filter(pk=agent.pk).update(finished_at=then)
    assert prune_old_records()["agents"] == 1
    assert not archive_dir(agent.agent_id).exists() and not (tmp_path / f"{agent.agent_id}.log").exists()


def test_the_archive_numbers_its_lines_by_their_place_in_the_output_after_a_cut(monkeypatch):
    monkeypatch.setattr(agents.archive, "ARCHIVE_BYTES", 20)
    output = b"".join(b"line %d\n\n" % i for i in range(1, 11))  # empty lines are not counted
    write_archive("scaler-container-0000a1a2", output, lines_before=100)
    kept = archived_lines("scaler-container-0000a1a2")
    assert kept.lines == ["line 9", "line 10"] and kept.first == 109 and kept.oldest == 109  # 8 cut, 100 before
    assert archived_lines("scaler-container-0000a1a2", 1, before=110) == (109, 109, ["line 9"])


@pytest.mark.django_db
def test_a_finished_agents_page_and_lines_endpoint_number_its_archive_as_the_output(viewer_client, monkeypatch):
    monkeypatch.setattr(agents.archive, "ARCHIVE_BYTES", 4096)
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    write_archive(agent.agent_id, "".join(f"output {i}\n" for i in range(1, 1001)).encode())
    first = 1001 - len(archive_path(agent.agent_id).read_bytes().splitlines())
    assert first > 1
    page = viewer_client.get(f"/agents/{agent.agent_id}/console/").content.decode()
    assert (
        '<tr id="L1000" data-seq="1000"><td class="ln"><a href="#L1000">1000</a></td><td class="tx">output 1000<'
        in page
    )
    assert f'id="L{first}"' in page and f'id="L{first - 1}"' not in page and 'id="L1"' not in page
    response = viewer_client.get(f"/agents/{agent.agent_id}/console/console/lines", {"before": first + 3, "limit": 10})
    assert response.status_code == 200
    body = response.json()
    assert body["oldest"] == first and body["first"] == first, body
    assert [row[0::2] for row in body["rows"]] == [[n, f"output {n}"] for n in range(first, first + 3)]


def test_the_parts_of_an_archive_keep_their_lines_times_at_their_places_in_it():
    parts = [("serial console", b"boot\nkernel\n"), ("VMM log", b"vmm 1\nvmm 2\nvmm 3")]
    archive_parts("scaler-firecracker-0000a1a3", parts, [{0: 5_000, 1: 5_000}, {1: 7_000, 2: 7_000}])
    lines = archived_lines("scaler-firecracker-0000a1a3").lines
    assert lines == ["--- serial console ---", "boot", "kernel", "--- VMM log ---", "vmm 1", "vmm 2", "vmm 3"]
    assert archived_times("scaler-firecracker-0000a1a3", 1, 8) == {2: 5_000, 3: 5_000, 6: 7_000, 7: 7_000}
    assert times_path("scaler-firecracker-0000a1a3").read_text() == "2 2 5000\n6 2 7000\n"
    # Without times nothing is kept beside it, and an old file of times goes.
    archive_parts("scaler-firecracker-0000a1a3", parts)
    assert archived_times("scaler-firecracker-0000a1a3", 1, 8) == {}
    assert not times_path("scaler-firecracker-0000a1a3").exists()
