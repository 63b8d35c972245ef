"""Which rules would change for live agents if a policy changed (the host-access editor's
preview). Pure: the same function serves the preview and the approved apply's re-check.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from network.nft.describe import describe_expr
from network.nft.exprs import forward_rule_exprs, input_rule_exprs
from network.nft.spec import AgentSpec, IPAddress

Action = Literal["add", "remove", "change"]


def spec_rule_lines(spec: AgentSpec) -> list[str]:
    """An agent's rules as lines, ``forward: ...`` then ``input: ...``, in chain order (the same
    wording ``AgentRules.describe()`` uses for rules read back from the kernel)."""
    return [f"forward: {describe_expr(e)}" for e in forward_rule_exprs(spec)] + [
        f"input: {describe_expr(e)}" for e in input_rule_exprs(spec)
    ]


@dataclass(frozen=True)
class RuleChange:
    """How one agent's rules would change.

    ``address``: the agent. ``action``: ``add`` (new agent), ``remove`` (agent gone), ``change``.
    ``removed`` / ``added``: rule lines leaving / arriving, in chain order. ``reordered``: the
    same rules in a different order (order matters: the first match decides).
    """

    address: IPAddress
    action: Action
    removed: tuple[str, ...] = field(default=())
    added: tuple[str, ...] = field(default=())
    reordered: bool = False


def line_diff(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    """``(removed, added)``: the lines of ``before`` that leave and the lines of ``after`` that arrive,
    each in chain order (difflib opcodes, no junk heuristic)."""
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        if op in ("replace", "delete"):
            removed += before[i1:i2]
        if op in ("replace", "insert"):
            added += after[j1:j2]
    return removed, added


def _by_address(specs: Iterable[AgentSpec]) -> dict[IPAddress, AgentSpec]:
    out: dict[IPAddress, AgentSpec] = {}
    for spec in specs:
        if spec.address in out:
            raise ValueError(f"agent address {spec.address} appears twice")
        out[spec.address] = spec
    return out


def plan_rule_diff(old_specs: Iterable[AgentSpec], new_specs: Iterable[AgentSpec]) -> list[RuleChange]:
    """Per-agent rule changes from ``old_specs`` to ``new_specs`` (agents keyed by address).

    Agents whose rules are identical are left out. Sorted by address. Raises ``ValueError`` when
    an address appears twice on one side.
    """
    old, new = _by_address(old_specs), _by_address(new_specs)
    changes: list[RuleChange] = []
    for addr in sorted(old.keys() | new.keys(), key=lambda a: (a.version, int(a))):
        before = spec_rule_lines(old[addr]) if addr in old else []
        after = spec_rule_lines(new[addr]) if addr in new else []
        if before == after:
            continue
        if addr not in old:
            changes.append(RuleChange(addr, "add", added=tuple(after)))
            continue
        if addr not in new:
            changes.append(RuleChange(addr, "remove", removed=tuple(before)))
            continue
        removed, added = line_diff(before, after)
        reordered = sorted(before) == sorted(after)
        changes.append(RuleChange(addr, "change", tuple(removed), tuple(added), reordered))
    return changes
