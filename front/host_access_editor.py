"""The label-set host-access editor's planning: validate what the operator typed, resolve the
effective list, and compute the input-rule diff for every live agent of the label set.

Pure apart from reading the database and this host's interface addresses (no nft, no writes), so
the preview endpoint can call it on every keystroke and the apply view re-runs the very same
function before it asks for an operation.
An explicit list, even empty, wins outright; otherwise the default list
``<gateway>:53``, ``<gateway>:<console port>``, storage entries (``network.host_access``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from django.conf import settings

from agents.choices import ACTIVE_STATES
from agents.models import Agent
from lib.wording import json_text, listed
from network.host_access import (
    MAX_ENTRY_LENGTH,
    ConsoleService,
    HostAccessError,
    HostAddress,
    Listening,
    console_port_warning,
    describe_host_access_entry,
    host_access_warnings,
    parse_host_access_entry,
    resolve_agent_host_access,
    same_host_access,
    storage_host_access_entries,
    tcp_listening,
)
from network.netlink import NetlinkError, host_addresses
from network.nft.plan import Op, rule_changes, spec_rule_lines
from network.nft.spec import AgentSpec, RuleSpecError
from scalers.backends.isolation import console_services, resolve_kici_host_access
from scalers.choices import ScalerType
from scalers.kici_orchestrator import kici_agent_target
from scalers.models import ConfigState, LabelSet, Scaler

DEFAULT = "default"
EXPLICIT = "explicit"
MODES = (DEFAULT, EXPLICIT)

#: Gateway of the container agents' bridge network (scalers.backends.docker_net).
CONTAINER_GATEWAY = "172.30.0.1"
#: An editor is for people: more entries than this is a paste accident, refused with a reason.
MAX_ENTRIES = 256
#: Live agents whose rule diff the preview lists; the others are counted, so the answer does not
#: grow with the fleet (each diff lists every rule of the agent's input chain).
PREVIEW_DIFFS = 20
#: Bytes of typed text the editor reads (UTF-8): room for :data:`MAX_ENTRIES` entries of the
#: longest length with generous layout. More is refused before any entry is parsed.
MAX_TEXT_BYTES = 64 * 1024


def count_entries(text: str) -> int:
    """How many entries ``text`` holds as :func:`check_lines` splits it (non-blank lines, each
    split at commas), without parsing any: cheap enough to refuse a paste accident first."""
    return sum(line.count(",") + 1 for line in (text or "").splitlines() if line.strip())


def input_limit_error(text: str) -> tuple[int, str] | None:
    """``(status, message)`` when the typed ``text`` is over a limit, naming it: 413 for more than
    :data:`MAX_TEXT_BYTES` bytes, 422 for more than :data:`MAX_ENTRIES` entries; None otherwise.
    Checked before parsing, so neither the work nor the answer grows with what was pasted."""
    size = len((text or "").encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        return 413, f"entries: at most {MAX_TEXT_BYTES} bytes are accepted, got {size}; nothing was done"
    count = count_entries(text)
    if count > MAX_ENTRIES:
        return 422, f"entries: at most {MAX_ENTRIES} are accepted, got {count}; nothing was done"
    return None


@dataclass
class EntryCheck:
    """One typed line: ``line`` (1-based), ``text`` (trimmed), ``ok``, and ``meaning`` (what it
    allows) or ``error`` (why it is refused, naming the entry). ``duplicate``: a repeat of an
    earlier line (allowed, but pointless). ``warning``: why an accepted entry will not do what it
    seems to (``network.host_access.host_access_warnings``, e.g. loopback); never blocks."""

    line: int
    text: str
    ok: bool
    meaning: str = ""
    error: str = ""
    duplicate: bool = False
    warning: str = ""


@dataclass
class AgentRuleDiff:
    """The input-chain change for one live agent: ``lines`` are ``(op, text)`` with op ``add``,
    ``del`` or ``same``; ``before`` / ``after`` the host-access lists; ``error`` when its rules
    cannot be rendered (e.g. no address yet)."""

    agent: Agent
    before: list[str]
    after: list[str]
    lines: list[tuple[Op, str]] = field(default_factory=list)
    error: str = ""

    @property
    def changed(self) -> bool:
        return any(op != "same" for op, _ in self.lines)


@dataclass
class EditorPlan:
    """Everything the editor shows for one input: ``mode`` (``default`` or ``explicit``), ``checks`` (one
    per typed entry), ``errors`` that block applying (refused entries with their line, then
    ``general_errors``), ``warnings`` that do not, ``entries`` to store (None: the default),
    ``effective`` (what the label set's agents would get), ``diffs`` per live agent, ``unchanged``,
    ``host_addresses`` (:func:`known_host_addresses`; None when unlisted, ``address_error`` says why).
    """

    label_set: LabelSet
    mode: str
    checks: list[EntryCheck]
    general_errors: list[str]
    entries: list[str] | None
    effective: list[str]
    diffs: list[AgentRuleDiff]
    unchanged: bool
    host_addresses: list[HostAddress] | None = None
    address_error: str = ""
    #: An explicit list that closes the console's port (``network.host_access.console_port_warning``).
    console_warning: str = ""
    #: Entries typed while the default mode is chosen that neither the default nor the list in
    #: force holds: the default mode ignores them (a note, not a warning: nothing they say is applied).
    ignored: list[str] = field(default_factory=list)
    #: The agents' gateway (:func:`gateway_for`), the address the warnings' advice names.
    gateway: HostAddress | None = None
    #: The console's backing services the warnings guard (``console_services``), as this preview read them.
    services: list[ConsoleService] = field(default_factory=list)
    #: This host's listening sockets as this preview read them (``tcp_listening``), named by warnings.
    listening: Listening | None = None

    @property
    def ignored_note(self) -> str:
        if not self.ignored:
            return ""
        return (
            f'The default mode ignores the typed entries {listed(self.ignored)}: choose "Explicit list" to apply them.'
        )

    @property
    def refused(self) -> list[EntryCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def errors(self) -> list[str]:
        return [f"line {c.line}: {c.error}" for c in self.refused] + list(self.general_errors)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def warnings(self) -> list[str]:
        typed = [f"line {c.line}: {c.warning}" for c in self.checks if c.ok and c.warning]
        seen = {c.text for c in self.checks}
        rest = [e for e in self.effective if e not in seen]
        unknown = [self.address_error] if self.address_error else []
        console = [self.console_warning] if self.console_warning else []
        warned = host_access_warnings(
            rest, self.host_addresses, self.services, gateway=self.gateway, listening=self.listening
        )
        defaults = [f"default entry: {w}" for w in warned]
        return unknown + console + typed + defaults

    @property
    def changed_agents(self) -> list[AgentRuleDiff]:
        return [d for d in self.diffs if d.changed or d.error]

    @property
    def shown_diffs(self) -> list[AgentRuleDiff]:
        """The diffs the preview lists: at most :data:`PREVIEW_DIFFS`, changed agents first."""
        return sorted(self.diffs, key=lambda d: not (d.changed or d.error))[:PREVIEW_DIFFS]

    @property
    def hidden_diffs(self) -> int:
        """How many diffs the preview only counts."""
        return max(0, len(self.diffs) - PREVIEW_DIFFS)


def check_lines(
    text: str,
    host_addresses: list[HostAddress] | None = None,
    gateway: HostAddress | None = None,
    services: list[ConsoleService] | None = None,
    listening: Listening | None = None,
) -> list[EntryCheck]:
    """Parse the textarea: one entry per line, commas also separate entries. Blank lines are
    layout and ignored; an empty piece between commas (``5000, ,6000``) is an empty entry and is
    refused like ``""`` in scalers.yaml. ``host_addresses``: what entries are warned against
    (``network.host_access.host_access_warnings``); None skips those warnings. ``gateway``: the
    agents' gateway, the address the warnings' advice names; ``services``: the console's backing
    services those warnings guard (``scalers.backends.isolation.console_services``); ``listening``:
    this host's listening sockets (``network.host_access.tcp_listening``) the warnings name."""
    checks: list[EntryCheck] = []
    seen: set[str] = set()
    for number, raw in enumerate((text or "").splitlines(), start=1):
        if not raw.strip():
            continue
        for piece in raw.split(","):
            item = piece.strip()
            try:
                parsed = parse_host_access_entry(item)
            except HostAccessError as exc:
                shown = item if len(item) <= MAX_ENTRY_LENGTH else item[:MAX_ENTRY_LENGTH] + "…"
                checks.append(EntryCheck(line=number, text=shown, ok=False, error=str(exc)))
                continue
            warning = next(
                iter(
                    host_access_warnings([parsed], host_addresses, services or (), gateway=gateway, listening=listening)
                ),
                "",
            )
            checks.append(
                EntryCheck(
                    line=number,
                    text=parsed.text,
                    ok=True,
                    meaning=describe_host_access_entry(parsed),
                    duplicate=parsed.text in seen,
                    warning=warning,
                )
            )
            seen.add(parsed.text)
    return checks


def gateway_for(scaler: Scaler) -> str:
    """The bridge gateway agents of ``scaler`` sit behind: the firecracker block's ``gateway``
    (default 10.0.0.1) for VMs, 172.30.0.1 otherwise."""
    if scaler.type == ScalerType.FIRECRACKER:
        return (ConfigState.load().firecracker or {}).get("gateway") or "10.0.0.1"
    return CONTAINER_GATEWAY


def known_host_addresses(scaler: Scaler) -> tuple[list[HostAddress] | None, str]:
    """This host's interface addresses plus the gateway of ``scaler``'s agents (its bridge may not
    exist before the first spawn), and ``""``; or ``(None, why)`` when they cannot be listed."""
    try:
        found = host_addresses()
    except NetlinkError as exc:
        return None, f"this host's addresses could not be listed ({exc}): entries are not checked against them"
    return [*found, ipaddress.ip_address(gateway_for(scaler))], ""


def effective_host_access(label_set: LabelSet, entries: list[str] | None) -> list[str]:
    """The host-access list agents of ``label_set`` get with ``entries`` as its hostAccess (None =
    the default list).

    Orchestrator URL: the scaler's ``orchestrator_url``, else ``settings.KICI_CONSOLE_URL``; host
    services: ``storage_host_access_entries(settings.KICI_STORAGE_URL)``. A label set running the
    real KiCI agent defaults to its orchestrator's port (``resolve_kici_host_access``).
    """
    scaler = label_set.scaler
    policy = None if entries is None else {"host_access": list(entries)}
    target = kici_agent_target(label_set)
    if target is not None:
        return resolve_kici_host_access(policy, target, gateway_for(scaler))[0]
    return resolve_agent_host_access(
        policy,
        scaler.orchestrator_url or settings.KICI_CONSOLE_URL,
        gateway_for(scaler),
        storage_host_access_entries(settings.KICI_STORAGE_URL),
    )


def _input_lines(agent: Agent, address: str, gateway: str, host_access: list[str]) -> list[str]:
    """The input-chain rules (the only chain host access changes) of ``agent`` at ``address`` as
    ``input: ...`` lines, worded as ``network.nft.plan.spec_rule_lines`` and the kernel read-back
    word them."""
    policy = dict(((agent.label_set.config if agent.label_set else None) or {}).get("networkPolicy") or {})
    spec = AgentSpec.build(
        address=address,
        gateway=gateway,
        allowlist=list(policy.get("allowlist") or []),
        deny_all=bool(policy.get("denyAll", False)),
        host_access=host_access,
    )
    return [line for line in spec_rule_lines(spec) if line.startswith("input: ")]


def rule_diff(agent: Agent, after: list[str], gateway: str, current_default: list[str]) -> AgentRuleDiff:
    """The input-chain diff for ``agent`` going from its stored list (or, if it has none stored,
    ``current_default``) to ``after``."""
    before = list(agent.host_access) if agent.host_access is not None else list(current_default)
    diff = AgentRuleDiff(agent=agent, before=before, after=list(after))
    address = agent.ip
    if not address:
        diff.error = "no address yet: its rules are written when it gets one"
        return diff
    try:
        old = _input_lines(agent, address, gateway, before)
    except RuleSpecError as exc:
        old = [f"(the current list does not render: {exc})"]
    try:
        new = _input_lines(agent, address, gateway, after)
    except RuleSpecError as exc:  # e.g. an allowlist entry the label set carries is bad
        diff.error = str(exc)
        return diff
    diff.lines = rule_changes(old, new)
    return diff


def plan_host_access_change(label_set: LabelSet, mode: str, text: str, *, agent_limit: int = 200) -> EditorPlan:
    """Validate ``mode`` (``default`` | ``explicit``) and ``text`` (entries, one per line) for
    ``label_set`` and compute the effective list and the per-agent rule diffs.

    Never raises for bad input: every problem is in ``errors`` (and per line in ``checks``), and
    an input with errors gets no diffs, so nothing can be applied from it.
    """
    general: list[str] = []
    checks: list[EntryCheck] = []
    entries: list[str] | None = None
    addresses, address_error = None, ""
    gateway = gateway_for(label_set.scaler)
    gateway_address = ipaddress.ip_address(gateway)
    # This host's listening sockets, read once for every warning of this preview.
    listening = tcp_listening()
    services = console_services(listening)
    if mode not in MODES:
        general.append(f"mode: must be one of {', '.join(MODES)}, got {json_text(mode)}")
    elif (limit := input_limit_error(text)) is not None:
        general.append(limit[1])  # nothing parsed: the work and the answer stay small
    elif mode == EXPLICIT:
        addresses, address_error = known_host_addresses(label_set.scaler)
        checks = check_lines(text, addresses, gateway_address, services, listening)
        entries = list(dict.fromkeys(c.text for c in checks if c.ok))
    if general or any(not c.ok for c in checks):
        return EditorPlan(label_set, mode, checks, general, None, [], [], False)
    if mode == DEFAULT:
        addresses, address_error = known_host_addresses(label_set.scaler)
    current = label_set.host_access
    # The same entries in another order (or spelling) allow the same: no change to apply.
    unchanged = (mode == DEFAULT and current is None) or (
        mode == EXPLICIT and current is not None and same_host_access(current, entries)
    )
    effective = effective_host_access(label_set, entries)
    current_effective = effective_host_access(label_set, current)
    agents = list(
        Agent.objects.filter(label_set=label_set, state__in=ACTIVE_STATES)
        .select_related("label_set")
        .order_by("created_at")[:agent_limit]
    )
    diffs = [rule_diff(a, effective, gateway, current_effective) for a in agents]
    # A real KiCI agent never dials the console: its list needs no console port.
    console = (
        None
        if kici_agent_target(label_set) is not None
        else console_port_warning(effective, label_set.scaler.orchestrator_url or settings.KICI_CONSOLE_URL, gateway)
    )
    # The textarea read as the explicit mode reads it (check_lines: lines, commas, canonical text).
    typed = [c.text for c in check_lines(text) if c.text] if mode == DEFAULT else []
    kept = set(effective) | set(current or ())
    ignored = [entry for entry in dict.fromkeys(typed) if entry not in kept]
    return EditorPlan(
        label_set,
        mode,
        checks,
        general,
        entries,
        effective,
        diffs,
        unchanged,
        addresses,
        address_error,
        console or "",
        ignored,
        gateway_address,
        services,
        listening,
    )
