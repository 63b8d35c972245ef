"""Who may call the orchestrator's API: ``KICI_API_TOKEN`` from the environment, and named tokens
kept as :class:`scalers.models.ApiToken` records (hashed at rest, shown once, scoped, expiring,
revocable), managed by an administrator on ``/tokens/`` or with ``manage.py api_tokens``. A bearer
is checked against ``KICI_API_TOKEN`` first (no database), then against the records by its
SHA-256; a verdict on a record is kept in this process for :data:`VERDICT_SECONDS` (a revocation
takes effect everywhere within that), and ``last_used_at`` is written at most once a minute.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lib.wording import json_text
from scalers.models import ApiToken

#: What a token may do: ``scale`` (POST /scale, job-complete, release) and ``read`` (GET agents).
SCOPES = ("scale", "read")
#: The name requests authenticated by ``KICI_API_TOKEN`` are recorded under.
ENV_TOKEN_NAME = "KICI_API_TOKEN"
#: Raw tokens start with this, so a leaked one is recognisable (secret scanners, logs).
TOKEN_PREFIX = "kct_"
#: Seconds a verdict on a record token is reused in this process.
VERDICT_SECONDS = 5.0
#: Seconds between two writes of a token's ``last_used_at``.
LAST_USED_SECONDS = 60
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
#: Longest expiry one may give, in days.
MAX_EXPIRY_DAYS = 3650


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the token's name and what it may do."""

    name: str
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        return scope in self.scopes


class TokenError(ValueError):
    """A token that cannot be created or revoked as asked; ``field`` names the input at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def hash_token(raw: str) -> str:
    """Hex SHA-256 of the raw token (what the record keeps)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def check_name(name: str) -> str:
    """``name`` when it is 1-63 characters of a-z, 0-9, ``.``, ``_``, ``-`` starting with a letter
    or digit and not the environment token's name; TokenError naming ``name`` otherwise."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        rule = "1-63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
        raise TokenError("name", f"{rule}, got {json_text(name)}")
    if name.upper() == ENV_TOKEN_NAME:
        raise TokenError("name", f"{ENV_TOKEN_NAME} is the environment's token")
    return name


def check_scopes(scopes) -> list[str]:
    """The scopes, in :data:`SCOPES` order, when they are a non-empty subset of it; TokenError
    naming ``scopes`` otherwise."""
    given = list(scopes or [])
    unknown = [s for s in given if s not in SCOPES]
    if unknown or not given:
        raise TokenError("scopes", f"one or more of {', '.join(SCOPES)}, got {json_text(given)}")
    return [s for s in SCOPES if s in given]


def check_expiry_days(days: int | None) -> timedelta | None:
    """None (never expires) or ``days`` as a timedelta when 1..:data:`MAX_EXPIRY_DAYS`."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_EXPIRY_DAYS:
        raise TokenError("expires_days", f"a whole number of days within 1..{MAX_EXPIRY_DAYS}, got {json_text(days)}")
    return timedelta(days=days)


def create_token(name: str, scopes, *, expires_days: int | None = None, created_by: str = "") -> tuple[ApiToken, str]:
    """Create the token ``name`` and return its record and the raw token (shown once, never kept).
    Every input is checked first (TokenError naming it, nothing written); a name in use, revoked
    or not, is refused."""
    name = check_name(name)
    scopes = check_scopes(scopes)
    lifetime = check_expiry_days(expires_days)
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        if ApiToken.objects.select_for_update().filter(name=name).exists():
            raise TokenError("name", f"a token named {json_text(name)} exists (revoked names are not reused)")
        token = ApiToken.objects.create(
            name=name,
            token_hash=hash_token(raw),
            prefix=raw[:12],
            scopes=scopes,
            created_by=created_by,
            expires_at=timezone.now() + lifetime if lifetime else None,
        )
    return token, raw


def revoke_token(name: str, *, revoked_by: str = "") -> ApiToken:
    """Revoke the token ``name`` now (idempotent: a revoked one keeps its first revocation).
    TokenError naming ``name`` when there is none."""
    token = ApiToken.objects.filter(name=name).first()
    if token is None:
        raise TokenError("name", f"no token named {json_text(name)}")
    if token.revoked_at is None:
        now = timezone.now()
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now, revoked_by=revoked_by)
        token.refresh_from_db()
    forget_verdicts()
    return token


def token_state(token: ApiToken, now: datetime | None = None) -> str:
    """``active``, ``expired`` or ``revoked``."""
    now = now or timezone.now()
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "active"


_verdicts: dict[str, tuple[float, Caller | None]] = {}
_verdicts_lock = threading.Lock()


def environment_caller(raw: str) -> Caller | None:
    """The caller of ``KICI_API_TOKEN`` when ``raw`` is it (constant-time), else None; no database."""
    expected = settings.KICI_API_TOKEN
    if expected and hmac.compare_digest(raw.encode(), expected.encode()):
        return Caller(ENV_TOKEN_NAME, frozenset(SCOPES))
    return None


def record_caller(raw: str) -> Caller | None:
    """The caller of the active record token ``raw``, else None (reads the database at most once
    per :data:`VERDICT_SECONDS` per token in this process). Raises database errors."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(raw)
    now_mono = time.monotonic()
    with _verdicts_lock:
        cached = _verdicts.get(digest)
    if cached is not None and cached[0] > now_mono:
        return cached[1]
    now = timezone.now()
    token = ApiToken.objects.filter(token_hash=digest).first()
    caller = None
    if token is not None and token_state(token, now) == "active":
        caller = Caller(token.name, frozenset(token.scopes))
        if token.last_used_at is None or token.last_used_at < now - timedelta(seconds=LAST_USED_SECONDS):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    with _verdicts_lock:
        if len(_verdicts) > 10_000:
            _verdicts.clear()
        _verdicts[digest] = (now_mono + VERDICT_SECONDS, caller)
    return caller


def token_caller(raw: str) -> Caller | None:
    """The caller whose bearer token is ``raw`` ("" for none sent): ``KICI_API_TOKEN`` first (no
    database), then a record (:func:`record_caller`); None when it is neither. Raises database
    errors."""
    if not raw:
        return None
    return environment_caller(raw) or record_caller(raw)


def forget_verdicts() -> None:
    """Drop this process's kept verdicts (a revocation here takes effect at once)."""
    with _verdicts_lock:
        _verdicts.clear()


def any_configured() -> bool:
    """Whether any token could be accepted: ``KICI_API_TOKEN`` or an active record."""
    if settings.KICI_API_TOKEN:
        return True
    now = timezone.now()
    return ApiToken.objects.filter(revoked_at__isnull=True).exclude(expires_at__lte=now).exists()
