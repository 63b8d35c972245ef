"""Orphan passes planned then applied, reap_unowned, the periodic sweep."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from network import netlink
from network.models import IpAllocation
from scalers.backends.firecracker import jail
from scalers.backends.firecracker.orphans import (
    AllocationRow,
    OrphanFacts,
    PeriodicSweep,
    plan_orphans,
    spared_vms,
    vm_target,
)
from scalers.backends.ownership import Owner
from tests.support.firecracker import owned_vm_dir

ME, OTHER = "fc-test", "fc-other"
MINE = Owner("0f" * 16, "console-a", ME)
#: A second console started on a restored copy of the database: same installation and scaler name.
SECOND = Owner("0f" * 16, "console-b", ME)


def _owner_file(owner: Owner, vm_id: str) -> dict:
    return {"kici-managed": "true", **owner.labels(), "kici-agent-id": vm_id}


def _facts(**kw):
    """Facts of this console (``MINE``); every chroot's owner file is its own unless ``owners`` says."""
    base = dict(
        scaler_name=ME, tracked=frozenset(), chroot_ids=(), live_chroots=frozenset(),
        allocations_before=(), links=(), allocations_after=(), rule_ips=frozenset(), owner=MINE,
    )  # fmt: skip
    base.update(kw)
    base["owners"] = {i: _owner_file(MINE, i) for i in base["chroot_ids"]} | dict(kw.get("owners", {}))
    return OrphanFacts(**base)


def _row(vm, ip, scaler=ME):
    return AllocationRow(ip=ip, vm_id=vm, scaler_name=scaler, tap_device=netlink.tap_name_for(vm))


def test_pass_3_deletes_only_unallocated_kici_taps():
    facts = _facts(links=("kici-1a2b3c4d", "kici-br0", "kici-ABCDEF12", "kici-isoprobe", "eth0", "lo"))
    assert plan_orphans(facts) == [vm_target(3, "tap", tap="kici-1a2b3c4d", scaler=ME)]


def test_pass_3_spares_taps_allocated_before_or_after_listing_and_taps_of_live_vms():
    facts = _facts(
        links=("kici-00000001", "kici-00000002", "kici-00000003", "kici-00000004"),
        allocations_before=(_row("scaler-firecracker-00000001", "10.9.0.2", OTHER),),
        allocations_after=(_row("scaler-firecracker-00000002", "10.9.0.3", OTHER),),
        tracked=frozenset({"scaler-firecracker-00000003"}),
    )
    assert [t.tap for t in plan_orphans(facts) if t.pass_no == 3] == ["kici-00000004"]


def test_pass_1_takes_this_scalers_dead_allocations_only():
    dead, other, tracked, live = (f"scaler-firecracker-0000000{i}" for i in range(1, 5))
    facts = _facts(
        allocations_before=(
            _row(dead, "10.9.0.2"),
            _row(other, "10.9.0.3", OTHER),
            _row(tracked, "10.9.0.4"),
            _row(live, "10.9.0.5"),
        ),
        tracked=frozenset({tracked}), chroot_ids=(dead, live), live_chroots=frozenset({live}),
        rule_ips=frozenset({"10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5"}),
    )  # fmt: skip
    plan = plan_orphans(facts)
    assert plan == [
        vm_target(1, "allocation", dead, "10.9.0.2", "kici-00000001", scaler=ME),
        vm_target(4, "rules", dead, "10.9.0.2", scaler=ME),
    ]
    assert "pass 1" in plan[0].reason and "10.9.0.2" in plan[1].reason


def test_pass_2_takes_unallocated_dead_chroots_and_a_failed_rule_listing_plans_no_rules():
    a, b, c = "scaler-firecracker-0000000a", "scaler-firecracker-0000000b", "scaler-firecracker-0000000c"
    facts = _facts(
        chroot_ids=(a, b, c),
        live_chroots=frozenset({b}),
        allocations_before=(_row(c, "10.9.0.9", OTHER),),
        rule_ips=None,
    )
    assert plan_orphans(facts) == [vm_target(2, "chroot", a, scaler=ME)]


def test_no_pass_plans_anything_of_a_vm_whose_owner_file_is_not_this_consoles():
    second, legacy, blank, mine = (f"scaler-firecracker-0000001{i}" for i in range(4))
    facts = _facts(
        chroot_ids=(second, legacy, blank, mine),
        # the restored copy carries the first console's allocation row of its VM
        allocations_before=(_row(second, "10.9.0.2"),),
        links=(netlink.tap_name_for(second), netlink.tap_name_for(legacy)),
        rule_ips=frozenset({"10.9.0.2"}),
        owners={
            second: _owner_file(SECOND, second),
            legacy: None,
            blank: {**_owner_file(MINE, blank), "kici-instance-id": ""},
        },
    )
    assert plan_orphans(facts) == [vm_target(2, "chroot", mine, scaler=ME)]
    assert dict(spared_vms(facts)) == {
        second: "skipped: another console's (kici-instance-id=console-b)",
        legacy: "skipped: ownership unknown (no kici-installation-id, kici-instance-id, kici-scaler-name)",
        blank: "skipped: ownership unknown (no kici-instance-id)",
    }
    # the same host seen by the second console: its own VM is an orphan there, and the first's is not
    theirs = OrphanFacts(**{**facts.__dict__, "owner": SECOND})
    assert {(t.pass_no, t.agent_id) for t in plan_orphans(theirs)} == {(1, second), (4, second)}  # its TAP in pass 1


# ---- applied on a real host (netns, nft, database, processes) ----------------------------------

_CHILD = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
os.chroot(sys.argv[2]); os.chdir("/")
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    time.sleep(60)
"""


def _start_in_chroot(comm: str, chroot) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _CHILD, comm, str(chroot)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    (chroot / "firecracker.pid").write_text(str(p.pid))
    return p


def _vm_dir(env, vm_id, owner=None):
    root = owned_vm_dir(env.base, vm_id, ME, owner=owner)
    (root / "serial-console.log").write_text(f"last words of {vm_id}\n")
    return root


def _setup(env):
    b = env.backend(jailer="/bin/false", firecracker="/opt/fc/firecracker", kernel="/bin/false", name=ME)
    assert b.ensure_host_ready()
    b.tracked_provider = None  # the database knows no agents here; tracked = this process's VMs
    return b


def _allocate(env, b, vm_id, scaler=ME, tap=True, rules=True):
    from network.ipalloc_db import DbIpAllocator

    alloc = DbIpAllocator(env.cidr, env.gateway).allocate(vm_id, scaler)
    if tap:
        netlink.create_tap(alloc.tap_device, env.bridge, netns=env.netns)
    if rules:
        b.nft.apply_agent(b.rule_spec(alloc.ip, {}, [f"{env.gateway}:53"]))
    return alloc


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_cleanup_orphans_plans_then_applies_the_passes_and_spares_live_vms(fc_env):
    env = fc_env
    b = _setup(env)
    ids = {
        k: f"scaler-firecracker-{n:08x}" for n, k in enumerate(["dead", "other", "alive", "nodb", "stray"], start=0xA0)
    }
    dead = _allocate(env, b, ids["dead"])
    _vm_dir(env, ids["dead"])
    other = _allocate(env, b, ids["other"], scaler=OTHER)
    alive = _allocate(env, b, ids["alive"])
    proc = _start_in_chroot("bash", _vm_dir(env, ids["alive"]))  # running, identity unconfirmed: spared
    _vm_dir(env, ids["nodb"])
    subprocess.run(
        ["ip", "netns", "exec", env.netns, "ip", "tuntap", "add", "kici-1a2b3c4d", "mode", "tap"], check=True
    )
    sink_before = len(env.log_lines)
    try:
        plan = b.orphans.plan_orphans()
        assert {(t.pass_no, t.agent_id or t.tap) for t in plan} == {
            (1, ids["dead"]), (2, ids["nodb"]), (3, "kici-1a2b3c4d"), (4, ids["dead"]),
        }  # fmt: skip
        assert (env.base / "firecracker" / ids["nodb"]).exists()  # planning touched nothing
        report = b.orphans.apply_orphans(plan)
        assert (report.cleaned, report.rules_deleted, report.skipped) == (3, 1, [])
        assert not IpAllocation.objects.filter(vm_id=ids["dead"]).exists()
        assert (
            not (env.base / "firecracker" / ids["dead"]).exists()
            and not (env.base / "firecracker" / ids["nodb"]).exists()
        )
        links = env.links()
        assert dead.tap_device not in links and "kici-1a2b3c4d" not in links
        assert other.tap_device in links and alive.tap_device in links
        rules = {str(a) for a in b.nft.list_agents()}
        assert dead.ip not in rules and {other.ip, alive.ip} <= rules
        assert (env.base / "firecracker" / ids["alive"]).exists() and proc.poll() is None
        assert any(r["message"] == f"last words of {ids['dead']}" for _, _, r in env.log_lines[sink_before:])
        assert b.orphans.cleanup_orphans() == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_a_stale_plan_is_rechecked_and_a_target_that_came_alive_is_skipped(fc_env):
    env = fc_env
    b = _setup(env)
    vm_id = "scaler-firecracker-000000b1"
    _vm_dir(env, vm_id)
    plan = b.orphans.plan_orphans()
    assert [t.agent_id for t in plan] == [vm_id]
    b.tracked_provider = lambda name: {vm_id}  # another worker started spawning it meanwhile
    report = b.orphans.apply_orphans(plan)
    assert report.cleaned == 0 and report.skipped == [(plan[0], "the VM is live now")]
    assert (env.base / "firecracker" / vm_id).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_vm_dirs_of_a_second_console_or_without_an_owner_file_survive_every_sweep_and_reclaim(fc_env, caplog):
    from scalers.backends.ownership import current_owner

    env = fc_env
    b = _setup(env)
    second = Owner(current_owner(ME).installation_id, "console-b", ME)
    theirs, legacy, mine = (f"scaler-firecracker-000000e{i}" for i in range(3))
    _vm_dir(env, theirs, owner=second)
    (env.base / "firecracker" / legacy / "root").mkdir(parents=True)  # made before owner files existed
    _vm_dir(env, mine)
    with caplog.at_level("WARNING", logger="scalers.backends.firecracker.sweeps"):
        plan = b.orphans.plan_orphans()
    assert [(t.pass_no, t.agent_id) for t in plan] == [(2, mine)]
    assert any(legacy in r.getMessage() and "ownership unknown" in r.getMessage() for r in caplog.records)
    assert b.orphans.cleanup_orphans() == 1
    assert b.reap_unowned(theirs) is False and b.reap_unowned(legacy) is False
    top = env.base / "firecracker"
    assert sorted(p.name for p in top.iterdir()) == sorted([theirs, legacy])
    # a plan made while the dir was this console's is re-checked against its owner file before acting
    _vm_dir(env, mine)
    plan = b.orphans.plan_orphans()
    jail.write_owner(jail.owner_path(env.base, mine), {"kici-managed": "true", **second.labels()})
    report = b.orphans.apply_orphans(plan)
    assert report.skipped == [(plan[0], "skipped: another console's (kici-instance-id=console-b)")]
    assert (top / mine).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_reap_unowned_kills_a_confirmed_vm_and_removes_only_its_directory_when_another_scaler_owns_the_ip(
    fc_env,
):
    env = fc_env
    b = _setup(env)
    assert b.reap_unowned("scaler-firecracker-000000c0") is False
    vm_id = "scaler-firecracker-000000c1"
    alloc = _allocate(env, b, vm_id, scaler=OTHER)
    proc = _start_in_chroot("firecracker", _vm_dir(env, vm_id))
    try:
        assert b.reap_unowned(vm_id) is True
        proc.wait(5)
        assert not (env.base / "firecracker" / vm_id).exists()
        assert IpAllocation.objects.filter(vm_id=vm_id, scaler_name=OTHER).exists()
        assert alloc.tap_device in env.links() and alloc.ip in {str(a) for a in b.nft.list_agents()}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_reap_unowned_of_this_scalers_vm_releases_everything_and_spares_an_unconfirmed_process(fc_env):
    env = fc_env
    b = _setup(env)
    vm_id = "scaler-firecracker-000000d1"
    alloc = _allocate(env, b, vm_id)
    proc = _start_in_chroot("sshd", _vm_dir(env, vm_id))
    try:
        assert b.reap_unowned(vm_id) is True
        time.sleep(0.2)
        assert proc.poll() is None  # never signalled: not provably this VM's process
        assert not IpAllocation.objects.filter(vm_id=vm_id).exists()
        assert alloc.tap_device not in env.links() and alloc.ip not in {str(a) for a in b.nft.list_agents()}
    finally:
        proc.kill()
        proc.wait()


def test_the_periodic_sweep_never_runs_twice_at_once():
    gate, entered = threading.Event(), threading.Event()

    def slow():
        entered.set()
        gate.wait(5)
        return 7

    sweep = PeriodicSweep(slow, interval_s=3600)
    results = []
    t = threading.Thread(target=lambda: results.append(sweep.run_once()))
    t.start()
    assert entered.wait(5)
    assert sweep.run_once() is None  # a second run while the first is in progress is skipped
    gate.set()
    t.join(5)
    assert results == [7] and sweep.runs == 1


def test_the_periodic_sweep_ticks_until_stopped():
    calls = []
    sweep = PeriodicSweep(lambda: calls.append(time.monotonic()), interval_s=0.05).start()
    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sweep.stop()
    n = len(calls)
    time.sleep(0.2)
    assert n >= 3 and len(calls) == n
