"""Test settings: the production settings with a throwaway secret key."""

import os
import tempfile

os.environ.setdefault("SECRET_KEY", "test-only-not-secret-0123456789abcdef0123456789abcdef")
# A fixed key for the registry credentials' secrets (url-safe base64 of 32 bytes).
os.environ.setdefault("KICI_SECRETS_KEY", "dGVzdC1vbmx5LXNlY3JldHMta2V5LTMyLWJ5dGVzISE=")

from .settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

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
