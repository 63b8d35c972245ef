"""Isolation rules as nftables JSON, computed without touching the kernel (SPEC f, issue 5).

Layout of one console's table (``inet <table>``; the name is the scaler's configured one, never a
literal, so two consoles on one host never touch each other's rules — seed firecracker-backend.d.ts
``nftOpts``)::

    map agents4_fwd  ipv4_addr : verdict      agent address -> jump a4-<addr>-fwd
    map agents6_fwd  ipv6_addr : verdict      (IPv6-addressed agents)
    map agents4_in   ipv4_addr : verdict      agent address -> jump a4-<addr>-in
    map agents6_in   ipv6_addr : verdict
    set guard_ifaces ifname                   bridges agents sit behind
    set private4 ipv4_addr (interval)         10/8, 172.16/12, 192.168/16, 169.254/16

    chain forward  (filter hook forward priority 0, policy accept)
        ip saddr vmap @agents4_fwd
        ip6 saddr vmap @agents6_fwd
        iifname @guard_ifaces drop
    chain input    (filter hook input priority 0, policy accept)
        icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept
        ip saddr vmap @agents4_in
        ip6 saddr vmap @agents6_in
        iifname @guard_ifaces drop

    chain a4-172-30-0-5-fwd   (what the agent reaches THROUGH the host; SPEC f, NFT-01..03)
        ip daddr <gateway> accept
        ip daddr <allowlist entry> accept          (each, in order)
        ip daddr @private4 drop                    (RFC1918 + 169.254/16: NFT-01's four drops)
        drop                                       (denyAll)   -- or, without denyAll:
        meta nfproto ipv6 drop
        accept
    chain a4-172-30-0-5-in    (what the agent reaches ON the host; NFT-06..09)
        ct direction reply ct state established,related accept
        ip daddr A tcp dport P accept ; ip daddr A udp dport P accept    (each entry)
        drop

Conntrack on input accepts only the REPLY direction (the agent answering a connection the host
opened). The reference accepts ``ct state established,related`` in both directions; here a flow the
agent opened is re-checked packet by packet against its entries, because a container runs for a
moment before its rules are written (see ``scalers.backends.container``) and a connection it opened
to a host port in that moment would otherwise stay open for good. An allowed entry passes every
packet of its flows anyway, so only flows the entries do not allow are affected.

Per-packet cost is one hash lookup however many agents there are, and adding or removing an agent
touches only its two map elements and its two chains. Ownership is read from names: chain
``a4-172-30-0-5-fwd`` belongs to agent 172.30.0.5 (``a6-`` chains to IPv6 agents, ``:`` written as
``-``), never from rule text.

IPv6 policy (decided here, tested with packets in tests/test_isolation_packets.py):

* An agent is keyed by one address. Traffic from an address in no map that arrives on a guarded
  interface (the agents' bridge) is dropped on both hooks. This drops every IPv6 packet from an
  IPv4-keyed agent (its link-local and any other IPv6 source), and also spoofed or not yet
  registered IPv4 sources.
* Inside an agent's chains IPv6 is closed unless an entry names it: forward ends with
  ``meta nfproto ipv6 drop`` before its final accept; input ends with ``drop``. Only bracketed
  ``hostAccess`` entries and IPv6 allowlist entries produce IPv6 accepts; wildcard host-access
  entries (``*``, ``*:port``, a bare port) are rendered ``meta nfproto ipv4`` so they never open
  IPv6. IPv6 entries take effect for IPv6-keyed agents only.
* One exception on input: neighbour solicitations and advertisements with hop limit 255 (link-local
  by construction, never routed) are accepted from anyone, because without them the host cannot
  answer an IPv6 agent at all. They open no host service.

Divergences from the reference's rule text (not from its per-packet verdicts): the four
private-range drops are one lookup in the shared ``private4`` set (fewer rules per agent, so 1,000
agents apply in well under a second), and the forward chain ends with an explicit verdict (it
cannot fall through to the guard rule): ``meta nfproto ipv6 drop`` then ``accept``, or with
denyAll a single ``drop`` that closes both families.

Modules, one job each (every public name is importable from here): :mod:`~network.nft.spec`
(:class:`AgentSpec` and input checks), :mod:`~network.nft.names` (object and chain names),
:mod:`~network.nft.exprs` (rule expressions), :mod:`~network.nft.commands` (the commands that
write the table, :func:`document`) and :mod:`~network.nft.describe` (rules as nft-like text).
"""

from __future__ import annotations

from .commands import (
    EGRESS_MSS_CHAIN,
    EGRESS_NAT_CHAIN,
    document,
    render_agent_add,
    render_agent_remove,
    render_egress_baseline,
    render_full,
    render_table_base,
)
from .describe import describe_expr
from .exprs import (
    ACCEPT,
    DROP,
    PRIVATE_DROPS,
    base_rule_exprs,
    forward_rule_exprs,
    host_access_rule_exprs,
    input_rule_exprs,
)
from .names import (
    FAMILY,
    FORWARD_CHAIN,
    GUARD_SET,
    INPUT_CHAIN,
    MAP_TYPES,
    MAPS,
    PRIVATE_SET,
    agent_chain_names,
    agent_key,
    parse_chain_name,
)
from .spec import AgentSpec, IPAddress, IPNetwork, RuleSpecError, parse_allowlist_entry, validate_table_name

__all__ = [
    "ACCEPT",
    "DROP",
    "EGRESS_MSS_CHAIN",
    "EGRESS_NAT_CHAIN",
    "FAMILY",
    "FORWARD_CHAIN",
    "GUARD_SET",
    "INPUT_CHAIN",
    "MAPS",
    "MAP_TYPES",
    "PRIVATE_DROPS",
    "PRIVATE_SET",
    "AgentSpec",
    "IPAddress",
    "IPNetwork",
    "RuleSpecError",
    "agent_chain_names",
    "agent_key",
    "base_rule_exprs",
    "describe_expr",
    "document",
    "forward_rule_exprs",
    "host_access_rule_exprs",
    "input_rule_exprs",
    "parse_allowlist_entry",
    "parse_chain_name",
    "render_agent_add",
    "render_agent_remove",
    "render_egress_baseline",
    "render_full",
    "render_table_base",
    "validate_table_name",
]
