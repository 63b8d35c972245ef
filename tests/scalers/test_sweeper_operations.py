"""The sweeper plans the periodic operation sweeps while it leads, and only plans them."""

import time

import pytest

from operations.management.commands.scaler_sweeper import Command
from scalers.provision_reaper import ProvisionReaper


@pytest.mark.django_db(transaction=True)
def test_the_leading_sweeper_runs_the_operation_sweeps(monkeypatch):
    calls = []
    import operations.sweeps

    monkeypatch.setattr(operations.sweeps, "run_periodic_sweeps", lambda now, **kw: calls.append(kw) or [])
    cmd = Command()
    cmd.handle(once=True, no_warm_pools=True)
    assert calls == [{"global_scopes": False}, {"host_scopes": False}]  # this host's, then the leader's


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_finds_nothing_plans_nothing():
    from operations.models import Operation

    cmd = Command()
    cmd.handle(once=True, no_warm_pools=True)
    assert Operation.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_hosts_are_readied_once_per_scaler_version_and_a_failure_only_degrades_that_scaler(monkeypatch):
    from scalers.models import Scaler

    good = Scaler.objects.create(name="ready-ok", type="container", max_agents=1)
    tools = {"firecrackerPath": "/bin/true", "jailerPath": "/bin/true"}  # present: only the host fails
    Scaler.objects.create(name="ready-broken", type="firecracker", max_agents=1, config=tools)
    Scaler.objects.create(name="ready-event", type="event", max_agents=1)
    calls = []

    class FakeBackend:
        def __init__(self, scaler):
            self.scaler = scaler

        def ensure_host_ready(self):
            calls.append(self.scaler.name)
            if self.scaler.name == "ready-broken":
                raise RuntimeError("bridge port isolation is not available on kici-br0")

    monkeypatch.setattr("scalers.backends.factory.get_backend", lambda scaler, **kw: FakeBackend(scaler))
    cmd = Command()
    cmd.hosts_ready = set()
    assert cmd.handle_host_readiness() is True
    assert sorted(calls) == ["ready-broken", "ready-ok"]  # event scalers have no host
    # the failure is kept for the dashboard's "Needs attention"; the ready scaler has none
    errors = dict(Scaler.objects.values_list("name", "host_error"))
    assert errors["ready-broken"] == "RuntimeError: bridge port isolation is not available on kici-br0"
    assert errors["ready-ok"] == "" and Scaler.objects.get(name="ready-ok").host_checked_at is not None
    calls.clear()
    cmd.handle_host_readiness()
    assert calls == ["ready-broken"]  # the degraded one is retried, the ready one is not
    good.max_agents = 2
    good.save()  # a reload that changes the scaler readies it again
    calls.clear()
    cmd.handle_host_readiness()
    assert sorted(calls) == ["ready-broken", "ready-ok"]
    calls.clear()
    monkeypatch.setattr(FakeBackend, "ensure_host_ready", lambda self: calls.append(self.scaler.name))
    cmd.handle_host_readiness()  # fixed: the next success clears the error
    assert calls == ["ready-broken"] and Scaler.objects.get(name="ready-broken").host_error == ""


@pytest.mark.django_db(transaction=True)
def test_a_lead_lost_mid_round_stops_the_round_before_the_next_unit():
    """The lock session ends during a global unit (the server ended it) and another process takes
    the lock: the rest of the round's global units is not run, so the new leader's round is not
    doubled."""
    from django.db import connection

    from scalers.leader import Leadership, host_lock_key

    cmd = Command()
    cmd.shutdown, cmd.warm, cmd.booted, cmd.instance_id = False, False, True, "console-a"
    cmd.hosts_ready = set()
    cmd.leadership = Leadership()
    cmd.host_lock = Leadership(host_lock_key("console-a-host"))
    cmd.reaper = ProvisionReaper(cmd.instance_id)
    cmd.leading = False
    rival = Leadership()
    ran = []

    def lose_the_lead():
        ran.append("waiting spawns")
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [cmd.leadership._conn.info.backend_pid])
        deadline = time.monotonic() + 5
        while not rival.poll()[0]:
            assert time.monotonic() < deadline, "the ended session kept the lock"
            time.sleep(0.05)
        return True

    cmd.handle_waiting_spawns = lose_the_lead  # the first global unit
    for name in ("handle_isolation_drift", "handle_stale_spawns", "handle_operation_sweeps", "handle_old_records"):
        setattr(cmd, name, lambda name=name: ran.append(name))
    try:
        cmd.tick()
        # this host's units ran; of the global ones, none after the lead was lost
        assert ran == ["handle_isolation_drift", "handle_stale_spawns", "waiting spawns"], ran
        assert not cmd.leading
    finally:
        rival.release()
        cmd.leadership.release()
        cmd.host_lock.release()
