"""Browser test harness: a real daphne serving the test database, and Debian Chromium via Playwright.

pytest-django's ``live_server`` is WSGI-only (no WebSockets), so the session starts
``daphne kici_site.asgi:application`` in a subprocess on 127.0.0.1:<free port>, pointed at the test
database and the same Redis as the test process. Data a test writes must be committed to be seen
by daphne: browser tests use ``transactional_db`` (the ``browser_page`` fixture requests it).
Events recorded in the test process (``agents.events.record_event``) are published on commit to
the Redis channel layer, where daphne's consumers pick them up.

Fixtures:

* ``live_daphne`` (session): the base URL, e.g. ``http://127.0.0.1:41234``.
* ``chromium`` (session): a headless Chromium browser (``/usr/bin/chromium``).
* ``browser_page(*perms, username="ui-browser", csp=False)``: a new page in a fresh context, signed
  in as a user with ``agents.view_agent`` plus ``perms`` (``"app.codename"``). ``page.goto(path)``
  takes paths: the context's base URL is the live server. The context bypasses the pages'
  Content-Security-Policy unless ``csp=True``: Playwright's ``wait_for_function`` polls by
  evaluating its expression in the page, which the policy (no ``'unsafe-eval'``) refuses. Tests
  of the policy itself, or of anything it could break, pass ``csp=True`` and wait with locators.
* ``wait_live(page)``: wait until the page's WebSocket indicator says "live".
* ``off_loop(fn, *args, **kwargs)``: run ``fn`` in a fresh thread and return its result. Playwright's
  sync API leaves an asyncio loop marked as running in the test's thread, so anything that calls
  ``async_to_sync`` (``record_event`` publishing to the channel layer) must go through this.
  Plain ORM calls work in the test body (``DJANGO_ALLOW_ASYNC_UNSAFE`` is set while Chromium runs).

Every test here is marked ``browser``. Timeouts are short (the suite must stay under a minute).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("KICI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEFAULT_TIMEOUT_MS = 10_000


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _database_url(settings_dict: dict) -> str:
    from urllib.parse import quote

    user = quote(settings_dict.get("USER") or "postgres")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{quote(settings_dict['NAME'])}"


@pytest.fixture(scope="session")
def live_daphne(django_db_setup, django_db_blocker, tmp_path_factory):
    """Start daphne on a free loopback port against the test database; yield its base URL."""
    from django.conf import settings
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = _database_url(connection.settings_dict)
    port = _free_port()
    log_path = tmp_path_factory.mktemp("daphne") / "daphne.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": db_url,
        "REDIS_URL": settings.REDIS_URL,
        "KICI_OPERATOR_LISTEN": f"127.0.0.1:{port}",  # the pages are served on the operator listener
        "KICI_TEST_AGENT_LOG_DIR": settings.KICI_AGENT_LOG_DIR,  # the archives the tests write
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "kici_site.asgi:application"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/accounts/login/", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not answer within 30 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def chromium():
    """A headless Debian Chromium driven by Playwright (sync API)."""
    if not Path(CHROMIUM).exists() and not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop marked as running in this thread, which makes
    # Django refuse ORM calls from the test body; the calls are still synchronous here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
    finally:
        pw.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def _user_with(username: str, perms) -> object:
    from django.contrib.auth.models import Permission, User

    user, _ = User.objects.get_or_create(username=username)
    for perm in ("agents.view_agent", *perms):
        app, codename = perm.split(".", 1)
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


@pytest.fixture
def browser_page(transactional_db, live_daphne, chromium):
    """Factory: ``browser_page(*perms, username=...)`` → a signed-in Playwright page."""
    from django.conf import settings
    from django.test import Client

    contexts = []
    errors: list[str] = []

    def make(*perms: str, username: str = "ui-browser", viewport: dict | None = None, csp: bool = False):
        user = _user_with(username, perms)
        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        context = chromium.new_context(
            base_url=live_daphne, viewport=viewport or {"width": 1280, "height": 900}, bypass_csp=not csp
        )
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_daphne}])
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on(
            "console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None
        )
        page.js_errors = errors
        return page

    yield make
    for context in contexts:
        context.close()
    _wait_for_quiet_database()


def _wait_for_quiet_database(timeout: float = 5.0, quiet_for: float = 0.3) -> None:
    """Wait until no other session of the test database is running a statement or holding a
    transaction (a closed page's live consumer may still be reading its last batch), so the
    flush that ends the test does not deadlock against it."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    quiet_since = None
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state IS NOT NULL AND state <> 'idle'"
            )
            if cur.fetchone()[0]:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_for:
                return
            time.sleep(0.05)


@pytest.fixture
def wait_live():
    """``wait_live(page)``: wait until the page's WebSocket indicator turns "live"."""

    def wait(page, timeout: float = DEFAULT_TIMEOUT_MS):
        page.wait_for_selector("[data-live-status].is-open", timeout=timeout)

    return wait


@pytest.fixture
def off_loop():
    """``off_loop(fn, *args, **kwargs)``: call ``fn`` in a new thread (see the module docstring)."""
    import threading

    from django.db import connections

    def run(fn, *args, **kwargs):
        result: dict = {}

        def target():
            try:
                result["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                result["error"] = exc
            finally:
                connections.close_all()

        thread = threading.Thread(target=target, name="off-loop")
        thread.start()
        thread.join(30)
        if thread.is_alive():
            raise TimeoutError(f"{fn!r} did not return within 30 s")
        if "error" in result:
            raise result["error"]
        return result.get("value")

    return run
