"""Whose a container is: the three ownership labels, the judge of one container, and the ids
(installation, console instance) they are made of."""

from __future__ import annotations

import logging

import pytest

from kici_site.settings import _default_instance_id
from scalers.backends.container.orphans import SparedContainer, TrackedAgent, judge_container, plan_container_orphans
from scalers.backends.orphans import OrphanTarget
from scalers.backends.ownership import MINE, OTHER, UNKNOWN, Owner, current_owner, judge_ownership
from scalers.models import Installation

INSTALLATION = "0f" * 16
A = Owner(INSTALLATION, "console-a", "ci")
#: A console started on a restored copy of A's database: same installation, same scaler name.
B = Owner(INSTALLATION, "console-b", "ci")


def _summary(labels: dict, state: str = "running", cid: str = "c" * 64) -> dict:
    return {"Id": cid, "Names": ["/agent"], "State": state, "Status": "", "Labels": labels, "NetworkSettings": {}}


def _made_by(owner: Owner, agent_id: str) -> dict:
    return {"kici-managed": "true", **owner.labels(), "kici-agent-id": agent_id}


def test_a_sandbox_is_mine_only_when_all_three_labels_are_mine():
    assert judge_ownership(A.labels(), A).ownership == MINE
    for name, value in (
        ("kici-installation-id", "1e" * 16),
        ("kici-instance-id", "console-b"),
        ("kici-scaler-name", "ci-2"),
        ("kici-scaler-name", "CI"),
        ("kici-instance-id", "console-a "),
    ):
        verdict = judge_ownership({**A.labels(), name: value}, A)
        assert verdict.ownership == OTHER and f"{name}={value}" in verdict.reason, (name, value)
    assert "another console's" in judge_ownership(B.labels(), A).reason


@pytest.mark.parametrize("name", ["kici-installation-id", "kici-instance-id", "kici-scaler-name"])
def test_a_missing_or_empty_owner_label_is_ownership_unknown(name):
    for labels in ({**A.labels(), name: ""}, {k: v for k, v in A.labels().items() if k != name}):
        verdict = judge_ownership(labels, A)
        assert verdict.ownership == UNKNOWN and verdict.reason.startswith("skipped: ownership unknown")
        assert name in verdict.reason
    assert judge_ownership(None, A).ownership == UNKNOWN


def test_the_restored_copy_never_judges_the_first_consoles_running_agent_an_orphan():
    # A's agent runs and is registered with A; B's database never heard of it (spawned after the copy).
    running = _summary(_made_by(A, "scaler-container-a0000001"))
    seen_by_b = judge_container(running, B, {}, lambda agent_id: False)
    assert isinstance(seen_by_b, SparedContainer)
    assert seen_by_b.reason == "skipped: another console's (kici-instance-id=console-a)"
    # The same container, judged by its own console with the same (empty) view, is an orphan:
    # only the instance label spares it from B.
    assert isinstance(judge_container(running, A, {}, lambda agent_id: False), OrphanTarget)


def test_a_stopped_container_of_another_installation_is_spared_too():
    stranger = Owner("1e" * 16, "console-a", "ci")
    exited = _summary(_made_by(stranger, "scaler-container-a0000002"), state="exited")
    verdict = judge_container(exited, A, {}, None)
    assert isinstance(verdict, SparedContainer) and verdict.reason.startswith("skipped: another installation's")


def test_a_container_without_owner_labels_is_shown_as_ownership_unknown_logged_and_never_a_target(caplog):
    legacy = _summary(
        {"kici-managed": "true", "kici-scaler-name": "ci", "kici-agent-id": "scaler-container-a0000003"},
        state="exited",
    )
    empty = _summary({**_made_by(A, "scaler-container-a0000004"), "kici-instance-id": ""}, "exited", "d" * 64)
    with caplog.at_level(logging.WARNING, logger="scalers.backends.container.orphans"):
        plan = plan_container_orphans([legacy, empty], A, {}, None)
    assert plan.targets == []
    assert [(s.container_id, s.reason) for s in plan.spared] == [
        ("c" * 64, "skipped: ownership unknown (no kici-installation-id, kici-instance-id)"),
        ("d" * 64, "skipped: ownership unknown (no kici-instance-id)"),
    ]
    assert sum("is never reaped: skipped: ownership unknown" in r.getMessage() for r in caplog.records) == 2


def test_another_scalers_container_is_not_in_this_scalers_plan_at_all():
    other_scaler = _summary(_made_by(Owner(INSTALLATION, "console-a", "ci-2"), "scaler-container-a0000005"))
    assert judge_container(other_scaler, A, {}, None) is None


def test_ownership_is_judged_before_the_tracked_rule():
    # B tracks an agent id of A's (its restored rows): the container is still A's, and says so.
    verdict = judge_container(
        _summary(_made_by(A, "scaler-container-a0000006")), B, {"scaler-container-a0000006": TrackedAgent()}, None
    )
    assert verdict.reason.startswith("skipped: another console's")


@pytest.mark.django_db
def test_the_installation_id_is_made_once_and_then_always_the_same(settings):
    assert not Installation.objects.exists()
    first = Installation.current_id()
    assert len(first) == 32 and Installation.current_id() == first and Installation.objects.count() == 1
    settings.KICI_INSTANCE_ID = "console-z"
    assert current_owner("ci") == Owner(first, "console-z", "ci")


def test_the_default_instance_id_is_stable_per_console_and_differs_between_consoles_on_one_host():
    db = {"HOST": "127.0.0.1", "PORT": "5432", "NAME": "kici"}
    first = _default_instance_id("build-1", db)
    assert first == _default_instance_id("build-1", dict(db)) and first.startswith("build-1-")
    restored = {**db, "NAME": "kici_restored"}
    assert len({first, _default_instance_id("build-1", restored), _default_instance_id("build-2", db)}) == 3
    assert _default_instance_id("build-1", {**db, "PORT": "5433"}) != first


@pytest.mark.parametrize("state", ["running", "paused", "restarting"])
def test_a_live_container_of_mine_with_no_agent_id_is_spared_not_reaped(state):
    labels = {k: v for k, v in _made_by(A, "").items() if k != "kici-agent-id"}
    verdict = judge_container(_summary(labels, state=state), A, {}, lambda agent_id: False)
    assert isinstance(verdict, SparedContainer)
    assert verdict.reason == f"{state} with no kici-agent-id label: cannot tell whose it is"


def test_a_container_the_runtime_is_already_removing_is_left_to_it():
    removing = _summary(_made_by(A, "scaler-container-a0000010"), state="removing")
    verdict = judge_container(removing, A, {}, lambda agent_id: False)
    assert isinstance(verdict, SparedContainer) and verdict.reason == "being removed by the runtime (removing)"
