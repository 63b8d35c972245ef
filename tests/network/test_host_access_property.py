"""Property tests: thousands of random hostAccess entries.

Every entry either parses or fails with a message naming it, and the rules rendered for an entry
accept exactly the packets the entry allows: never a broader one. The rules are judged by a small
evaluator written here from the nft JSON schema, independent of the renderer.
"""

from __future__ import annotations

import ipaddress

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from network.host_access import HostAccessError, parse_host_access_entry
from network.nft.exprs import host_access_rule_exprs, input_rule_exprs
from network.nft.spec import AgentSpec

MANY = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- entries -----------------------------------------------------------------------------------

ports = st.integers(min_value=1, max_value=65535)
bad_ports = st.one_of(st.integers(max_value=0), st.integers(min_value=65536, max_value=10**12))
v4_nets = st.builds(
    lambda addr, plen: ipaddress.IPv4Network((addr, plen), strict=False),
    st.integers(0, 2**32 - 1),
    st.integers(0, 32),
)
v6_nets = st.builds(
    lambda addr, plen: ipaddress.IPv6Network((addr, plen), strict=False),
    st.integers(0, 2**128 - 1),
    st.integers(0, 128),
)


def show(net):
    if net.prefixlen == net.max_prefixlen and net.version == 4:
        return str(net.network_address)
    text = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
    return f"[{text}]" if net.version == 6 else text


@st.composite
def valid_entries(draw):
    """(text, expected daddr, expected port) for a well-formed entry."""
    kind = draw(st.sampled_from(["bare", "star", "v4", "v6"]))
    port = draw(st.one_of(st.none(), ports))
    if kind == "bare":
        port = draw(ports)
        return str(port), None, port
    if kind == "star":
        addr, daddr = "*", None
    else:
        daddr = draw(v4_nets if kind == "v4" else v6_nets)
        addr = show(daddr)
    if port is None:
        text = draw(st.sampled_from([addr, f"{addr}:*"]))
    else:
        text = f"{addr}:{port}"
    pad = draw(st.sampled_from(["", " ", "\t", "  "]))
    return pad + text + pad[::-1], daddr, port


GRAMMAR_CHARS = "0123456789.:/*[]abcdefx -%"
noisy_entries = st.one_of(
    st.text(alphabet=GRAMMAR_CHARS, max_size=24),
    st.text(max_size=24),
    st.builds(lambda n, p: f"{n}:{p}", v4_nets.map(str), bad_ports),
    st.builds(lambda a, p: f"{a}:{p}", st.sampled_from(["*", "10.0.0.1", "[fd00::1]"]), bad_ports),
    st.builds(lambda n: str(n), v6_nets),  # unbracketed IPv6
    st.builds(
        lambda a, b: f"{a}.{b}", st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.sampled_from(["lan:80", "internal"])
    ),
)


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def assert_parses_or_names_itself(text: str):
    try:
        return parse_host_access_entry(text)
    except HostAccessError as exc:
        message = str(exc)
        assert exc.entry in (text, text.strip())
        if text.strip():
            assert quoted(text.strip()) in message, message
        else:
            assert "hostAccess entry is empty" in message
        return None


# -- an independent evaluator for the rules the renderer emits ---------------------------------


def packet_matches(expr: list[dict], pkt: dict) -> str | None:
    """Walk one rule's expressions over ``pkt``; return its verdict, or None when a match fails.

    ``pkt``: {"family": 4|6, "daddr": ip_address, "proto": "tcp"|"udp"|"icmp", "dport": int,
    "ct": "new", "ctdir": "original"|"reply" (default original)}. Unknown expressions raise, so
    a new rule shape cannot pass unexamined.
    """
    for item in expr:
        if "accept" in item:
            return "accept"
        if "drop" in item:
            return "drop"
        m = item["match"]
        left, right, op = m["left"], m["right"], m["op"]
        if "meta" in left and left["meta"]["key"] == "nfproto":
            ok = {"ipv4": 4, "ipv6": 6}[right] == pkt["family"]
        elif "ct" in left and left["ct"]["key"] == "state":
            assert op == "in"
            ok = pkt["ct"] in right
        elif "ct" in left and left["ct"]["key"] == "direction":
            ok = pkt.get("ctdir", "original") == right
        elif "payload" in left and left["payload"]["field"] == "daddr":
            version = {"ip": 4, "ip6": 6}[left["payload"]["protocol"]]
            if pkt["family"] != version:
                ok = False
            else:
                if isinstance(right, dict):
                    net = ipaddress.ip_network(f"{right['prefix']['addr']}/{right['prefix']['len']}")
                else:
                    net = ipaddress.ip_network(right)
                ok = pkt["daddr"] in net
        elif "payload" in left and left["payload"]["field"] == "dport":
            ok = pkt["proto"] == left["payload"]["protocol"] and pkt["dport"] == right
        else:
            raise AssertionError(f"unexpected expression {item}")
        if op not in ("==", "in"):
            raise AssertionError(f"unexpected operator {op}")
        if not ok:
            return None
    return None


def entry_allows(entry, pkt) -> bool:
    """What the entry means, stated directly (module doc of network.host_access)."""
    if entry.daddr is None:
        if pkt["family"] != 4:
            return False
    elif pkt["family"] != entry.daddr.version or pkt["daddr"] not in entry.daddr:
        return False
    if entry.port is None:
        return True
    return pkt["proto"] in ("tcp", "udp") and pkt["dport"] == entry.port


def packets_near(entry, draw) -> list[dict]:
    """Packets on and just around the entry's edges, plus random ones of both families."""
    addrs = [
        ipaddress.ip_address(draw(st.integers(0, 2**32 - 1))),
        ipaddress.ip_address(draw(st.integers(0, 2**128 - 1))),
    ]
    if entry.daddr is not None:
        lo, hi = int(entry.daddr.network_address), int(entry.daddr.broadcast_address)
        top = 2**entry.daddr.max_prefixlen - 1
        make = ipaddress.IPv4Address if entry.daddr.version == 4 else ipaddress.IPv6Address
        for n in (lo, hi, lo - 1, hi + 1, draw(st.integers(lo, hi))):
            if 0 <= n <= top:
                addrs.append(make(n))
    port = entry.port or draw(ports)
    dports = {port, max(1, port - 1), min(65535, port + 1), draw(ports)}
    return [
        {"family": a.version, "daddr": a, "proto": proto, "dport": d, "ct": "new"}
        for a in addrs
        for proto in ("tcp", "udp", "icmp")
        for d in dports
    ]


# -- properties --------------------------------------------------------------------------------


@MANY
@given(valid_entries())
def test_well_formed_entries_parse_to_what_was_written(case):
    text, daddr, port = case
    entry = assert_parses_or_names_itself(text)
    assert entry is not None, text
    assert (entry.daddr, entry.port) == (daddr, port)
    assert entry.family == ("ipv6" if daddr is not None and daddr.version == 6 else "ipv4")
    assert parse_host_access_entry(entry.canonical) == parse_host_access_entry(entry.canonical)
    assert (parse_host_access_entry(entry.canonical).daddr, parse_host_access_entry(entry.canonical).port) == (
        daddr,
        port,
    )


@MANY
@given(noisy_entries)
def test_any_text_parses_or_fails_naming_the_entry(text):
    assert_parses_or_names_itself(text)


@MANY
@given(st.one_of(valid_entries().map(lambda c: c[0]), noisy_entries), st.data())
def test_no_rendered_rule_is_broader_than_its_entry(text, data):
    entry = assert_parses_or_names_itself(text)
    if entry is None:
        return
    rules = host_access_rule_exprs(entry)
    for pkt in packets_near(entry, data.draw):
        verdicts = [packet_matches(rule, pkt) for rule in rules]
        accepted = "accept" in verdicts
        assert "drop" not in verdicts
        # Not broader (accepted ⇒ allowed) and not narrower (allowed ⇒ accepted).
        assert accepted == entry_allows(entry, pkt), (text, pkt, rules)


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_entries().map(lambda c: c[0]), max_size=6), st.data())
def test_an_agent_input_chain_accepts_exactly_the_union_of_its_entries(texts, data):
    spec = AgentSpec.build("172.30.0.5", "172.30.0.1", host_access=texts)
    chain = input_rule_exprs(spec)
    for entry in spec.host_access or [parse_host_access_entry("1")]:
        for pkt in packets_near(entry, data.draw):
            verdict = next(v for v in (packet_matches(r, pkt) for r in chain) if v is not None)
            assert (verdict == "accept") == any(entry_allows(e, pkt) for e in spec.host_access)
            # A reply to a flow the host opened passes whatever the entries say; a packet of a
            # flow the agent opened is judged by the entries even once established.
            reply = dict(pkt, ct="established", ctdir="reply")
            assert next(v for v in (packet_matches(r, reply) for r in chain) if v) == "accept"
            own = dict(pkt, ct="established", ctdir="original")
            verdict = next(v for v in (packet_matches(r, own) for r in chain) if v is not None)
            assert (verdict == "accept") == any(entry_allows(e, pkt) for e in spec.host_access)
