from django.db import migrations

# The usage tally's triggers write the states of agents.choices.ACTIVE_STATES out: `held` (a
# sandbox kept for debugging, scalers.holds) joins them, so a held agent counts against maxAgents
# as its reservation counts against the resource caps. tests/scalers/admission/test_usage_tally.py
# holds the list equal to ACTIVE_STATES.
OLD_STATES = "'spawning', 'connecting', 'running', 'draining', 'destroying'"
NEW_STATES = OLD_STATES + ", 'held'"


def _functions(states: str) -> str:
    """The agent trigger function and the recount of 0012_usage_tally, counting ``states`` active,
    then a recount of the tally from the tables."""
    return f"""
CREATE OR REPLACE FUNCTION kici_usage_tally_agents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ({states}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, -sum(a), -sum(f), -sum(w) FROM (
      SELECT scaler_id, (state IN ({states}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  ELSE
    INSERT INTO scalers_usagetally (scaler_id, machine_pool_id, reservations, cpus, memory_bytes, active,
                                    spawns_in_flight, spawns_waiting)
    SELECT scaler_id, NULL, 0, 0, 0, sum(a), sum(f), sum(w) FROM (
      SELECT scaler_id, (state IN ({states}))::int AS a,
             (state = 'spawning' AND rq_job_id <> '')::int AS f, (state = 'spawning' AND rq_job_id = '')::int AS w
      FROM new_rows
      UNION ALL
      SELECT scaler_id, -(state IN ({states}))::int,
             -(state = 'spawning' AND rq_job_id <> '')::int, -(state = 'spawning' AND rq_job_id = '')::int
      FROM old_rows) d
    GROUP BY scaler_id HAVING sum(a) <> 0 OR sum(f) <> 0 OR sum(w) <> 0;
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION kici_usage_tally_count() RETURNS void LANGUAGE plpgsql AS $$
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
  FROM agents_agent WHERE state IN ({states})
  GROUP BY scaler_id;
END $$;
SELECT kici_usage_tally_count();
"""


class Migration(migrations.Migration):
    """A held agent counts as active in admission's usage tally."""

    dependencies = [
        ("scalers", "0020_orchestrator_admin_token"),
        ("agents", "0020_hold"),
    ]

    operations = [migrations.RunSQL(_functions(NEW_STATES), _functions(OLD_STATES))]
