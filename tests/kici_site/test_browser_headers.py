"""Session lifetime (kici_site.sessions), no-store responses, Secure cookies behind TLS and the
Content-Security-Policy header."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from kici_site.sessions import RENEWED_AT, SIGNED_IN_AT, renew, renew_every

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def viewer(db):
    user = User.objects.create_user("headers-viewer", password="pw-headers-viewer")
    user.user_permissions.add(Permission.objects.get(codename="view_agent", content_type__app_label="agents"))
    return user


def _stored_expiry(client):
    from django.conf import settings

    return Session.objects.get(session_key=client.cookies[settings.SESSION_COOKIE_NAME].value).expire_date


def test_a_signed_in_page_is_no_store_and_a_cookieless_call_is_left_alone(client, viewer):
    anonymous = client.get("/healthz")
    assert "no-store" not in anonymous.get("Cache-Control", "")
    client.force_login(viewer)
    for path in ("/", "/agents/", "/events/", "/no-such-page/"):
        response = client.get(path)
        assert "no-store" in response["Cache-Control"], path
        assert "private" in response["Cache-Control"] or "no-cache" in response["Cache-Control"], path


def test_a_session_expires_after_the_idle_time_slid_by_its_requests(client, viewer, settings):
    settings.KICI_SESSION_IDLE_SECONDS = 1800
    client.force_login(viewer)
    client.get("/")
    expiry = _stored_expiry(client)
    assert abs((expiry - timezone.now()).total_seconds() - 1800) < 30
    # Pushed back once it is due, without a write on every request in between.
    session = client.session
    session[RENEWED_AT] = int(time.time()) - renew_every()
    session.save()
    client.get("/")
    assert abs((_stored_expiry(client) - timezone.now()).total_seconds() - 1800) < 30


def _session(**data) -> SessionStore:
    session = SessionStore()
    session[SESSION_KEY] = "1"
    for key, value in data.items():
        session[key] = value
    session.save()
    return SessionStore(session.session_key)


def test_renew_slides_the_expiry_at_most_once_per_interval(db, settings):
    settings.KICI_SESSION_IDLE_SECONDS = 3600
    settings.KICI_SESSION_MAX_SECONDS = 7 * 86400
    now = 1_000_000_000
    session = _session(**{SIGNED_IN_AT: now - 100, RENEWED_AT: now - 10})
    renew(session, now)
    assert not session.modified  # renewed 10 s ago: nothing to write
    renew(session, now + renew_every())
    assert session.modified and session.get_expiry_age() == 3600


def test_renew_caps_the_expiry_at_the_absolute_maximum_and_ends_the_session_past_it(db, settings):
    settings.KICI_SESSION_IDLE_SECONDS = 3600
    settings.KICI_SESSION_MAX_SECONDS = 86400
    now = 1_000_000_000
    session = _session(**{SIGNED_IN_AT: now - 86400 + 600})
    renew(session, now)
    assert session.get_expiry_age() == 600
    gone = _session(**{SIGNED_IN_AT: now - 86400})
    key = gone.session_key
    renew(gone, now)
    assert SESSION_KEY not in gone and not SessionStore().exists(key)


def test_renew_leaves_an_anonymous_session_alone(db):
    session = SessionStore()
    session["something"] = 1
    session.save()
    session = SessionStore(session.session_key)
    renew(session)
    assert not session.modified


def _settings_in_subprocess(env: dict, expr: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "SECRET_KEY": "x" * 50, **env}
    full.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-c", f"import kici_site.settings as s; print({expr})"],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kici_tls_proxy_turns_on_secure_cookies_and_the_forwarded_scheme():
    expr = "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER"
    off = _settings_in_subprocess({"KICI_TLS_PROXY": ""}, expr)
    assert off.stdout.strip() == "False False None", off.stderr
    on = _settings_in_subprocess({"KICI_TLS_PROXY": "true"}, expr)
    assert on.stdout.strip() == "True True ('HTTP_X_FORWARDED_PROTO', 'https')", on.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KICI_TLS_PROXY": "sometimes"}, "KICI_TLS_PROXY='sometimes' is not a boolean"),
        ({"KICI_SESSION_IDLE_SECONDS": "12h"}, "KICI_SESSION_IDLE_SECONDS='12h' is not an integer"),
        ({"KICI_SESSION_IDLE_SECONDS": "10"}, "KICI_SESSION_IDLE_SECONDS=10 is below the minimum 300"),
        (
            {"KICI_SESSION_IDLE_SECONDS": "7200", "KICI_SESSION_MAX_SECONDS": "3600"},
            "KICI_SESSION_MAX_SECONDS=3600 is below the minimum 7200",
        ),
    ],
)
def test_a_malformed_browser_setting_stops_the_start_naming_it(env, message):
    result = _settings_in_subprocess(env, "1")
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


def test_every_page_carries_the_strict_policy(client, viewer):
    for path in ("/accounts/login/", "/healthz"):
        policy = client.get(path)["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "script-src 'self';" in policy
        assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy


def test_the_admin_style_element_gets_the_policys_nonce_and_the_rq_dashboard_its_own_policy(client, db):
    admin = User.objects.create_superuser("headers-admin", password="pw-headers-admin")
    client.force_login(admin)
    response = client.get("/admin/auth/user/")
    nonce = re.search(r"style-src 'self' 'nonce-([^']+)'", response["Content-Security-Policy"]).group(1)
    assert f'nonce="{nonce}"' in response.content.decode()
    rq = client.get("/admin/rq/")
    assert rq.status_code == 200
    assert "script-src 'self' 'unsafe-inline'" in rq["Content-Security-Policy"]
    assert "unsafe-inline" not in client.get("/")["Content-Security-Policy"]
