"""IP allocator and address helpers (SPEC h; CASES IP-01..IP-11)."""

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
def test_addresses_convert_to_numbers_and_back(ip, number):  # IP-01, IP-03
    assert ip_to_number(ip) == number
    assert number_to_ip(number) == ip


@pytest.mark.parametrize("bad", ["not-an-ip", "10.0.0", "10.0.0.256", "", " 10.0.0.1", None])
def test_bad_addresses_are_refused(bad):  # IP-02
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
def test_cidr_usable_ranges(cidr, prefix, start, end):  # IP-04
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
def test_macs_derive_from_the_address(ip, mac):  # IP-06
    assert mac_for_ip(ip) == mac


def test_a_mac_for_a_non_address_is_refused():
    with pytest.raises(ValueError, match="Invalid IP address"):
        mac_for_ip("not-an-ip")


def test_the_first_allocation_skips_the_gateway():  # IP-08
    a = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={}).allocate("scaler-firecracker-1d993749")
    assert (a.ip, a.mac, a.tap_device) == ("10.0.0.2", "06:00:AC:00:00:02", "kici-1d993749")
    assert (a.gateway, a.netmask, a.prefix) == ("10.0.0.1", "255.255.255.0", 24)


def test_taken_addresses_are_skipped():  # IP-09
    alloc = IpAllocator("10.0.0.0/24", "10.0.0.1", taken={"10.0.0.2": "vm-a", "10.0.0.3": None})
    assert alloc.allocate("vm-b").ip == "10.0.0.4"


def test_release_makes_the_lowest_address_available_again():  # IP-11
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
