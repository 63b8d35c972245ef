"""A label set's ``kiciAgent`` in scalers.yaml: accepted when right, each mistake named with its file,
line and field."""

from __future__ import annotations

import textwrap

import pytest

from scalers.config.loader import ConfigInvalid, parse_scalers_config_text

GOOD = """\
version: 1
scalers:
  - name: real
    type: container
    maxAgents: 2
    labelSets:
      - labels: [real-linux]
        image: kici-real-agent:test
        kiciAgent:
          orchestratorUrl: ws://172.30.0.1:8480/ws
          adminTokenRef: main-orchestrator
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigInvalid) as info:
        parse_scalers_config_text(textwrap.dedent(text), "scalers.yaml")
    return [str(problem) for problem in info.value.problems]


def test_it_accepts_a_label_set_running_the_real_agent():
    config = parse_scalers_config_text(GOOD, "scalers.yaml")
    kici = config.scalers[0].label_sets[0].kici_agent
    assert (kici.orchestrator_url, kici.admin_token_ref, kici.admin_url) == (
        "ws://172.30.0.1:8480/ws",
        "main-orchestrator",
        None,
    )
    raw = config.scalers[0].to_raw()["labelSets"][0]["kiciAgent"]
    assert raw == {"orchestratorUrl": "ws://172.30.0.1:8480/ws", "adminTokenRef": "main-orchestrator"}


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://172.30.0.1:8480/ws", "WebSocket URL"),
        ("ws://172.30.0.1:8480", "ending in /ws"),
        ("ws://user:pw@172.30.0.1:8480/ws", "no credentials"),
        ("ws://172.30.0.1:99999/ws", "bad port"),
    ],
)
def test_it_names_the_file_line_and_field_of_a_bad_orchestrator_url(url, words):
    problems = problems_of(GOOD.replace("ws://172.30.0.1:8480/ws", url))
    assert len(problems) == 1, problems
    assert problems[0].startswith("scalers.yaml:10: scalers.0.labelSets.0.kiciAgent.orchestratorUrl: ")
    assert words in problems[0]


def test_it_refuses_a_missing_admin_token_ref_and_unknown_keys():
    text = GOOD.replace("          adminTokenRef: main-orchestrator\n", "          adminToken: kat_secret\n")
    problems = problems_of(text)
    assert any("scalers.0.labelSets.0.kiciAgent.adminTokenRef" in p for p in problems), problems
    assert any(p.startswith("scalers.yaml:11: scalers.0.labelSets.0.kiciAgent.adminToken:") for p in problems), problems


def test_it_refuses_env_beside_the_real_agent():
    problems = problems_of(GOOD + "        env:\n          KICI_RUNTIME_IMAGE: x\n")
    assert len(problems) == 1, problems
    assert problems[0].startswith("scalers.yaml:12: scalers.0.labelSets.0.env: ")
    assert "KICI_RUNTIME_IMAGE" in problems[0]


def test_it_refuses_the_real_agent_on_another_scaler_type_or_for_several_jobs():
    text = GOOD.replace("type: container", "type: event") + "        maxUses: 3\n"
    problems = problems_of(text)
    kici = [p for p in problems if p.startswith("scalers.yaml:9: scalers.0.labelSets.0.kiciAgent: ")]
    assert len(kici) == 1 and "event scaler; only container, bare-metal and firecracker" in kici[0], problems
    assert any(p.startswith("scalers.yaml:12: scalers.0.labelSets.0.maxUses: ") for p in problems), problems


@pytest.mark.django_db
def test_an_imported_label_set_names_its_orchestrator():
    from scalers.importing import apply_scalers_config
    from scalers.kici_orchestrator import kici_agent_target
    from scalers.models import LabelSet

    apply_scalers_config(parse_scalers_config_text(GOOD, "scalers.yaml"), "scalers.yaml")
    target = kici_agent_target(LabelSet.objects.get(scaler__name="real"))
    assert (target.ws_url, target.admin_url, target.admin_token_ref, target.port) == (
        "ws://172.30.0.1:8480/ws",
        "http://172.30.0.1:8480",
        "main-orchestrator",
        8480,
    )


FIRECRACKER = """\
version: 1
scalers:
  - name: real-vm
    type: firecracker
    maxAgents: 2
    firecrackerPath: /usr/local/bin/firecracker
    jailerPath: /usr/local/bin/jailer
    kernelPath: /var/lib/kici/vmlinux
    uid: 10000
    gid: 10000
    labelSets:
      - labels: [real-vm]
        rootfsPath: /var/lib/kici/rootfs-real.ext4
        kiciAgent:
          orchestratorUrl: ws://10.0.0.1:8480/ws
          adminTokenRef: main-orchestrator
"""


def test_it_accepts_the_real_agent_in_a_firecracker_label_set():
    config = parse_scalers_config_text(FIRECRACKER, "scalers.yaml")
    kici = config.scalers[0].label_sets[0].kici_agent
    assert (kici.orchestrator_url, kici.admin_token_ref) == ("ws://10.0.0.1:8480/ws", "main-orchestrator")
    raw = config.scalers[0].to_raw()["labelSets"][0]
    assert raw["kiciAgent"] == {"orchestratorUrl": "ws://10.0.0.1:8480/ws", "adminTokenRef": "main-orchestrator"}
    assert raw["rootfsPath"] == "/var/lib/kici/rootfs-real.ext4"


REF = "          adminTokenRef: main-orchestrator\n"


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("ws://10.0.0.1:8480/ws", "http://10.0.0.1:8480/ws", "15: scalers.0.labelSets.0.kiciAgent.orchestratorUrl",
         "WebSocket URL"),
        ("ws://10.0.0.1:8480/ws", "ws://10.0.0.1:8480/agents", "15: scalers.0.labelSets.0.kiciAgent.orchestratorUrl",
         "ending in /ws"),
        (REF, "          adminTokenRef: ''\n", "16: scalers.0.labelSets.0.kiciAgent.adminTokenRef", ""),
        (REF, REF + "        env:\n          KICI_ROLES: builder\n", "17: scalers.0.labelSets.0.env", "KICI_ROLES"),
        (REF, REF + "        maxUses: 2\n", "17: scalers.0.labelSets.0.maxUses", "exits once idle"),
        (REF, REF + "          adminUrl: ftp://10.0.0.1\n", "17: scalers.0.labelSets.0.kiciAgent.adminUrl",
         "http:// or https://"),
    ],
)  # fmt: skip
def test_it_names_the_line_and_field_of_a_bad_real_agent_value_on_a_firecracker_scaler(old, new, field, words):
    problems = problems_of(FIRECRACKER.replace(old, new))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"scalers.yaml:{field}: "), problems
    assert words in problems[0]


BARE_METAL = """\
version: 1
scalers:
  - name: real-host
    type: bare-metal
    maxAgents: 2
    labelSets:
      - labels: [real-host]
        binaryPath: /usr/local/bin/kici-agent
        kiciAgent:
          orchestratorUrl: ws://127.0.0.1:8480/ws
          adminTokenRef: main-orchestrator
"""


def test_it_accepts_the_real_agent_as_a_bare_metal_process():
    config = parse_scalers_config_text(BARE_METAL, "scalers.yaml")
    raw = config.scalers[0].to_raw()["labelSets"][0]
    assert raw["kiciAgent"] == {"orchestratorUrl": "ws://127.0.0.1:8480/ws", "adminTokenRef": "main-orchestrator"}
    assert raw["binaryPath"] == "/usr/local/bin/kici-agent"


BM_REF = "          adminTokenRef: main-orchestrator\n"


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("ws://127.0.0.1:8480/ws", "wss://127.0.0.1:8480/", "10: scalers.0.labelSets.0.kiciAgent.orchestratorUrl",
         "ending in /ws"),
        (BM_REF, BM_REF + "        env:\n          KICI_PORT: '0'\n", "12: scalers.0.labelSets.0.env", "KICI_PORT"),
        (BM_REF, BM_REF + "        maxUses: 2\n", "12: scalers.0.labelSets.0.maxUses", "exits once idle"),
        ("        binaryPath: /usr/local/bin/kici-agent\n", "        image: kici-real-agent:test\n",
         "7: scalers.0.labelSets.0.binaryPath", "without binaryPath"),
    ],
)  # fmt: skip
def test_it_names_the_line_and_field_of_a_bad_real_agent_value_on_a_bare_metal_scaler(old, new, field, words):
    problems = problems_of(BARE_METAL.replace(old, new))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"scalers.yaml:{field}: "), problems
    assert words in problems[0]
