"""Which rules would change for live agents if a policy changed (the host-access editor's preview
and the host-access-apply plan). Pure: the same function serves the preview and the approved
apply's re-check. Rules are compared by verdict, so reordering a run of accepts is no change:
docs/nft-isolation.md ("Previewing a host-access change").
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
Op = Literal["same", "add", "del"]


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
    same rules in an order that changes a verdict (a rule moved past one that is not an accept).
    """

    address: IPAddress
    action: Action
    removed: tuple[str, ...] = field(default=())
    added: tuple[str, ...] = field(default=())
    reordered: bool = False


def _chain_of(line: str) -> str:
    return line.partition(": ")[0]


def _aligned(before: list[str], after: list[str]) -> list[str]:
    """``before`` with each run of consecutive accept rules of one chain put in the order those
    lines have in ``after`` (lines ``after`` lacks last, in their own order): the same verdicts
    (module doc), lined up so that a mere reorder compares equal."""
    rank: dict[str, int] = {}
    for index, line in enumerate(after):
        rank.setdefault(line, index)
    out: list[str] = []
    run: list[str] = []
    for line in [*before, ""]:
        if line.endswith(" accept") and (not run or _chain_of(run[0]) == _chain_of(line)):
            run.append(line)
            continue
        out += sorted(run, key=lambda held: rank.get(held, len(after)))
        run = [line] if line.endswith(" accept") else []
        if not run and line:
            out.append(line)
    return out


def rule_changes(before: list[str], after: list[str]) -> list[tuple[Op, str]]:
    """``(op, line)`` from ``before`` to ``after``, in ``after``'s chain order: ``same``, ``add``,
    or ``del`` (a leaving line, shown where it stood). Lines that only move within a run of
    accept rules are ``same`` (module doc). difflib opcodes, no junk heuristic."""
    old = _aligned(before, after)
    lines: list[tuple[Op, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=after, autojunk=False).get_opcodes():
        if op == "equal":
            lines += [("same", line) for line in after[j1:j2]]
            continue
        lines += [("del", line) for line in old[i1:i2]]
        lines += [("add", line) for line in after[j1:j2]]
    return lines


def line_diff(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    """``(removed, added)``: the lines of ``before`` that leave and the lines of ``after`` that
    arrive, each in chain order (:func:`rule_changes`); both empty when only accept rules moved."""
    changes = rule_changes(before, after)
    return [line for op, line in changes if op == "del"], [line for op, line in changes if op == "add"]


def _by_address(specs: Iterable[AgentSpec]) -> dict[IPAddress, AgentSpec]:
    out: dict[IPAddress, AgentSpec] = {}
    for spec in specs:
        if spec.address in out:
            raise ValueError(f"agent address {spec.address} appears twice")
        out[spec.address] = spec
    return out


def plan_rule_diff(old_specs: Iterable[AgentSpec], new_specs: Iterable[AgentSpec]) -> list[RuleChange]:
    """Per-agent rule changes from ``old_specs`` to ``new_specs`` (agents keyed by address).

    Agents whose rules give the same verdicts (identical, or accept rules reordered: module doc)
    are left out. Sorted by address. Raises ``ValueError`` when an address appears twice on one
    side.
    """
    old, new = _by_address(old_specs), _by_address(new_specs)
    changes: list[RuleChange] = []
    for addr in sorted(old.keys() | new.keys(), key=lambda a: (a.version, int(a))):
        before = spec_rule_lines(old[addr]) if addr in old else []
        after = spec_rule_lines(new[addr]) if addr in new else []
        if addr not in old:
            changes.append(RuleChange(addr, "add", added=tuple(after)))
            continue
        if addr not in new:
            changes.append(RuleChange(addr, "remove", removed=tuple(before)))
            continue
        removed, added = line_diff(before, after)
        if removed or added:
            reordered = sorted(before) == sorted(after)
            changes.append(RuleChange(addr, "change", tuple(removed), tuple(added), reordered))
    return changes
