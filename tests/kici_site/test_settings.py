import pytest
from django.core.exceptions import ImproperlyConfigured

from lib import env


def test_it_parses_a_database_url():
    db = env.database_from_url("DATABASE_URL", "postgres://u:p%40ss@db.local:6543/kici")
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == ("kici", "u", "p@ss", "db.local", "6543")


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("mysql://x/kici", "only postgres"),
        ("postgres://127.0.0.1:5432", "names no database"),
        ("postgres://h:port/x", "port"),
    ],
)
def test_it_refuses_a_bad_database_url_naming_it(url, fragment):
    with pytest.raises(ImproperlyConfigured, match=fragment) as exc:
        env.database_from_url("DATABASE_URL", url)
    assert "DATABASE_URL" in str(exc.value)


def test_it_refuses_a_non_boolean(monkeypatch):
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="DEBUG='maybe'"):
        env.env_bool("DEBUG")


def test_it_refuses_an_int_below_minimum(monkeypatch):
    monkeypatch.setenv("X_SECONDS", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum"):
        env.env_int("X_SECONDS", 5, minimum=1)


def test_it_refuses_a_non_redis_url(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "http://127.0.0.1:6379")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        env.redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.mark.django_db
def test_healthz_reports_each_check(client):
    body = client.get("/healthz").json()
    assert set(body["checks"]) == {"database", "redis", "docker", "workers"}
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is True


@pytest.mark.django_db
def test_healthz_names_a_failed_check_without_its_exception_text(client, settings, caplog):
    settings.DOCKER_HOST = "tcp://127.0.0.1:9"  # loopback, nothing listens: connection refused
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["docker"] == {"ok": False, "detail": "unreachable"}
    assert "refused" not in response.content.decode().lower()
    assert "health check docker failed" in caplog.text and "refused" in caplog.text.lower()


def test_it_parses_provisioning_target_urls(monkeypatch):
    monkeypatch.setenv("KICI_PROVISIONING_TARGET_URLS", "myorg/infra=https://hooks.invalid/x, b=http://127.0.0.1:9/y")
    assert env.env_url_map("KICI_PROVISIONING_TARGET_URLS") == {
        "myorg/infra": "https://hooks.invalid/x",
        "b": "http://127.0.0.1:9/y",
    }


@pytest.mark.parametrize("raw", ["noequals", "a=ftp://x", "=https://x", "a=https://"])
def test_it_refuses_a_bad_target_map_naming_the_item(monkeypatch, raw):
    monkeypatch.setenv("KICI_PROVISIONING_TARGET_URLS", raw)
    with pytest.raises(ImproperlyConfigured, match="KICI_PROVISIONING_TARGET_URLS"):
        env.env_url_map("KICI_PROVISIONING_TARGET_URLS")


def test_favicon_ico_leads_to_the_vendored_icon(client):
    """Browsers ask for /favicon.ico on pages that do not name an icon (/metrics, /healthz)."""
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/img/favicon.svg"
    icon = client.get(response["Location"])
    body = b"".join(icon.streaming_content) if icon.streaming else icon.content
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml") and b"<svg" in body


def test_a_pool_size_gives_a_psycopg_pool_of_that_size():
    assert env.database_pool(4, 0) == {"pool": {"min_size": 1, "max_size": 4, "timeout": 10, "max_idle": 300}}
    assert env.database_pool(0, 0) == {}


def test_a_pool_with_conn_max_age_is_refused_naming_both():
    with pytest.raises(ImproperlyConfigured, match=r"DB_CONN_MAX_AGE=60 with KICI_DB_POOL_SIZE=4"):
        env.database_pool(4, 60)
