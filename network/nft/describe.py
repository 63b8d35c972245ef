"""nft JSON rule expressions in nft-like text, for the agent page's "rules in force" and for test
diagnostics."""

from __future__ import annotations

from typing import Any


def _describe_value(value: Any) -> str:
    if isinstance(value, dict) and "prefix" in value:
        return f"{value['prefix']['addr']}/{value['prefix']['len']}"
    if isinstance(value, dict) and "set" in value:
        return "{ " + ", ".join(_describe_value(v) for v in value["set"]) + " }"
    if isinstance(value, list):
        return ",".join(_describe_value(v) for v in value)
    return str(value)


def _describe_operand(left: Any) -> str:
    if isinstance(left, dict):
        if "payload" in left:
            return f"{left['payload']['protocol']} {left['payload']['field']}"
        if "meta" in left:
            key = left["meta"]["key"]
            return key if key in ("iifname", "oifname", "iif", "oif") else f"meta {key}"
        if "ct" in left:
            return f"ct {left['ct']['key']}"
        if "concat" in left:
            return " . ".join(_describe_operand(v) for v in left["concat"])
        for op in ("&", "|"):
            if op in left:
                a, b = left[op]
                return f"{_describe_operand(a)} {op} {_describe_operand(b)}"
    if isinstance(left, int):
        return hex(left)
    return _describe_value(left)


def describe_expr(expr: list[dict]) -> str:
    """One rule's expressions in nft-like text, e.g. ``ip daddr 172.30.0.1 tcp dport 53 accept``.

    Only the shapes this module renders (and what nft prints back for them) are spelled out;
    anything else is shown as its JSON key.
    """
    words: list[str] = []
    for item in expr:
        if "match" in item:
            left, right = item["match"]["left"], item["match"]["right"]
            words.append(_describe_operand(left))
            op = item["match"]["op"]
            if op not in ("==", "in"):
                words.append(op)
            words.append(_describe_operand(right) if isinstance(right, int) and "&" in left else _describe_value(right))
        elif "mangle" in item:
            words.append(f"{_describe_operand(item['mangle']['key'])} set {_describe_operand(item['mangle']['value'])}")
        elif "vmap" in item:
            key = item["vmap"]["key"]
            if "payload" in key:
                words.append(f"{key['payload']['protocol']} {key['payload']['field']}")
            words.append(f"vmap {item['vmap']['data']}")
        elif "jump" in item:
            words.append(f"jump {item['jump']['target']}")
        elif "goto" in item:
            words.append(f"goto {item['goto']['target']}")
        else:
            words.extend(item.keys())
    return " ".join(words)
