"""Test settings: the production settings with a throwaway secret key."""

import os

os.environ.setdefault("SECRET_KEY", "test-only-not-secret-0123456789abcdef0123456789abcdef")

from .settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
