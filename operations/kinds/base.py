"""What every operation kind provides, and the pure re-check that guards every run.

A kind is a :class:`Kind` subclass with one planning method used for the preview *and* at run time,
and one acting method that is handed only the targets whose evidence is unchanged. Nothing here
touches docker, nft or the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

from django.utils import timezone

from agents.choices import AgentState

from ..choices import OperationKind, TargetOutcome


class ScopeInvalid(ValueError):
    """The scope does not fit the kind (e.g. an orphan-VM reap for a container scaler); says which field."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


class PlanRefused(ValueError):
    """The planner will not plan: e.g. the config file is invalid. ``problems`` lists every line."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message if not self.problems else message + ":\n" + "\n".join(self.problems))


@dataclass(frozen=True)
class Scope:
    """What a planner is asked about.

    ``scaler`` is a ``scalers.models.Scaler`` or None; ``agent_ids`` a tuple of agent id strings;
    ``label_set`` a ``LabelSet`` or None; ``params`` kind-specific inputs (JSON-serialisable).
    """

    scaler: Any = None
    agent_ids: tuple[str, ...] = ()
    label_set: Any = None
    params: dict = field(default_factory=dict)

    def key(self, kind: str) -> str:
        """The identity of (kind, scope) used to find an identical open operation."""
        parts = [
            kind,
            f"scaler={self.scaler.name if self.scaler else ''}",
            f"labelset={self.label_set.pk if self.label_set else ''}",
            "agents=" + ",".join(sorted(self.agent_ids)),
            "params=" + json.dumps(self.params, sort_keys=True, separators=(",", ":")),
        ]
        key = "|".join(parts)
        return key if len(key) <= 500 else key[:436] + "#" + hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Target:
    """One thing the operation would act on. ``key`` is unique within a plan and stable across re-plans
    (e.g. ``container:<full id>``); ``evidence`` is a flat JSON dict of why it is a target."""

    key: str
    action: str
    subject: str
    evidence: dict

    def as_json(self) -> dict:
        return {"key": self.key, "action": self.action, "subject": self.subject, "evidence": self.evidence}


@dataclass
class Spared:
    """A candidate the planner looked at and left alone, with the reason (shown in the preview; at run
    time it is the reason a previously planned target is skipped)."""

    key: str
    subject: str
    reason: str
    evidence: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"key": self.key, "subject": self.subject, "reason": self.reason, "evidence": self.evidence}


@dataclass
class Plan:
    """A planner's answer. ``notes`` are remarks; ``warnings`` are what the plan may do that its
    requester did not mean (an entry that opens nothing, or every port of the host): a person
    approves such a plan only after confirming them, never a policy. ``context`` is opaque data
    the acting function may need (e.g. the backend's own plan object); it is never stored."""

    targets: list[Target] = field(default_factory=list)
    spared: list[Spared] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    context: Any = None

    def target_map(self) -> dict[str, Target]:
        return {t.key: t for t in self.targets}

    def spared_map(self) -> dict[str, Spared]:
        return {s.key: s for s in self.spared}


class Run(Protocol):
    """What an acting function is handed: ``report(key, outcome, detail)`` records what happened to
    one target (first report wins), ``log(message, level="info")`` adds a run-log line,
    ``operation_id`` names the operation (for reasons written elsewhere, e.g. events)."""

    operation_id: int

    def report(self, key: str, outcome: TargetOutcome | str, detail: str = "") -> None: ...
    def log(self, message: str, level: str = "info") -> None: ...


class Kind:
    """One operation kind: what it plans for a scope and how it acts on the approved targets.

    Subclasses set :attr:`name` and override :meth:`plan` and :meth:`act`; the registry
    (``operations.kinds.catalog``) maps each name to its class.
    """

    name: ClassVar[OperationKind]
    #: evidence fields that drift by themselves (ages) and are not compared at run time
    volatile: ClassVar[frozenset[str]] = frozenset()
    #: True when the targets are applied together (a config reload): any change skips all
    atomic: ClassVar[bool] = False
    #: the ``Scope.params`` keys the kind reads; others are dropped
    params: ClassVar[tuple[str, ...]] = ()
    #: planned by the periodic sweeps
    swept: ClassVar[bool] = False
    #: default seconds between two sweeps of one scope; None = ``settings.KICI_SWEEP_INTERVAL_SECONDS``
    sweep_seconds: ClassVar[int | None] = None

    @property
    def label(self) -> str:
        return self.name.label

    def validate_scope(self, scope: Scope) -> None:
        """Raise :class:`ScopeInvalid` naming the field when ``scope`` does not fit the kind."""

    def sweep_scopes(self) -> list[Scope]:
        """The scopes a periodic sweep plans (swept kinds only)."""
        return []

    def planned_by_host(self, scope: Scope) -> bool:
        """Whether the sweep of ``scope`` is planned by the sweeper of its scaler's host (it reads
        that host's docker, VMs, chroots or nft table) instead of the leading one (a global scope,
        planned from the database alone). Default: every scaler scope is its host's."""
        return scope.scaler is not None

    def plan(self, scope: Scope) -> Plan:
        raise NotImplementedError

    def act(self, run: Run, scope: Scope, plan: Plan, targets: list[Target]) -> None:
        raise NotImplementedError

    def auto_approves(self, scope: Scope) -> bool:
        """Whether a swept operation of ``scope`` is approved without a person."""
        return False

    def observe(self, scope: Scope, plan: Plan, operation=None) -> int:
        """Told what each sweep of ``scope`` found (also when it found nothing). Returns how many
        targets it newly recorded somewhere (a kind that records nothing: 0)."""
        return 0


def is_registered(agent) -> bool:
    """Whether an agent row says its agent registered and its sandbox still runs (a held agent's
    is kept running, drained)."""
    return (
        agent is not None
        and agent.registered_at is not None
        and agent.state in (AgentState.RUNNING, AgentState.DRAINING, AgentState.HELD)
    )


def age_seconds(since: datetime | None, now: datetime | None = None) -> int | None:
    if since is None:
        return None
    return max(0, int(((now or timezone.now()) - since).total_seconds()))


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from a JSONField (tuples become lists, datetimes ISO strings)."""
    return json.loads(json.dumps(value, default=str))


def stable_evidence(evidence: dict, volatile: Iterable[str]) -> dict:
    """The evidence without its volatile fields, in JSON form (what a run compares)."""
    volatile = frozenset(volatile)
    return {k: v for k, v in jsonable(evidence).items() if k not in volatile}


def plan_digest(targets: Iterable[dict], volatile: Iterable[str]) -> str:
    """sha256 over the targets' keys, actions and stable evidence: two plans that would do the same
    thing for the same reasons have the same digest (used to avoid duplicate open operations)."""
    volatile = frozenset(volatile)
    canon = sorted(
        json.dumps([t["key"], t["action"], stable_evidence(t["evidence"], volatile)], sort_keys=True, default=str)
        for t in targets
    )
    return hashlib.sha256("\n".join(canon).encode()).hexdigest()


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Recheck:
    """The result of comparing the approved plan with a fresh one."""

    matched: list[Target]
    skipped: list[tuple[str, str]]  # (key, reason)


def recheck(approved: list[dict], fresh: Plan, volatile: Iterable[str]) -> Recheck:
    """Keep only approved targets that the fresh plan still proposes with the same stable evidence.

    Every other approved target is skipped with the reason: spared now (the planner's own reason, e.g.
    "running and registered"), gone since the preview, or evidence changed (naming each field with its
    old and new value). Targets the fresh plan adds are ignored: nobody approved them.
    """
    volatile = frozenset(volatile)
    targets = fresh.target_map()
    spared = fresh.spared_map()
    matched: list[Target] = []
    skipped: list[tuple[str, str]] = []
    for old in approved:
        key = old["key"]
        new = targets.get(key)
        if new is None:
            if key in spared:
                skipped.append((key, f"spared since the preview: {spared[key].reason}"))
            else:
                skipped.append((key, "no longer found since the preview"))
            continue
        before = stable_evidence(old["evidence"], volatile)
        after = stable_evidence(new.evidence, volatile)
        if before != after or old.get("action") != new.action:
            changes = [
                f"{name}: {_short(before.get(name))} → {_short(after.get(name))}"
                for name in sorted(set(before) | set(after))
                if before.get(name) != after.get(name)
            ]
            if old.get("action") != new.action:
                changes.insert(0, f"action: {old.get('action')} → {new.action}")
            skipped.append((key, "evidence changed since the preview: " + "; ".join(changes)))
            continue
        matched.append(new)
    return Recheck(matched=matched, skipped=skipped)


def require_scaler(scope: Scope, types: Iterable[str] | None = None, what: str = "this operation") -> None:
    """ScopeInvalid unless the scope names a scaler (of one of ``types`` when given)."""
    if scope.scaler is None:
        raise ScopeInvalid("scaler", f"{what} needs a scaler")
    if types is not None and scope.scaler.type not in set(types):
        raise ScopeInvalid(
            "scaler",
            f"{what} applies to {' or '.join(sorted(types))} scalers; {scope.scaler.name!r} is {scope.scaler.type}",
        )


def require_agents(scope: Scope, what: str) -> None:
    if not scope.agent_ids:
        raise ScopeInvalid("agent", f"{what} needs at least one agent id")
