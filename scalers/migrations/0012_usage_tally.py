from django.db import migrations, models

# Every statement that inserts, updates or deletes reservations or agents adds its change to the
# usage counts of admission as rows of scalers_usagetally (one per scaler and machine pool it
# touched; nothing when the counts do not change). The states are those of
# agents.choices.ACTIVE_STATES; tests/scalers/admission/test_usage_tally.py holds them equal.
RESERVATION_DELTA = """
CREATE FUNCTION kici_usage_tally_reservations() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, machine_pool_id, count(*), sum(cpus::numeric), sum(memory_bytes), 0, 0, 0
    FROM new_rows GROUP BY scaler_id, machine_pool_id;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, machine_pool_id, -count(*), -sum(cpus::numeric), -sum(memory_bytes), 0, 0, 0
    FROM old_rows GROUP BY scaler_id, machine_pool_id;
  ELSE
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, machine_pool_id, sum(n), sum(c), sum(m), 0, 0, 0
    FROM (SELECT scaler_id, machine_pool_id, 1 AS n, cpus::numeric AS c, memory_bytes AS m FROM new_rows
          UNION ALL
          SELECT scaler_id, machine_pool_id, -1, -cpus::numeric, -memory_bytes FROM old_rows) d
    GROUP BY scaler_id, machine_pool_id HAVING sum(n) <> 0 OR sum(c) <> 0 OR sum(m) <> 0;
  END IF;
  RETURN NULL;
END $$;
"""

AGENT_DELTA = """
CREATE FUNCTION kici_usage_tally_agents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ('spawning', 'connecting', 'running', 'draining', 'destroying'))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, -sum(a), -sum(f), -sum(w) FROM (
      SELECT scaler_id, (state IN ('spawning', 'connecting', 'running', 'draining', 'destroying'))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSE
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ('spawning', 'connecting', 'running', 'draining', 'destroying'))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows
      UNION ALL
      SELECT scaler_id, -(state IN ('spawning', 'connecting', 'running', 'draining', 'destroying'))::int,
             -(state = 'spawning' AND rq_job_id <> '')::int, -(state = 'spawning' AND rq_job_id = '')::int
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  END IF;
  RETURN NULL;
END $$;
"""

# Counts the tally from the tables themselves: once when it is created, and after a TRUNCATE of
# either table (which fires no row triggers) or of the tally. Under the admission lock, so no batch folds meanwhile.
REBUILD = """
CREATE FUNCTION kici_usage_tally_count() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM scalers_configstate WHERE id = 1 FOR UPDATE;
  DELETE FROM scalers_usagetally;
  INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                  spawns_in_flight, spawns_waiting)
  SELECT scaler_id, machine_pool_id, count(*), sum(cpus::numeric), sum(memory_bytes), 0, 0, 0
  FROM scalers_reservation GROUP BY scaler_id, machine_pool_id
  UNION ALL
  SELECT scaler_id, NULL, 0, 0, 0, count(*), count(*) FILTER (WHERE state = 'spawning' AND rq_job_id <> ''),
         count(*) FILTER (WHERE state = 'spawning' AND rq_job_id = '')
  FROM agents_agent WHERE state IN ('spawning', 'connecting', 'running', 'draining', 'destroying')
  GROUP BY scaler_id;
END $$;
CREATE FUNCTION kici_usage_tally_rebuild() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM kici_usage_tally_count();
  RETURN NULL;
END $$;
"""


def _triggers(table: str, function: str) -> str:
    # One trigger per event: PostgreSQL allows transition tables only on single-event triggers.
    return (
        f"CREATE TRIGGER kici_usage_tally_insert AFTER INSERT ON {table} REFERENCING NEW TABLE AS new_rows "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}();"
        f"CREATE TRIGGER kici_usage_tally_update AFTER UPDATE ON {table} "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}();"
        f"CREATE TRIGGER kici_usage_tally_delete AFTER DELETE ON {table} REFERENCING OLD TABLE AS old_rows "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}();"
        f"CREATE TRIGGER kici_usage_tally_truncate AFTER TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION kici_usage_tally_rebuild();"
    )


FORWARD = (
    RESERVATION_DELTA
    + AGENT_DELTA
    + REBUILD
    + _triggers("scalers_reservation", "kici_usage_tally_reservations")
    + _triggers("agents_agent", "kici_usage_tally_agents")
    + "CREATE TRIGGER kici_usage_tally_truncate AFTER TRUNCATE ON scalers_usagetally "
    + "FOR EACH STATEMENT EXECUTE FUNCTION kici_usage_tally_rebuild();"
    + "SELECT kici_usage_tally_count();"
)

BACKWARD = "".join(
    f"DROP TRIGGER IF EXISTS kici_usage_tally_{event} ON {table};"
    for table in ("scalers_reservation", "agents_agent")
    for event in ("insert", "update", "delete", "truncate")
) + (
    "DROP TRIGGER IF EXISTS kici_usage_tally_truncate ON scalers_usagetally;"
    "DROP FUNCTION IF EXISTS kici_usage_tally_reservations(); DROP FUNCTION IF EXISTS kici_usage_tally_agents();"
    "DROP FUNCTION IF EXISTS kici_usage_tally_rebuild(); DROP FUNCTION IF EXISTS kici_usage_tally_count();"
)


class Migration(migrations.Migration):
    """Admission's usage counts kept by the database as the tables change (scalers.models.UsageTally)."""

    dependencies = [
        ("scalers", "0011_scaler_host"),
        ("agents", "0013_agent_teardown_reason"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageTally",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("scaler_id", models.BigIntegerField(null=True)),
                ("machine_pool_id", models.BigIntegerField(null=True)),
                ("reservations", models.IntegerField(default=0)),
                ("cpus", models.DecimalField(decimal_places=15, default=0, max_digits=40)),
                ("memory_bytes", models.BigIntegerField(default=0)),
                ("active", models.IntegerField(default=0, help_text="agents in an active state")),
                (
                    "spawns_in_flight",
                    models.IntegerField(default=0, help_text="spawning agents holding a spawn job id"),
                ),
                (
                    "spawns_waiting",
                    models.IntegerField(default=0, help_text="spawning agents waiting for a spawn slot"),
                ),
            ],
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
