"""Settings for the KiCI Scaler Console, read from the environment (see README "Configuration")."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import TypedDict

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from lib.env import (
    database_from_url,
    database_pool,
    env_bool,
    env_http_url,
    env_int,
    env_list,
    env_listeners,
    env_secrets_key,
    env_str,
    env_url_map,
    redis_place,
    redis_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    path = Path(env_str("SECRET_KEY_FILE", str(BASE_DIR / ".secret_key")))
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key
    raise ImproperlyConfigured(
        f"SECRET_KEY is unset and {path} does not exist: run `make run` (it generates one) or export SECRET_KEY"
    )


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
# 172.30.0.1 is the gateway of kici-agent-net: agents dial the console there.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "172.30.0.1"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "django_rq",
    "axes",
    "audit",
    "scalers",
    "agents",
    "network",
    "operations",
    "front",
    "live",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # WhiteNoise, usable in the async stack (no thread hop for requests that are not static files).
    "kici_site.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Idle and absolute session end; no-store on every response to a signed-in browser.
    "kici_site.sessions.SessionLifetimeMiddleware",
    "kici_site.middleware.NoStoreMiddleware",
    # JSON errors on /api/, styled pages for empty errors (405); outside the NUL guard's 400s.
    "kici_site.middleware.ErrorBodyMiddleware",
    # 400 naming the field for a NUL byte in the path, a parameter, a form field or an API body.
    "kici_site.middleware.NulByteMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Login throttling; last, as django-axes requires.
    "axes.middleware.AxesMiddleware",
]

# The machine-facing API (/api/, bearer tokens, JSON) is served through these alone
# (kici_site.asgi.ApiHandler): it needs no session, CSRF, messages, CSP or login throttle, and
# under ASGI each of Django's synchronous middleware hooks is a hop to a thread and back.
KICI_API_MIDDLEWARE = [
    "kici_site.middleware.ErrorBodyMiddleware",
    "kici_site.middleware.NulByteMiddleware",
]

ROOT_URLCONF = "kici_site.urls"
CSRF_FAILURE_VIEW = "lib.errors.csrf_failure"
ASGI_APPLICATION = "kici_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "front.context_processors.attention",
                "front.context_processors.pauses",
            ],
        },
    },
]

DATABASES = {"default": database_from_url("DATABASE_URL", env_str("DATABASE_URL", "postgres://127.0.0.1:5432/kici"))}
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 0, minimum=0)
# A serving process keeps up to KICI_DB_POOL_SIZE persistent connections in a psycopg pool: an API
# request borrows one and gives it back in the call that serves it (kici_site.asgi.SyncApiHandler),
# so no request pays for a connection's start.
# 0 = no pool, one connection per request or job (forked rq work-horses must not inherit a pool's
# open sockets). make run sets it for each daphne, gateway and api process, sized so that all of
# them stay within PostgreSQL's max_connections (operations.supervision.db_pool_size).
KICI_DB_POOL_SIZE = env_int("KICI_DB_POOL_SIZE", 0, minimum=0)
DATABASES["default"]["OPTIONS"] = database_pool(KICI_DB_POOL_SIZE, DATABASES["default"]["CONN_MAX_AGE"])
DATABASES["default"]["TEST"] = {"NAME": env_str("KICI_TEST_DATABASE", "test_kici")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")

# Redis Pub/Sub channels are shared by every database of a server: the prefix carries the db
# number so two consoles (or two test runs) on one Redis never hear each other's groups.
_REDIS_DB = redis_place(REDIS_URL)[1]
CHANNEL_LAYERS = {
    "default": {
        # Pub/Sub: one PUBLISH per group message and pushed delivery; the list-based
        # RedisChannelLayer needs several round trips per received message, too slow for the
        # live fan-out (compare with bench/fanout.py --layer project|list).
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        # redis-py 8 drops idle sockets after 5 s unless socket_timeout is None.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}], "prefix": f"asgi.db{_REDIS_DB}."},
    }
}

# The host this process runs on owns the docker host / VM host resources it acts on:
# operations that touch them run on the queue "host:<KICI_HOST_NAME>".
KICI_HOST_NAME = env_str("KICI_HOST_NAME", socket.gethostname())
KICI_HOST_QUEUE = f"host:{KICI_HOST_NAME}"
# Every rq job is JSON (ids and plain values), never pickle: unpickling runs code, so a queue entry
# pushed by another Redis client must not run as the worker's user. Queues carry it here; the
# worker (kici_site.worker.KiciWorker, also for a bare `rqworker`) decodes with nothing else.
KICI_JOB_SERIALIZER = "rq.serializers.JSONSerializer"
# The packages whose functions a KiciWorker runs as jobs and callbacks (kici_site.worker.job_function).
KICI_JOB_PACKAGES: tuple[str, ...] = ("agents", "kici_site", "live", "network", "operations", "scalers")


class RqQueue(TypedDict):
    """One django-rq queue: its Redis ``URL``, job timeout (seconds) and job serializer."""

    URL: str
    DEFAULT_TIMEOUT: int
    SERIALIZER: str


RQ_QUEUES: dict[str, RqQueue] = {
    name: {
        "URL": REDIS_URL,
        "DEFAULT_TIMEOUT": env_int("KICI_JOB_TIMEOUT", 900, minimum=10),
        "SERIALIZER": KICI_JOB_SERIALIZER,
    }
    for name in ["default", KICI_HOST_QUEUE, *env_list("KICI_EXTRA_QUEUES", [])]
}
RQ = {"COMMIT_MODE": "on_db_commit", "WORKER_CLASS": "kici_site.worker.KiciWorker"}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login throttling (django-axes): after KICI_LOGIN_FAILURE_LIMIT failed logins for one user name
# from one address, that pair is refused (429) for KICI_LOGIN_COOLOFF_SECONDS; a success resets it.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("KICI_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_int("KICI_LOGIN_COOLOFF_SECONDS", 900, minimum=1) / 3600  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_USERNAME_CALLABLE = "kici_site.login_throttle.throttled_username"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request when it is missing

# --- Scaler ----------------------------------------------------------------------------------
KICI_SCALER_CONFIG_PATH = env_str("KICI_SCALER_CONFIG_PATH")
KICI_SCALER_CONFIG_DIR = env_str("KICI_SCALER_CONFIG_DIR")
DOCKER_HOST = env_str("DOCKER_HOST")
# Bearer token the orchestrator presents on POST /api/v1/scale.
KICI_API_TOKEN = env_str("KICI_API_TOKEN")
# Key of the registry credentials' secrets (scalers.credentials); make run generates one into var/env.
KICI_SECRETS_KEY = env_secrets_key("KICI_SECRETS_KEY")


def _default_instance_id(host_name: str, database: dict) -> str:
    """``<host name>-<8 hex digits of the database's host, port and name>``: the same across the
    restarts of one console, different for a second console on this host (it has its own database)."""
    where = f"{database['HOST']}:{database['PORT']}/{database['NAME']}"
    return f"{host_name}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


# Stable id of this console instance: owner of the reservations it writes, stamped on every
# sandbox it makes (scalers.backends.ownership). Set it when the host name is not stable (a
# console in a container) or when two consoles on one host share a database.
KICI_INSTANCE_ID = env_str("KICI_INSTANCE_ID", _default_instance_id(KICI_HOST_NAME, DATABASES["default"]))
# URL agents dial back to register (scaler orchestratorUrl wins when set).
KICI_CONSOLE_URL = env_str("KICI_CONSOLE_URL", "http://172.30.0.1:8000")
# Where the operator side is served (pages, admin, /metrics, /healthz, the scale API). A request on
# any other listener, such as the agents' gateway of KICI_CONSOLE_URL, reaches only the agent API
# (kici_site.listeners).
KICI_OPERATOR_LISTEN = env_listeners("KICI_OPERATOR_LISTEN", "127.0.0.1:8000")
# Where the orchestrator's API alone is served (the API but the agent routes, and /healthz), by
# uvicorn processes of its own (kici_site.gateway --api); empty: nowhere apart (the operator
# listeners serve it too either way).
KICI_API_LISTEN = env_listeners("KICI_API_LISTEN", "", optional=True)
# Request bodies above this many bytes are refused with 413 before the application reads them.
KICI_MAX_REQUEST_BODY_BYTES = env_int("KICI_MAX_REQUEST_BODY_BYTES", 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = KICI_MAX_REQUEST_BODY_BYTES
# The agents' gateway (kici_site.gateway): seconds a request's headers, then its body, may take to
# arrive; connections one source address may hold open to it at once (nft ct count, make run);
# the listen backlog of the console's sockets (bursts of connections wait there, not in resets).
KICI_GATEWAY_HEADER_TIMEOUT_SECONDS = env_int("KICI_GATEWAY_HEADER_TIMEOUT_SECONDS", 10, minimum=1)
KICI_GATEWAY_BODY_TIMEOUT_SECONDS = env_int("KICI_GATEWAY_BODY_TIMEOUT_SECONDS", 30, minimum=1)
KICI_GATEWAY_CONNECTIONS_PER_SOURCE = env_int("KICI_GATEWAY_CONNECTIONS_PER_SOURCE", 16, minimum=2)
KICI_LISTEN_BACKLOG = env_int("KICI_LISTEN_BACKLOG", 4096, minimum=64)
KICI_AGENT_TOKEN_TTL_SECONDS = env_int("KICI_AGENT_TOKEN_TTL_SECONDS", 3600, minimum=10)
KICI_SPAWN_TIMEOUT_SECONDS = env_int("KICI_SPAWN_TIMEOUT_SECONDS", 300, minimum=1)
KICI_STORAGE_URL = env_str("KICI_STORAGE_URL")
KICI_AGENT_IMAGE = env_str("KICI_AGENT_IMAGE", "kici-agent:local")
KICI_NFT_TABLE = env_str("KICI_NFT_TABLE", "kici")
# Network namespace the nft commands (and Firecracker links) of operations run in; None = the host's
# own. Tests set it to a namespace they created, so no rule or link of theirs lands on the host.
KICI_NFT_NETNS = None
KICI_NETWORK_ISOLATION = env_bool("KICI_NETWORK_ISOLATION", True)
KICI_OPERATION_PLAN_TTL_SECONDS = env_int("KICI_OPERATION_PLAN_TTL_SECONDS", 3600, minimum=10)
KICI_SWEEP_INTERVAL_SECONDS = env_int("KICI_SWEEP_INTERVAL_SECONDS", 900, minimum=5)
# Seconds between an agent's heartbeats (the register answer's heartbeatIntervalSeconds): 30 s, as the
# reference agent, so that two cores carry the heartbeats of 10,000 agents (docs/serving.md).
KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS = env_int("KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS", 30, minimum=1)
# An agent running/draining that sent no heartbeat for this long is lost (agents.liveness): by
# default four intervals, so three beats lost in a row (a network blip, a console restart) are not.
KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS = env_int(
    "KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS", 4 * KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS, minimum=10
)
# The lost-agents sweep approves by itself the release of agents whose sandbox is provably gone
# (container exited/missing, VM or process not running); silence alone always waits for a person.
KICI_LOST_AGENTS_AUTO_RELEASE = env_bool("KICI_LOST_AGENTS_AUTO_RELEASE", True)
KICI_REQUIRE_DISTINCT_APPROVER = env_bool("KICI_REQUIRE_DISTINCT_APPROVER", False)
# Finished agents, events and expired tokens are pruned this many days on (agents.retention);
# scale request records after KICI_REQUEST_RETENTION_HOURS.
KICI_RETENTION_DAYS = env_int("KICI_RETENTION_DAYS", 14, minimum=1)
KICI_REQUEST_RETENTION_HOURS = env_int("KICI_REQUEST_RETENTION_HOURS", 24, minimum=1)
# Audit records (/audit/, the audit app) are pruned this many days on by the leading sweeper.
KICI_AUDIT_RETENTION_DAYS = env_int("KICI_AUDIT_RETENTION_DAYS", 365, minimum=1)
# The leading sweeper samples every scaler's capacity and scale->registered latency this often
# (scalers.samples); the scaler page charts the last 24 h of them.
KICI_CAPACITY_SAMPLE_SECONDS = env_int("KICI_CAPACITY_SAMPLE_SECONDS", 60, minimum=5)
# Event backend: HMAC key for scale-up/-down deliveries, and target names -> URLs.
KICI_PROVISIONING_SECRET = env_str("KICI_PROVISIONING_SECRET")
KICI_PROVISIONING_TARGET_URLS = env_url_map("KICI_PROVISIONING_TARGET_URLS")
# Approval notices (operations.notify): an operation waiting for a person is POSTed to this URL,
# signed with HMAC-SHA256 under KICI_NOTIFY_SECRET as the event backend signs; off when unset.
# KICI_OPERATOR_URL: the console's operator address as people reach it, for links in the notice.
KICI_NOTIFY_URL = env_http_url("KICI_NOTIFY_URL")
KICI_NOTIFY_SECRET = env_str("KICI_NOTIFY_SECRET", "")
if KICI_NOTIFY_URL and not KICI_NOTIFY_SECRET:
    raise ImproperlyConfigured("KICI_NOTIFY_URL is set but KICI_NOTIFY_SECRET is not: notices are never sent unsigned")
_op_host, _op_port = KICI_OPERATOR_LISTEN[0]
KICI_OPERATOR_URL = env_http_url(
    "KICI_OPERATOR_URL",
    "http://" + (f"[{_op_host}]" if ":" in _op_host else _op_host) + (f":{_op_port}" if _op_port else ""),
)
# Event-provision reaper (scalers.provision_reaper), times in ms as the reference's knobs: sweep
# interval, flap grace (floored at 2 x the peer stale timeout), the wait before a silent agent
# whose console is still live is reaped, and the pause between two teardown attempts of one agent.
KICI_SCALER_REAP_INTERVAL_MS = env_int("KICI_SCALER_REAP_INTERVAL_MS", 60_000, minimum=5000)
KICI_REROUTE_FLAP_GRACE_MS = env_int("KICI_REROUTE_FLAP_GRACE_MS", 120_000, minimum=0)
KICI_PEER_STALE_TIMEOUT_MS = env_int("KICI_PEER_STALE_TIMEOUT_MS", 60_000, minimum=1000)
KICI_SCALER_REAP_STRANDED_TIMEOUT_MS = env_int("KICI_SCALER_REAP_STRANDED_TIMEOUT_MS", 1_800_000, minimum=1000)
KICI_SCALER_REAP_REATTEMPT_MS = env_int("KICI_SCALER_REAP_REATTEMPT_MS", 600_000, minimum=1000)
# Seconds an orchestrator is told to wait (Retry-After) before asking again for a job refused
# at capacity: the reference's pending-scale sweep interval (10 s).
KICI_SCALE_RETRY_AFTER_SECONDS = env_int("KICI_SCALE_RETRY_AFTER_SECONDS", 10, minimum=1)
# Render live event rows in the producer (rq worker, API) instead of in each console process.
KICI_RENDER_EVENTS_AT_PUBLISH = env_bool("KICI_RENDER_EVENTS_AT_PUBLISH", False)
# Where bare-metal process-mode agents write their output.
KICI_AGENT_LOG_DIR = env_str("KICI_AGENT_LOG_DIR", str(BASE_DIR / "var" / "agents"))
# Bytes of output a running agent's file may hold (VM serial console, VMM log, process output)
# before the sweeper frees all but its last half (scalers.output_caps).
KICI_AGENT_OUTPUT_CAP_BYTES = env_int("KICI_AGENT_OUTPUT_CAP_BYTES", 8 * 1024 * 1024, minimum=65536)
# An approver's shell into a container agent (live.shell) ends this long after it opened, and
# after this long without a keystroke.
KICI_SHELL_MAX_SECONDS = env_int("KICI_SHELL_MAX_SECONDS", 900, minimum=1)
KICI_SHELL_IDLE_SECONDS = env_int("KICI_SHELL_IDLE_SECONDS", 300, minimum=1)

# --- Browser security (sessions, cookies, Content-Security-Policy) ---------------------------
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto: cookies only over https, and
# request.is_secure() from the proxy's header (never set it without such a proxy in front).
KICI_TLS_PROXY = env_bool("KICI_TLS_PROXY", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = KICI_TLS_PROXY
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if KICI_TLS_PROXY else None
# A session ends KICI_SESSION_IDLE_SECONDS after its last request, and KICI_SESSION_MAX_SECONDS
# after its sign-in whatever happens (kici_site.sessions); open WebSockets close with it (live.session).
KICI_SESSION_IDLE_SECONDS = env_int("KICI_SESSION_IDLE_SECONDS", 12 * 3600, minimum=300)
KICI_SESSION_MAX_SECONDS = env_int("KICI_SESSION_MAX_SECONDS", 7 * 24 * 3600, minimum=KICI_SESSION_IDLE_SECONDS)
SESSION_COOKIE_AGE = KICI_SESSION_IDLE_SECONDS
# No inline script or style anywhere (static/js holds every behaviour); the nonce is for the <style>
# of Django's admin. connect-src 'self' covers ws:/wss: on the page's own host and port (CSP 3).
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.NONCE],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # Client errors (4xx) are logged as one line, without Django's traceback.
    "filters": {"one_line_4xx": {"()": "lib.logfilters.OneLineClientErrors"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["one_line_4xx"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}


# Serve static files from the app and static/ directories directly (no collectstatic needed).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
