"""Test settings: the production settings with a throwaway secret key, the suite's own Redis
database and PostgreSQL database, never a console's (README "Tests")."""

import os
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from lib.env import redact_url, redis_place, redis_url

os.environ.setdefault("SECRET_KEY", "test-only-not-secret-0123456789abcdef0123456789abcdef")
# A fixed key for the registry credentials' secrets (url-safe base64 of 32 bytes).
os.environ.setdefault("KICI_SECRETS_KEY", "dGVzdC1vbmx5LXNlY3JldHMta2V5LTMyLWJ5dGVzISE=")

#: The suite's Redis when neither KICI_TEST_REDIS_URL nor REDIS_URL names another (scripts/test.sh empties it).
SUITE_REDIS_URL = "redis://127.0.0.1:6379/15"
#: The database `make run` creates when DATABASE_URL names none (scripts/lib.sh ensure_database).
CONSOLE_DATABASE = "kici"
_CHECKOUT = Path(__file__).resolve().parent.parent


def _console_env() -> dict[str, str]:
    """The ``export NAME=value`` lines `make run` generated into var/env (DATABASE_URL, REDIS_URL, ...)."""
    path = _CHECKOUT / "var" / "env"
    values = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, sep, value = line.strip().removeprefix("export ").partition("=")
        if sep:
            values[name.strip()] = value.strip().strip("'\"")
    return values


def _suite_redis_url(console: dict[str, str]) -> str:
    """The suite's Redis URL: ``KICI_TEST_REDIS_URL``, else ``REDIS_URL``, else SUITE_REDIS_URL.
    ImproperlyConfigured, naming the variable and its value (password hidden), for a console's:
    database 0 (where a console's queues live by default), make run's own Redis (var/run/redis/)
    or the Redis of this checkout's var/env."""
    name = next((n for n in ("KICI_TEST_REDIS_URL", "REDIS_URL") if os.environ.get(n)), "")
    url = redis_url(name, SUITE_REDIS_URL) if name else SUITE_REDIS_URL
    server, db = redis_place(url)
    consoles = {("unix:" + str(_CHECKOUT / "var" / "run" / "redis" / "redis.sock"), 0)}
    if console.get("REDIS_URL"):
        consoles.add(redis_place(console["REDIS_URL"]))
    if db == 0 or (server, db) in consoles or "/var/run/redis/" in server:
        raise ImproperlyConfigured(
            f"{name}={redact_url(url)!r} is a console's Redis (database 0, make run's var/run/redis/ or var/env's "
            f"REDIS_URL): the tests would take its queued jobs. Unset it (the suite uses {SUITE_REDIS_URL}) or set "
            f"KICI_TEST_REDIS_URL to a database of its own"
        )
    return url


def _check_test_database(console: dict[str, str]) -> None:
    """ImproperlyConfigured when ``KICI_TEST_DATABASE`` names a console's database: pytest-django
    creates, empties and drops it."""
    name = os.environ.get("KICI_TEST_DATABASE") or "test_kici"
    consoles = {CONSOLE_DATABASE}
    if console.get("DATABASE_URL"):
        consoles.add(console["DATABASE_URL"].rsplit("/", 1)[-1].partition("?")[0])
    if name in consoles:
        raise ImproperlyConfigured(
            f"KICI_TEST_DATABASE={name!r} is a console's database ({', '.join(sorted(consoles))}): the suite "
            f"drops its test database; name another"
        )


_CONSOLE = _console_env()
_check_test_database(_CONSOLE)
# Pinned in the environment before the production settings read it, so that the queues, the
# Channels layer and every process a test starts (daphne, rq workers, consoles) use it.
os.environ["REDIS_URL"] = _suite_redis_url(_CONSOLE)

from .settings import *  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The tests' own job functions (tests/...) run in real workers too.
KICI_JOB_PACKAGES = (*KICI_JOB_PACKAGES, "tests")  # noqa: F405

# Tests never write to the default console table of this host ("kici"): a leftover there would
# judge the sandboxes of a `make run` on the same machine. tests/conftest.py drops it at the end.
KICI_NFT_TABLE = "kicitest"

# Agents' kept output goes to a directory of this run, never the repository's var/agents;
# tests/conftest.py removes it at the end. A console process a test starts (the browser tests'
# daphne) is handed the test process's directory in KICI_TEST_AGENT_LOG_DIR, so both read the
# same archives.
KICI_AGENT_LOG_DIR = os.environ.get("KICI_TEST_AGENT_LOG_DIR") or os.path.join(
    tempfile.gettempdir(), f"kici-test-agents-{os.getpid()}"
)

# The suite's agents beat every 5 s, lost after 90 s: a test that waits for a drain or a stop to
# reach an agent waits one short interval.
KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS = 5
KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS = int(os.environ.get("KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS", 90))
