"""Leader failover between two real sweeper processes (``manage.py scaler_sweeper``) posing as two
hosts (their own instance id, host name and host queue) on one PostgreSQL database and one Redis:
exactly one leads; the leader killed with SIGKILL hands over within 10 s; the new leader's
leader-change recovery runs once; leader-only work lands once, written only by the process that
holds the lock; a SIGTERM hands over too.

Who wrote what is read from PostgreSQL itself: each sweeper's Django sessions carry an
``application_name`` (``PGAPPNAME``) and a trigger of this test copies it into a trace table for
every write to the tables the leader's units write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from operations.choices import OperationKind
from operations.models import Operation
from scalers.models import RecoveryReport, Reservation, ScaleOutcome, ScaleRequest
from tests.support.scalers import make_scaler
from tests.support.soak import database_url, lock_holders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("failover-a", "failover-b")
#: the sweepers' default round interval: the takeover bound holds with it, not with a test value
INTERVAL = "5"
TAKEOVER_BOUND = 10.0
APP = "failover-django:"

#: tables a leader's units write: (table, operations traced)
TRACED = {
    "scalers_recoveryreport": "INSERT",
    "operations_sweepstate": "INSERT OR UPDATE",
    "operations_operation": "INSERT",
    "scalers_scalerequest": "DELETE",
}


@pytest.fixture
def trace():
    """A trace table filled by triggers on :data:`TRACED`: who (``application_name``) wrote which
    table when. Dropped afterwards (the test database is flushed, not rebuilt)."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE failover_trace (id bigserial PRIMARY KEY, app text, tbl text, op text,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        cur.execute(
            "CREATE FUNCTION failover_trace_fn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO failover_trace (app, tbl, op)"
            " VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP); RETURN NULL; END $$"
        )
        for table, ops in TRACED.items():
            cur.execute(
                f"CREATE TRIGGER failover_trace AFTER {ops} ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION failover_trace_fn()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cur:
            for table in TRACED:
                cur.execute(f"DROP TRIGGER IF EXISTS failover_trace ON {table}")
            cur.execute("DROP FUNCTION IF EXISTS failover_trace_fn() CASCADE")
            cur.execute("DROP TABLE IF EXISTS failover_trace")


def traced(since=None) -> list[tuple[str, str, str, object]]:
    """``(instance, table, op, at)`` of the traced writes of the sweepers (since ``since``)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT substr(app, %s), tbl, op, at FROM failover_trace WHERE starts_with(app, %s)"
            " AND (%s::timestamptz IS NULL OR at >= %s) ORDER BY id",
            [len(APP) + 1, APP, since, since],
        )
        return cur.fetchall()


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def wait_for(what: str, check, timeout: float, logs: Path):
    """Poll ``check()`` every 50 ms until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    dump = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{dump}")


class Host:
    """One sweeper process posing as a host: instance id, host name (and queue) ``name``."""

    def __init__(self, name: str, logs: Path):
        self.name = name
        self.logs = logs
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        db = connection.settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "kici_site.settings",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "failover-only-not-secret",
            "DATABASE_URL": database_url(db),
            "REDIS_URL": settings.REDIS_URL,
            "KICI_INSTANCE_ID": self.name,
            "KICI_HOST_NAME": self.name,
            "PGAPPNAME": APP + self.name,
            "KICI_NFT_TABLE": "kicifailover",
            "KICI_AGENT_LOG_DIR": str(self.logs / "agents"),
            "KICI_SWEEP_ORPHAN_CONTAINERS_SECONDS": "0",
            # The suite's heartbeat (kici_site.settings_test), not the production 30 s: drains and
            # stops reach the agents within seconds.
            "KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS": "5",
            "KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS": os.environ.get("KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS", "90"),
            "KICI_SWEEP_ORPHAN_VMS_SECONDS": "0",
            "KICI_SWEEP_STALE_ISOLATION_RULES_SECONDS": "0",
            "KICI_SWEEP_LOST_AGENTS_SECONDS": "0",
            "KICI_SWEEP_STALE_RESERVATIONS_SECONDS": "5",
            "LOG_LEVEL": "INFO",
        }
        self.starts += 1
        with open(self.logs / f"{self.name}-{self.starts}.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "scaler_sweeper", "--interval", INTERVAL, "--no-warm-pools"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def reports(trigger: str, instance: str | None = None) -> int:
    qs = RecoveryReport.objects.filter(trigger=trigger)
    return qs.filter(instance_id=instance).count() if instance else qs.count()


def seed_old_request(n: int) -> ScaleRequest:
    """A decided scale request past retention (the leader's retention unit deletes it)."""
    long_ago = timezone.now() - timedelta(days=30)
    return ScaleRequest.objects.create(
        job_id=f"failover-job-{n}",
        labels=["linux"],
        outcome=ScaleOutcome.AT_CAPACITY,
        first_requested_at=long_ago,
        decided_at=long_ago,
    )


def test_a_killed_leader_hands_over_within_10s_and_nothing_is_done_twice(tmp_path, trace):
    scaler = make_scaler("failover-event", type="event")
    # Leader-only work that either sweeper would do: a stale reservation (a failed agent still
    # holding its slot, planned by the stale-reservations sweep) and a request past retention.
    agent = Agent.objects.create(
        agent_id="scaler-event-failover1", scaler=scaler, state=AgentState.FAILED, owner_instance="gone"
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=0, memory_bytes=0, owner_instance="gone")
    old = seed_old_request(1)
    hosts = {name: Host(name, tmp_path) for name in HOSTS}
    try:
        for host in hosts.values():
            host.start()
        # Exactly one leads: both booted (each recovered its own rows), one holds the lock.
        wait_for("both boot recoveries", lambda: reports("boot") == 2, 60, tmp_path)
        wait_for("a leader", lock_holders, 30, tmp_path)
        wait_for("the sweep plan", lambda: Operation.objects.exists(), 30, tmp_path)
        wait_for("retention", lambda: not ScaleRequest.objects.filter(pk=old.pk).exists(), 30, tmp_path)
        # Both run side by side for more than one sweep interval: the follower must do nothing.
        held = set()
        until = time.monotonic() + 7
        while time.monotonic() < until:
            holders = lock_holders()
            assert len(holders) <= 1, f"two sweepers lead at once: {holders}"
            held.update(holders)
            time.sleep(0.1)
        assert len(held) == 1, f"the lead changed hands while both ran: {held}"
        (leader,) = held
        (follower,) = set(HOSTS) - held
        writers = {instance for instance, table, _, _ in traced() if table != "scalers_recoveryreport"}
        assert writers == {leader}, f"leader-only work was written by {writers}, the leader is {leader}"
        assert reports("leader-change") == 0

        # SIGKILL the leader: PostgreSQL ends its session, the follower takes the lock.
        killed_at = db_now()
        t0 = time.monotonic()
        hosts[leader].proc.send_signal(signal.SIGKILL)
        wait_for("the killed leader's lock to go", lambda: leader not in lock_holders(), 10, tmp_path)
        released = time.monotonic() - t0
        wait_for("the follower to lead", lambda: lock_holders() == [follower], TAKEOVER_BOUND, tmp_path)
        took_over = time.monotonic() - t0
        print(f"failover: lock released {released:.2f}s, follower leads {took_over:.2f}s after SIGKILL")
        assert took_over < TAKEOVER_BOUND

        # Its leader-change recovery runs once, for its own instance.
        wait_for("the leader-change recovery", lambda: reports("leader-change") == 1, 10, tmp_path)
        new_old = seed_old_request(2)
        wait_for(
            "retention by the new leader", lambda: not ScaleRequest.objects.filter(pk=new_old.pk).exists(), 15, tmp_path
        )
        time.sleep(6)  # another sweep interval: the open plan is not stored again
        assert reports("leader-change") == 1 and reports("leader-change", follower) == 1
        assert Operation.objects.filter(kind=OperationKind.STALE_RESERVATIONS).count() == 1
        after = traced(since=killed_at)
        assert after and {instance for instance, *_ in after} == {follower}
        first_write = min(at for *_, at in after)
        assert (first_write - killed_at).total_seconds() < TAKEOVER_BOUND

        # A graceful stop hands over too: the killed host comes back, then the leader gets SIGTERM.
        hosts[leader].start()
        wait_for("the restarted host's boot recovery", lambda: reports("boot", leader) == 2, 60, tmp_path)
        assert lock_holders() == [follower]
        t0 = time.monotonic()
        hosts[follower].proc.send_signal(signal.SIGTERM)
        wait_for("the restarted host to lead", lambda: lock_holders() == [leader], TAKEOVER_BOUND, tmp_path)
        handed = time.monotonic() - t0
        assert hosts[follower].proc.wait(15) == 0
        print(f"failover: SIGTERM handed the lead over in {handed:.2f}s")
        wait_for("its leader-change recovery", lambda: reports("leader-change", leader) == 1, 10, tmp_path)
        assert reports("leader-change") == 2
    finally:
        for host in hosts.values():
            host.stop()
