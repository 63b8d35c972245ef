"""Settings accepted without effect: warned about by ``make check`` and, once each, by an import."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from agents.choices import EventType
from agents.models import ScalerEvent
from scalers.config.loader import parse_scalers_config_text
from scalers.config.warnings import config_warnings, entry_warnings
from scalers.importing import apply_scalers_config

CONFIG = """\
version: 1
scalers:
  - name: metal
    type: bare-metal
    maxAgents: 2
    networkIsolation: {isolation}
    labelSets:
      - labels: [gpu]
        binaryPath: /opt/kici/kici-agent
        networkPolicy: {{denyAll: true}}
      - labels: [img]
        image: kici-agent:local
        networkPolicy: {{denyAll: true}}
  - name: boxes
    type: container
    maxAgents: 2
    networkIsolation: false
    labelSets:
      - labels: [ctr]
        image: kici-agent:local
"""


def parse(isolation: str = "false"):
    return parse_scalers_config_text(CONFIG.format(isolation=isolation), "scalers.yaml")


def test_a_policy_on_a_process_label_set_and_isolation_off_on_bare_metal_are_warned_about():
    warnings = config_warnings(parse())
    assert [(path, w.scaler) for path, w in warnings] == [
        ("scalers.0.networkIsolation", "metal"),
        ("scalers.0.labelSets.0.networkPolicy", "metal"),
    ]  # the image label set's policy is enforced; a container scaler may turn isolation off
    assert "networkIsolation: false is ignored" in warnings[0][1].message
    assert "label set [0] runs a host process (binaryPath): its networkPolicy is not enforced" in warnings[1][1].message
    assert [w.path for w in entry_warnings(parse("true").scalers[0].to_raw())] == ["labelSets.0.networkPolicy"]


def test_check_prints_the_warnings_after_the_verdict(tmp_path):
    path = tmp_path / "scalers.yaml"
    path.write_text(CONFIG.format(isolation="false"))
    out = io.StringIO()
    call_command("import_scalers", str(path), "--check", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "OK: 2 scalers, 3 label sets"
    assert lines[1].startswith('warning: scalers.0.networkIsolation: Bare-metal scaler "metal": networkIsolation')
    assert lines[2].startswith("warning: scalers.0.labelSets.0.networkPolicy: ")
    assert len(lines) == 3


def warning_events() -> list[str]:
    return list(
        ScalerEvent.objects.filter(type=EventType.CONFIG_WARNING).order_by("id").values_list("detail", flat=True)
    )


@pytest.mark.django_db
def test_an_import_records_each_warning_once_when_it_appears(caplog):
    summary = apply_scalers_config(parse("true"), "scalers.yaml")
    assert [line.split(":")[0] for line in summary.warnings] == ["scalers.0.labelSets.0.networkPolicy"]
    [first] = warning_events()
    assert "not enforced" in first and "(import of scalers.yaml)" in first
    assert any("not enforced" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert ScalerEvent.objects.get(type=EventType.CONFIG_WARNING).scaler_name == "metal"

    again = apply_scalers_config(parse("true"), "scalers.yaml")  # the same file: nothing new
    assert len(again.warnings) == 1 and len(warning_events()) == 1
    assert "warning: scalers.0.labelSets.0.networkPolicy" in str(again)

    apply_scalers_config(parse("false"), "scalers.yaml")  # a change adds one warning: one event
    events = warning_events()
    assert len(events) == 2 and "networkIsolation: false is ignored" in events[1]


def test_net_raw_without_an_agent_container_is_warned_about():
    entry = {
        "name": "vms",
        "type": "firecracker",
        "labelSets": [{"labels": ["vm"], "netRaw": True}, {"labels": ["vm2"], "netRaw": False}],
    }
    assert [(w.path, w.message) for w in entry_warnings(entry)] == [
        ("labelSets.0.netRaw", 'Scaler "vms" label set [0] runs no agent container: netRaw has no effect')
    ]
    metal = {"name": "m", "type": "bare-metal", "labelSets": [{"labels": ["a"], "binaryPath": "/x", "netRaw": True}]}
    assert [w.path for w in entry_warnings(metal)] == ["labelSets.0.netRaw"]
    container = {"name": "c", "type": "container", "labelSets": [{"labels": ["a"], "image": "i", "netRaw": True}]}
    assert entry_warnings(container) == []  # it takes effect: the scaler page warns instead


def test_a_debug_hold_on_an_event_scaler_is_warned_about():
    held = {"labels": ["a"], "debugHold": {"onFailure": True}}
    event = {"name": "ev", "type": "event", "labelSets": [held, {"labels": ["b"], "debugHold": {"onFailure": False}}]}
    assert [(w.path, w.message) for w in entry_warnings(event)] == [
        (
            "labelSets.0.debugHold",
            'Event scaler "ev" label set [0] provisions machines the console does not hold: debugHold has no effect',
        )
    ]
    container = {"name": "c", "type": "container", "labelSets": [held | {"image": "i"}]}
    assert entry_warnings(container) == []


def test_the_real_agent_on_a_bare_metal_host_is_warned_about_its_firewall_rule():
    entry = {
        "name": "metal",
        "type": "bare-metal",
        "labelSets": [
            {"labels": ["a"], "binaryPath": "/usr/local/bin/kici-agent", "kiciAgent": {"orchestratorUrl": "ws://o/ws"}},
            {"labels": ["b"], "binaryPath": "/opt/kici/kici-agent"},
        ],
    }
    (warning,) = entry_warnings(entry)
    assert warning.path == "labelSets.0.kiciAgent" and "iptables OUTPUT rule" in warning.message
