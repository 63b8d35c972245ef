"""The sweeper plans the periodic operation sweeps while it leads, and only plans them."""

import pytest

from scalers.management.commands.scaler_sweeper import Command


@pytest.mark.django_db(transaction=True)
def test_the_leading_sweeper_runs_the_operation_sweeps(monkeypatch):
    calls = []
    import operations.sweeps

    monkeypatch.setattr(operations.sweeps, "run_periodic_sweeps", lambda now: calls.append(now) or [])
    cmd = Command()
    cmd.handle(once=True, no_warm_pools=True)
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_finds_nothing_plans_nothing():
    from operations.models import Operation

    cmd = Command()
    cmd.handle(once=True, no_warm_pools=True)
    assert Operation.objects.count() == 0
