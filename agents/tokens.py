"""Agent credentials: single-use registration tokens and per-agent session tokens. Only a token's
SHA-256 is stored (``AgentToken.token_hash``), with its first characters (``prefix``) for support.
``ket_…``: the ephemeral registration token, minted at spawn with a TTL
(``settings.KICI_AGENT_TOKEN_TTL_SECONDS``, or the event scaler's ``agentTokenTtlSeconds``), handed
to the sandbox in ``KICI_AGENT_TOKEN``, redeemed once by ``POST /api/v1/agents/register``.
``kas_…``: the session token a registration returns once; it authenticates the agent's heartbeats
until it reaches a terminal state.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .models import Agent, AgentToken

REGISTRATION_PREFIX = "ket_"
SESSION_PREFIX = "kas_"
#: Session tokens outlive any realistic job; they die with the agent (terminal state) anyway.
SESSION_TTL_SECONDS = 30 * 24 * 3600


class TokenRejected(Exception):
    """A token that does not authenticate. ``reason``: unknown | expired | used | invalid-token | agent-mismatch.

    ``invalid-token``: not a token of the kind asked for (no ``ket_`` / ``kas_`` prefix).
    """

    def __init__(self, reason: str):
        super().__init__(f"token rejected: {reason}")
        self.reason = reason


def hash_token(raw: str) -> str:
    """Hex SHA-256 of the token text (what the database stores)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def _mint(agent: Agent, prefix: str, ttl_seconds: float) -> str:
    raw = prefix + secrets.token_urlsafe(32)
    AgentToken.objects.create(
        agent=agent,
        token_hash=hash_token(raw),
        prefix=raw[:12],
        expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
    )
    return raw


def mint_registration_token(agent: Agent, ttl_seconds: float | None = None) -> str:
    """Mint a single-use registration token for ``agent``; returns the raw text (shown once).

    ``ttl_seconds`` defaults to ``settings.KICI_AGENT_TOKEN_TTL_SECONDS`` (3600), read at every
    call so a changed setting applies to the next spawn. Raises ``ValueError`` for ttl <= 0.
    """
    ttl = settings.KICI_AGENT_TOKEN_TTL_SECONDS if ttl_seconds is None else ttl_seconds
    if ttl <= 0:
        raise ValueError(f"ttl_seconds must be positive, got {ttl!r}")
    return _mint(agent, REGISTRATION_PREFIX, ttl)


def redeem_registration_token(raw: str) -> Agent:
    """Consume a registration token atomically and return its agent.

    Compare-and-swap on ``used_at IS NULL AND expires_at > now``, so two concurrent redemptions
    of one token cannot both win. Raises :class:`TokenRejected` (``invalid-token``, ``unknown``,
    ``used`` or ``expired``).
    """
    if not isinstance(raw, str) or not raw.startswith(REGISTRATION_PREFIX):
        raise TokenRejected("invalid-token")
    digest = hash_token(raw)
    now = timezone.now()
    with transaction.atomic():
        won = AgentToken.objects.filter(token_hash=digest, used_at__isnull=True, expires_at__gt=now).update(used_at=now)
        token = AgentToken.objects.select_related("agent").filter(token_hash=digest).first()
    if token is None:
        raise TokenRejected("unknown")
    if not won:
        raise TokenRejected("used" if token.used_at is not None else "expired")
    return token.agent


def mint_session_token(agent: Agent) -> str:
    """Mint the heartbeat credential returned by a successful registration (raw text, shown once)."""
    return _mint(agent, SESSION_PREFIX, SESSION_TTL_SECONDS)


def authenticate_session(raw: str, agent_id: str) -> Agent:
    """The agent a session token belongs to, checked against ``agent_id`` from the URL.

    The agent comes with ``pk``, ``agent_id``, ``state`` and ``scaler_id`` alone, from one indexed
    query that builds no model of the token: what a heartbeat reads. Its other fields are unset.

    Raises :class:`TokenRejected` (``invalid-token``, ``unknown``, ``expired``, ``agent-mismatch``).
    """
    if not isinstance(raw, str) or not raw.startswith(SESSION_PREFIX):
        raise TokenRejected("invalid-token")
    try:
        token = AgentToken.objects.values(
            "expires_at", "agent_id", "agent__agent_id", "agent__state", "agent__scaler_id"
        ).get(token_hash=hash_token(raw))
    except AgentToken.DoesNotExist:
        raise TokenRejected("unknown") from None
    if token["expires_at"] <= timezone.now():
        raise TokenRejected("expired")
    if token["agent__agent_id"] != agent_id:
        raise TokenRejected("agent-mismatch")
    return Agent(
        pk=token["agent_id"],
        agent_id=token["agent__agent_id"],
        state=token["agent__state"],
        scaler_id=token["agent__scaler_id"],
    )


def revoke_registration_tokens(agent: Agent) -> int:
    """Expire ``agent``'s unused registration tokens now (its sandbox is gone: nothing may register
    as it). Its session tokens stay, so a late heartbeat still hears "stop". Returns how many."""
    now = timezone.now()
    return (
        AgentToken.objects.filter(agent=agent, expires_at__gt=now, used_at__isnull=True)
        .filter(prefix__startswith=REGISTRATION_PREFIX)
        .update(expires_at=now)
    )


def revoke_agent_tokens(agent: Agent) -> int:
    """Expire every token of ``agent`` now (spawn failure, destroy). Returns how many changed."""
    now = timezone.now()
    return AgentToken.objects.filter(agent=agent, expires_at__gt=now).update(expires_at=now)
