"""/metrics as a Prometheus user meets it: promtool's own checker passes on a scrape where every
series has a value, every series is there at 0 from the first scrape, and the example alerting
rules in docs/prometheus/ are valid, pass their own unit tests and name only exported series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from agents.choices import AgentState
from scalers.metrics import (
    HISTOGRAMS,
    SCALE_DOWN_EMITTED,
    SCALE_TO_REGISTERED,
    SPAWN_DURATION,
    SPAWN_STEP,
    count,
    observe,
    set_gauge,
)
from scalers.scrape import SHARED
from tests.support.root import IN_CI
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if IN_CI:
            pytest.fail("promtool is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("promtool is missing (Debian's prometheus package)")
    return path


def scrape() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def scalers():
    """One scaler of each type, as the zero-valued series are made from them."""
    return {kind: make_scaler(f"m-{kind}", type=kind, label_sets=[[kind]]) for kind in ("container", "event")}


def test_every_series_is_on_the_first_scrape_at_zero(scalers):
    families = {f.name: f for f in text_string_to_metric_families(scrape())}
    for series in SHARED.values():
        name = series.name.removesuffix("_total") if not series.gauge else series.name
        assert name in families, series.name
        if series.name != SCALE_DOWN_EMITTED:  # its reason label has no closed set of values
            assert families[name].samples, f"{series.name} has no sample before its first write"
            assert all(s.value == 0 for s in families[name].samples if s.name.endswith(("_total", name))), name
    refusals = families["kici_scaler_spawn_refusals"].samples
    assert {(s.labels["scaler"], s.labels["cap"]) for s in refusals} >= {("m-container", "maxAgents")}
    up = families["kici_orch_scaler_scale_up_emitted"].samples
    assert [s.labels["scaler"] for s in up if s.name.endswith("_total")] == ["m-event"]
    for hist in HISTOGRAMS.values():
        counts = [s for s in families[hist.name].samples if s.name.endswith("_count")]
        assert counts and all(s.value == 0 for s in counts), hist.name
    assert families["kici_scaler_notices"].samples, "the series operations registers is there too"


def test_promtool_finds_nothing_wrong_with_a_scrape_where_every_series_has_values(scalers):
    scaler = scalers["container"]
    for series in SHARED.values():
        labels = {name: f"v-{name}" for name in series.labels}
        (set_gauge(series.name, 1, labels) if series.gauge else count(series.name, labels, 2))
    observe(SCALE_TO_REGISTERED, {"scaler": scaler.name}, 1.5)
    observe(SPAWN_DURATION, {"scaler": scaler.name, "result": "spawned"}, 700)
    observe(SPAWN_STEP, {"scaler": scaler.name, "step": "create"}, 0.2)
    make_agent(scaler, AgentState.RUNNING, lost={"lost_by": "heartbeat"})
    body = scrape()
    assert 'kici_scaler_scale_to_registered_seconds_bucket{le="2.0",scaler="m-container"} 1.0' in body
    assert 'kici_scaler_spawn_duration_seconds_bucket{le="120.0",result="spawned",scaler="m-container"} 0.0' in body
    assert 'kici_scaler_spawn_duration_seconds_bucket{le="+Inf",result="spawned",scaler="m-container"} 1.0' in body
    assert 'kici_scaler_spawn_step_seconds_bucket{le="0.25",scaler="m-container",step="create"} 1.0' in body
    assert 'kici_scaler_spawn_step_seconds_count{scaler="m-event",step="register"} 0.0' in body
    checked = subprocess.run([promtool(), "check", "metrics"], input=body, capture_output=True, text=True)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked.stdout + checked.stderr


def test_the_example_alerting_rules_are_valid_and_pass_their_unit_tests():
    for verb, name in (("check", "alerts.yml"), ("test", "alerts_test.yml")):
        run = subprocess.run([promtool(), verb, "rules", name], cwd=RULES, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_alerting_rules_name_only_series_the_console_exports(scalers):
    exported = {f.name for f in text_string_to_metric_families(scrape())}
    named = set(re.findall(r"\bkici_[a-z_]+", (RULES / "alerts.yml").read_text()))
    assert named
    for name in named:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert base in exported, name
