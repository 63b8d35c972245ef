"""Host-access grammar and resolution."""

from __future__ import annotations

import ipaddress

import pytest

from network.host_access import (
    ConsoleService,
    HostAccessError,
    agent_facing_storage_url,
    host_access_warnings,
    parse_host_access,
    parse_host_access_entry,
    resolve_agent_host_access,
    storage_host_access_entries,
)


def net(text):
    return ipaddress.ip_network(text)


# -- grammar -----------------------------------------------------------------------------------


def test_a_bare_port_means_that_port_on_any_address():
    e = parse_host_access_entry("5000")
    assert (e.daddr, e.port, e.family) == (None, 5000, "ipv4")


def test_a_cidr_with_a_port():
    e = parse_host_access_entry("10.98.0.0/24:443")
    assert (e.daddr, e.port) == (net("10.98.0.0/24"), 443)


def test_a_star_with_a_port():
    e = parse_host_access_entry("*:10143")
    assert (e.daddr, e.port) == (None, 10143)


def test_an_address_without_a_port_means_every_port():
    e = parse_host_access_entry("192.168.1.40")
    assert (e.daddr, e.port) == (net("192.168.1.40/32"), None)
    assert e.canonical == "192.168.1.40"


@pytest.mark.parametrize(
    "text, daddr, port",
    [
        ("*", None, None),
        ("10.0.0.1:*", "10.0.0.1/32", None),
        ("  172.30.0.1:53 ", "172.30.0.1/32", 53),
        ("0.0.0.0/0:22", "0.0.0.0/0", 22),
        ("10.0.0.0/8", "10.0.0.0/8", None),
        ("65535", None, 65535),
    ],
)
def test_other_accepted_ipv4_shapes(text, daddr, port):
    e = parse_host_access_entry(text)
    assert e.daddr == (net(daddr) if daddr else None)
    assert e.port == port


def test_it_refuses_a_hostname_and_says_why():
    with pytest.raises(HostAccessError) as exc:
        parse_host_access_entry("registry.internal:5000")
    msg = str(exc.value)
    assert '"registry.internal:5000"' in msg
    assert 'which is not an IPv4 address, an IPv4 CIDR, or "*"' in msg
    assert "Hostnames are not accepted" in msg


# Every way an entry is refused, with the whole message: it names the entry's place in the list and
# the entry, and says what is wrong with it (not a neighbouring sentence: "::1" is IPv6, not a name).
BAD_ENTRIES = [
    ("", 'hostAccess entry is empty (got "")'),
    ("\t", 'hostAccess entry is empty (got "\t")'),
    (5000, "hostAccess entry must be a string, got 5000"),
    (None, "hostAccess entry must be a string, got null"),
    (["*:53"], 'hostAccess entry must be a string, got ["*:53"]'),
    ("1" * 70, f'hostAccess entry "{"1" * 40}…" is 70 characters long; an entry is at most 64'),
    # whitespace inside an entry (around it is trimmed)
    ("127.0.0.1 :8000", 'hostAccess entry "127.0.0.1 :8000" has whitespace inside it: did you mean "127.0.0.1:8000"?'),
    ("10.0.0.1:\t80", 'hostAccess entry "10.0.0.1:\t80" has whitespace inside it: did you mean "10.0.0.1:80"?'),
    ("[fd00::1] :9000", 'hostAccess entry "[fd00::1] :9000" has whitespace inside it: did you mean "[fd00::1]:9000"?'),
    ("10.0.0.1:5 3", 'hostAccess entry "10.0.0.1:5 3" has whitespace inside it: an entry is written without spaces'),
    ("ci runner:22", 'hostAccess entry "ci runner:22" has whitespace inside it: an entry is written without spaces'),
    # ports
    ("0", 'hostAccess entry "0" has port 0, outside 1-65535'),
    ("65536", 'hostAccess entry "65536" has port 65536, outside 1-65535'),
    ("*:70000", 'hostAccess entry "*:70000" has port 70000, outside 1-65535'),
    ("-1", 'hostAccess entry "-1" has port -1, outside 1-65535'),
    ("*:-1", 'hostAccess entry "*:-1" has port -1, outside 1-65535'),
    ("[::1]:-8", 'hostAccess entry "[::1]:-8" has port -8, outside 1-65535'),
    ("*:http", 'hostAccess entry "*:http" has port "http": a port is written as digits, 1-65535'),
    ("10.0.0.1:+80", 'hostAccess entry "10.0.0.1:+80" has port "+80": a port is written as digits, 1-65535'),
    (
        "*:4000/tcp",
        'hostAccess entry "*:4000/tcp" names a protocol after port 4000: an entry opens its port on TCP and UDP '
        'alike, write "*:4000"',
    ),
    (
        "10.0.0.1:",
        'hostAccess entry "10.0.0.1:" has no port after the ":": write a port 1-65535 or "*", or leave out the ":" '
        "for every port",
    ),
    # addresses
    (
        ":53",
        'hostAccess entry ":53" has no address before the ":": write "*:53" (or just "53") for port 53 on any '
        "IPv4 host address",
    ),
    (
        "host:-1",
        'hostAccess entry "host:-1" names "host", which is not an IPv4 address, an IPv4 CIDR, or "*". Hostnames '
        "are not accepted: a firewall rule needs an address, and a name can resolve to a different one later. "
        'IPv6 addresses go in brackets, e.g. "[fd00::1]:9000".',
    ),
    (
        "192.168.1.256",
        'hostAccess entry "192.168.1.256" names "192.168.1.256", which is not a valid IPv4 address: octet 256 is '
        "above 255",
    ),
    (
        "10.0.0.1:80:90",
        'hostAccess entry "10.0.0.1:80:90" has more than one ":": an IPv4 entry is address:port, and IPv6 '
        'addresses go in brackets, e.g. "[fd00::1]:9000"',
    ),
    (
        "10.0.0.1/24:443",
        'hostAccess entry "10.0.0.1/24:443" has CIDR "10.0.0.1/24" with host bits set, which is ambiguous: write '
        '"10.0.0.0/24" for the network or "10.0.0.1" for the one address',
    ),
    # IPv6 is accepted in brackets only
    ("::1", 'hostAccess entry "::1" is an IPv6 address without brackets: write "[::1]"'),
    (
        "fd00::1:9000",
        'hostAccess entry "fd00::1:9000" is an IPv6 address without brackets: write "[fd00::1:9000]" for that '
        'address, or "[fd00::1]:9000" for port 9000 on fd00::1',
    ),
    ("2001:db8::/32", 'hostAccess entry "2001:db8::/32" is an IPv6 CIDR without brackets: write "[2001:db8::/32]"'),
    (
        "fd00::1:http",
        'hostAccess entry "fd00::1:http" starts with IPv6 address fd00::1 without brackets: write '
        '"[fd00::1]:<port>", or "[fd00::1]" for every port',
    ),
    ("fe80::1%eth0", 'hostAccess entry "fe80::1%eth0" has a zone index; scoped IPv6 addresses are not accepted'),
    ("[fd00::1", 'hostAccess entry "[fd00::1" opens a bracket but never closes it'),
    ("[fd00::1]x", 'hostAccess entry "[fd00::1]x" has "x" after the bracket; expected nothing or :port'),
    (
        "[10.0.0.1]:80",
        'hostAccess entry "[10.0.0.1]:80" has IPv4 address 10.0.0.1 in brackets, which are for IPv6: write '
        '"10.0.0.1:80"',
    ),
    (
        "[fd00::zz]",
        'hostAccess entry "[fd00::zz]" has "fd00::zz" in brackets, which is not an IPv6 address or IPv6 CIDR',
    ),
    ("[fd00::1]:0", 'hostAccess entry "[fd00::1]:0" has port 0, outside 1-65535'),
]

# Accepted entries and their normal form, whitespace around them trimmed.
GOOD_ENTRIES = [
    ("5000", "*:5000"),
    ("*:5000", "*:5000"),
    (" 10.0.0.1", "10.0.0.1"),
    ("10.0.0.1:5000 ", "10.0.0.1:5000"),
    ("\t10.98.0.0/24:443\n", "10.98.0.0/24:443"),
    ("10.0.0.1:*", "10.0.0.1"),
    ("*", "*"),
    ("65535", "*:65535"),
    ("[fd00::1]:9000", "[fd00::1]:9000"),
    ("[fd00::/64]:443", "[fd00::/64]:443"),
    (" [::1] ", "[::1]"),
]


@pytest.mark.parametrize("entry, message", BAD_ENTRIES, ids=[repr(e)[:30] for e, _ in BAD_ENTRIES])
def test_each_refused_entry_is_named_with_its_index_and_what_is_wrong(entry, message):
    with pytest.raises(HostAccessError) as exc:
        parse_host_access(["*:53", entry])
    assert str(exc.value) == f"hostAccess[1]: {message}"


@pytest.mark.parametrize("entry, canonical", GOOD_ENTRIES)
def test_each_accepted_entry_parses_to_its_normal_form(entry, canonical):
    (parsed,) = parse_host_access([entry])
    assert parsed.canonical == canonical and parsed.text == entry.strip()


@pytest.mark.parametrize(
    "text,reason",
    [
        ("192.168.1.256", 'names "192.168.1.256", which is not a valid IPv4 address: octet 256 is above 255'),
        ("999.0.0.1:443", "not a valid IPv4 address: octet 999 is above 255"),
        ("10.0.0:80", "not a valid IPv4 address: it has 3 dot-separated parts, an IPv4 address has 4"),
        ("1.2.3.4.5", "it has 5 dot-separated parts"),
        ("10..0.1", "one of its four octets is empty"),
        ("010.0.0.1", 'octet "010" has a leading zero'),
        ("10.0.0.0/33:443", "not a valid IPv4 CIDR: prefix /33 is above 32"),
        ("10.0.0.1/024", "not a valid IPv4 CIDR: prefix /024 has a leading zero"),
        ("10.0.0.0/", 'the prefix after "/" is "", not a number 0-32'),
        ("172.30.0.1:08000", 'has port "08000" with a leading zero: write 8000'),
        ("[fd00::1]:0443", 'has port "0443" with a leading zero: write 443'),
        ("080", 'has port "080" with a leading zero: write 80'),
    ],
)
def test_a_dotted_number_that_is_no_address_says_what_is_wrong_not_hostnames(text, reason):
    with pytest.raises(HostAccessError) as exc:
        parse_host_access_entry(text)
    msg = str(exc.value)
    assert msg.startswith(f'hostAccess entry "{text}" ') and reason in msg
    assert "Hostnames" not in msg and "hostname" not in msg.lower()


@pytest.mark.parametrize(
    "text,hint",
    [
        (":53", 'has no address before the ":": write "*:53" (or just "53") for port 53 on any IPv4 host address'),
        (":", 'has no address before the ":": write an IPv4 address, an IPv4 CIDR or "*" before the ":"'),
        (":http", 'write an IPv4 address, an IPv4 CIDR or "*"'),
    ],
)
def test_an_empty_address_before_the_port_says_so_and_suggests_the_wildcard(text, hint):
    with pytest.raises(HostAccessError) as exc:
        parse_host_access_entry(text)
    msg = str(exc.value)
    assert msg.startswith(f'hostAccess entry "{text}" ') and hint in msg
    assert 'names ""' not in msg and "Hostnames" not in msg


def test_loopback_and_every_port_entries_are_accepted_with_a_warning_and_others_are_not():
    entries = [
        "127.0.0.1:5432",
        "[::1]",
        "127.0.0.0/8:80",
        "0.0.0.0/0",
        "*",
        "10.0.0.0/8",
        "*:53",
        "172.30.0.1:53",
        "172.30.0.1",
        "[fd00::1]:9000",
        "bad entry",
    ]
    for text in entries[:-1]:
        parse_host_access_entry(text)  # all accepted
    warnings = host_access_warnings(entries)
    assert len(warnings) == 6
    assert warnings[0].startswith(
        'hostAccess entry "127.0.0.1:5432" names the host\'s loopback (127.0.0.1): agents cannot reach'
    )
    assert 'hostAccess entry "[::1]" names the host\'s loopback (::1)' in warnings[1]
    assert "(127.0.0.0/8)" in warnings[2]
    assert warnings[3].startswith('hostAccess entry "0.0.0.0/0" opens every port on every address of this host')
    assert warnings[4].startswith('hostAccess entry "*" opens every port on every address of this host')
    assert warnings[5].startswith('hostAccess entry "10.0.0.0/8" opens every port on every address in 10.0.0.0/8')
    assert host_access_warnings([]) == []


@pytest.mark.parametrize("text", ["", "   ", "\t"])
def test_it_refuses_an_empty_entry(text):
    with pytest.raises(HostAccessError, match="hostAccess entry is empty"):
        parse_host_access_entry(text)


@pytest.mark.parametrize("text, hint", [("10.0.0.1/24:443", '"10.0.0.0/24"'), ("[fd00::1/64]:443", '"[fd00::/64]"')])
def test_it_refuses_a_cidr_with_host_bits_set_and_says_so(text, hint):
    with pytest.raises(HostAccessError, match="host bits set") as exc:
        parse_host_access_entry(text)
    assert f'"{text}"' in str(exc.value)
    assert hint in str(exc.value)


def test_bracketed_ipv6_entries_parse():
    a = parse_host_access_entry("[fd00::1]:9000")
    b = parse_host_access_entry("[fd00::/64]:443")
    c = parse_host_access_entry("[fd00::1]")
    assert (a.daddr, a.port, a.family) == (net("fd00::1/128"), 9000, "ipv6")
    assert (b.daddr, b.port, b.family) == (net("fd00::/64"), 443, "ipv6")
    assert (c.daddr, c.port, c.family) == (net("fd00::1/128"), None, "ipv6")
    assert [x.canonical for x in (a, b, c)] == ["[fd00::1]:9000", "[fd00::/64]:443", "[fd00::1]"]


@pytest.mark.parametrize("text", ["[fd00::1", "[fd00::1]x", "[10.0.0.1]:80", "[fe80::1%eth0]:22", "[fd00::1]:0"])
def test_it_refuses_malformed_brackets(text):
    with pytest.raises(HostAccessError) as exc:
        parse_host_access_entry(text)
    assert f'"{text}"' in str(exc.value)


def test_a_list_is_all_or_nothing_and_names_the_index():
    with pytest.raises(HostAccessError, match=r"hostAccess\[1\]: .*registry"):
        parse_host_access(["*:4000", "registry:5000", "*:9000"])


# -- storage endpoint (g.2) --------------------------------------------------------------------


def test_storage_at_an_ip_literal_is_scoped_to_that_address_and_port():
    assert storage_host_access_entries("http://192.168.1.5:9000") == ["192.168.1.5:9000"]


def test_storage_at_an_ip_literal_without_a_port_uses_the_scheme_port():
    assert storage_host_access_entries("http://10.0.0.9") == ["10.0.0.9:80"]
    assert storage_host_access_entries("https://10.0.0.9/bucket") == ["10.0.0.9:443"]


def test_storage_at_a_name():
    assert storage_host_access_entries("https://s3.us-east-1.amazonaws.com") == []
    assert storage_host_access_entries("https://minio.lan:9443") == ["*:9443"]


def test_filesystem_storage_urls():
    url = agent_facing_storage_url("filesystem", console_port=4000)
    assert url == "http://127.0.0.1:4000"
    assert storage_host_access_entries(url) == ["127.0.0.1:4000"]
    assert storage_host_access_entries(agent_facing_storage_url("filesystem", fs_base_url="http://ci.lan:8080")) == [
        "*:8080"
    ]
    assert storage_host_access_entries(agent_facing_storage_url(None)) == []


def test_s3_prefers_the_external_endpoint():
    assert agent_facing_storage_url("s3", external_endpoint="http://a:1", endpoint="http://b:2") == "http://a:1"
    assert agent_facing_storage_url("s3", endpoint="http://b:2") == "http://b:2"


@pytest.mark.parametrize("url", [None, "", "not a url", "ftp://10.0.0.1/x", "http://10.0.0.1:99999", "http://[::1"])
def test_unusable_storage_urls_give_nothing(url):
    assert storage_host_access_entries(url) == []


def test_storage_at_an_ipv6_literal_is_bracketed():
    assert storage_host_access_entries("http://[fd00::9]:9000") == ["[fd00::9]:9000"]


# -- resolution (g.3) --------------------------------------------------------------------------


def test_the_default_is_gateway_dns_and_the_console_port():
    resolved = resolve_agent_host_access(None, "ws://10.0.0.1:4000/ws", "172.30.0.1", [])
    assert resolved == ["172.30.0.1:53", "172.30.0.1:4000"]


def test_the_console_port_comes_from_the_scheme_when_the_url_has_none():
    resolved = resolve_agent_host_access(None, "wss://ci.example.com/ws", "172.30.0.1")
    assert resolved == ["172.30.0.1:53", "172.30.0.1:443"]
    assert resolve_agent_host_access(None, "ws://host/ws", "172.30.0.1") == ["172.30.0.1:53", "172.30.0.1:80"]


def test_an_unparseable_console_url_is_left_out():
    assert resolve_agent_host_access(None, "::::", "172.30.0.1", ["*:9000"]) == ["172.30.0.1:53", "*:9000"]
    assert resolve_agent_host_access(None, "gopher://x/", "172.30.0.1", ["*:9000"]) == ["172.30.0.1:53", "*:9000"]


def test_duplicates_keep_the_first_occurrence():
    assert resolve_agent_host_access(None, "ws://10.0.0.1:4000/ws", "172.30.0.1", ["172.30.0.1:4000"]) == [
        "172.30.0.1:53",
        "172.30.0.1:4000",
    ]
    assert resolve_agent_host_access(None, "ws://x:4000", "10.0.0.1", ["10.0.0.1:53", "*:9", "*:9"]) == [
        "10.0.0.1:53",
        "10.0.0.1:4000",
        "*:9",
    ]


def test_an_allowlist_alone_keeps_the_default():
    policy = {"allowlist": ["10.1.0.0/16"]}
    resolved = resolve_agent_host_access(policy, "ws://10.0.0.1:4000/ws", "172.30.0.1")
    assert resolved == ["172.30.0.1:53", "172.30.0.1:4000"]


def test_an_explicit_list_wins_outright_even_when_empty():
    assert resolve_agent_host_access({"hostAccess": []}, "ws://10.0.0.1:4000/ws", "172.30.0.1", ["*:9000"]) == []
    assert resolve_agent_host_access({"host_access": ["*:22", "*:22"]}, "ws://x:1", "172.30.0.1") == ["*:22", "*:22"]

    class Policy:
        host_access = ["10.0.0.1:5432"]

    assert resolve_agent_host_access(Policy(), "ws://x:1", "172.30.0.1", ["*:9000"]) == ["10.0.0.1:5432"]


def test_the_documented_examples():
    s3 = storage_host_access_entries("http://192.168.1.5:9000")
    assert resolve_agent_host_access(None, "ws://10.1.2.3:4000/ws", "172.30.0.1", s3) == [
        "172.30.0.1:53",
        "172.30.0.1:4000",
        "192.168.1.5:9000",
    ]
    aws = storage_host_access_entries("https://s3.amazonaws.com")
    assert resolve_agent_host_access(None, "ws://10.0.0.1:8080/ws", "10.0.0.1", aws) == ["10.0.0.1:53", "10.0.0.1:8080"]
    fs = storage_host_access_entries(agent_facing_storage_url("filesystem", console_port=4000))
    assert resolve_agent_host_access(None, "ws://10.0.0.1:4000/ws", "10.0.0.1", fs) == [
        "10.0.0.1:53",
        "10.0.0.1:4000",
        "127.0.0.1:4000",
    ]


def test_an_ipv6_gateway_gets_a_bracketed_dns_entry():
    resolved = resolve_agent_host_access(None, "ws://x:4000", "fd13::1")
    assert resolved == ["[fd13::1]:53", "[fd13::1]:4000"]
    assert [parse_host_access_entry(e).family for e in resolved] == ["ipv6", "ipv6"]


def test_the_console_port_is_opened_on_the_gateways_never_on_every_host_address():
    """Not ``*:<port>``: the host's other addresses may carry the operator listener on that port."""
    resolved = resolve_agent_host_access(None, "http://172.30.0.1:8000", "172.30.0.1", [], "fd13::1")
    assert resolved == ["172.30.0.1:53", "172.30.0.1:8000", "[fd13::1]:8000"]
    parsed = [parse_host_access_entry(e) for e in resolved]
    assert all(e.daddr is not None and e.daddr.num_addresses == 1 for e in parsed), resolved


def test_every_resolved_default_entry_parses():
    resolved = resolve_agent_host_access(
        None, "wss://ci.example.com/ws", "172.30.0.1", storage_host_access_entries("https://minio.lan:9443")
    )
    assert [parse_host_access_entry(e).canonical for e in resolved] == ["172.30.0.1:53", "172.30.0.1:443", "*:9443"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("*:4000", "TCP and UDP port 4000 on any IPv4 address of the host"),
        ("192.168.1.40", "every port and protocol on 192.168.1.40"),
        ("[fd00::/64]:443", "TCP and UDP port 443 on host addresses in fd00::/64"),
        ("*", "every port and protocol on any IPv4 address of the host"),
    ],
)
def test_entries_are_explained_in_plain_words(text, words):
    from network.host_access import describe_host_access_entry

    assert describe_host_access_entry(parse_host_access_entry(text)) == words


def test_a_hostname_error_reads_as_the_reference_example():
    """tests/scalers/config/examples/README.md, invalid-04: the entry, then the name it wrongly gives."""
    from network.host_access import HostAccessError, parse_host_access_entry

    with pytest.raises(HostAccessError) as exc:
        parse_host_access_entry("registry.internal:5000")
    assert str(exc.value).startswith(
        'hostAccess entry "registry.internal:5000" names "registry.internal", '
        'which is not an IPv4 address, an IPv4 CIDR, or "*".'
    )


HOST = [
    ipaddress.ip_address(a)
    for a in ("127.0.0.1", "172.30.0.1", "192.168.1.10", "192.168.7.1", "::1", "fe80::1c2d:3eff:fe4f:5a6b")
]


@pytest.mark.parametrize("entry", ["10.0.0.0/8:22", "10.0.0.5:443", "10.0.0.0/8", "10.0.0.5"])
def test_an_address_or_range_holding_none_of_the_host_addresses_opens_nothing(entry):
    (warning,) = host_access_warnings([entry], HOST)
    assert warning.startswith(f'hostAccess entry "{entry}" holds none of this host\'s addresses (')
    # The host's addresses of the entry's family: no loopback, no link-local IPv6 for an IPv4 entry.
    assert "(172.30.0.1, 192.168.1.10, 192.168.7.1)" in warning and "127.0.0.1" not in warning
    assert "so this entry opens nothing" in warning and "write" not in warning


def test_an_ipv6_entry_holding_none_of_the_host_addresses_lists_those_of_its_family():
    (warning,) = host_access_warnings(["[fd00::/64]:443"], HOST)
    assert "holds none of this host's addresses (fe80::1c2d:3eff:fe4f:5a6b), so this entry opens nothing" in warning


def test_a_listen_address_written_as_an_entry_is_told_the_wildcard():
    (warning,) = host_access_warnings(["0.0.0.0:8000"], HOST)
    assert "holds none of this host's addresses" in warning
    assert warning.endswith('For port 8000 on every host IPv4 address, write "*:8000".'), warning


def test_a_range_with_a_port_over_several_host_addresses_names_them():
    (warning,) = host_access_warnings(["192.168.0.0/16:22"], HOST)
    assert warning.startswith('hostAccess entry "192.168.0.0/16:22" opens port 22 on 2 addresses of this host: ')
    assert "192.168.1.10, 192.168.7.1, not only on the agents' gateway" in warning


@pytest.mark.parametrize("entry", ["172.30.0.0/16:53", "172.30.0.1:53", "*:8000", "8000", "192.168.1.10:22"])
def test_an_entry_on_one_host_address_or_a_wildcard_port_is_not_warned_about(entry):
    assert host_access_warnings([entry], HOST) == []


def test_without_the_host_addresses_a_foreign_range_is_not_judged():
    assert host_access_warnings(["10.0.0.0/8:22", "10.0.0.5:443"]) == []


#: The console's backing services as a typical install has them: PostgreSQL and Redis on
#: loopback, the operator listener on the host's LAN address.
SERVICES = [
    ConsoleService("PostgreSQL (DATABASE_URL)", "127.0.0.1", 5432),
    ConsoleService("Redis (REDIS_URL)", "127.0.0.1", 6379),
    ConsoleService("operator listener (KICI_OPERATOR_LISTEN)", "192.168.1.10", 8000, exact=True),
]


@pytest.mark.parametrize(
    "entry, service",
    [
        ("172.30.0.1:6379", "Redis (REDIS_URL) on 127.0.0.1:6379"),
        ("*:5432", "PostgreSQL (DATABASE_URL) on 127.0.0.1:5432"),
        ("5432", "PostgreSQL (DATABASE_URL) on 127.0.0.1:5432"),
        ("*:8000", "operator listener (KICI_OPERATOR_LISTEN) on 192.168.1.10:8000"),
        ("192.168.1.10:8000", "operator listener (KICI_OPERATOR_LISTEN) on 192.168.1.10:8000"),
        ("192.168.1.10", "operator listener (KICI_OPERATOR_LISTEN) on 192.168.1.10:8000"),
    ],
)
def test_an_entry_opening_a_console_backing_service_is_warned_about(entry, service):
    (warning,) = host_access_warnings([entry], HOST, SERVICES)
    assert warning.startswith(f'hostAccess entry "{entry}" opens the console\'s own '), warning
    assert service in warning


@pytest.mark.parametrize("entry", ["172.30.0.1:53", "172.30.0.1:8000", "192.168.7.1:8000", "[fd00::1]:6379"])
def test_an_entry_missing_every_backing_service_is_not_warned_about_for_them(entry):
    assert not any("console's own" in w for w in host_access_warnings([entry], HOST, SERVICES))


def test_an_operator_listener_on_loopback_is_out_of_reach_and_not_warned_about():
    listener = [ConsoleService("operator listener (KICI_OPERATOR_LISTEN)", "127.0.0.1", 8000, exact=True)]
    assert host_access_warnings(["*:8000", "172.30.0.1:8000"], HOST, listener) == []


def test_a_service_listening_on_a_wildcard_or_a_name_is_reached_on_every_host_address():
    services = [ConsoleService("Redis (REDIS_URL)", "0.0.0.0", 6379), ConsoleService("PostgreSQL", "db", 5432)]
    warned = host_access_warnings(["172.30.0.1:6379", "192.168.1.10:5432", "172.30.0.1:53"], HOST, services)
    assert [w.split(" opens ")[0] for w in warned] == [
        'hostAccess entry "172.30.0.1:6379"',
        'hostAccess entry "192.168.1.10:5432"',
    ]


def test_a_service_the_host_listens_for_on_loopback_only_is_not_warned_about():
    loopback = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
    only_there = [ConsoleService("PostgreSQL (DATABASE_URL)", "localhost", 5432, listeners=loopback)]
    assert [w for w in host_access_warnings(["*:5432", "0.0.0.0/0"], HOST, only_there) if "PostgreSQL" in w] == []
    everywhere = [
        ConsoleService("PostgreSQL (DATABASE_URL)", "127.0.0.1", 5432, listeners=(*loopback, net("0.0.0.0/32")[0]))
    ]
    (warning,) = host_access_warnings(["*:5432"], HOST, everywhere)
    assert "opens the console's own PostgreSQL (DATABASE_URL) on 127.0.0.1:5432" in warning


def test_the_host_listeners_are_read_from_the_kernel(tmp_path):
    import socket

    from network.host_access import tcp_listening

    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        port = v4.getsockname()[1]
        assert tcp_listening()[port] == (ipaddress.ip_address("127.0.0.1"),)
        v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6.bind(("::", port))  # an IPv6 wildcard beside it
        v6.listen()
        assert sorted(map(str, tcp_listening()[port])) == ["127.0.0.1", "::"]
    assert port not in tcp_listening()
    assert tcp_listening(tables=[str(tmp_path / "missing")]) is None


#: A host with docker0 (172.17.0.1) besides the agents' bridge (172.30.0.1): the advice names the
#: latter, the address agents reach the host on, never the first one sorted.
DOCKER_HOST = [ipaddress.ip_address(a) for a in ("127.0.0.1", "172.17.0.1", "172.30.0.1", "192.168.1.10")]
GATEWAY = ipaddress.ip_address("172.30.0.1")


@pytest.mark.parametrize("entry", ["0.0.0.0/0", "*", "*:5432", "172.16.0.0/12:5432"])
def test_the_advice_about_an_exposed_service_names_where_agents_reach_it(entry):
    wildcard = (ipaddress.ip_address("0.0.0.0"),)
    postgres = [ConsoleService("PostgreSQL (DATABASE_URL)", "127.0.0.1", 5432, listeners=wildcard)]
    (warning,) = host_access_warnings([entry], DOCKER_HOST, postgres, gateway=GATEWAY)
    assert "PostgreSQL (DATABASE_URL) on 127.0.0.1:5432, listening on 0.0.0.0:5432, " in warning, warning
    assert "to the agents at 172.30.0.1:5432" in warning
    assert "172.17.0.1" not in warning


def test_the_advice_about_a_wide_entry_or_a_range_names_the_agents_gateway():
    other_gateway = ipaddress.ip_address("10.0.0.1")
    host = [*DOCKER_HOST, other_gateway]
    wide, ranged = host_access_warnings(["172.16.0.0/12", "0.0.0.0/0:22"], host, gateway=other_gateway)
    assert wide.endswith('Name the ports agents need on the agents\' gateway instead (e.g. "10.0.0.1:53").'), wide
    assert ranged.endswith('(e.g. "10.0.0.1:22").'), ranged
    (ranged,) = host_access_warnings(["172.16.0.0/12:22"], DOCKER_HOST, gateway=GATEWAY)
    assert ranged.endswith('(e.g. "172.30.0.1:22").'), ranged


#: Where this host's sockets listen: sshd everywhere, PostgreSQL on loopback only, a service on
#: the gateway, one on the LAN address, and an IPv6 wildcard.
LISTENING = {
    22: (ipaddress.ip_address("0.0.0.0"),),
    5432: (ipaddress.ip_address("127.0.0.1"),),
    8080: (ipaddress.ip_address("172.30.0.1"),),
    9000: (ipaddress.ip_address("192.168.1.10"),),
    9100: (ipaddress.ip_address("::"),),
}


@pytest.mark.parametrize(
    "entry, where, exposed",
    [
        ("172.30.0.1", "this host's address 172.30.0.1", "22 on 0.0.0.0, 8080 on 172.30.0.1"),
        ("172.30.0.1:*", "this host's address 172.30.0.1", "22 on 0.0.0.0, 8080 on 172.30.0.1"),
        ("192.168.1.10", "this host's address 192.168.1.10", "22 on 0.0.0.0, 9000 on 192.168.1.10"),
        ("0.0.0.0/0", "every address of this host", "22 on 0.0.0.0, 8080 on 172.30.0.1, 9000 on 192.168.1.10"),
        ("*", "every address of this host", "22 on 0.0.0.0, 8080 on 172.30.0.1, 9000 on 192.168.1.10"),
        ("[fd00::1]", "this host's address fd00::1", "9100 on [::]"),
    ],
)
def test_an_entry_opening_every_port_of_a_host_address_names_what_listens_there(entry, where, exposed):
    host = [*DOCKER_HOST, ipaddress.ip_address("fd00::1")]
    (warning,) = host_access_warnings([entry], host, gateway=GATEWAY, listening=LISTENING)
    assert warning.startswith(f'hostAccess entry "{entry}" opens every port on {where} to the agents: '), warning
    assert f"(listening there now: {exposed})." in warning, warning


def test_the_gateway_alone_on_every_port_is_warned_about_without_the_host_addresses():
    (warning,) = host_access_warnings(["172.30.0.1"], gateway=GATEWAY)
    assert "opens every port on this host's address 172.30.0.1" in warning
    assert host_access_warnings(["172.30.0.1:53"], gateway=GATEWAY, listening=LISTENING) == []


def test_an_entry_opening_a_service_and_every_other_port_says_both():
    wildcard = (ipaddress.ip_address("0.0.0.0"),)
    postgres = [ConsoleService("PostgreSQL (DATABASE_URL)", "127.0.0.1", 5432, listeners=wildcard)]
    (warning,) = host_access_warnings(["172.30.0.1"], DOCKER_HOST, postgres, gateway=GATEWAY, listening=LISTENING)
    assert "opens the console's own PostgreSQL (DATABASE_URL)" in warning
    assert "It opens every other port there too (listening there now: 22 on 0.0.0.0, 8080 on 172.30.0.1)." in warning
