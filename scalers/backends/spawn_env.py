"""What every agent is spawned with: labels, console URL, environment, limits.

Pure functions over a scaler, its label set and an agent, shared by the container, bare-metal
and event backends so the three cannot drift; the real KiCI agent's environment
(:func:`kici_agent_pairs`) is the container's, the Firecracker VM's and the bare-metal process's alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings

from scalers.kici_orchestrator import agent_labels as kici_agent_labels
from scalers.kici_orchestrator import kici_agent_target, scale_up_claim
from scalers.labels import agent_labels
from scalers.models import ConfigState
from scalers.resources import EffectiveLimits, effective_limits, resolve_resources

from .base import scaler_option
from .ownership import current_owner

if TYPE_CHECKING:
    from agents.models import Agent
    from scalers.models import LabelSet, Scaler

#: Prefix of host environment variables forwarded into every agent, suffix = the agent's name.
FORWARD_PREFIX = "KICI_AGENT_ENV_"

#: The real KiCI agent's ``KICI_EXECUTION_MODE`` values (where its steps run).
KICI_EXECUTION_MODES = ("bare-metal", "container", "firecracker")

#: System variables a bare-metal process inherits; everything else is dropped
#: unless KICI_TRUSTED_ENV=true.
PROCESS_ENV_ALLOWLIST = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR", "TERM")


def label_set_option(label_set: LabelSet | None, key: str, default: Any = None) -> Any:
    """Read a label-set field by its yaml name (camelCase), else ``default``."""
    if label_set is None:
        return default
    return scaler_option(label_set.config or {}, key, default)


def network_policy(label_set: LabelSet | None) -> dict:
    """The label set's ``networkPolicy`` with ``hostAccess`` taken from ``LabelSet.host_access``.

    The column is the source of truth (the host-access editor changes it without re-importing):
    a list (even ``[]``) is the explicit policy, ``None`` means the default
    (``isolation.resolve_host_access``).
    """
    policy = dict(label_set_option(label_set, "networkPolicy") or {})
    policy.pop("hostAccess", None)
    policy.pop("host_access", None)
    if label_set is not None and label_set.host_access is not None:
        policy["hostAccess"] = list(label_set.host_access)
    return policy


def console_url(scaler: Scaler) -> str:
    """The URL agents dial back: the scaler's ``orchestratorUrl``, else ``settings.KICI_CONSOLE_URL``."""
    return (scaler.orchestrator_url or scaler_option(scaler, "orchestratorUrl") or settings.KICI_CONSOLE_URL).strip()


def full_labels(agent: Agent) -> list[str]:
    """The agent's full labels (declared + ``kici:`` auto labels), as admission stored them.

    Falls back to ``scalers.labels.agent_labels`` over the label set when the row carries none.
    """
    if agent.labels:
        return list(agent.labels)

    declared = agent.label_set.labels if agent.label_set is not None else []
    return agent_labels(
        declared, scaler_name=agent.scaler.name, scaler_type=agent.scaler.type, roles=agent.scaler.roles
    )


def normalized_label_set(agent: Agent) -> str:
    """``kici-labels`` value: the label set's normalized form (sorted, de-duplicated, comma-joined)."""
    if agent.label_set is not None:
        return agent.label_set.normalized
    declared = [label for label in full_labels(agent) if not label.startswith("kici:")]
    return ",".join(sorted(set(declared)))


def forwarded_env(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Host ``KICI_AGENT_ENV_<X>=v`` as ``(X, v)``, in sorted order; an empty suffix is skipped."""
    environ = os.environ if environ is None else environ
    out = []
    for key in sorted(environ):
        if key.startswith(FORWARD_PREFIX) and len(key) > len(FORWARD_PREFIX):
            out.append((key[len(FORWARD_PREFIX) :], environ[key]))
    return out


def _label_env(label_set: LabelSet | None) -> list[tuple[str, str]]:
    env = label_set_option(label_set, "env", {}) or {}
    if not isinstance(env, Mapping):
        raise ValueError(f"labelSets.env must be a mapping, got {type(env).__name__}")
    return [(str(k), str(v)) for k, v in env.items()]


def kici_agent_pairs(agent: Agent, token: str | None, *, execution_mode: str) -> list[tuple[str, str]]:
    """The environment of the real KiCI agent (label set ``kiciAgent``) as ``(name, value)`` pairs in
    order: exactly the variables it accepts and needs, nothing of the console's own agent nor
    forwarded; every backend running it starts it with these. ``execution_mode``: where its steps
    run (``bare-metal`` or ``firecracker``). An agent a KiCI scale-up asked for gets the scale-up's URL
    and labels and a claim code instead of a token. Each variable: docs/real-kici-agent.md (the
    spawn's "Environment", and "The spawn" of a scale-up). Raises ``ValueError`` for a label set
    without ``kiciAgent``, an agent with neither token nor claim code, or an unknown mode.
    """
    target = kici_agent_target(agent.label_set)
    claim = scale_up_claim(agent)
    if target is None or not (token or claim):
        raise ValueError(
            f"{agent.agent_id}: the real KiCI agent needs a kiciAgent label set and an orchestrator token or claim code"
        )
    if execution_mode not in KICI_EXECUTION_MODES:
        raise ValueError(f"execution_mode must be one of {KICI_EXECUTION_MODES}, got {execution_mode!r}")
    if claim is not None:
        pairs = [
            ("KICI_ORCHESTRATOR_URL", claim.orchestrator_url),
            ("KICI_AGENT_ID", agent.agent_id),
            ("KICI_LABELS", ",".join(claim.labels)),
            ("KICI_SCALER_CLAIM_CODE", claim.claim_code),
        ]
        roles = list(claim.roles) or agent.scaler.roles
    else:
        pairs = [
            ("KICI_ORCHESTRATOR_URL", target.ws_url),
            ("KICI_AGENT_ID", agent.agent_id),
            ("KICI_LABELS", ",".join(kici_agent_labels(agent.label_set))),
            ("KICI_AGENT_TOKEN", str(token)),
        ]
        roles = agent.scaler.roles
    if roles is not None and "all" not in roles:
        pairs.append(("KICI_ROLES", ",".join(roles)))
    pairs += [("KICI_SCALER_MANAGED", "1"), ("KICI_EXECUTION_MODE", execution_mode)]
    return pairs


def kici_agent_env(agent: Agent, token: str | None) -> list[str]:
    """``Env`` of a container running the real KiCI agent: :func:`kici_agent_pairs` with steps run
    in the container (``KICI_EXECUTION_MODE=bare-metal``)."""
    return [f"{k}={v}" for k, v in kici_agent_pairs(agent, token, execution_mode="bare-metal")]


def kici_process_env(agent: Agent, token: str | None, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a bare-metal process running the real KiCI agent: the allow-listed system
    variables of ``environ`` (:data:`PROCESS_ENV_ALLOWLIST`: ``PATH``, ``HOME``, ``TMPDIR``, ...; never
    ``KICI_TRUSTED_ENV``'s whole environment nor a forwarded ``KICI_AGENT_ENV_*``, since the agent
    refuses every ``KICI_*`` it does not know), then :func:`kici_agent_pairs` with steps run as the
    agent's own processes on this host (``KICI_EXECUTION_MODE=bare-metal``). Raises ``ValueError``
    as :func:`kici_agent_pairs` does."""
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in PROCESS_ENV_ALLOWLIST if k in environ}
    env.update(kici_agent_pairs(agent, token, execution_mode="bare-metal"))
    return env


def container_env(
    agent: Agent, token: str | None, *, image: str, environ: Mapping[str, str] | None = None, job_image: bool = False
) -> list[str]:
    """``Env`` of an agent container (:func:`kici_agent_env` for a ``kiciAgent`` label set), in this order:

    ``KICI_ORCHESTRATOR_URL``, ``KICI_AGENT_ID``, ``KICI_LABELS``, ``KICI_SCALER_MANAGED=1``,
    ``KICI_EXECUTION_MODE=bare-metal``, ``KICI_RUNTIME_IMAGE``, ``KICI_AGENT_TOKEN`` (when
    minted), ``KICI_BACKPRESSURE_MODE`` (label set ``backpressureMode``), ``KICI_JOB_IMAGE_AGENT=1``
    (bare-metal container mode), forwarded ``KICI_AGENT_ENV_*``, then label-set ``env`` (later
    entries win, so the yaml beats the forwarded value).
    """
    if kici_agent_target(agent.label_set) is not None:
        return kici_agent_env(agent, token)
    pairs: list[tuple[str, str]] = [
        ("KICI_ORCHESTRATOR_URL", console_url(agent.scaler)),
        ("KICI_AGENT_ID", agent.agent_id),
        ("KICI_LABELS", ",".join(full_labels(agent))),
        ("KICI_SCALER_MANAGED", "1"),
        ("KICI_EXECUTION_MODE", "bare-metal"),
        ("KICI_RUNTIME_IMAGE", image),
    ]
    if token:
        pairs.append(("KICI_AGENT_TOKEN", token))
    backpressure = label_set_option(agent.label_set, "backpressureMode")
    if backpressure:
        pairs.append(("KICI_BACKPRESSURE_MODE", str(backpressure)))
    if job_image:
        pairs.append(("KICI_JOB_IMAGE_AGENT", "1"))
    pairs += forwarded_env(environ)
    pairs += _label_env(agent.label_set)
    return [f"{k}={v}" for k, v in pairs]


def process_env(agent: Agent, token: str | None, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a bare-metal agent process (process mode).

    Allow-listed system variables (all of them when ``KICI_TRUSTED_ENV=true`` in the label env
    or the forwarded host env), forwarded ``KICI_AGENT_ENV_*``, then ``KICI_AGENT_TOKEN``,
    ``KICI_ORCHESTRATOR_URL``, ``KICI_AGENT_ID``, ``KICI_LABELS``, ``KICI_SCALER_MANAGED=1``,
    ``KICI_EXECUTION_MODE=bare-metal``, ``KICI_PORT=0``, ``KICI_RUNTIME_IMAGE`` (if an image),
    ``KICI_BACKPRESSURE_MODE``, then label-set ``env`` (wins).
    """
    environ = os.environ if environ is None else environ
    forwarded = forwarded_env(environ)
    label_env = _label_env(agent.label_set)
    trusted = dict(label_env).get("KICI_TRUSTED_ENV") == "true" or dict(forwarded).get("KICI_TRUSTED_ENV") == "true"
    env: dict[str, str] = dict(environ) if trusted else {k: environ[k] for k in PROCESS_ENV_ALLOWLIST if k in environ}
    env.update(forwarded)
    if token:
        env["KICI_AGENT_TOKEN"] = token
    env.update(
        {
            "KICI_ORCHESTRATOR_URL": console_url(agent.scaler),
            "KICI_AGENT_ID": agent.agent_id,
            "KICI_LABELS": ",".join(full_labels(agent)),
            "KICI_SCALER_MANAGED": "1",
            "KICI_EXECUTION_MODE": "bare-metal",
            "KICI_PORT": "0",
        }
    )
    image = label_set_option(agent.label_set, "image")
    if image:
        env["KICI_RUNTIME_IMAGE"] = str(image)
    backpressure = label_set_option(agent.label_set, "backpressureMode")
    if backpressure:
        env["KICI_BACKPRESSURE_MODE"] = str(backpressure)
    env.update(label_env)
    return env


def container_labels(agent: Agent, *, bound_job_labels: bool = True) -> dict[str, str]:
    """Labels stamped on an agent container (container backend and bare-metal container mode).

    ``kici-managed=true``, the ownership labels (``kici-installation-id``, ``kici-instance-id``,
    ``kici-scaler-name``: ``scalers.backends.ownership``), ``kici-agent-id``, ``kici-labels``; plus
    ``kici-bound-job-id`` / ``kici-run-id`` for a job-bound spawn when ``bound_job_labels``.
    Raises database errors (the installation id is read, made on first use).
    """
    labels = {
        "kici-managed": "true",
        **current_owner(agent.scaler.name).labels(),
        "kici-agent-id": agent.agent_id,
        "kici-labels": normalized_label_set(agent),
    }
    if bound_job_labels and agent.bound_job_id:
        labels["kici-bound-job-id"] = agent.bound_job_id
        if agent.run_id:
            labels["kici-run-id"] = agent.run_id
    return labels


def spawn_limits(agent: Agent) -> EffectiveLimits:
    """Limits for this spawn: the reservation's resolved limits when either is set, else the
    label set's (or ``defaults``') limits side."""
    reservation = getattr(agent, "reservation", None) if agent.pk else None
    try:
        if reservation is not None and (reservation.limit_cpus > 0 or reservation.limit_memory_bytes > 0):
            return effective_limits(reservation.limit_cpus, reservation.limit_memory_bytes)
    except Exception:  # noqa: BLE001 - RelatedObjectDoesNotExist: no reservation row
        pass
    ls = agent.label_set
    ls_resources = label_set_option(ls, "resources")
    flat = {k: label_set_option(ls, k) for k in ("cpus", "memory") if label_set_option(ls, k) is not None}
    layer = ls_resources if ls_resources is not None else (flat or None)
    state = ConfigState.objects.filter(pk=1).first()
    defaults = (state.defaults or {}) if state else {}
    if "resources" in defaults:
        defaults = defaults["resources"]
    defaults = defaults or None
    resolved = resolve_resources(None, layer, defaults)
    return effective_limits(resolved.limits.cpus, resolved.limits.mem_bytes)
