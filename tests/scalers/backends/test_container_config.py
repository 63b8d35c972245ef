"""What an agent container is created with: HostConfig, env, labels, network, and which runtime
it is created on."""

from __future__ import annotations

import threading

import pytest

from network.nft.names import AGENT_MAC_PREFIX
from scalers.backends.container.backend import ContainerBackend
from scalers.backends.container.job_runtime import AGENT_ENTRYPOINT, RUNTIME_DIR, runtime_volume_name
from scalers.backends.container.ready import forget_spawn_facts
from scalers.backends.container.spawn import spawn_image
from scalers.backends.docker_net import (
    ISOLATED_NETWORK_NAME,
    IsolatedNetworkError,
    ensure_isolated_network,
    find_isolated_network,
    forget_isolated_network,
)
from scalers.backends.failure import failure_detail
from scalers.backends.hostconfig import AGENT_CONTAINER_PIDS_LIMIT, build_agent_container_host_config
from scalers.backends.runtime import NO_RUNTIME_MESSAGE, NoContainerRuntime, RuntimeInfo, detect_container_runtime
from scalers.backends.spawn_env import container_env, process_env
from scalers.models import Installation, Reservation
from scalers.resources import EffectiveLimits
from tests.support.scalers import make_agent, make_scaler

LOCAL = RuntimeInfo(runtime="docker", base_url="unix:///var/run/docker.sock", socket_path="/var/run/docker.sock")


# -- HostConfig (the one builder) ---------------------------------------------------------------


def test_the_host_config_always_bounds_pids_and_drops_only_net_raw():
    hc = build_agent_container_host_config()
    assert hc == {
        "AutoRemove": False,
        "PidsLimit": AGENT_CONTAINER_PIDS_LIMIT,
        "Init": True,
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "8m", "max-file": "2"}},  # rotated: bounded
        "CapDrop": ["NET_RAW"],
    }
    assert AGENT_CONTAINER_PIDS_LIMIT == 4096
    assert "SecurityOpt" not in hc


def test_net_raw_gives_the_capability_back_and_must_be_a_boolean():
    assert "CapDrop" not in build_agent_container_host_config(net_raw=True)
    with pytest.raises(ValueError, match="net_raw must be true or false, got 'yes'"):
        build_agent_container_host_config(net_raw="yes")


def test_the_host_config_carries_the_operators_limits_binds_and_hosts():
    hc = build_agent_container_host_config(
        EffectiveLimits(cpus=0.5, mem_bytes=1 << 30), ["/a:/b:ro"], ["reg.lan:10.9.0.1"]
    )
    assert hc["Memory"] == 1073741824 and hc["NanoCpus"] == 500000000
    assert hc["Binds"] == ["/a:/b:ro"] and hc["ExtraHosts"] == ["reg.lan:10.9.0.1"]


def test_the_host_config_leaves_out_zero_limits_and_empty_lists():
    hc = build_agent_container_host_config(EffectiveLimits(cpus=2, mem_bytes=0), [], [])
    assert hc["NanoCpus"] == 2000000000 and "Memory" not in hc and "Binds" not in hc and "ExtraHosts" not in hc


def test_the_host_config_refuses_negative_limits_naming_the_field():
    with pytest.raises(ValueError, match="limits.cpus"):
        build_agent_container_host_config(EffectiveLimits(cpus=-1))
    with pytest.raises(ValueError, match="binds"):
        build_agent_container_host_config(binds=[""])


# -- create config ------------------------------------------------------------------------------


def backend_for(scaler, **kw):
    return ContainerBackend(scaler, docker=object(), runtime=kw.pop("runtime", LOCAL), nft=object(), **kw)


@pytest.mark.django_db
def test_the_env_carries_url_id_labels_token_and_image_in_order(settings):
    settings.KICI_CONSOLE_URL = "http://localhost:4000"
    scaler = make_scaler(
        name="test-container", labels=("linux", "docker"), ls_config={"image": "img:1", "env": {"NODE_VERSION": "20"}}
    )
    agent = make_agent(
        scaler,
        agent_id="agent-1",
        labels=[
            "linux",
            "docker",
            "kici:agent:container",
            "kici:scaler:test-container",
            "kici:role:builder",
            "kici:role:init-runner",
        ],
    )
    env = container_env(
        agent, "ket_x", image="img:1", environ={"KICI_AGENT_ENV_FOO": "bar", "KICI_AGENT_ENV_": "skipped"}
    )
    assert env[:7] == [
        "KICI_ORCHESTRATOR_URL=http://localhost:4000",
        "KICI_AGENT_ID=agent-1",
        "KICI_LABELS=linux,docker,kici:agent:container,kici:scaler:test-container,kici:role:builder,kici:role:init-runner",
        "KICI_SCALER_MANAGED=1",
        "KICI_EXECUTION_MODE=bare-metal",
        "KICI_RUNTIME_IMAGE=img:1",
        "KICI_AGENT_TOKEN=ket_x",
    ]
    assert env[7:] == ["FOO=bar", "NODE_VERSION=20"]


@pytest.mark.django_db
def test_the_label_set_env_comes_after_the_forwarded_one_so_the_yaml_wins():
    scaler = make_scaler(ls_config={"image": "img:1", "env": {"FOO": "baz"}})
    env = container_env(make_agent(scaler), None, image="img:1", environ={"KICI_AGENT_ENV_FOO": "bar"})
    assert env.index("FOO=bar") < env.index("FOO=baz")
    assert not any(e.startswith("KICI_AGENT_TOKEN=") for e in env)


@pytest.mark.django_db
def test_the_scalers_orchestrator_url_beats_the_console_setting(settings):
    settings.KICI_CONSOLE_URL = "http://172.30.0.1:8000"
    agent = make_agent(make_scaler(orchestrator_url="http://10.1.2.3:4000"))
    assert container_env(agent, None, image="i")[0] == "KICI_ORCHESTRATOR_URL=http://10.1.2.3:4000"


@pytest.mark.django_db
def test_container_labels_carry_ownership_and_bound_job_only_when_bound(settings):
    settings.KICI_INSTANCE_ID = "console-a"
    scaler = make_scaler(name="test-container", labels=("linux", "docker"))
    free = backend_for(scaler).create_config(make_agent(scaler, agent_id="agent-1"), None, "img")
    assert free["labels"] == {
        "kici-managed": "true",
        "kici-installation-id": Installation.objects.get().installation_id,
        "kici-instance-id": "console-a",
        "kici-scaler-name": "test-container",
        "kici-agent-id": "agent-1",
        "kici-labels": "docker,linux",
    }
    bound = backend_for(scaler).create_config(
        make_agent(scaler, agent_id="agent-2", bound_job_id="job-123", run_id="run-456"), None, "img"
    )
    assert bound["labels"]["kici-bound-job-id"] == "job-123" and bound["labels"]["kici-run-id"] == "run-456"


@pytest.mark.django_db
def test_limits_come_from_the_reservation_else_from_the_label_set():
    scaler = make_scaler(ls_config={"image": "i", "resources": {"memory": "2g", "cpus": 2}})
    agent = make_agent(scaler)
    hc = backend_for(scaler).create_config(agent, None, "i")["host_config"]
    assert hc["Memory"] == 2147483648 and hc["NanoCpus"] == 2000000000
    Reservation.objects.filter(agent=agent).update(limit_cpus=0.5, limit_memory_bytes=1 << 30)
    agent.refresh_from_db()
    hc = backend_for(scaler).create_config(agent, None, "i")["host_config"]
    assert hc["Memory"] == 1073741824 and hc["NanoCpus"] == 500000000


@pytest.mark.django_db
def test_the_container_socket_is_bound_only_for_a_local_runtime():
    scaler = make_scaler(ls_config={"image": "i", "containerSocket": True})
    hc = backend_for(scaler).create_config(make_agent(scaler), None, "i")["host_config"]
    assert hc["Binds"] == ["/var/run/docker.sock:/var/run/docker.sock"]
    podman = RuntimeInfo("podman", "unix:///run/podman/podman.sock", "/run/podman/podman.sock")
    hc = backend_for(scaler, runtime=podman).create_config(make_agent(scaler), None, "i")["host_config"]
    assert hc["Binds"] == ["/run/podman/podman.sock:/run/podman/podman.sock"]
    remote = make_scaler(ls_config={"image": "i", "containerSocket": True}, config={"host": "tcp://h:2376"})
    hc = backend_for(remote, runtime=RuntimeInfo("docker", "tcp://h:2376")).create_config(
        make_agent(remote), None, "i"
    )["host_config"]
    assert "Binds" not in hc
    plain = make_scaler(ls_config={"image": "i"})
    assert "Binds" not in backend_for(plain).create_config(make_agent(plain), None, "i")["host_config"]


@pytest.mark.django_db
def test_agent_containers_lose_net_raw_unless_their_label_set_says_net_raw():
    plain = make_scaler(ls_config={"image": "i"})
    assert backend_for(plain).create_config(make_agent(plain), None, "i")["host_config"]["CapDrop"] == ["NET_RAW"]
    job = make_agent(plain, job_image="reg.example/tools:1", bound_job_id="j1")
    injected = backend_for(plain).create_config(job, None, "reg.example/tools:1", runtime_volume="v")
    assert injected["host_config"]["CapDrop"] == ["NET_RAW"]  # the agent injected into a job's image too
    granted = make_scaler(ls_config={"image": "i", "netRaw": True})
    assert "CapDrop" not in backend_for(granted).create_config(make_agent(granted), None, "i")["host_config"]


@pytest.mark.django_db
def test_a_job_image_runs_the_injected_agent_from_the_read_only_runtime_volume():
    scaler = make_scaler(ls_config={"image": "i", "volumes": ["/a:/b"]})
    agent = make_agent(scaler, job_image="reg.example/tools:1", bound_job_id="j1")
    config = backend_for(scaler).create_config(agent, None, "reg.example/tools:1", runtime_volume="kici-job-runtime-x")
    assert config["image"] == "reg.example/tools:1"
    assert config["entrypoint"] == AGENT_ENTRYPOINT and config["command"] == []
    assert config["host_config"]["Binds"] == ["/a:/b", f"kici-job-runtime-x:{RUNTIME_DIR}:ro"]
    env = dict(e.split("=", 1) for e in config["environment"])
    assert env["KICI_JOB_IMAGE_AGENT"] == "1" and env["KICI_RUNTIME_IMAGE"] == "reg.example/tools:1"
    assert config["labels"]["kici-bound-job-id"] == "j1"  # the container backend keeps its job labels
    plain = backend_for(scaler).create_config(make_agent(scaler), None, "i")
    assert "entrypoint" not in plain and "KICI_JOB_IMAGE_AGENT=1" not in plain["environment"]
    bare_metal = backend_for(scaler, job_image=True).create_config(agent, None, "x:1", runtime_volume="v")
    assert bare_metal["entrypoint"] == AGENT_ENTRYPOINT and f"v:{RUNTIME_DIR}:ro" in bare_metal["host_config"]["Binds"]
    assert "kici-bound-job-id" not in bare_metal["labels"]  # container mode: the four ownership labels only


@pytest.mark.django_db
def test_the_spawn_image_and_credential_are_the_jobs_else_the_label_sets(settings):
    scaler = make_scaler(ls_config={"image": "reg.example/agent:2", "credentialsRef": "ls-reg"})
    assert spawn_image(make_agent(scaler)) == ("reg.example/agent:2", "ls-reg")
    job = make_agent(scaler, job_image="other.example/job:1", job_credentials_ref="job-reg")
    assert spawn_image(job) == ("other.example/job:1", "job-reg")
    assert spawn_image(make_agent(scaler, job_image="public:1")) == ("public:1", "")  # never the label set's
    bare = make_scaler(ls_config={})
    assert spawn_image(make_agent(bare)) == (settings.KICI_AGENT_IMAGE, "")


def test_the_runtime_volume_is_named_by_the_agent_image_id():
    assert runtime_volume_name("sha256:" + "ab" * 32) == "kici-job-runtime-abababababab"


@pytest.mark.django_db
def test_isolation_attaches_to_the_agent_network_and_its_absence_attaches_nothing():
    scaler = make_scaler()
    agent = make_agent(scaler)
    on = backend_for(scaler).create_config(agent, None, "i")
    mac = on["networking_config"]["EndpointsConfig"][ISOLATED_NETWORK_NAME]["MacAddress"]
    assert mac.startswith(AGENT_MAC_PREFIX + ":") and len(mac) == 17
    assert on["mac_address"] == mac  # daemons before API 1.44 read only the container-wide MAC
    assert on["host_config"]["NetworkMode"] == ISOLATED_NETWORK_NAME
    assert on["host_config"]["Sysctls"] == {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
    }
    off_scaler = make_scaler(config={"networkIsolation": False})
    off = backend_for(off_scaler).create_config(make_agent(off_scaler), None, "i")
    assert "networking_config" not in off and "mac_address" not in off and "NetworkMode" not in off["host_config"]
    assert "Sysctls" not in off["host_config"]


def test_a_failure_detail_appends_the_captured_output():
    assert failure_detail(RuntimeError("exit 1"), ["boom"]) == "exit 1\n--- captured output ---\nboom"
    assert failure_detail(RuntimeError("exit 1"), []) == "exit 1"


@pytest.mark.django_db
def test_process_env_has_port_zero_and_label_env_wins():
    scaler = make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true", "env": {"FOO": "yaml"}})
    env = process_env(
        make_agent(scaler), "ket_y", environ={"PATH": "/usr/bin", "SECRET": "x", "KICI_AGENT_ENV_FOO": "fwd"}
    )
    assert env["KICI_PORT"] == "0" and env["KICI_SCALER_MANAGED"] == "1" and env["KICI_EXECUTION_MODE"] == "bare-metal"
    assert (
        env["FOO"] == "yaml"
        and env["PATH"] == "/usr/bin"
        and "SECRET" not in env
        and env["KICI_AGENT_TOKEN"] == "ket_y"
    )
    trusted = make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true", "env": {"KICI_TRUSTED_ENV": "true"}})
    assert process_env(make_agent(trusted), None, environ={"SECRET": "x"})["SECRET"] == "x"


# -- runtime detection --------------------------------------------------------------------------


def test_runtime_detection_probes_docker_then_podman():
    docker_only = detect_container_runtime(accessible=lambda p: p == "/var/run/docker.sock", environ={})
    assert docker_only == RuntimeInfo("docker", "unix:///var/run/docker.sock", "/var/run/docker.sock")
    probed = []
    with pytest.raises(
        NoContainerRuntime, match="No container runtime found. Install Docker or Podman, or configure host."
    ):
        detect_container_runtime(hint="podman", accessible=lambda p: probed.append(p) and False, environ={})
    assert probed == ["/run/podman/podman.sock"]
    assert NO_RUNTIME_MESSAGE.startswith("No container runtime found")


def test_a_remote_host_is_not_local_and_a_socket_path_names_its_runtime():
    remote = detect_container_runtime(host="tcp://h:2376")
    assert remote.runtime == "docker" and not remote.spawns_on_local_host
    assert detect_container_runtime(host="tcp://h:2376", hint="podman").runtime == "podman"
    assert detect_container_runtime(socket_path="/run/user/1000/podman/podman.sock").runtime == "podman"
    assert detect_container_runtime(socket_path="/run/podman/podman.sock").spawns_on_local_host


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("docker_host", "local"),
    [
        ("tcp://docker.example:2376", False),
        ("tcp://192.0.2.7:2375", False),
        ("tcp://127.0.0.1:2375", True),
        ("tcp://[::1]:2375", True),
        ("tcp://localhost:2375", True),
        ("unix:///run/docker.sock", True),
    ],
)
def test_a_console_wide_docker_host_decides_whether_this_host_guards_the_bridge(settings, docker_host, local):
    """A remote ``DOCKER_HOST`` puts agents on another host's bridge: this host neither guards it
    nor expects it (the scaler becomes ready); a loopback or unix endpoint is this host's."""
    settings.DOCKER_HOST = docker_host
    backend = ContainerBackend(make_scaler(), docker=object(), nft=object())
    assert backend.spawns_on_local_host is local
    if not local:
        assert backend.isolation_target() is None


# -- the isolated network, on the real private dockerd ------------------------------------------


@pytest.mark.docker
def test_the_network_lookup_wants_the_exact_name(docker_client):
    decoy = docker_client.api.create_network(
        "kici-agent-net-old", driver="bridge", ipam={"Driver": "default", "Config": [{"Subnet": "172.31.250.0/24"}]}
    )
    try:
        found = find_isolated_network(docker_client)
        assert found is None or found["Name"] == ISOLATED_NETWORK_NAME
        net_id = ensure_isolated_network(docker_client)
        assert net_id != decoy["Id"]
        assert docker_client.api.inspect_network(net_id)["Name"] == ISOLATED_NETWORK_NAME
    finally:
        docker_client.api.remove_network(decoy["Id"])


@pytest.mark.docker
def test_concurrent_creators_end_with_one_network_with_the_fixed_subnet(docker_client):
    existing = find_isolated_network(docker_client)
    if existing:
        attached = docker_client.api.inspect_network(existing["Id"]).get("Containers") or {}
        if attached:
            pytest.fail(f"{ISOLATED_NETWORK_NAME} still has containers attached: {list(attached)}")
        docker_client.api.remove_network(existing["Id"])
    forget_isolated_network()
    forget_spawn_facts()
    ids, errors = [], []

    def create():
        try:
            ids.append(ensure_isolated_network(docker_client))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(ids)) == 1
    nets = [n for n in docker_client.api.networks(names=[ISOLATED_NETWORK_NAME]) if n["Name"] == ISOLATED_NETWORK_NAME]
    assert len(nets) == 1
    info = docker_client.api.inspect_network(ids[0])
    assert info["Driver"] == "bridge" and info["Labels"] == {"kici-managed": "true"}
    assert info["IPAM"]["Config"] == [{"Subnet": "172.30.0.0/16", "Gateway": "172.30.0.1"}]


def test_a_409_with_nothing_to_find_afterwards_is_an_error():
    from docker.errors import APIError

    class Api:
        def networks(self, names):
            return [{"Name": "kici-agent-net-old", "Id": "x"}]

        def create_network(self, *a, **kw):
            raise APIError("conflict", response=type("R", (), {"status_code": 409, "reason": "Conflict"})())

    with pytest.raises(IsolatedNetworkError, match="after 409 conflict"):
        ensure_isolated_network(Api())


# -- fail-closed isolation and idempotent destroy ----------------------------------------------


@pytest.mark.django_db
def test_a_backend_with_isolation_refuses_to_start_when_nft_is_unusable():
    from network.nft.apply import NftClient, NftUnavailableError

    broken = NftClient("ctr_kici_none", library="/nonexistent/libnftables.so.1")
    with pytest.raises(NftUnavailableError, match="not available"):
        ContainerBackend(make_scaler(), docker=object(), runtime=LOCAL, nft=broken).ensure_host_ready()
    # isolation off: no nft check at all
    ContainerBackend(
        make_scaler(config={"networkIsolation": False}), docker=object(), runtime=LOCAL, nft=broken
    ).ensure_host_ready()


@pytest.mark.docker
@pytest.mark.django_db
def test_destroy_is_a_no_op_for_an_unknown_or_already_removed_container(docker_client, agent_image):
    scaler = make_scaler(config={"networkIsolation": False})
    backend = ContainerBackend(scaler, docker=docker_client)
    backend.destroy(make_agent(scaler))  # never spawned: nothing to find
    c = docker_client.api.create_container(
        agent_image, command=["true"], labels={"kici-managed": "true", "kici-scaler-name": scaler.name}
    )
    docker_client.api.remove_container(c["Id"], force=True)
    backend.destroy(make_agent(scaler, managed_id=c["Id"]))  # already gone: no error


@pytest.mark.django_db
def test_the_label_set_column_decides_host_access_not_the_imported_config(settings):
    from scalers.backends.isolation import resolve_host_access
    from scalers.backends.spawn_env import network_policy

    settings.KICI_STORAGE_URL = None
    scaler = make_scaler(
        ls_config={"image": "i", "networkPolicy": {"allowlist": ["10.1.0.0/16"], "hostAccess": ["*:1"]}}
    )
    ls = scaler.label_sets.get()
    ls.host_access = ["*:9999"]  # changed in the editor after the import
    assert network_policy(ls) == {"allowlist": ["10.1.0.0/16"], "hostAccess": ["*:9999"]}
    assert resolve_host_access(network_policy(ls), "http://172.30.0.1:8000") == (["*:9999"], True)
    ls.host_access = None  # back to the default
    assert resolve_host_access(network_policy(ls), "http://172.30.0.1:8000") == (
        ["172.30.0.1:53", "172.30.0.1:8000"],
        False,
    )
