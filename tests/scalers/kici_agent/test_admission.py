"""``/scale`` and a label set running the real KiCI agent: a job's own image cannot run there."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.models import Agent
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]

TOKEN = "test-kici-admission-token"


def _scale(body: dict):
    return Client().post(
        "/api/v1/scale", data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )


def test_a_job_image_is_refused_before_anything_is_written(settings):
    settings.KICI_API_TOKEN = TOKEN
    make_scaler(
        "real",
        labels=("real-linux",),
        ls_config={
            "image": "kici-real-agent:test",
            "kiciAgent": {"orchestratorUrl": "ws://172.30.0.1:8480/ws", "adminTokenRef": "orch"},
        },
    )
    refused = _scale({"labels": ["real-linux"], "jobId": "j1", "container": {"image": "debian:12"}})
    assert refused.status_code == 422, refused.content
    assert "label set [0] of scaler real (container) cannot run a job image" in refused.content.decode()
    assert not Agent.objects.exists()
    assert _scale({"labels": ["real-linux"], "jobId": "j2"}).status_code == 201
