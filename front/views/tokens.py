"""``/tokens/``: the orchestrator's named API tokens (``scalers.api_tokens``), for administrators
(superusers) only: list them, create one (its token shown once, on the answer to the POST), revoke
one. Every other user gets 403; the CLI twin is ``manage.py api_tokens``."""

from __future__ import annotations

import re
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from lib.wording import json_text
from scalers.api_tokens import (
    ENV_TOKEN_NAME,
    MAX_EXPIRY_DAYS,
    SCOPES,
    TokenError,
    create_token,
    revoke_token,
    token_state,
)
from scalers.models import ApiToken


def admin_required(view):
    """Signed in (else the login page) and a superuser (else 403)."""

    @wraps(view)
    def check(request, *args, **kwargs):
        if not request.user.is_superuser:
            raise PermissionDenied("API tokens are managed by administrators")
        return view(request, *args, **kwargs)

    return login_required(check)


def _page(request, *, created=None, raw: str = "", error: str = "", form: dict | None = None, status: int = 200):
    now = timezone.now()
    tokens = [(token, token_state(token, now)) for token in ApiToken.objects.all()]
    ctx = {
        "tokens": tokens,
        "scopes": SCOPES,
        "env_name": ENV_TOKEN_NAME,
        "created": created,
        "raw": raw,
        "error": error,
        "form": form or {"scopes": list(SCOPES)},
    }
    return render(request, "scalers/tokens.html", ctx, status=status)


@require_http_methods(["GET", "POST"])
@admin_required
def token_list(request):
    """GET the list; POST ``name``, ``scopes`` (repeated), ``expires_days`` (empty: never) creates a
    token and answers the page with it shown once (400 naming the field at fault, nothing made)."""
    if request.method == "GET":
        return _page(request)
    form = {
        "name": request.POST.get("name", "").strip(),
        "scopes": request.POST.getlist("scopes"),
        "expires_days": request.POST.get("expires_days", "").strip(),
    }
    try:
        days = form["expires_days"]
        if days and not re.fullmatch(r"-?[0-9]{1,9}", days):
            raise TokenError(
                "expires_days", f"a whole number of days within 1..{MAX_EXPIRY_DAYS}, got {json_text(days)}"
            )
        who = request.user.get_username()
        lifetime = int(days) if days else None
        token, raw = create_token(form["name"], form["scopes"], expires_days=lifetime, created_by=who)
    except TokenError as exc:
        return _page(request, error=str(exc), form=form, status=400)
    return _page(request, created=token, raw=raw)


@require_http_methods(["GET", "POST"])
@admin_required
def token_revoke(request, name: str):
    """GET: the confirmation step (what revoking ``name`` does, with its last use); POST: revoke
    it (404 for an unknown one), then back to the list."""
    if request.method == "GET":
        token = ApiToken.objects.filter(name=name).first()
        if token is None or token_state(token) != "active":
            return _page(request, error=f"name: no active token named {json_text(name)}", status=404)
        return render(request, "scalers/token_revoke.html", {"token": token})
    try:
        revoke_token(name, revoked_by=request.user.get_username())
    except TokenError as exc:
        return _page(request, error=str(exc), status=404)
    return redirect("token_list")
