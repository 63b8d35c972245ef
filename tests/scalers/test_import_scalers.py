"""``manage.py import_scalers`` and ``scalers.importing.apply_scalers_config``."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from django.core.management import call_command

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.config.loader import ConfigInvalid, parse_scalers_config_text
from scalers.importing import apply_scalers_config
from scalers.models import ConfigState, LabelSet, MachinePool, Scaler

pytestmark = pytest.mark.django_db

EXAMPLES = str(Path(__file__).resolve().parent / "config" / "examples")

BASE = """\
version: 1
globalMaxAgents: 12
defaults:
  resources: {cpus: 1, memory: 1g}
globalResourceCap: {maxCpu: 16, maxMemory: 32g}
machinePools:
  - name: shared
    cap: {maxCpu: 8, maxMemory: 16g}
scalers:
  - name: alpha
    type: container
    maxAgents: 3
    machinePool: shared
    resourceCap: {maxCpu: 4, maxMemory: 8g}
    warmPool: {enabled: true, size: 1}
    roles: [builder]
    labelSets:
      - labels: [linux, alpha]
        image: a:1
        networkPolicy:
          hostAccess: ['*:4000']
      - labels: [linux, alpha, big]
        image: a:2
  - name: beta
    type: bare-metal
    maxAgents: 1
    mandatoryLabels: [GPU]
    labelSets:
      - labels: [linux, gpu]
        binaryPath: /opt/agent
"""


def write(tmp_path, text, name="scalers.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("import_scalers", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()


def snapshot():
    """Everything the import writes, as comparable plain data."""
    return {
        "state": list(ConfigState.objects.values()),
        "pools": list(MachinePool.objects.order_by("pk").values()),
        "scalers": list(Scaler.objects.order_by("pk").values()),
        "label_sets": list(LabelSet.objects.order_by("pk").values()),
    }


def apply_text(text, source="test.yaml"):
    return apply_scalers_config(parse_scalers_config_text(textwrap.dedent(text), source), source)


# ----------------------------------------------------------------------------- --check


@pytest.mark.parametrize(
    "name, counts",
    [
        ("01-container-basic.yaml", "1 scalers, 2 label sets"),
        ("02-container-podman-remote.yaml", "2 scalers, 2 label sets"),
        ("03-bare-metal-gpu.yaml", "1 scalers, 2 label sets"),
        ("04-firecracker.yaml", "1 scalers, 2 label sets"),
        ("05-mixed-pools-warm.yaml", "3 scalers, 4 label sets"),
        ("07-event-and-platforms.yaml", "3 scalers, 3 label sets"),
    ],
)
def test_check_accepts_every_valid_example_and_writes_nothing(name, counts):
    code, out, err = run(f"{EXAMPLES}/{name}", "--check")
    assert (code, out.strip(), err) == (0, f"OK: {counts}", "")
    assert not Scaler.objects.exists()
    assert not ConfigState.objects.exists()


@pytest.mark.parametrize(
    "name, line_prefix",
    [
        ("invalid-01-container-missing-image.yaml", ":7: scalers.0.labelSets.0.image: Container scaler"),
        ("invalid-02-unknown-machine-pool.yaml", ':10: scalers.0.machinePool: Scaler "bare-metal-builders"'),
        ("invalid-03-gate-label-missing.yaml", ':10: scalers.0.labelSets.1.labels: Scaler "leaky-gate" gate label'),
        (
            "invalid-04-hostaccess-hostname.yaml",
            ":11: scalers.0.labelSets.0.networkPolicy.hostAccess.0: hostAccess entry",
        ),
        ("invalid-05-event-no-targets.yaml", ':3: scalers.0.provisioningTargets: Event scaler "cloud"'),
    ],
)
def test_check_rejects_every_invalid_example_naming_the_field(name, line_prefix):
    path = f"{EXAMPLES}/{name}"
    code, out, err = run(path, "--check")
    assert code == 1
    assert out == ""
    assert err.splitlines()[0].startswith(path + line_prefix)


def test_every_problem_gets_its_own_line(tmp_path):
    path = write(
        tmp_path,
        """\
        version: 1
        scalers:
          - name: a
            type: docker
            maxAgents: 0
            labelSets: [{labels: [x], image: i}]
        """,
    )
    code, _, err = run(path, "--check")
    assert code == 1
    assert err.splitlines() == [
        f"{path}:4: scalers.0.type: Input should be 'container', 'bare-metal', 'firecracker' or 'event', "
        'received "docker"',
        f"{path}:5: scalers.0.maxAgents: Input should be greater than 0, received 0",
    ]


def test_a_yaml_syntax_error_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, "version: 1\nscalers:\n  - name: [oops\n")
    code, _, err = run(path)
    assert code == 1
    assert err.startswith(f"{path}:")
    assert "YAML syntax error" in err
    assert not Scaler.objects.exists()


def test_check_uses_the_drop_in_directory(tmp_path):
    path = write(tmp_path, BASE)
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "x.yaml").write_text("scalers: [{name: gamma, type: container, maxAgents: 1, labelSets: [{labels: [g]}]}]\n")
    code, _, err = run(path, "--dir", str(d), "--check")
    assert code == 1
    assert err.strip() == (
        f"{d / 'x.yaml'}:1: scalers.0.labelSets.0.image: "
        "Container scaler \"gamma\" label set [0] requires an 'image' field"
    )


# ----------------------------------------------------------------------------- apply


def test_apply_writes_scalers_label_sets_pools_and_globals(tmp_path):
    path = write(tmp_path, BASE)
    code, out, err = run(path)
    assert (code, err) == (0, "")
    assert "created alpha, beta" in out

    state = ConfigState.objects.get(pk=1)
    assert (state.global_max_agents, state.global_max_cpu, state.global_max_memory_bytes) == (12, 16, 32 * 1024**3)
    assert state.defaults == {"requests": {"cpus": 1, "memory": "1g"}, "limits": {"cpus": 1, "memory": "1g"}}
    assert state.firecracker == {}
    assert state.source == path
    assert state.imported_at is not None
    assert parse_scalers_config_text(__import__("yaml").safe_dump(state.raw)).to_raw() == state.raw

    pool = MachinePool.objects.get(name="shared")
    assert (pool.max_cpu, pool.max_memory_bytes) == (8, 16 * 1024**3)

    alpha = Scaler.objects.get(name="alpha")
    assert (alpha.type, alpha.max_agents, alpha.max_concurrent_spawns) == ("container", 3, 8)
    assert (alpha.max_cpu, alpha.max_memory_bytes, alpha.machine_pool) == (4, 8 * 1024**3, pool)
    assert (alpha.warm_pool_enabled, alpha.warm_pool_size, alpha.warm_pool_idle_timeout_seconds) == (True, 1, 300)
    assert alpha.roles == ["builder"]
    assert alpha.retiring is False
    assert alpha.config["labelSets"][0]["image"] == "a:1"
    assert alpha.config["vcpuCount"] == 2  # defaults materialised in the stored entry

    sets = list(alpha.label_sets.order_by("index"))
    assert [(s.index, s.labels, s.normalized, s.retired) for s in sets] == [
        (0, ["linux", "alpha"], "alpha,linux", False),
        (1, ["linux", "alpha", "big"], "alpha,big,linux", False),
    ]
    assert sets[0].host_access == ["*:4000"]
    assert sets[1].host_access is None
    assert sets[1].config["image"] == "a:2"

    beta = Scaler.objects.get(name="beta")
    assert beta.mandatory_labels == ["gpu"]
    assert beta.roles is None
    assert beta.machine_pool is None


def test_reapplying_the_same_file_changes_nothing(tmp_path):
    first = apply_text(BASE)
    assert first.created == ["alpha", "beta"]
    before = snapshot()
    again = apply_text(BASE)
    assert (again.created, again.changed, again.retiring, again.unchanged) == ([], [], [], ["alpha", "beta"])
    after = snapshot()
    for key in ("pools", "scalers", "label_sets"):
        assert before[key] == after[key]


def test_changes_are_applied_and_reported():
    apply_text(BASE)
    summary = apply_text(BASE.replace("maxAgents: 3", "maxAgents: 7"))
    assert summary.changed == ["alpha"]
    assert summary.unchanged == ["beta"]
    assert Scaler.objects.get(name="alpha").max_agents == 7
    assert Scaler.objects.get(name="alpha").config["maxAgents"] == 7


def config_events():
    return {
        e.payload["value"]: e
        for e in ScalerEvent.objects.filter(type__in=[EventType.CONFIG_CHANGED, EventType.CONFIG_OVERRIDE_KEPT])
    }


def test_every_value_an_import_changes_is_recorded_with_old_new_and_the_source():
    apply_text(BASE)
    apply_text(BASE)
    assert config_events() == {}, "a first import changes nothing in force, a same-file import nothing at all"

    edited = (
        BASE.replace("maxAgents: 3", "maxAgents: 7")
        .replace("globalMaxAgents: 12", "globalMaxAgents: 13")
        .replace("'*:4000'", "'*:4001'")
        .replace("image: a:2", "image: a:3")
        .replace("  - name: beta", "      - labels: [linux, alpha, new]\n        image: a:4\n  - name: beta")
    )
    summary = apply_text(edited, source="edited.yaml")
    events = config_events()
    expected = {
        "globalMaxAgents": (12, 13, ""),
        "scalers.alpha.maxAgents": (3, 7, "alpha"),
        "scalers.alpha.labelSets": (
            ["alpha,linux", "alpha,big,linux"],
            ["alpha,linux", "alpha,big,linux", "alpha,linux,new"],
            "alpha",
        ),
        "scalers.alpha.labelSets[alpha,linux].networkPolicy.hostAccess": (["*:4000"], ["*:4001"], "alpha"),
        "scalers.alpha.labelSets[alpha,big,linux].image": ("a:2", "a:3", "alpha"),
    }
    assert sorted(events) == sorted(expected)
    for value, (old, new, scaler) in expected.items():
        event = events[value]
        assert event.type == EventType.CONFIG_CHANGED and event.agent is None and event.scaler_name == scaler
        assert event.payload == {"value": value, "old": old, "new": new, "source": "edited.yaml"}
        assert value in event.detail and "edited.yaml" in event.detail
    assert len(summary.changes) == len(expected)
    assert "changed scalers.alpha.maxAgents: 3 → 7 (import of edited.yaml)" in str(summary)

    apply_text(edited.replace("  - name: beta\n    type: bare-metal", "  - name: gamma\n    type: bare-metal"))
    scalers = config_events()["scalers"]
    assert (scalers.payload["old"], scalers.payload["new"]) == (["alpha", "beta"], ["alpha", "gamma"])


def test_an_import_keeps_a_host_access_set_in_the_console_and_records_the_files_change():
    apply_text(BASE)
    label_set = LabelSet.objects.get(scaler__name="alpha", index=0)
    LabelSet.objects.filter(pk=label_set.pk).update(
        host_access=["*:9000"], host_access_override=True, host_access_override_operation=41
    )
    summary = apply_text(BASE)
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.file_host_access == ["*:4000"]
    assert label_set.host_access_differs and config_events() == {}
    assert summary.overrides == [
        'scalers.alpha.labelSets[alpha,linux].networkPolicy.hostAccess = ["*:9000"] (file: ["*:4000"])'
    ]

    apply_text(BASE.replace("'*:4000'", "'*:4001'"), source="edited.yaml")
    label_set.refresh_from_db()
    assert label_set.host_access == ["*:9000"] and label_set.file_host_access == ["*:4001"]
    (event,) = config_events().values()
    assert event.type == EventType.CONFIG_OVERRIDE_KEPT
    assert event.payload == {
        "value": "scalers.alpha.labelSets[alpha,linux].networkPolicy.hostAccess",
        "old": ["*:4000"],
        "new": ["*:4001"],
        "source": "edited.yaml",
        "kept": ["*:9000"],
        "operation": 41,
    }


def test_a_scaler_missing_from_the_file_is_marked_retiring_never_deleted():
    apply_text(BASE)
    without_beta = BASE[: BASE.index("  - name: beta")]
    summary = apply_text(without_beta)
    assert summary.retiring == ["beta"]
    beta = Scaler.objects.get(name="beta")
    assert beta.retiring is True
    assert beta.retiring_since is not None
    assert beta.label_sets.count() == 1

    # Still missing: stays retiring, reported once.
    assert apply_text(without_beta).retiring == []

    back = apply_text(BASE)
    assert back.resurrected == ["beta"]
    beta.refresh_from_db()
    assert (beta.retiring, beta.retiring_since) == (False, None)


def test_label_sets_keep_their_rows_when_reordered_and_removed_ones_retire():
    apply_text(BASE)
    alpha = Scaler.objects.get(name="alpha")
    pk_by_key = {ls.normalized: ls.pk for ls in alpha.label_sets.all()}
    reordered = BASE.replace(
        """      - labels: [linux, alpha]
        image: a:1
        networkPolicy:
          hostAccess: ['*:4000']
      - labels: [linux, alpha, big]
        image: a:2
""",
        """      - labels: [linux, alpha, huge]
        image: a:3
      - labels: [linux, alpha, big]
        image: a:2
""",
    )
    summary = apply_text(reordered)
    assert summary.changed == ["alpha"]
    assert summary.retired_label_sets == 1
    rows = {ls.normalized: ls for ls in LabelSet.objects.filter(scaler=alpha)}
    assert rows["alpha,big,linux"].pk == pk_by_key["alpha,big,linux"]
    assert rows["alpha,big,linux"].index == 1
    assert rows["alpha,huge,linux"].index == 0
    assert rows["alpha,linux"].retired is True
    assert rows["alpha,linux"].pk == pk_by_key["alpha,linux"]

    # Bringing the removed set back reuses its row.
    apply_text(BASE)
    restored = LabelSet.objects.get(scaler=alpha, normalized="alpha,linux")
    assert (restored.pk, restored.retired, restored.index) == (pk_by_key["alpha,linux"], False, 0)
    assert LabelSet.objects.get(scaler=alpha, normalized="alpha,huge,linux").retired is True


def test_unreferenced_pools_leaving_the_file_are_removed():
    apply_text(BASE)
    no_pool = BASE.replace("    machinePool: shared\n", "").replace(
        "machinePools:\n  - name: shared\n    cap: {maxCpu: 8, maxMemory: 16g}\n", ""
    )
    summary = apply_text(no_pool)
    assert summary.pools_removed == ["shared"]
    assert not MachinePool.objects.exists()
    assert Scaler.objects.get(name="alpha").machine_pool is None


def test_a_pool_still_used_by_a_retiring_scaler_is_kept():
    apply_text(BASE)
    text = BASE.replace("machinePools:\n  - name: shared\n    cap: {maxCpu: 8, maxMemory: 16g}\n", "")
    text = text[: text.index("  - name: alpha")] + text[text.index("  - name: beta") :]
    summary = apply_text(text)
    assert summary.retiring == ["alpha"]
    assert summary.pools_kept == ["shared"]
    assert Scaler.objects.get(name="alpha").machine_pool.name == "shared"


def test_type_change_with_live_agents_is_refused_and_changes_nothing():
    apply_text(BASE)
    beta = Scaler.objects.get(name="beta")
    Agent.objects.create(agent_id="scaler-bare-metal-0000abcd", scaler=beta, state=AgentState.RUNNING)
    before = snapshot()
    changed = BASE.replace("type: bare-metal", "type: container").replace("binaryPath: /opt/agent", "image: b:1")
    with pytest.raises(ConfigInvalid) as info:
        apply_text(changed.replace("maxAgents: 3", "maxAgents: 9"))
    (problem,) = info.value.problems
    assert problem.path == "scalers.1.type"
    assert "cannot change from bare-metal to container" in problem.message
    assert snapshot() == before


def test_type_change_without_live_agents_is_applied():
    apply_text(BASE)
    beta = Scaler.objects.get(name="beta")
    Agent.objects.create(agent_id="scaler-bare-metal-0000dead", scaler=beta, state=AgentState.DESTROYED)
    changed = BASE.replace("type: bare-metal", "type: container").replace("binaryPath: /opt/agent", "image: b:1")
    assert apply_text(changed).changed == ["beta"]
    assert Scaler.objects.get(name="beta").type == "container"


def test_invalid_input_changes_nothing(tmp_path):
    good = write(tmp_path, BASE)
    assert run(good)[0] == 0
    before = snapshot()
    bad = write(
        tmp_path,
        BASE.replace("maxAgents: 3", "maxAgents: 30")
        .replace("image: a:2", "image: a:2\n        imagePullPolicy: Sometimes")
        .replace("binaryPath: /opt/agent", "env: {A: b}"),
        name="bad.yaml",
    )
    code, out, err = run(bad)
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "scalers.0.labelSets.1.imagePullPolicy",
        "scalers.1.labelSets.0.binaryPath",
    ]
    assert snapshot() == before


def test_a_failure_midway_rolls_everything_back(monkeypatch):
    apply_text(BASE)
    before = snapshot()
    import scalers.importing as importing

    real = importing._sync_label_sets
    calls = []

    def failing(scaler, entries, summary):
        calls.append(scaler.name)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real(scaler, entries, summary)

    monkeypatch.setattr(importing, "_sync_label_sets", failing)
    with pytest.raises(RuntimeError):
        apply_text(BASE.replace("maxAgents: 3", "maxAgents: 5").replace("globalMaxAgents: 12", "globalMaxAgents: 13"))
    assert calls == ["alpha", "beta"]
    assert snapshot() == before


def test_import_of_the_examples_round_trips_through_the_database():
    for name in ("04-firecracker.yaml", "05-mixed-pools-warm.yaml", "07-event-and-platforms.yaml"):
        code, _, err = run(f"{EXAMPLES}/{name}")
        assert (code, err) == (0, "")
    # The last import retired the scalers of the earlier files.
    assert set(Scaler.objects.filter(retiring=False).values_list("name", flat=True)) == {
        "cloud-arm",
        "macos-bare-metal",
        "windows-bare-metal",
    }
    assert Scaler.objects.get(name="fc-linux").retiring is True
    state = ConfigState.objects.get(pk=1)
    assert state.firecracker == {}
    fc = Scaler.objects.get(name="fc-linux")
    assert fc.config["firecrackerPath"] == "/usr/local/bin/firecracker"
