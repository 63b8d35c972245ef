"""A scratch PostgreSQL database for a benchmark: created empty, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_database(url: str, keep: bool = False) -> Iterator[str]:
    """Drop and create the database named by ``url`` (on its server, through its ``postgres``
    database), point Django at it (``DATABASE_URL``, ``SECRET_KEY`` and the settings module when
    unset), yield ``url``, then close Django's connections and drop it unless ``keep``."""
    import psycopg

    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url
    finally:
        if not keep:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
