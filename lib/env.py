"""Typed readers for settings that come from the environment.

Every helper refuses a malformed value with ``ImproperlyConfigured`` naming the
variable and the value, so a typo fails at start-up rather than as a surprise later.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import overload
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    """Return ``$name`` or ``default`` when unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def env_bool(name: str, default: bool = False) -> bool:
    """Parse ``$name`` as a boolean (1/0, true/false, yes/no, on/off)."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Parse ``$name`` as an integer within ``[minimum, maximum]``."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Parse ``$name`` as a comma-separated list (blank items dropped)."""
    raw = os.environ.get(name, "")
    if raw == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(name: str, url: str) -> dict:
    """Turn ``postgres://user:pass@host:port/db`` into a Django DATABASES entry.

    Only PostgreSQL is accepted: admission relies on its row locks and advisory locks.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(f"{name}={url!r}: only postgres:// URLs are supported")
    db = parts.path.lstrip("/")
    if not db:
        raise ImproperlyConfigured(f"{name}={url!r}: the URL names no database")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={url!r}: the port is not a number") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(db),
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(port or 5432),
    }


def database_pool(pool_size: int, conn_max_age: int) -> dict:
    """The ``OPTIONS`` of a DATABASES entry whose process keeps up to ``pool_size`` persistent
    connections in a psycopg pool (Django's ``pool`` option), ``{}`` for 0 (one connection per
    request or job). A request waits up to 10 s for a free connection, then fails with
    OperationalError; a connection idle for 5 minutes is closed (the pool keeps one). Raises
    ImproperlyConfigured naming ``DB_CONN_MAX_AGE`` when it is set too: Django refuses both."""
    if not pool_size:
        return {}
    if conn_max_age:
        raise ImproperlyConfigured(
            f"DB_CONN_MAX_AGE={conn_max_age} with KICI_DB_POOL_SIZE={pool_size}: a pooled connection is "
            "already persistent; leave DB_CONN_MAX_AGE at 0"
        )
    return {"pool": {"min_size": 1, "max_size": pool_size, "timeout": 10, "max_idle": 300}}


def redis_url(name: str, default: str) -> str:
    """Return ``$name`` after checking it is a ``redis://``, ``rediss://`` or
    ``unix:///path?db=N&password=...`` URL (the forms redis-py, rq and channels-redis all read)."""
    url = env_str(name, default)
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"{name}={redact_url(url)!r}: expected a redis://, rediss:// or unix:// URL")
    try:
        _ = parts.port  # urlsplit parses the port lazily: reading it raises on a non-number
        redis_place(url)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={redact_url(url)!r}: {exc}") from None
    return url


def redis_place(url: str) -> tuple[str, int]:
    """``(server, db)`` of a Redis URL: ``("unix:<socket path>", db)`` or ``("<host>:<port>", db)``
    (port 6379 when the URL names none; db from the path or ``?db=``, 0 when neither). Two URLs
    with the same place reach the same keys whatever their password. ValueError for a db that is
    not a number."""
    from redis.connection import parse_url

    kwargs = parse_url(url)
    server = (
        f"unix:{kwargs['path']}"
        if "path" in kwargs
        else f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    )
    return server, int(kwargs.get("db") or 0)


def redact_url(url: str) -> str:
    """``url`` with its password (in the user info or a ``password=`` parameter) shown as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if at and colon:
        netloc = f"{user}:***@{hostport}"
    query = "&".join(
        "password=***" if pair.partition("=")[0] == "password" else pair for pair in parts.query.split("&") if pair
    )
    redacted = parts._replace(netloc=netloc, query=query).geturl()
    if not parts.netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its "//"
        redacted = redacted.replace(":", "://", 1)
    return redacted


def env_url_map(name: str) -> dict[str, str]:
    """Parse ``$name`` as ``key=http(s)://url,key2=...`` (e.g. provisioning target names to URLs)."""
    raw = os.environ.get(name, "")
    out: dict[str, str] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        key, sep, url = part.partition("=")
        key, url = key.strip(), url.strip()
        if not sep or not key or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ImproperlyConfigured(f"{name}: {part!r} is not NAME=http(s)://host/path")
        out[key] = url
    return out


def env_http_url(name: str, default: str = "") -> str:
    """``$name`` as an ``http(s)://host/...`` URL, or ``default`` when unset or empty; refuses
    any other value naming the variable (without echoing credentials in it)."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        scheme = parts.scheme or "(none)"
        raise ImproperlyConfigured(f"{name}: expected an http(s)://host/path URL, got scheme {scheme!r}")
    return raw


def env_listeners(name: str, default: str, *, optional: bool = False) -> list[tuple[str, int | None]]:
    """Parse ``$name`` as comma-separated ``host:port`` listeners (``[v6]:port``; port ``*`` = any).

    Returns ``(host, port)`` pairs, ``port`` None for ``*``; with ``optional``, none when it names
    none. Refuses an item without a host or port, or with a port outside 1-65535, naming the
    variable and the item.
    """
    raw = os.environ.get(name, "") or default
    listeners: list[tuple[str, int | None]] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port:
            raise ImproperlyConfigured(f"{name}: {item!r} is not host:port")
        if port == "*":
            listeners.append((host, None))
            continue
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ImproperlyConfigured(f"{name}: {item!r} has no port in 1-65535 (or *)")
        listeners.append((host, int(port)))
    if not listeners and not optional:
        raise ImproperlyConfigured(f"{name} names no listener")
    return listeners


def env_secrets_key(name: str) -> str | None:
    """``$name`` as a Fernet key (url-safe base64 of 32 bytes, as ``Fernet.generate_key()`` makes
    it), or None when unset. The value itself is never part of the error."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return None
    try:
        decoded = base64.urlsafe_b64decode(raw.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        decoded = b""
    if len(decoded) != 32:
        raise ImproperlyConfigured(f"{name} is not a Fernet key (url-safe base64 of 32 bytes)")
    return raw
