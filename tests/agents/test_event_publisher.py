"""Events are pushed after commit, off the producer's thread, in commit order; flush drains them."""

import threading

import pytest
from django.db import transaction

from agents import events
from agents.choices import EventType


@pytest.mark.django_db(transaction=True)
def test_recording_does_not_wait_for_the_push_and_flush_drains_in_order(monkeypatch):
    gate = threading.Event()
    pushed = []

    def slow_push(event):
        gate.wait(10)
        pushed.append(event.detail)

    monkeypatch.setattr(events, "_publish_now", slow_push)
    for n in range(3):
        with transaction.atomic():
            events.record_event(None, EventType.PROVISIONING, f"step {n}", agent_ref="scaler-container-00000000")
    assert pushed == []  # the producer did not wait for the (blocked) push
    assert events.flush_events(timeout=0.2) is False
    gate.set()
    assert events.flush_events(timeout=10) is True
    assert pushed == ["step 0", "step 1", "step 2"]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_event_is_never_pushed(monkeypatch):
    pushed = []
    monkeypatch.setattr(events, "_publish_now", lambda e: pushed.append(e.detail))
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            events.record_event(None, EventType.FAILED, "rolled back", agent_ref="x")
            raise RuntimeError
    with transaction.atomic():
        events.record_event(None, EventType.READY, "kept", agent_ref="x")
    assert events.flush_events(timeout=10)
    assert pushed == ["kept"]


@pytest.mark.django_db
def test_the_producer_sends_the_event_id_and_leaves_rendering_to_the_console_processes(settings):
    from agents.models import ScalerEvent
    from live.publish import event_message

    event = ScalerEvent.objects.create(
        agent_ref="scaler-container-0000aaaa", type=EventType.READY, detail="container started"
    )
    message = event_message(event)
    assert message == {"type": "event.message", "event_id": event.pk, "agent_ref": "scaler-container-0000aaaa"}
    settings.KICI_RENDER_EVENTS_AT_PUBLISH = True
    assert "container started" in event_message(event)["html"]
