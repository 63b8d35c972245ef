"""``scalers.api.agent_values`` runs its statement prepared on the connection (``lib.prepared``)
outside a transaction block: the same values as the ORM reads, prepared again after a
``DEALLOCATE ALL`` or a schema change that invalidates it, and never prepared inside
``transaction.atomic()`` (a failing ``EXECUTE`` would abort the caller's transaction)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from agents.choices import AgentState
from agents.models import Agent
from lib.prepared import forget
from scalers.api import AGENT_BY_ID_STATEMENT, AGENT_JSON_FIELDS, agent_values
from tests.support.scalers import agent_field_cases, make_agent, make_scaler

pytestmark = pytest.mark.django_db(transaction=True)


def _executions() -> int | None:
    """How often this session ran the agent statement prepared (None: it is not prepared)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE name = %s", [AGENT_BY_ID_STATEMENT]
        )
        row = cur.fetchone()
    return None if row is None else row[0]


@pytest.fixture(autouse=True)
def unprepared():
    """A session without prepared statements, before and after (other tests count theirs)."""
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    forget(connection.connection)
    yield
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    forget(connection.connection)


def _orm_values(agent_id: str) -> dict:
    return Agent.objects.filter(agent_id=agent_id).values(*AGENT_JSON_FIELDS).get()


@pytest.mark.parametrize(("state", "fields"), agent_field_cases())
def test_the_prepared_statement_gives_what_the_orm_reads(state, fields):
    agent = make_agent(make_scaler(), state, **fields)
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    assert agent_values("nobody") is None
    assert _executions() == 3, "the agent was read by the prepared statement, prepared once"


def test_a_deallocated_statement_is_prepared_again():
    agent = make_agent(make_scaler(), AgentState.RUNNING, labels=["linux"])
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    for drop in ("DEALLOCATE ALL", "DISCARD ALL", f"DEALLOCATE {AGENT_BY_ID_STATEMENT}"):
        with connection.cursor() as cur:
            cur.execute(drop)
        assert _executions() is None
        assert agent_values(agent.agent_id) == _orm_values(agent.agent_id), drop
        assert _executions() == 1, drop


def test_a_column_type_change_prepares_it_again():
    """A migration that changes a selected column's type: "cached plan must not change result type"."""
    agent = make_agent(make_scaler(), AgentState.RUNNING, bound_job_id="job-9")
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    assert _executions() == 2
    table = Agent._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = 'bound_job_id'",
            [table],
        )
        (column_type,) = cur.fetchone()
        cur.execute(f"ALTER TABLE {table} ALTER COLUMN bound_job_id TYPE text")
    try:
        assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
        assert _executions() == 1, "prepared anew and run"
    finally:
        with connection.cursor() as cur:
            cur.execute(f"ALTER TABLE {table} ALTER COLUMN bound_job_id TYPE {column_type}")


def test_inside_a_transaction_block_it_runs_the_plain_statement():
    agent = make_agent(make_scaler(), AgentState.RUNNING, labels=["linux"])
    with transaction.atomic():
        assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
        assert _executions() is None, "prepared inside the caller's transaction"
    # A statement lost inside the caller's transaction must not abort it.
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    with transaction.atomic():
        assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
        assert Agent.objects.filter(agent_id=agent.agent_id).exists()


def test_a_statement_lost_twice_is_answered_by_the_plain_one(monkeypatch):
    """Prepared and lost again before its run (as behind a pooler in transaction mode): the plain
    statement answers rather than the error."""
    import scalers.api

    agent = make_agent(make_scaler(), AgentState.RUNNING, labels=["linux"])
    monkeypatch.setattr(scalers.api, "prepare_once", lambda conn, statements: None)
    assert agent_values(agent.agent_id) == _orm_values(agent.agent_id)
    assert _executions() is None
