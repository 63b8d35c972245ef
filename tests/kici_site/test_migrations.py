"""The models and the migrations agree: a model change without its migration fails here; and a
database migrated before the migrations were squashed is taken as fully migrated by the squashed set.
(That the squashed set builds the same schema as the old one: scripts/compare_migrations.py.)"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

#: The rows django_migrations held for the squashed apps when their migrations were squashed: what
#: a database ``make run`` migrated then holds (audit and network kept their one migration).
PRE_SQUASH = {
    "agents": (
        "0001_initial 0002_initial 0003_agent_lost 0004_agent_completed_job_id 0005_event_backoff_index "
        "0006_config_events 0007_agent_state_connecting 0008_agent_bridge_port 0009_host_tools 0010_agent_job_image "
        "0011_agent_registered_at_index 0012_agent_heartbeat_order 0013_agent_teardown_reason "
        "0014_agent_fewer_indexes 0015_agent_jobs_served 0016_console_process_events 0017_agent_spawn_trace "
        "0018_agent_idempotency 0019_api_call_token 0020_hold"
    ),
    "scalers": (
        "0001_initial 0002_admission 0003_scale_outcome_exceeds_cap 0004_config_overrides 0005_installation "
        "0006_host_tools 0007_scaler_host_readiness 0008_config_generation 0009_registry_credential "
        "0010_capacity_sample 0011_scaler_host 0012_usage_tally 0013_scalerequest_fewer_indexes "
        "0014_admission_guard 0015_spawn_failure_counter 0016_api_token 0017_scale_outcome_replayed 0018_pause "
        "0019_scalerequest_token_name 0020_orchestrator_admin_token 0021_held_counts_active"
    ),
    "operations": "0001_initial 0002_roles 0003_lost_agents_kind 0004_operation_warnings 0005_finding "
    "0006_pause_kinds 0007_hold",
}

#: The migrations that replaced them, which a database migrated before the squash has no row for.
SQUASHED = [
    ("agents", "0001_squashed_initial"),
    ("agents", "0002_squashed_0020_hold"),
    ("scalers", "0001_squashed_0020_orchestrator_admin_token"),
    ("scalers", "0002_squashed_0021_held_counts_active"),
    ("operations", "0001_squashed_0007_hold"),
]


@pytest.mark.django_db
def test_no_model_change_lacks_its_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:
        pytest.fail(f"makemigrations --check found changes without a migration (exit {exc.code}):\n{out.getvalue()}")


@pytest.mark.django_db
def test_a_database_migrated_before_the_squash_has_nothing_left_to_apply():
    """The test database's schema is the squashed set's (the same as the old set's); its record is
    rewritten, inside the test's transaction, to the old migrations' rows: the squashed migrations'
    rows go (migrations added after the squash keep theirs), the old ones' come."""
    with connection.cursor() as cursor:
        cursor.executemany("DELETE FROM django_migrations WHERE app = %s AND name = %s", SQUASHED)
        cursor.executemany(
            "INSERT INTO django_migrations (app, name, applied) VALUES (%s, %s, now())",
            [(app, name) for app, names in PRE_SQUASH.items() for name in names.split()],
        )
    out = io.StringIO()
    try:
        call_command("migrate", "--check", stdout=out, stderr=out)
    except SystemExit as exc:
        pytest.fail(f"migrate --check found migrations to apply (exit {exc.code}):\n{out.getvalue()}")
    call_command("showmigrations", *PRE_SQUASH, stdout=out)
    assert "[ ]" not in out.getvalue(), out.getvalue()
