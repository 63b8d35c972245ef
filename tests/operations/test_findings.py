"""Findings (operations.findings): what the detection of every sweeper round sees, kept with its
evidence and shown, while nothing is planned, stored as an operation or announced."""

from __future__ import annotations

import logging

import pytest

from operations.choices import OperationKind
from operations.findings import detect_findings
from operations.kinds.base import Plan, Target
from operations.kinds.orphan_containers import OrphanContainers
from operations.models import Finding, Operation
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.django_db


@pytest.fixture
def runtime(monkeypatch):
    """What the orphan-container plan finds: ``runtime.found`` (targets), or ``runtime.error``."""

    class Runtime:
        found: list[Target] = []
        error: Exception | None = None

    def plan(self, scope):
        if Runtime.error is not None:
            raise Runtime.error
        return Plan(targets=list(Runtime.found))

    monkeypatch.setattr("operations.findings.DETECTING_KINDS", (OperationKind.ORPHAN_CONTAINERS,))
    monkeypatch.setattr(OrphanContainers, "plan", plan)
    return Runtime


def orphan(n: int, state: str = "exited") -> Target:
    return Target(f"container:{n:064x}", "stop and remove container", f"kici-orphan-{n}", {"container_state": state})


def test_a_round_keeps_what_it_finds_and_forgets_what_is_gone_storing_no_operation(runtime, settings):
    scaler = make_scaler("f-ci")
    runtime.found = [orphan(1), orphan(2)]
    assert detect_findings() is True
    rows = {f.key: f for f in Finding.objects.filter(scaler=scaler)}
    assert [f.subject for f in rows.values()] == ["kici-orphan-1", "kici-orphan-2"]
    assert rows[orphan(1).key].evidence == {"container_state": "exited"}
    first_seen = rows[orphan(1).key].first_seen_at

    runtime.found = [orphan(1, state="dead"), orphan(2)]
    assert detect_findings() is False, "nothing appeared or went"
    again = Finding.objects.get(key=orphan(1).key)
    assert again.first_seen_at == first_seen and again.last_seen_at > first_seen
    assert again.evidence == {"container_state": "dead"}

    runtime.found = [orphan(2)]
    assert detect_findings() is True and list(Finding.objects.values_list("subject", flat=True)) == ["kici-orphan-2"]
    assert not Operation.objects.exists()


def test_a_runtime_that_cannot_be_listed_leaves_the_findings_as_they_were_and_warns_once(runtime, caplog):
    make_scaler("f-ci")
    runtime.found = [orphan(1)]
    detect_findings()
    runtime.error = ConnectionError("docker is not answering")
    with caplog.at_level(logging.DEBUG, logger="operations.findings"):
        assert detect_findings() is False and detect_findings() is False
    assert Finding.objects.count() == 1
    levels = [r.levelno for r in caplog.records if r.name == "operations.findings"]
    assert levels == [logging.WARNING, logging.DEBUG], "a warning per failing spell, not per round"
    runtime.error = None
    detect_findings()
    runtime.error = ConnectionError("docker is not answering again")
    caplog.clear()
    detect_findings()
    assert [r.levelno for r in caplog.records if r.name == "operations.findings"] == [logging.WARNING]


def test_only_this_hosts_scalers_are_detected(runtime):
    scaler = make_scaler("f-elsewhere")
    scaler.host = "another-host"
    scaler.save(update_fields=["host"])
    runtime.found = [orphan(1)]
    assert detect_findings() is False and not Finding.objects.exists()


def test_the_scaler_page_shows_its_findings_with_evidence_and_refetches_them(runtime, viewer_client):
    scaler = make_scaler("f-page")
    page = viewer_client.get("/scalers/f-page/").content.decode()
    assert 'id="findings-panel" hx-get="/scalers/f-page/?part=findings" hx-trigger="every 5s"' in page
    assert 'id="findings"' not in page, "nothing found: no panel"

    runtime.found = [orphan(7, state="dead")]
    detect_findings()
    fragment = viewer_client.get("/scalers/f-page/?part=findings").content.decode()
    assert fragment.lstrip().startswith('<div id="findings-panel"') and "<html" not in fragment
    row = fragment[fragment.index('<tr id="finding-') :]
    assert "kici-orphan-7" in row and "stop and remove container" in row
    assert "<dt>container</dt><dd>dead</dd>" in row
    assert Finding.objects.get(scaler=scaler).subject in viewer_client.get("/scalers/f-page/").content.decode()
    bad = viewer_client.get("/scalers/f-page/?part=rows")
    assert bad.status_code == 400 and "part" in bad.content.decode()
