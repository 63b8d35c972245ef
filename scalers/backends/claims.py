"""The event scaler's claim store, kept in Redis.

A claim code is 32 random bytes as 64 hex characters, handed to the provisioning target inside
the ``kici.scaler.scale-up`` event. Only its SHA-256 and first 12 characters are stored, under
``kici:claim:<sha256>``, with the agent id, the scaler and the expiry; the key itself lives for
``claimTtlSeconds`` + ``CLAIM_RETENTION_SECONDS`` so an expired code still answers "expired"
rather than "invalid" for an hour. Redemption is single-use and atomic (a Lua script), then a
registration token is minted with ``agentTokenTtlSeconds`` (default 600 s).
"""

from __future__ import annotations

import hashlib
import secrets
import time

from django.conf import settings

from agents import tokens
from agents.choices import UNREGISTERED_STATES
from agents.models import Agent

from .spawn_env import console_url, full_labels

DEFAULT_CLAIM_TTL_SECONDS = 300
DEFAULT_AGENT_TOKEN_TTL_SECONDS = 600
#: How long an expired or consumed claim is remembered, in seconds (then purged).
CLAIM_RETENTION_SECONDS = 3600

_REDEEM = """
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then return 'invalid' end
if redis.call('HGET', k, 'state') == 'consumed' then return 'consumed' end
if tonumber(redis.call('HGET', k, 'expires_at')) <= tonumber(ARGV[1]) then return 'expired' end
redis.call('HSET', k, 'state', 'consumed', 'consumed_at', ARGV[1])
return 'ok'
"""

MESSAGES = {
    "invalid": "invalid claim code",
    "consumed": "claim code already consumed",
    "expired": "claim code expired",
}


class ClaimError(Exception):
    """A claim that cannot be redeemed; ``str()`` is the matching entry of :data:`MESSAGES`."""


def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def _key(digest: str) -> str:
    return f"kici:claim:{digest}"


def _agent_key(agent_id: str) -> str:
    return f"kici:claims-of:{agent_id}"


def create_claim(
    agent, ttl_seconds: int = DEFAULT_CLAIM_TTL_SECONDS, token_ttl_seconds: int = DEFAULT_AGENT_TOKEN_TTL_SECONDS
) -> str:
    """Register a claim for ``agent``; returns the code (shown once). ``ttl_seconds`` > 0."""
    if ttl_seconds <= 0 or token_ttl_seconds <= 0:
        raise ValueError(f"claim ttl and token ttl must be positive, got {ttl_seconds!r}, {token_ttl_seconds!r}")
    code = secrets.token_hex(32)
    digest = hashlib.sha256(code.encode()).hexdigest()
    now = time.time()
    r = _redis()
    pipe = r.pipeline()
    pipe.hset(
        _key(digest),
        mapping={
            "agent_id": agent.agent_id,
            "scaler": agent.scaler.name,
            "prefix": code[:12],
            "expires_at": repr(now + ttl_seconds),
            "token_ttl": str(int(token_ttl_seconds)),
            "state": "pending",
        },
    )
    pipe.expire(_key(digest), int(ttl_seconds + CLAIM_RETENTION_SECONDS))
    pipe.sadd(_agent_key(agent.agent_id), digest)
    pipe.expire(_agent_key(agent.agent_id), int(ttl_seconds + CLAIM_RETENTION_SECONDS))
    pipe.execute()
    return code


def redeem_claim(code: str) -> dict:
    """Redeem ``code`` once and mint the agent's registration token.

    Returns ``{agentId, token, orchestratorUrl, labels}``. Raises :class:`ClaimError` with
    ``invalid claim code`` / ``claim code already consumed`` / ``claim code expired`` (also when
    the agent is no longer spawning).
    """
    if not isinstance(code, str) or len(code) != 64:
        raise ClaimError(MESSAGES["invalid"])
    digest = hashlib.sha256(code.encode()).hexdigest()
    r = _redis()
    verdict = r.eval(_REDEEM, 1, _key(digest), repr(time.time()))
    verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
    if verdict != "ok":
        raise ClaimError(MESSAGES[verdict])
    fields = {k.decode(): v.decode() for k, v in r.hgetall(_key(digest)).items()}
    agent = Agent.objects.select_related("scaler", "label_set").filter(agent_id=fields.get("agent_id", "")).first()
    if agent is None or agent.state not in UNREGISTERED_STATES:
        raise ClaimError(MESSAGES["invalid"])
    token = tokens.mint_registration_token(
        agent, ttl_seconds=int(fields.get("token_ttl") or DEFAULT_AGENT_TOKEN_TTL_SECONDS)
    )
    return {
        "agentId": agent.agent_id,
        "token": token,
        "orchestratorUrl": console_url(agent.scaler),
        "labels": full_labels(agent),
    }


def invalidate_claims(agent_id: str) -> int:
    """Forget every claim of ``agent_id`` (destroy). Returns how many were dropped."""
    r = _redis()
    digests = [d.decode() for d in r.smembers(_agent_key(agent_id))]
    if digests:
        r.delete(*[_key(d) for d in digests])
    r.delete(_agent_key(agent_id))
    return len(digests)
