"""IP allocator and address helpers."""

from __future__ import annotations

import pytest

from network.ipalloc import (
    IpAllocator,
    IpPoolExhausted,
    ip_to_number,
    mac_for_ip,
    number_to_ip,
    parse_cidr,
)


@pytest.mark.parametrize(
    "ip, number",
    [("0.0.0.0", 0), ("255.255.255.255", 4294967295), ("10.0.0.1", 167772161), ("192.168.1.100", 3232235876)],
)
def test_addresses_convert_to_numbers_and_back(ip, number):
    assert ip_to_number(ip) == number
    assert number_to_ip(number) == ip


@pytest.mark.parametrize("bad", ["not-an-ip", "10.0.0", "10.0.0.256", "", " 10.0.0.1", None])
def test_bad_addresses_are_refused(bad):
    with pytest.raises(ValueError, match="Invalid IP address"):
        ip_to_number(bad)


@pytest.mark.parametrize("bad", [-1, 2**32, "1"])
def test_bad_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="Invalid IP number"):
        number_to_ip(bad)


@pytest.mark.parametrize(
    "cidr, prefix, start, end",
    [
        ("10.0.0.0/24", 24, "10.0.0.1", "10.0.0.254"),
        ("192.168.100.0/28", 28, "192.168.100.1", "192.168.100.14"),
        ("10.0.0.0/22", 22, "10.0.0.1", "10.0.3.254"),
        ("10.0.0.0/30", 30, "10.0.0.1", "10.0.0.2"),
    ],
)
def test_cidr_usable_ranges(cidr, prefix, start, end):
    r = parse_cidr(cidr)
    assert (r.prefix, r.start, r.end) == (prefix, start, end)


@pytest.mark.parametrize("bad", ["10.0.0.0", "10.0.0.1/24", "10.0.0.0/31", "10.0.0.0/33", "x/24"])
def test_unusable_cidrs_are_refused(bad):
    with pytest.raises(ValueError, match="Invalid"):
        parse_cidr(bad)


@pytest.mark.parametrize(
    "ip, mac",
    [("10.0.0.5", "06:00:AC:00:00:05"), ("10.0.1.42", "06:00:AC:00:01:2A"), ("10.255.255.255", "06:00:AC:FF:FF:FF")],
)
def test_macs_derive_from_the_address(ip, mac):
    assert mac_for_ip(ip) == mac


def test_a_mac_for_a_non_address_is_refused():
    with pytest.raises(ValueError, match="Invalid IP address"):
        mac_for_ip("not-an-ip")


def test_the_first_allocation_skips_the_gateway():
    a = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={}).allocate("scaler-firecracker-1d993749")
    assert (a.ip, a.mac, a.tap_device) == ("10.0.0.2", "06:00:AC:00:00:02", "kici-1d993749")
    assert (a.gateway, a.netmask, a.prefix) == ("10.0.0.1", "255.255.255.0", 24)


def test_taken_addresses_are_skipped():
    alloc = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={"10.0.0.2": "vm-a", "10.0.0.3": None})
    assert alloc.allocate("vm-b").ip == "10.0.0.4"


def test_release_makes_the_lowest_address_available_again():
    alloc = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={})
    assert [alloc.allocate(v).ip for v in ("vm-001", "vm-002", "vm-003")] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert alloc.release("vm-001") == "10.0.0.2"
    assert alloc.allocate("vm-004").ip == "10.0.0.2"
    assert alloc.release_by_ip("10.0.0.3") == "vm-002"
    assert alloc.allocate("vm-005").ip == "10.0.0.3"
    assert alloc.release("vm-unknown") is None
    assert alloc.release_by_ip("10.0.0.200") is None


def test_allocating_twice_for_one_vm_returns_its_address():
    alloc = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={})
    assert alloc.allocate("vm-1").ip == alloc.allocate("vm-1").ip == "10.0.0.2"


def test_an_exhausted_pool_says_which_range():
    alloc = IpAllocator("10.0.0.0/30", "10.0.0.1", taken={})
    assert alloc.allocate("vm-1").ip == "10.0.0.2"
    with pytest.raises(IpPoolExhausted, match="IP pool exhausted: no available addresses in 10.0.0.1-10.0.0.2"):
        alloc.allocate("vm-2")


def test_state_is_rebuilt_from_rows_and_interfaces_never_from_empty():
    alloc = IpAllocator.from_live_state(
        "10.0.0.0/24",
        "10.0.0.1",
        allocations=[("10.0.0.2", "vm-a"), ("10.0.0.4", "vm-b"), ("192.168.9.9", "vm-elsewhere")],
        interface_addresses=["10.0.0.3", "10.0.0.1"],
    )
    assert alloc.taken() == {"10.0.0.1": None, "10.0.0.2": "vm-a", "10.0.0.3": None, "10.0.0.4": "vm-b"}
    assert alloc.allocate("vm-c").ip == "10.0.0.5"
    assert alloc.allocate("vm-a").ip == "10.0.0.2"
    with pytest.raises(TypeError):
        IpAllocator("10.0.0.0/24", "10.0.0.1")  # live state is required


# -- the database-backed allocator ------------------------------------------------------


@pytest.fixture
def db_alloc(db):
    from network.ipalloc_db import DbIpAllocator

    return DbIpAllocator("10.0.0.0/24", "10.0.0.1")


def test_db_allocations_are_rows_and_come_back_for_the_same_vm(db_alloc):
    from network.models import IpAllocation

    a = db_alloc.allocate("scaler-firecracker-1d993749", "fc1")
    assert (a.ip, a.mac, a.tap_device) == ("10.0.0.2", "06:00:AC:00:00:02", "kici-1d993749")
    row = IpAllocation.objects.get(pk="10.0.0.2")
    assert (row.vm_id, row.scaler_name, row.tap_device, row.mac_address) == (
        "scaler-firecracker-1d993749",
        "fc1",
        "kici-1d993749",
        "06:00:AC:00:00:02",
    )
    assert db_alloc.allocate("scaler-firecracker-1d993749", "fc1").ip == "10.0.0.2"
    assert db_alloc.allocate("scaler-firecracker-00000002", "fc2").ip == "10.0.0.3"


def test_db_allocation_sees_other_scalers_rows_and_interface_addresses(db):
    from network.ipalloc_db import DbIpAllocator
    from network.models import IpAllocation

    IpAllocation.objects.create(
        ip="10.0.0.2", vm_id="vm-other", scaler_name="fc-b", tap_device="kici-other", mac_address="x"
    )
    alloc = DbIpAllocator("10.0.0.0/24", "10.0.0.1", interface_addresses=lambda: ["10.0.0.3"])
    assert alloc.allocate("vm-mine", "fc-a").ip == "10.0.0.4"


def test_db_release_frees_the_address(db_alloc):
    for vm in ("vm-001", "vm-002", "vm-003"):
        db_alloc.allocate(vm, "fc1")
    assert db_alloc.release("vm-001") == "10.0.0.2"
    assert db_alloc.release("vm-001") is None
    assert db_alloc.allocate("vm-004", "fc1").ip == "10.0.0.2"
    assert db_alloc.release_by_ip("10.0.0.3") == "vm-002"
    assert [r.ip for r in db_alloc.allocations("fc1")] == ["10.0.0.2", "10.0.0.4"]


def test_a_tap_name_held_by_another_vm_is_not_reused(db_alloc):
    a = db_alloc.allocate("scaler-a-1d993749", "fc1")
    b = db_alloc.allocate("scaler-b-1d993749", "fc1")
    assert a.tap_device == "kici-1d993749"
    assert b.tap_device != a.tap_device and len(b.tap_device) <= 15


def test_sixteen_consecutive_primary_key_conflicts_give_up(db):
    from network.ipalloc_db import DbIpAllocator, IpAllocationConflict
    from network.models import IpAllocation

    for n in range(2, 40):
        IpAllocation.objects.create(
            ip=f"10.0.0.{n}", vm_id=f"vm-{n}", scaler_name="other", tap_device=f"t{n}", mac_address="x"
        )

    class StaleReader(DbIpAllocator):
        """Reads as if no row existed, as a peer that keeps winning every race would look."""

        def _live(self):
            return IpAllocator(self.cidr, self.gateway, taken={})

    with pytest.raises(IpAllocationConflict, match="16 consecutive ip_allocations_pkey conflicts"):
        StaleReader("10.0.0.0/24", "10.0.0.1").allocate("vm-new", "fc1")
    assert not IpAllocation.objects.filter(vm_id="vm-new").exists()
    # A reader that loses fewer than 16 races re-picks and succeeds.
    IpAllocation.objects.filter(ip__in=[f"10.0.0.{n}" for n in range(10, 40)]).delete()
    assert StaleReader("10.0.0.0/24", "10.0.0.1").allocate("vm-new", "fc1").ip == "10.0.0.10"


@pytest.mark.django_db(transaction=True)
def test_concurrent_allocators_never_hand_out_one_address_twice():
    import threading

    from django.db import connection

    from network.ipalloc_db import DbIpAllocator
    from network.models import IpAllocation

    results, errors = [], []
    start = threading.Barrier(6)

    def worker(n):
        try:
            alloc = DbIpAllocator("10.0.0.0/24", "10.0.0.1")
            start.wait()
            for k in range(6):
                results.append(alloc.allocate(f"vm-{n}-{k}", f"fc{n}").ip)
        except Exception as exc:  # noqa: BLE001 - any failure of a worker is reported by the assert below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == len(set(results)) == 36
    assert IpAllocation.objects.count() == 36
