"""Label logic: canonical forms, enrichment, gates, routing, overlaps."""

from __future__ import annotations

import pytest

from scalers.config.schema import Platform, validate_document
from scalers.labels import (
    BackendMatch,
    LabelSetOverlap,
    RoutingEntry,
    agent_labels,
    build_routing_entries,
    canonicalize_labels,
    enrich_label_set,
    find_backend_for_labels,
    find_label_set_overlaps,
    label_set_gate,
    normalize_label_set,
    os_arch_labels,
    platform_to_taints,
    role_labels,
    roles_allow,
    unreachable_gate_labels,
)


def scaler(name, sets, type="container", **extra):
    entry = {"name": name, "type": type, "maxAgents": 5, "labelSets": [], **extra}
    for labels in sets:
        ls = {"labels": labels}
        if type == "container":
            ls["image"] = "img"
        elif type == "bare-metal":
            ls["binaryPath"] = "/agent"
        entry["labelSets"].append(ls)
    if type == "event":
        entry.setdefault("provisioningTargets", ["org/infra"])
    return entry


def entries(*scalers, os_name="linux", arch="x64", retiring=()):
    config, issues = validate_document({"version": 1, "scalers": list(scalers)})
    assert not issues, [str(i) for i in issues]
    return build_routing_entries(config.scalers, retiring=retiring, os_name=os_name, arch=arch)


def match(job, routing, exclude=()):
    found = find_backend_for_labels(job, routing, exclude)
    return None if found is None else (found.scaler_name, found.label_set_index)


@pytest.fixture
def fixture_f():
    return entries(
        scaler("docker-linux", [["linux", "docker"], ["linux", "node20"]]),
        scaler("bare-metal-gpu", [["linux", "gpu", "cuda"]], type="bare-metal"),
    )


# ----------------------------------------------------------------------------- canonical forms


@pytest.mark.parametrize(
    "labels, key",
    [
        (["docker", "linux"], "docker,linux"),
        (["linux", "docker"], "docker,linux"),
        (["Docker", "linux", "linux"], "docker,linux"),
        ([], ""),
    ],
)
def test_lbl01_normalize_label_set(labels, key):
    assert normalize_label_set(labels) == key


def test_canonicalize_keeps_order_and_duplicates():
    assert canonicalize_labels([" Linux ", "GPU", "gpu"]) == ["linux", "gpu", "gpu"]


# ----------------------------------------------------------------------------- matching (fixture F)


@pytest.mark.parametrize(
    "job, exclude, expected",
    [
        (["linux", "docker"], (), ("docker-linux", 0)),
        (["linux", "node20"], (), ("docker-linux", 1)),
        (["linux", "gpu", "cuda"], (), ("bare-metal-gpu", 0)),
        (["linux"], (), ("docker-linux", 0)),  # smallest, first wins a tie
        (["Linux", "Docker"], (), ("docker-linux", 0)),
        (["linux"], ["gpu"], ("docker-linux", 0)),
        (["linux"], [], ("docker-linux", 0)),
        (["linux", "windows"], (), None),
        (["linux", "docker", "node20"], (), None),
    ],
)
def test_fixture_f_routing(fixture_f, job, exclude, expected):
    assert match(job, fixture_f, exclude) == expected


def test_lbl09_exclude_skips_a_scaler():
    routing = entries(scaler("gpu-scaler", [["linux", "gpu"]]), scaler("docker-scaler", [["linux", "docker"]]))
    assert match(["linux"], routing) == ("gpu-scaler", 0)
    assert match(["linux"], routing, ["gpu"]) == ("docker-scaler", 0)


# ----------------------------------------------------------------------------- gates


def test_lbl11_gates_pick_the_gated_pool_only_when_asked():
    routing = entries(
        scaler("gpu-pool", [["linux", "gpu"]], mandatoryLabels=["gpu"]),
        scaler("generic", [["linux", "docker"]]),
    )
    assert match(["linux", "gpu"], routing) == ("gpu-pool", 0)
    assert match(["linux"], routing) == ("generic", 0)


def test_lbl12_only_a_gated_pool_means_no_match():
    routing = entries(scaler("gpu-pool", [["linux", "gpu"]], mandatoryLabels=["gpu"]))
    assert match(["linux"], routing) is None


def test_lbl13_gates_are_case_insensitive():
    routing = entries(scaler("g", [["linux", "GPU"]], mandatoryLabels=["GPU"]))
    assert match(["linux", "gpu"], routing) == ("g", 0)


def test_lbl14_every_gate_label_is_required():
    routing = entries(scaler("g", [["linux", "gpu", "cuda"]], mandatoryLabels=["gpu", "cuda"]))
    assert match(["linux", "gpu"], routing) is None
    assert match(["linux", "gpu", "cuda"], routing) == ("g", 0)


def test_lbl16_the_narrowest_gated_set_wins():
    routing = entries(
        scaler("gpu-wide", [["linux", "gpu", "cuda", "extra"]], mandatoryLabels=["gpu"]),
        scaler("gpu-narrow", [["linux", "gpu"]], mandatoryLabels=["gpu"]),
    )
    assert match(["linux", "gpu"], routing) == ("gpu-narrow", 0)


@pytest.mark.parametrize(
    "job, exclude, expected",
    [
        (["linux"], (), None),
        (["linux", "gpu"], (), ("g", 0)),
        (["linux", "gpu"], ["spot"], None),
        (["linux", "gpu", "spot"], (), ("g", 0)),
    ],
)
def test_lbl17_gate_with_exclude(job, exclude, expected):
    routing = entries(scaler("g", [["linux", "gpu", "spot"]], mandatoryLabels=["gpu"]))
    assert match(job, routing, exclude) == expected


def test_lbl18_a_misaligned_gate_array_makes_the_scaler_unroutable():
    good = RoutingEntry("ok", "container", (frozenset({"linux", "docker"}),), ((),))
    misaligned = RoutingEntry("bad", "container", (frozenset({"linux"}), frozenset({"linux", "x"})), ((),))
    assert match(["linux"], [misaligned, good]) == ("ok", 0)
    assert match([], [misaligned, good]) == ("ok", 0)
    assert match(["linux"], [misaligned]) is None


def test_empty_runs_on_takes_the_first_ungated_set():
    routing = entries(
        scaler("gated", [["linux", "gpu"]], mandatoryLabels=["gpu"]),
        scaler("mac", [["macos", "xcode"]]),
        scaler("plain", [["linux", "a"], ["linux", "b"]]),
    )
    assert match([], routing) == ("plain", 0)
    only_gated = entries(scaler("gated", [["linux", "gpu"]], mandatoryLabels=["gpu"]))
    assert match([], only_gated) is None


# ----------------------------------------------------------------------------- enrichment


@pytest.mark.parametrize(
    "job, expected",
    [
        (["linux", "kici:agent:container"], ("c1", 0)),
        (["kici:scaler:c1"], ("c1", 0)),
        (["kici:role:builder"], ("c1", 0)),
        (["kici:role:init-runner"], ("c1", 0)),
        (["kici:agent:firecracker"], None),
        (["kici:os:linux"], ("c1", 0)),
        (["kici:arch:amd64"], ("c1", 0)),
        (["kici:os:macos"], None),
    ],
)
def test_lbl19_enriched_labels_route(job, expected):
    routing = entries(scaler("c1", [["linux", "docker"]]))
    assert match(job, routing) == expected


def test_roles_limit_the_injected_role_labels():
    routing = entries(scaler("b", [["linux"]], roles=["builder"]), scaler("none", [["x"]], roles=[]))
    assert match(["kici:role:builder"], routing) == ("b", 0)
    assert match(["kici:role:init-runner"], routing) is None


def test_lbl21_declared_platform_gates_and_labels():
    routing = entries(scaler("mac", [["xcode"]], type="bare-metal", platform={"os": "macos", "arch": "arm64"}))
    assert match(["xcode"], routing) is None
    assert match(["xcode", "macos", "arm64"], routing) == ("mac", 0)
    assert match(["xcode", "macos"], routing) is None
    assert match(["xcode", "macos", "arm64", "kici:os:darwin", "kici:arch:arm64"], routing) == ("mac", 0)


@pytest.mark.parametrize("type_", ["container", "bare-metal"])
def test_lbl22_plain_taints_in_declared_labels_gate_their_set(type_):
    routing = entries(scaler("legacy", [["linux", "gpu"], ["macos", "xcode"]], type=type_))
    assert match(["gpu"], routing) == ("legacy", 0)
    assert match(["xcode"], routing) is None
    assert match(["xcode", "macos"], routing) == ("legacy", 1)


def test_bare_metal_without_platform_takes_the_host_os_and_arch():
    (entry,) = entries(scaler("bm", [["x"]], type="bare-metal"), os_name="macos", arch="arm64")
    assert {"kici:os:macos", "kici:os:darwin", "kici:arch:arm64"} <= entry.label_sets[0]
    (entry,) = entries(scaler("c", [["x"]]), os_name="macos", arch="arm64")
    assert {"kici:os:linux", "kici:arch:arm64"} <= entry.label_sets[0]
    assert "kici:os:macos" not in entry.label_sets[0]


def test_retiring_scalers_are_not_routed():
    routing = entries(scaler("old", [["linux", "a"]]), scaler("new", [["linux", "b"]]), retiring=["old"])
    assert [e.scaler_name for e in routing] == ["new"]
    assert match(["a"], routing) is None


def test_the_smallest_enriched_set_wins_across_roles():
    # roles [] injects no role labels, so its enriched set is smaller than the default's.
    routing = entries(scaler("all-roles", [["linux", "a"]]), scaler("exec-only", [["linux", "b"]], roles=[]))
    assert match(["linux"], routing) == ("exec-only", 0)


@pytest.mark.parametrize(
    "os_name, arch, expected",
    [
        ("linux", "x64", ["kici:os:linux", "kici:arch:x64", "kici:arch:amd64"]),
        ("macos", "arm64", ["kici:os:macos", "kici:os:darwin", "kici:arch:arm64"]),
        ("darwin", "arm64", ["kici:os:macos", "kici:os:darwin", "kici:arch:arm64"]),
        ("windows", "x64", ["kici:os:windows", "kici:os:win32", "kici:arch:x64", "kici:arch:amd64"]),
        ("win32", "x64", ["kici:os:windows", "kici:os:win32", "kici:arch:x64", "kici:arch:amd64"]),
    ],
)
def test_os_arch_label_shapes(os_name, arch, expected):
    assert os_arch_labels(os_name, arch) == expected


@pytest.mark.parametrize(
    "os_name, arch, taints",
    [
        ("linux", "x64", []),
        ("linux", "arm64", ["arm64"]),
        ("macos", "arm64", ["macos", "arm64"]),
        ("windows", "x64", ["windows"]),
    ],
)
def test_platform_taints(os_name, arch, taints):
    assert platform_to_taints(Platform(os=os_name, arch=arch)) == taints


def test_gate_combines_mandatory_platform_and_plain_taints():
    assert label_set_gate(["linux", "Arm", "gpu"], ["GPU"], Platform(os="windows", arch="x64")) == [
        "gpu",
        "windows",
        "arm",
    ]
    assert unreachable_gate_labels(["linux"], ["gpu"], Platform(os="macos", arch="arm64")) == ["gpu"]
    assert unreachable_gate_labels(["xcode"], [], Platform(os="macos", arch="arm64")) == []


def test_enrich_label_set_order():
    assert enrich_label_set(
        ["linux", "docker"], scaler_name="C1", scaler_type="container", os_name="linux", arch="x64"
    ) == [
        "linux",
        "docker",
        "kici:os:linux",
        "kici:arch:x64",
        "kici:arch:amd64",
        "kici:agent:container",
        "kici:scaler:c1",
        "kici:role:builder",
        "kici:role:init-runner",
    ]


def test_agent_labels_match_the_example():
    labels = agent_labels(["linux", "docker"], scaler_name="test-container", scaler_type="container")
    assert ",".join(labels) == (
        "linux,docker,kici:agent:container,kici:scaler:test-container,kici:role:builder,kici:role:init-runner"
    )
    assert agent_labels(
        ["x"], scaler_name="m", scaler_type="bare-metal", roles=[], platform=Platform(os="macos", arch="arm64")
    ) == [
        "x",
        "kici:agent:bare-metal",
        "kici:scaler:m",
        "macos",
        "arm64",
    ]


# ----------------------------------------------------------------------------- roles


@pytest.mark.parametrize(
    "roles, build, init, labels",
    [
        (None, True, True, ["kici:role:builder", "kici:role:init-runner"]),
        (["all"], True, True, ["kici:role:builder", "kici:role:init-runner"]),
        (["builder", "all"], True, True, ["kici:role:builder", "kici:role:init-runner"]),
        ([], False, False, []),
        (["builder"], True, False, ["kici:role:builder"]),
        (["init-runner"], False, True, ["kici:role:init-runner"]),
        (["init-runner", "builder"], True, True, ["kici:role:builder", "kici:role:init-runner"]),
    ],
)
def test_roles_table(roles, build, init, labels):
    assert roles_allow(roles, "execution") is True
    assert roles_allow(roles, "build") is build
    assert roles_allow(roles, "init") is init
    assert role_labels(roles) == labels


def test_roles_allow_refuses_an_unknown_job_kind():
    with pytest.raises(ValueError, match="unknown job kind"):
        roles_allow(None, "deploy")


# ----------------------------------------------------------------------------- overlaps


def test_lbl23_overlap_between_two_scalers():
    overlaps = find_label_set_overlaps([("docker-1", [["linux", "docker"]]), ("docker-2", [["docker", "linux"]])])
    assert overlaps == [LabelSetOverlap("docker,linux", "docker-1", "docker-2")]
    assert overlaps[0].message == 'Label set [docker,linux] overlaps between scalers "docker-1" and "docker-2"'


def test_lbl24_the_same_set_twice_in_one_scaler_is_not_an_overlap():
    assert find_label_set_overlaps([("s", [["linux", "docker"], ["docker", "linux"]])]) == []


def test_overlaps_accept_config_entries():
    config, _ = validate_document({"version": 1, "scalers": [scaler("a", [["x", "y"]]), scaler("b", [["z"]])]})
    assert find_label_set_overlaps(config.scalers) == []


def test_backend_match_is_a_value():
    assert BackendMatch("a", 0) == BackendMatch("a", 0)
