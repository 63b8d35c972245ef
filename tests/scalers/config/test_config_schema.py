"""The scalers.yaml schema, on already-parsed documents."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pydantic import ValidationError

from scalers.backends.firecracker.settings import FirecrackerSettings
from scalers.config.schema import ResourceRequest, ScalerEntry, ScalersConfig, parse_resource_request, validate_document


def container(**extra):
    """A container entry with ``extra`` merged in."""
    entry = {"name": "c", "type": "container", "maxAgents": 5, "labelSets": [{"labels": ["linux"], "image": "a:1"}]}
    entry.update(extra)
    return entry


def doc(*scalers, **top):
    return {"version": 1, "scalers": list(scalers), **top}


def valid(document) -> ScalersConfig:
    config, issues = validate_document(document)
    assert issues == [], [str(i) for i in issues]
    assert config is not None
    return config


def invalid(document) -> list[tuple[str, str]]:
    config, issues = validate_document(document)
    assert config is None
    assert issues, "expected at least one issue"
    return [(i.dotted_path, i.message) for i in issues]


def with_label_set(**fields):
    return container(labelSets=[{"labels": ["linux"], "image": "a:1", **fields}])


# ----------------------------------------------------------------------------- defaults


def test_cfg01_defaults_materialise_on_every_entry():
    config = valid(doc(container()))
    assert config.global_max_agents == 50
    s = config.scalers[0]
    ls = s.label_sets[0]
    assert ls.container_socket is False
    assert ls.image_pull_policy == "IfNotPresent"
    assert s.runtime == "auto"
    assert s.network_isolation is True
    assert s.max_concurrent_spawns == 8
    assert s.mandatory_labels == []
    assert s.roles is None
    assert s.enforce_cgroups is False
    assert s.require_sudo is False
    assert s.claim_ttl_seconds == 300
    assert s.agent_token_ttl_seconds == 600
    assert s.chroot_base_dir == "/srv/jailer"
    assert s.vcpu_count == 2
    assert s.mem_size_mib == 512
    assert s.warm_pool is None
    assert config.machine_pools == []
    assert config.firecracker is None
    assert config.firecracker_network.cidr == "10.0.0.0/24"


def test_cfg02_mixed_types_keep_their_type_and_global_cap():
    bare = {"name": "b", "type": "bare-metal", "maxAgents": 2, "labelSets": [{"labels": ["gpu"], "binaryPath": "/a"}]}
    config = valid(doc(container(), bare, globalMaxAgents=30))
    assert [s.type for s in config.scalers] == ["container", "bare-metal"]
    assert config.global_max_agents == 30


# ----------------------------------------------------------------------------- top level


def test_cfg03_version_is_required():
    document = doc(container())
    del document["version"]
    assert ("version", "Required") in invalid(document)


@pytest.mark.parametrize("version", [2, "1", True, 1.5, 0])
def test_cfg04_only_version_1_is_accepted(version):
    issues = invalid(doc(container(), version=version))
    assert issues[0][0] == "version"
    assert "Expected version 1" in issues[0][1]


def test_cfg48_unknown_top_level_keys_are_dropped():
    config = valid(doc(container(), foo=1))
    assert "foo" not in config.to_raw()


def test_cfg49_an_empty_scaler_list_is_valid():
    assert valid(doc()).scalers == []


def test_scalers_is_required_and_must_be_a_list():
    assert ("scalers", "Required") in invalid({"version": 1})
    assert invalid({"version": 1, "scalers": {"a": 1}})[0][0] == "scalers"


@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_global_max_agents_must_be_a_positive_integer(value):
    assert invalid(doc(container(), globalMaxAgents=value))[0][0] == "globalMaxAgents"


def test_the_document_must_be_a_mapping():
    issues = invalid(["version", 1])
    assert issues[0][0] == ""
    assert "Expected a mapping" in issues[0][1]


# ----------------------------------------------------------------------------- strict objects


def test_cfg06_unknown_scaler_keys_are_unrecognized_keys():
    issues = invalid(doc(container(cleanable=True, cleanupScript="/x")))
    paths = {p for p, _ in issues}
    assert paths == {"scalers.0.cleanable", "scalers.0.cleanupScript"}
    assert all("unrecognized_keys" in m for _, m in issues)
    assert any('"cleanable"' in m for _, m in issues)


def test_cfg07_removed_keys_are_unrecognized():
    assert "unrecognized_keys" in invalid(doc(container(dockerHost="tcp://x")))[0][1]
    issues = invalid(doc(with_label_set(dockerSocket=True)))
    assert issues[0][0] == "scalers.0.labelSets.0.dockerSocket"
    assert "unrecognized_keys" in issues[0][1]


def test_snake_case_keys_are_not_accepted_in_yaml():
    issues = invalid(doc(container(max_concurrent_spawns=3)))
    assert issues[0][0] == "scalers.0.max_concurrent_spawns"


@pytest.mark.parametrize("kind", ["docker", "kubernetes", "", None])
def test_cfg08_unknown_types_are_refused(kind):
    issues = invalid(doc(container(type=kind)))
    assert issues[0][0] == "scalers.0.type"


def test_errors_name_the_value():
    issues = invalid(doc(container(type="docker", maxAgents=0)))
    messages = dict(issues)
    assert '"docker"' in messages["scalers.0.type"]
    assert "received 0" in messages["scalers.0.maxAgents"]


# ----------------------------------------------------------------------------- per-type refinements


def test_cfg09_container_label_sets_need_an_image():
    entry = container(labelSets=[{"labels": ["linux"]}])
    assert invalid(doc(entry)) == [
        ("scalers.0.labelSets.0.image", "Container scaler \"c\" label set [0] requires an 'image' field")
    ]


def test_bare_metal_label_sets_need_a_binary_or_an_image():
    entry = {"name": "b", "type": "bare-metal", "maxAgents": 1, "labelSets": [{"labels": ["x"]}]}
    ((path, message),) = invalid(doc(entry))
    assert path == "scalers.0.labelSets.0.binaryPath"
    assert message.startswith("Bare-metal scaler \"b\" label set [0] requires a 'binaryPath'")
    assert "'image'" in message


def test_cfg11_bare_metal_with_only_an_image_is_valid():
    entry = {"name": "b", "type": "bare-metal", "maxAgents": 1, "labelSets": [{"labels": ["x"], "image": "node:20"}]}
    valid(doc(entry))


def test_a_label_set_names_a_credentials_ref_only_where_it_pulls_an_image():
    valid(doc(container(labelSets=[{"labels": ["x"], "image": "reg.example/a:1", "credentialsRef": "reg"}])))
    bare = {"name": "b", "type": "bare-metal", "maxAgents": 1}
    valid(doc({**bare, "labelSets": [{"labels": ["x"], "image": "reg.example/a:1", "credentialsRef": "reg"}]}))
    process = {**bare, "labelSets": [{"labels": ["x"], "binaryPath": "/bin/agent", "credentialsRef": "reg"}]}
    ((path, message),) = invalid(doc(process))
    assert path == "scalers.0.labelSets.0.credentialsRef" and 'credentialsRef "reg" but pulls no image' in message
    assert invalid(doc(container(labelSets=[{"labels": ["x"], "image": "a", "credentialsRef": ""}])))


def firecracker(**extra):
    entry = {
        "name": "fc",
        "type": "firecracker",
        "maxAgents": 2,
        "firecrackerPath": "/fc",
        "jailerPath": "/jailer",
        "kernelPath": "/vmlinux",
        "uid": 1000,
        "gid": 1000,
        "labelSets": [{"labels": ["linux", "vm"], "rootfsPath": "/rootfs.ext4"}],
    }
    entry.update(extra)
    return entry


def test_an_initrd_path_is_kept_for_the_scaler_and_a_label_set_and_reaches_the_backend_settings():
    entry = firecracker(
        initrdPath="/guest/initrd.img",
        labelSets=[{"labels": ["linux", "vm"], "rootfsPath": "/rootfs.ext4", "initrdPath": "/other/initrd.img"}],
    )
    raw = valid(doc(entry)).scalers[0].to_raw()
    assert raw["initrdPath"] == "/guest/initrd.img" and raw["labelSets"][0]["initrdPath"] == "/other/initrd.img"
    assert FirecrackerSettings.from_config(raw).initrd_path == "/guest/initrd.img"
    assert FirecrackerSettings.from_config(firecracker()).initrd_path == ""


def test_cfg12_firecracker_requirements_are_each_reported():
    entry = firecracker(labelSets=[{"labels": ["vm"]}])
    for key in ("firecrackerPath", "jailerPath", "kernelPath", "uid", "gid"):
        del entry[key]
    issues = invalid(doc(entry))
    assert issues == [
        ("scalers.0.firecrackerPath", "Firecracker scaler \"fc\" requires a 'firecrackerPath' field"),
        ("scalers.0.jailerPath", "Firecracker scaler \"fc\" requires a 'jailerPath' field"),
        ("scalers.0.kernelPath", "Firecracker scaler \"fc\" requires a 'kernelPath' field"),
        ("scalers.0.uid", "Firecracker scaler \"fc\" requires a 'uid' field"),
        ("scalers.0.gid", "Firecracker scaler \"fc\" requires a 'gid' field"),
        ("scalers.0.labelSets.0.rootfsPath", "Firecracker scaler \"fc\" label set [0] requires a 'rootfsPath' field"),
    ]


def test_cfg13_firecracker_defaults():
    s = valid(doc(firecracker())).scalers[0]
    assert (s.chroot_base_dir, s.vcpu_count, s.mem_size_mib, s.require_sudo) == ("/srv/jailer", 2, 512, False)


def test_cfg14_firecracker_block_defaults():
    config = valid(doc(firecracker(), firecracker={}))
    assert config.firecracker.model_dump(by_alias=True) == {
        "cidr": "10.0.0.0/24",
        "bridgeName": "kici-br0",
        "gateway": "10.0.0.1",
        "netmask": "255.255.255.0",
        "table": "kici",
        "autoProvisionHost": True,
    }


@pytest.mark.parametrize(
    "block, path",
    [
        ({"cidr": "10.0.0.0/33"}, "firecracker.cidr"),
        ({"gateway": "gw.local"}, "firecracker.gateway"),
        ({"bridgeName": "a-bridge-name-too-long"}, "firecracker.bridgeName"),
        ({"autoProvisionHost": "yes"}, "firecracker.autoProvisionHost"),
    ],
)
def test_the_firecracker_block_refuses_bad_network_values(block, path):
    assert invalid(doc(firecracker(), firecracker=block))[0][0] == path


def test_cfg16_dual_arch_firecracker_keeps_per_set_overrides():
    entry = firecracker(
        vcpuCount=4,
        labelSets=[
            {"labels": ["linux", "amd64"], "rootfsPath": "/opt/kici/rootfs-amd64.ext4"},
            {
                "labels": ["linux", "arm64-guest"],
                "rootfsPath": "/opt/kici/rootfs-arm64.ext4",
                "kernelPath": "/opt/kici/Image-arm64",
                "vcpuCount": 2,
            },
        ],
    )
    config = valid(doc(entry, firecracker={"cidr": "10.0.0.0/22"}))
    s = config.scalers[0]
    assert s.vcpu_count == 4
    assert s.label_sets[0].kernel_path is None
    assert (s.label_sets[1].kernel_path, s.label_sets[1].vcpu_count) == ("/opt/kici/Image-arm64", 2)
    assert config.firecracker.cidr == "10.0.0.0/22"


def test_cfg36_event_scaler_needs_no_image():
    entry = {
        "name": "cloud",
        "type": "event",
        "maxAgents": 2,
        "provisioningTargets": ["org/infra"],
        "labelSets": [{"labels": ["linux", "cloud"]}],
    }
    s = valid(doc(entry)).scalers[0]
    assert s.provisioning_targets == ["org/infra"]


@pytest.mark.parametrize("targets", [None, []])
def test_event_scalers_need_provisioning_targets(targets):
    entry = {"name": "cloud", "type": "event", "maxAgents": 2, "labelSets": [{"labels": ["x"]}]}
    if targets is not None:
        entry["provisioningTargets"] = targets
    ((path, message),) = invalid(doc(entry))
    assert path == "scalers.0.provisioningTargets"
    assert message.startswith("Event scaler \"cloud\" requires a non-empty 'provisioningTargets' array (")


# ----------------------------------------------------------------------------- label sets


@pytest.mark.parametrize("mode", ["drop", "pause"])
def test_cfg17_backpressure_mode_is_kept(mode):
    assert valid(doc(with_label_set(backpressureMode=mode))).scalers[0].label_sets[0].backpressure_mode == mode


def test_cfg17_unknown_backpressure_mode_is_refused():
    assert invalid(doc(with_label_set(backpressureMode="block")))[0][0] == "scalers.0.labelSets.0.backpressureMode"


def test_cfg26_a_label_set_needs_at_least_one_label():
    ((path, message),) = invalid(doc(container(labelSets=[{"labels": [], "image": "a"}])))
    assert path == "scalers.0.labelSets.0.labels"
    assert "at least 1" in message


def test_a_scaler_needs_at_least_one_label_set():
    assert invalid(doc(container(labelSets=[])))[0][0] == "scalers.0.labelSets"


@pytest.mark.parametrize("label", ["kici:agent:container", "KICI:foo", "  kici:x"])
def test_the_kici_prefix_is_reserved_in_label_sets(label):
    ((path, message),) = invalid(doc(container(labelSets=[{"labels": ["linux", label], "image": "a"}])))
    assert path == "scalers.0.labelSets.0.labels.1"
    assert "Labels with 'kici:' prefix are reserved and cannot be used in scaler labelSets" in message


def test_the_kici_prefix_is_reserved_in_mandatory_labels():
    ((path, message),) = invalid(doc(container(mandatoryLabels=["kici:os:linux"])))
    assert path == "scalers.0.mandatoryLabels.0"
    assert "reserved" in message


def test_labels_are_canonicalised_keeping_order_and_length():
    entry = container(labelSets=[{"labels": [" Linux", "GPU", "gpu"], "image": "a"}])
    ls = valid(doc(entry)).scalers[0].label_sets[0]
    assert ls.labels == ["linux", "gpu", "gpu"]
    assert ls.normalized == "gpu,linux"


@pytest.mark.parametrize("label", ["", "   ", "a,b"])
def test_empty_labels_and_commas_are_refused(label):
    assert (
        invalid(doc(container(labelSets=[{"labels": [label], "image": "a"}])))[0][0] == "scalers.0.labelSets.0.labels.0"
    )


def test_label_set_env_must_map_strings_to_strings():
    issues = invalid(doc(with_label_set(env={"PORT": 8080})))
    assert issues[0][0] == "scalers.0.labelSets.0.env.PORT"


@pytest.mark.parametrize("policy", ["Always", "IfNotPresent", "Never"])
def test_pull_policies(policy):
    assert valid(doc(with_label_set(imagePullPolicy=policy))).scalers[0].label_sets[0].image_pull_policy == policy


def test_a_yaml_null_means_absent():
    s = valid(doc(container(orchestratorUrl=None, maxConcurrentSpawns=None))).scalers[0]
    assert s.orchestrator_url is None
    assert s.max_concurrent_spawns == 8


# ----------------------------------------------------------------------------- warm pool


def test_cfg18_warm_pool_defaults():
    wp = valid(doc(container(warmPool={"enabled": True}))).scalers[0].warm_pool
    assert (wp.enabled, wp.size, wp.idle_timeout_seconds) == (True, 0, 300)


@pytest.mark.parametrize("size", [-1, 1.5, "2"])
def test_cfg19_warm_pool_size_must_be_a_non_negative_integer(size):
    assert invalid(doc(container(warmPool={"enabled": True, "size": size})))[0][0] == "scalers.0.warmPool.size"


def test_cfg19_idle_timeout_has_no_lower_bound():
    assert valid(doc(container(warmPool={"idleTimeoutSeconds": 0}))).scalers[0].warm_pool.idle_timeout_seconds == 0


def test_warm_pool_is_not_strict():
    assert valid(doc(container(warmPool={"enabled": True, "colour": "blue"}))).scalers[0].warm_pool.enabled


# ----------------------------------------------------------------------------- network policy


def test_cfg21_host_access_entries_in_the_grammar_are_valid():
    hosts = ["*:5000", "10.98.0.0/24:443", "53"]
    policy = valid(doc(with_label_set(networkPolicy={"hostAccess": hosts}))).scalers[0].label_sets[0].network_policy
    assert policy.host_access == hosts
    assert policy.deny_all is False


def test_cfg22_host_access_refuses_a_hostname():
    ((path, message),) = invalid(doc(with_label_set(networkPolicy={"hostAccess": ["registry.internal:5000"]})))
    assert path == "scalers.0.labelSets.0.networkPolicy.hostAccess.0"
    assert "not an IPv4 address" in message
    assert "registry.internal:5000" in message


def test_cfg23_host_access_port_range_and_empty_list():
    ((path, message),) = invalid(doc(with_label_set(networkPolicy={"hostAccess": ["*:70000"]})))
    assert "outside 1-65535" in message
    policy = valid(doc(with_label_set(networkPolicy={"hostAccess": []}))).scalers[0].label_sets[0].network_policy
    assert policy.host_access == []


def test_network_policy_is_not_strict_and_keeps_allowlist():
    policy = (
        valid(doc(with_label_set(networkPolicy={"allowlist": ["10.0.5.0/24"], "denyAll": True, "other": 1})))
        .scalers[0]
        .label_sets[0]
        .network_policy
    )
    assert policy.allowlist == ["10.0.5.0/24"]
    assert policy.deny_all is True


# ----------------------------------------------------------------------------- roles


@pytest.mark.parametrize(
    "roles, expected",
    [
        (None, None),
        (["builder"], ["builder"]),
        ([], []),
        (["builder", "all"], None),
        (["all"], None),
        (["init-runner", "builder"], ["init-runner", "builder"]),
    ],
)
def test_cfg24_roles_are_normalised(roles, expected):
    entry = container() if roles is None else container(roles=roles)
    assert valid(doc(entry)).scalers[0].roles == expected


def test_cfg24_unknown_roles_are_refused():
    assert invalid(doc(container(roles=["unknown"])))[0][0] == "scalers.0.roles.0"


# ----------------------------------------------------------------------------- gates


def test_cfg27_mandatory_labels_default_to_empty():
    assert valid(doc(container())).scalers[0].mandatory_labels == []


def test_cfg28_mandatory_label_present_in_every_set():
    entry = container(mandatoryLabels=["gpu"], labelSets=[{"labels": ["linux", "gpu"], "image": "a"}])
    valid(doc(entry))


def test_cfg29_mandatory_labels_are_case_insensitive():
    entry = container(mandatoryLabels=["GPU"], labelSets=[{"labels": ["linux", "gpu"], "image": "a"}])
    assert valid(doc(entry)).scalers[0].mandatory_labels == ["gpu"]


def test_cfg31_a_gate_label_missing_from_a_set_is_refused():
    entry = container(
        mandatoryLabels=["gpu"],
        labelSets=[{"labels": ["linux", "gpu"], "image": "a"}, {"labels": ["linux", "cpu"], "image": "b"}],
    )
    ((path, message),) = invalid(doc(entry))
    assert path == "scalers.0.labelSets.1.labels"
    assert message.startswith('Scaler "c" gate label "gpu" is missing from labelSets[1].labels — ')


def test_cfg32_the_error_names_the_set_that_lacks_it():
    entry = container(
        mandatoryLabels=["mandatory"],
        labelSets=[
            {"labels": ["a", "mandatory"], "image": "a"},
            {"labels": ["b", "mandatory"], "image": "a"},
            {"labels": ["c"], "image": "a"},
        ],
    )
    ((path, message),) = invalid(doc(entry))
    assert path == "scalers.0.labelSets.2.labels"
    assert "labelSets[2]" in message


def test_cfg33_platform_taints_are_reachable_by_construction():
    entry = {
        "name": "mac",
        "type": "bare-metal",
        "maxAgents": 1,
        "platform": {"os": "macos", "arch": "arm64"},
        "labelSets": [{"labels": ["xcode"], "binaryPath": "/a"}],
    }
    s = valid(doc(entry)).scalers[0]
    assert s.gates == [["macos", "arm64"]]


@pytest.mark.parametrize(
    "platform, path",
    [
        ({"os": "freebsd", "arch": "x64"}, "scalers.0.platform.os"),
        ({"os": "linux", "arch": "x64", "extra": 1}, "scalers.0.platform.extra"),
        ({"os": "linux"}, "scalers.0.platform.arch"),
    ],
)
def test_cfg34_platform_is_strict(platform, path):
    assert invalid(doc(container(platform=platform)))[0][0] == path


# ----------------------------------------------------------------------------- caps and pools


def test_cfg37_caps_and_pools_are_normalised():
    config = valid(
        doc(
            container(resourceCap={"maxCpu": 8}, machinePool="shared-host"),
            globalResourceCap={"maxCpu": 16, "maxMemory": "64g"},
            machinePools=[{"name": "shared-host", "cap": {"maxCpu": 32, "maxMemory": "128g"}}],
        )
    )
    assert config.global_resource_cap.max_cpu == 16
    assert config.global_resource_cap.max_memory_bytes == 68719476736
    assert config.machine_pools[0].cap.max_memory_bytes == 137438953472
    s = config.scalers[0]
    assert (s.resource_cap.max_cpu, s.resource_cap.max_memory_bytes) == (8, None)
    assert s.machine_pool == "shared-host"
    assert config.machine_pool("shared-host").cap.max_cpu == 32


def test_cfg38_unknown_machine_pool():
    ((path, message),) = invalid(doc(container(machinePool="nope")))
    assert path == "scalers.0.machinePool"
    assert message == 'Scaler "c" references unknown machinePool "nope". Define it under top-level machinePools[].'


def test_cfg39_duplicate_machine_pool_names():
    pools = [{"name": "a", "cap": {}}, {"name": "a", "cap": {"maxCpu": 1}}]
    assert invalid(doc(container(), machinePools=pools)) == [("machinePools.1.name", 'Duplicate machinePool name "a".')]


def test_an_empty_cap_is_legal():
    config = valid(doc(container(resourceCap={}), globalResourceCap={}))
    assert config.global_resource_cap.max_cpu is None
    assert config.global_resource_cap.max_memory_bytes is None


@pytest.mark.parametrize(
    "cap, path",
    [
        ({"maxMemory": "4Gi"}, "globalResourceCap.maxMemory"),
        ({"maxMemory": 512}, "globalResourceCap.maxMemory"),
        ({"maxCpu": 0}, "globalResourceCap.maxCpu"),
        ({"maxCpu": 2, "cpus": 2}, "globalResourceCap.cpus"),
    ],
)
def test_resource_caps_are_checked_at_load(cap, path):
    issues = invalid(doc(container(), globalResourceCap=cap))
    assert issues[0][0] == path


def test_a_bad_cap_memory_names_the_memory_format_message():
    ((_, message),) = invalid(doc(container(resourceCap={"maxMemory": "4Gi"})))
    assert message.startswith('Invalid memory format: "4Gi".')


# ----------------------------------------------------------------------------- resources


def test_cfg41_flat_resources_become_requests_and_limits():
    resources = valid(doc(with_label_set(resources={"cpus": 2, "memory": "4g"}))).scalers[0].label_sets[0].resources
    assert resources.model_dump(exclude_none=True) == {
        "requests": {"cpus": 2, "memory": "4g"},
        "limits": {"cpus": 2, "memory": "4g"},
    }


def test_cfg42_nested_resources_are_kept():
    nested = {"requests": {"cpus": 1, "memory": "1g"}, "limits": {"cpus": 2, "memory": "4g"}}
    resources = valid(doc(with_label_set(resources=nested))).scalers[0].label_sets[0].resources
    assert resources.model_dump(exclude_none=True) == nested


def test_cfg43_one_sided_resources_are_not_mirrored_by_the_schema():
    resources = valid(doc(with_label_set(resources={"requests": {"cpus": 1}}))).scalers[0].label_sets[0].resources
    assert resources.model_dump(exclude_none=True) == {"requests": {"cpus": 1}}


def test_cfg44_mixed_resource_shapes_are_refused():
    ((path, message),) = invalid(doc(with_label_set(resources={"cpus": 2, "limits": {"cpus": 4}})))
    assert path == "scalers.0.labelSets.0.resources"
    assert "cannot be mixed" in message


def test_cfg46_memory_strings_in_resources_are_unchecked_by_the_schema():
    resources = valid(doc(with_label_set(resources={"memory": "4Gi"}))).scalers[0].label_sets[0].resources
    assert resources.requests.memory == "4Gi"


def test_an_empty_flat_resources_object_becomes_empty():
    resources = valid(doc(with_label_set(resources={}))).scalers[0].label_sets[0].resources
    assert resources.is_empty


@pytest.mark.parametrize(
    "resources, path",
    [
        ({"cpus": 0}, "scalers.0.labelSets.0.resources.cpus"),
        ({"cpus": 257}, "scalers.0.labelSets.0.resources.cpus"),
        ({"cpus": "2"}, "scalers.0.labelSets.0.resources.cpus"),
        ({"requests": {"cpus": -1}}, "scalers.0.labelSets.0.resources.requests.cpus"),
        ({"requests": {"gpus": 1}}, "scalers.0.labelSets.0.resources.requests.gpus"),
        (5, "scalers.0.labelSets.0.resources"),
    ],
)
def test_resource_values_are_validated(resources, path):
    assert invalid(doc(with_label_set(resources=resources)))[0][0] == path


@pytest.mark.parametrize(
    "resources, path, message",
    [
        (
            {"cpus": 1e-12},
            "scalers.0.labelSets.0.resources.cpus",
            "below 0.01, the smallest CPU limit the runtime can enforce (docker would round it to no limit at all), "
            "received 1e-12",
        ),
        (
            {"limits": {"cpus": 0.005}},
            "scalers.0.labelSets.0.resources.limits.cpus",
            "below 0.01, the smallest CPU limit the runtime can enforce (docker would round it to no limit at all), "
            "received 0.005",
        ),
        (
            {"memory": "1m"},
            "scalers.0.labelSets.0.resources.memory",
            'below 6m (6291456 bytes), the smallest memory limit the runtime accepts, received "1m"',
        ),
    ],
)
def test_resources_below_what_the_runtime_can_enforce_are_refused_naming_field_and_value(resources, path, message):
    """Docker's NanoCpus is CPUs × 10⁹: 1e-12 CPU rounds to 0, which is no limit at all."""
    assert invalid(doc(with_label_set(resources=resources)))[0] == (path, message)


def test_the_smallest_enforceable_resources_are_accepted():
    resources = valid(doc(with_label_set(resources={"cpus": 0.01, "memory": "6m"}))).scalers[0].label_sets[0].resources
    assert resources.limits.cpus == 0.01 and resources.limits.memory == "6m"


def test_defaults_resources_accept_both_shapes():
    config = valid(doc(container(), defaults={"resources": {"memory": "2g", "cpus": 2}, "other": 1}))
    assert config.default_resources.limits.memory == "2g"


def test_cfg47_max_concurrent_spawns_must_be_positive():
    assert invalid(doc(container(maxConcurrentSpawns=0)))[0][0] == "scalers.0.maxConcurrentSpawns"


def test_integral_floats_count_as_integers_but_bools_do_not():
    assert valid(doc(container(maxAgents=3.0))).scalers[0].max_agents == 3
    assert invalid(doc(container(maxAgents=True)))[0][0] == "scalers.0.maxAgents"


# ----------------------------------------------------------------------------- cross-scaler rules


def test_duplicate_scaler_names_are_refused():
    a = container(labelSets=[{"labels": ["a"], "image": "x"}])
    b = container(labelSets=[{"labels": ["b"], "image": "x"}])
    assert invalid(doc(a, b)) == [("scalers.1.name", 'Duplicate scaler name "c" (first defined at scalers[0])')]


def test_label_set_overlaps_between_scalers_are_refused():
    one = container(name="docker-1", labelSets=[{"labels": ["linux", "docker"], "image": "x"}])
    two = container(name="docker-2", labelSets=[{"labels": ["docker", "linux"], "image": "x"}])
    assert invalid(doc(one, two)) == [
        ("scalers.1.labelSets.0.labels", 'Label set [docker,linux] overlaps between scalers "docker-1" and "docker-2"')
    ]


def test_the_same_set_twice_in_one_scaler_is_allowed():
    valid(doc(container(labelSets=[{"labels": ["linux", "docker"], "image": "x"}] * 2)))


def test_every_problem_is_reported_not_only_the_first():
    broken = container(name="a", maxAgents=0, labelSets=[{"labels": ["x"]}])
    wrong_type = container(name="b", type="docker")
    pool_ref = container(name="d", machinePool="nowhere", labelSets=[{"labels": ["z"], "image": "i"}])
    paths = [p for p, _ in invalid(doc(broken, wrong_type, pool_ref, globalMaxAgents=-1))]
    assert "globalMaxAgents" in paths
    assert "scalers.0.maxAgents" in paths
    assert "scalers.1.type" in paths
    assert "scalers.2.machinePool" in paths


def test_refinements_run_on_entries_that_parsed_even_when_another_failed():
    broken = container(name="a", maxAgents=0)
    missing_image = container(name="b", labelSets=[{"labels": ["q"]}])
    paths = [p for p, _ in invalid(doc(broken, missing_image))]
    assert paths == ["scalers.0.maxAgents", "scalers.1.labelSets.0.image"]


# ----------------------------------------------------------------------------- model guarantees


def test_scalers_config_itself_enforces_the_refinements():
    with pytest.raises(ValidationError, match="requires an 'image' field"):
        ScalersConfig.model_validate(doc(container(labelSets=[{"labels": ["x"]}])))


def test_the_raw_dump_round_trips():
    with open(Path(__file__).resolve().parent / "examples" / "05-mixed-pools-warm.yaml") as fh:
        import yaml

        original = yaml.safe_load(fh)
    config = valid(original)
    raw = config.to_raw()
    again = valid(copy.deepcopy(raw))
    assert again == config
    assert again.to_raw() == raw
    entry = config.scalers[0]
    assert ScalerEntry.model_validate(entry.to_raw()) == entry


def test_config_objects_are_immutable():
    config = valid(doc(container()))
    with pytest.raises(ValidationError):
        config.scalers[0].max_agents = 9


# ----------------------------------------------------------------------------- job resources


def test_parse_resource_request_accepts_both_shapes_and_none():
    assert parse_resource_request(None) == ResourceRequest()
    flat = parse_resource_request({"cpus": 1, "memory": "1g"})
    assert flat.requests == flat.limits
    nested = parse_resource_request({"limits": {"memory": "16g"}})
    assert nested.requests is None and nested.limits.memory == "16g"


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"cpus": -1}, "resources.cpus"),
        ({"cpus": 2, "limits": {}}, "cannot be mixed"),
        ({"requests": {"memory": "4Gi"}}, 'Invalid memory format: "4Gi"'),
        ({"cpus": 1e9}, "less than or equal to 256"),
    ],
)
def test_parse_resource_request_refuses_bad_job_resources(value, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        parse_resource_request(value)
