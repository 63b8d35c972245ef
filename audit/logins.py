"""Sign-ins, refused sign-ins, lock-outs (django-axes) and sign-outs as audit records, from the
signals Django's auth and axes send."""

from __future__ import annotations

import ipaddress
from typing import Any

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed

from .choices import ActorKind, AuditAction
from .records import record_audit, user_actor


def _remote_addr(request: Any) -> str | None:
    """The peer address of ``request`` when it is an IP address (None without a request)."""
    raw = getattr(request, "META", {}).get("REMOTE_ADDR", "") if request is not None else ""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def _logged_in(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    actor, kind = user_actor(user)
    record_audit(AuditAction.LOGIN, actor=actor, actor_kind=kind, remote_addr=_remote_addr(request))


def _logged_out(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    if user is None:  # signing out of no session
        return
    actor, kind = user_actor(user)
    record_audit(AuditAction.LOGOUT, actor=actor, actor_kind=kind, remote_addr=_remote_addr(request))


def _login_failed(sender: Any, credentials: dict | None = None, request: Any = None, **kwargs: Any) -> None:
    name = str((credentials or {}).get("username", ""))
    record_audit(
        AuditAction.LOGIN_FAILED,
        actor=name,
        actor_kind=ActorKind.USER,
        detail="wrong user name or password, or locked out",
        remote_addr=_remote_addr(request),
    )


def _locked_out(sender: Any, request: Any = None, username: str = "", ip_address: str = "", **kwargs: Any) -> None:
    record_audit(
        AuditAction.LOCKED_OUT,
        actor=str(username or ""),
        actor_kind=ActorKind.USER,
        detail="too many failed sign-ins: locked out for the cool-off time",
        remote_addr=_remote_addr(request),
    )


def connect() -> None:
    """Connect the receivers (from ``AuditConfig.ready``; ``dispatch_uid`` keeps it once)."""
    user_logged_in.connect(_logged_in, dispatch_uid="audit.logged_in")
    user_logged_out.connect(_logged_out, dispatch_uid="audit.logged_out")
    user_login_failed.connect(_login_failed, dispatch_uid="audit.login_failed")
    user_locked_out.connect(_locked_out, dispatch_uid="audit.locked_out")
