from django.db import migrations

# The statement triggers and functions the database keeps for the console (design: docs/admission.md,
# docs/metrics.md). They come after agents 0002: the usage tally and the spawn-failure counter read
# agents_agent.scaler_id, which that migration adds.

# A fresh ConfigGeneration token per writing statement on the tables admission routes by (pk 1,
# created when missing: a TRUNCATE of the table itself is followed by a write that makes it again).
CONFIG_TABLES = ("scalers_scaler", "scalers_labelset", "scalers_machinepool", "scalers_pause")
CONFIG_GENERATION = (
    """
CREATE FUNCTION kici_bump_config_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scalers_configgeneration (id, token) VALUES (1, gen_random_uuid()::text)
    ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token;
    RETURN NULL;
END
$$;
"""
    + "".join(
        f"CREATE TRIGGER kici_config_generation AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {t} "
        "FOR EACH STATEMENT EXECUTE FUNCTION kici_bump_config_generation();\n"
        for t in CONFIG_TABLES
    )
    + "INSERT INTO scalers_configgeneration (id, token) VALUES (1, gen_random_uuid()::text);"
)
DROP_CONFIG_GENERATION = "".join(f"DROP TRIGGER IF EXISTS kici_config_generation ON {t};\n" for t in CONFIG_TABLES) + (
    "DROP FUNCTION IF EXISTS kici_bump_config_generation();"
)

# Every decided request is one row upserted under the admission lock. Its job_id has a unique
# index; the varchar_pattern_ops copy PostgreSQL gets beside it serves only LIKE 'prefix%'
# look-ups, which nothing makes.
JOB_ID_PATTERN_INDEX = "scalers_scalerequest_job_id_753de116_like"

# A batch decided against the usage snapshot its console's previous batch left sends this check
# first, under the admission lock: it fails the transaction, before anything is written, unless the
# state under the lock is still that snapshot. SQLSTATE KA001 tells that failure apart from every
# other (scalers.admission.ledger.SNAPSHOT_MOVED).
ADMISSION_GUARD = """
CREATE FUNCTION kici_admission_guard(unchanged boolean) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF unchanged IS NOT TRUE THEN
    RAISE EXCEPTION 'the admission snapshot moved' USING ERRCODE = 'KA001';
  END IF;
  RETURN true;
END $$;
"""

# Every statement that inserts, updates or deletes reservations or agents adds its change to the
# usage counts of admission as rows of scalers_usagetally (one per scaler and machine pool it
# touched; nothing when the counts do not change). ACTIVE is agents.choices.ACTIVE_STATES written
# out; tests/scalers/admission/test_usage_tally.py holds them equal.
ACTIVE = "'spawning', 'connecting', 'running', 'draining', 'destroying', 'held'"
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
AGENT_DELTA = f"""
CREATE FUNCTION kici_usage_tally_agents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ({ACTIVE}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, -sum(a), -sum(f), -sum(w) FROM (
      SELECT scaler_id, (state IN ({ACTIVE}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSE
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ({ACTIVE}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows
      UNION ALL
      SELECT scaler_id, -(state IN ({ACTIVE}))::int,
             -(state = 'spawning' AND rq_job_id <> '')::int, -(state = 'spawning' AND rq_job_id = '')::int
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  END IF;
  RETURN NULL;
END $$;
"""

# Counts the tally from the tables themselves: once when it is created, and after a TRUNCATE of
# either table (which fires no row triggers) or of the tally. Under the admission lock, so no batch
# folds meanwhile.
RECOUNT = f"""
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
  FROM agents_agent WHERE state IN ({ACTIVE})
  GROUP BY scaler_id;
END $$;
CREATE FUNCTION kici_usage_tally_rebuild() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM kici_usage_tally_count();
  RETURN NULL;
END $$;
"""


def _tally_triggers(table: str, function: str) -> str:
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


USAGE_TALLY = (
    RESERVATION_DELTA
    + AGENT_DELTA
    + RECOUNT
    + _tally_triggers("scalers_reservation", "kici_usage_tally_reservations")
    + _tally_triggers("agents_agent", "kici_usage_tally_agents")
    + "CREATE TRIGGER kici_usage_tally_truncate AFTER TRUNCATE ON scalers_usagetally "
    + "FOR EACH STATEMENT EXECUTE FUNCTION kici_usage_tally_rebuild();"
    + "SELECT kici_usage_tally_count();"
)
DROP_USAGE_TALLY = "".join(
    f"DROP TRIGGER IF EXISTS kici_usage_tally_{event} ON {table};"
    for table in ("scalers_reservation", "agents_agent")
    for event in ("insert", "update", "delete", "truncate")
) + (
    "DROP TRIGGER IF EXISTS kici_usage_tally_truncate ON scalers_usagetally;"
    "DROP FUNCTION IF EXISTS kici_usage_tally_reservations(); DROP FUNCTION IF EXISTS kici_usage_tally_agents();"
    "DROP FUNCTION IF EXISTS kici_usage_tally_rebuild(); DROP FUNCTION IF EXISTS kici_usage_tally_count();"
)

# kici_orch_scaler_spawn_failures_total{backend, bound} is a counter: each scaler.failed event adds
# one to its MetricCounter row in the transaction that stores the event, so the retention prune of
# old events never lowers it (scalers.metrics). backend is the scaler's type, bound whether a job
# was bound to the agent when it failed.
SPAWN_FAILURES = """
CREATE FUNCTION kici_count_spawn_failures() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN

INSERT INTO scalers_metriccounter (name, label_key, labels, value)
SELECT 'kici_orch_scaler_spawn_failures_total', 'backend=' || s.type || ',bound=' || b.bound,
       jsonb_build_object('backend', s.type, 'bound', b.bound), count(*)
FROM new_rows e
JOIN agents_agent a ON a.id = e.agent_id
JOIN scalers_scaler s ON s.id = a.scaler_id
CROSS JOIN LATERAL (SELECT CASE WHEN a.bound_job_id <> '' THEN 'true' ELSE 'false' END AS bound) b
WHERE e.type = 'scaler.failed'
GROUP BY s.type, b.bound
ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value;

  RETURN NULL;
END $$;
CREATE TRIGGER kici_count_spawn_failures AFTER INSERT ON agents_scalerevent
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kici_count_spawn_failures();
"""
DROP_SPAWN_FAILURES = """
DROP TRIGGER kici_count_spawn_failures ON agents_scalerevent;
DROP FUNCTION kici_count_spawn_failures();
DELETE FROM scalers_metriccounter WHERE name = 'kici_orch_scaler_spawn_failures_total';
"""


class Migration(migrations.Migration):
    """The database's own bookkeeping for admission and metrics: config generation, usage tally,
    admission guard, spawn-failure counter."""

    replaces = [
        ("scalers", "0021_held_counts_active"),
    ]

    dependencies = [
        ("scalers", "0001_squashed_0020_orchestrator_admin_token"),
        ("agents", "0002_squashed_0020_hold"),
    ]

    operations = [
        migrations.RunSQL(CONFIG_GENERATION, DROP_CONFIG_GENERATION),
        migrations.RunSQL(
            f"DROP INDEX IF EXISTS {JOB_ID_PATTERN_INDEX}",
            f"CREATE INDEX {JOB_ID_PATTERN_INDEX} ON scalers_scalerequest (job_id varchar_pattern_ops)",
        ),
        migrations.RunSQL(ADMISSION_GUARD, "DROP FUNCTION kici_admission_guard(boolean)"),
        migrations.RunSQL(USAGE_TALLY, DROP_USAGE_TALLY),
        migrations.RunSQL(SPAWN_FAILURES, DROP_SPAWN_FAILURES),
    ]
