"""The suite's settings use the suite's own Redis and PostgreSQL databases, never a console's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from kici_site import settings_test

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import json, os, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps([s.REDIS_URL, s.RQ_QUEUES['default']['URL'], "
    "s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], os.environ['REDIS_URL']]))"
)


def _load(**env: str) -> subprocess.CompletedProcess:
    """Load kici_site.settings_test in a fresh process whose environment has ``env`` as the only
    Redis and test database variables."""
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "KICI_TEST_REDIS_URL", "KICI_TEST_DATABASE")}
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_consoles_default_redis_database_in_the_environment_is_refused():
    proc = _load(REDIS_URL="redis://127.0.0.1:6379/0")
    assert proc.returncode != 0
    assert "ImproperlyConfigured: REDIS_URL='redis://127.0.0.1:6379/0' is a console's Redis" in proc.stderr


def test_make_runs_own_redis_is_refused_without_showing_its_password():
    url = f"unix://{ROOT}/var/run/redis/redis.sock?db=0&password=s3cret-value"
    proc = _load(REDIS_URL=url)
    assert proc.returncode != 0 and "is a console's Redis" in proc.stderr
    assert "password=***" in proc.stderr and "s3cret-value" not in proc.stderr


def test_without_a_redis_url_the_suite_uses_its_own_database_everywhere():
    proc = _load()
    assert proc.returncode == 0, proc.stderr
    url = settings_test.SUITE_REDIS_URL
    assert json.loads(proc.stdout) == [url, url, "asgi.db15.", url]


def test_kici_test_redis_url_wins_over_the_consoles_redis_url_and_reaches_subprocesses():
    proc = _load(REDIS_URL="redis://127.0.0.1:6379/0", KICI_TEST_REDIS_URL="redis://127.0.0.1:6379/12")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["redis://127.0.0.1:6379/12"] * 2 + ["asgi.db12.", "redis://127.0.0.1:6379/12"]


def test_another_database_given_in_redis_url_is_used():
    proc = _load(REDIS_URL="redis://127.0.0.1:6379/11")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0] == "redis://127.0.0.1:6379/11"


def test_the_redis_of_var_env_is_refused_whatever_password_names_it(monkeypatch):
    monkeypatch.delenv("KICI_TEST_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://10.9.8.7:6379/4")
    with pytest.raises(ImproperlyConfigured, match=r"REDIS_URL='redis://10.9.8.7:6379/4' is a console's Redis"):
        settings_test._suite_redis_url({"REDIS_URL": "redis://:pw@10.9.8.7/4"})
    monkeypatch.setenv("REDIS_URL", "redis://10.9.8.7:6379/5")
    assert settings_test._suite_redis_url({"REDIS_URL": "redis://:pw@10.9.8.7/4"}) == "redis://10.9.8.7:6379/5"


def test_the_consoles_database_name_is_refused_as_the_test_database(monkeypatch):
    proc = _load(KICI_TEST_DATABASE="kici")
    assert proc.returncode != 0
    assert "KICI_TEST_DATABASE='kici' is a console's database" in proc.stderr
    monkeypatch.setenv("KICI_TEST_DATABASE", "prod_ci")
    with pytest.raises(ImproperlyConfigured, match="KICI_TEST_DATABASE='prod_ci'"):
        settings_test._check_test_database({"DATABASE_URL": "postgres://kici:pw@127.0.0.1:5432/prod_ci"})
