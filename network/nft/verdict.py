"""What an agent's chain does with one packet, worked out from its rules as nft prints them back
(the self-test's "blocked by rule (verified, not probed)", for destinations it may not probe):
the first rule whose matches all hold gives the verdict, and an expression shape the renderer does
not write stops it with ``unknown``. Pure. Design: docs/nft-isolation.md ("The isolation self-test").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .describe import describe_expr
from .spec import IPAddress, IPNetwork

Verdict = Literal["accept", "drop", "reject", "fallthrough", "unknown"]


@dataclass(frozen=True)
class Packet:
    """One hypothetical packet from the agent: ``daddr`` (address object), ``proto`` (``tcp`` /
    ``udp``), ``dport`` (1-65535), ``ct_state`` (``new`` for a fresh connection) and
    ``ct_direction`` (``original``: the agent sent it)."""

    daddr: IPAddress
    proto: str = "tcp"
    dport: int = 0
    ct_state: str = "new"
    ct_direction: str = "original"

    @property
    def family(self) -> int:
        return self.daddr.version


@dataclass(frozen=True)
class ChainVerdict:
    """``verdict``: ``accept`` / ``drop`` / ``reject`` (a rule decided), ``fallthrough`` (no rule
    matched: the packet returns to the base chain, whose policy is accept), or ``unknown`` (a rule
    could not be read). ``index``: 0-based rule that decided or stopped it (None on fallthrough).
    ``rule``: that rule as nft-like text."""

    verdict: Verdict
    index: int | None = None
    rule: str = ""

    @property
    def blocks(self) -> bool:
        return self.verdict in ("drop", "reject")


class _Unknown(Exception):
    pass


def _networks(value: Any, sets: Mapping[str, Iterable[IPNetwork]]) -> list[IPNetwork]:
    """The right-hand side of an address match as networks (address, prefix, range, set, @set)."""
    if isinstance(value, str):
        if value.startswith("@"):
            if value[1:] not in sets:
                raise _Unknown(f"set {value} was not read")
            return list(sets[value[1:]])
        return [ipaddress.ip_network(value)]
    if isinstance(value, dict) and "prefix" in value:
        return [ipaddress.ip_network(f"{value['prefix']['addr']}/{value['prefix']['len']}")]
    if isinstance(value, dict) and "range" in value:
        lo, hi = (ipaddress.ip_address(v) for v in value["range"])
        return list(ipaddress.summarize_address_range(lo, hi))
    if isinstance(value, dict) and "set" in value:
        return [n for v in value["set"] for n in _networks(v, sets)]
    if isinstance(value, list):
        return [n for v in value for n in _networks(v, sets)]
    raise _Unknown(f"address value {value!r}")


def _values(value: Any) -> list[Any]:
    if isinstance(value, dict) and "set" in value:
        return list(value["set"])
    if isinstance(value, list):
        return list(value)
    return [value]


def _match(m: dict, pkt: Packet, sets: Mapping[str, Iterable[IPNetwork]]) -> bool:
    left, right, op = m["left"], m["right"], m.get("op", "==")
    if op not in ("==", "!=", "in"):
        raise _Unknown(f"operator {op}")
    if "payload" in left:
        proto, fld = left["payload"].get("protocol"), left["payload"].get("field")
        if fld == "daddr" and proto in ("ip", "ip6"):
            if pkt.family != (4 if proto == "ip" else 6):
                return False  # the payload match itself fails for the other family, whatever op
            hit = any(pkt.daddr in n for n in _networks(right, sets) if n.version == pkt.family)
        elif fld == "dport" and proto in ("tcp", "udp"):
            if pkt.proto != proto:
                return False
            hit = pkt.dport in _values(right)
        else:
            raise _Unknown(f"payload {proto} {fld}")
    elif "meta" in left:
        key = left["meta"].get("key")
        if key == "nfproto":
            actual = "ipv4" if pkt.family == 4 else "ipv6"
        elif key == "l4proto":
            actual = pkt.proto
        else:
            raise _Unknown(f"meta {key}")
        hit = actual in _values(right)
    elif "ct" in left:
        key = left["ct"].get("key")
        if key == "state":
            hit = pkt.ct_state in _values(right)
        elif key == "direction":
            hit = pkt.ct_direction in _values(right)
        else:
            raise _Unknown(f"ct {key}")
    else:
        raise _Unknown(str(left))
    return hit if op != "!=" else not hit


def rule_verdict(expr: list[dict], pkt: Packet, sets: Mapping[str, Iterable[IPNetwork]] = {}) -> str | None:
    """The verdict of one rule for ``pkt`` (``accept`` / ``drop`` / ``reject``), or None when a
    match fails or the rule has no verdict. Raises ``ValueError`` naming a shape it cannot read."""
    try:
        for item in expr:
            if "match" in item:
                if not _match(item["match"], pkt, sets):
                    return None
            elif "accept" in item or "drop" in item or "reject" in item:
                return next(k for k in ("accept", "drop", "reject") if k in item)
            elif "counter" in item or "log" in item:
                continue
            else:
                raise _Unknown(next(iter(item), "?"))
    except _Unknown as exc:
        raise ValueError(f"cannot evaluate {exc}") from None
    return None


def chain_verdict(rules: list[list[dict]], pkt: Packet, sets: Mapping[str, Iterable[IPNetwork]] = {}) -> ChainVerdict:
    """Walk an agent chain (lists of nft JSON expressions, head first) for ``pkt``.

    ``sets``: named sets the rules refer to (``private4`` → its networks, read from the same
    table). Returns the first deciding rule's :class:`ChainVerdict`, ``fallthrough`` when none
    decides, or ``unknown`` at the first rule it cannot read.
    """
    for index, expr in enumerate(rules):
        try:
            verdict = rule_verdict(expr, pkt, sets)
        except ValueError:
            return ChainVerdict("unknown", index, describe_expr(expr))
        if verdict is not None:
            return ChainVerdict(verdict, index, describe_expr(expr))  # type: ignore[arg-type]
    return ChainVerdict("fallthrough")
