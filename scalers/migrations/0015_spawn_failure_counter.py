from django.db import migrations

# kici_orch_scaler_spawn_failures_total{backend, bound} is a counter: each scaler.failed event adds
# one to its MetricCounter row in the transaction that stores the event, so the retention prune
# of old events never lowers it (scalers.metrics). backend is the scaler's type, bound whether a
# job was bound to the agent when it failed. The rows start from the events stored now.
NAME = "kici_orch_scaler_spawn_failures_total"


def _count_failures_of(events: str) -> str:
    """The statement adding the ``scaler.failed`` rows of ``events`` to their counter rows."""
    return f"""
INSERT INTO scalers_metriccounter (name, label_key, labels, value)
SELECT '{NAME}', 'backend=' || s.type || ',bound=' || b.bound,
       jsonb_build_object('backend', s.type, 'bound', b.bound), count(*)
FROM {events} e
JOIN agents_agent a ON a.id = e.agent_id
JOIN scalers_scaler s ON s.id = a.scaler_id
CROSS JOIN LATERAL (SELECT CASE WHEN a.bound_job_id <> '' THEN 'true' ELSE 'false' END AS bound) b
WHERE e.type = 'scaler.failed'
GROUP BY s.type, b.bound
ON CONFLICT (name, label_key) DO UPDATE SET value = scalers_metriccounter.value + EXCLUDED.value;
"""


COUNT_FAILURES = f"""
CREATE FUNCTION kici_count_spawn_failures() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{_count_failures_of("new_rows")}
  RETURN NULL;
END $$;
CREATE TRIGGER kici_count_spawn_failures AFTER INSERT ON agents_scalerevent
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kici_count_spawn_failures();
{_count_failures_of("agents_scalerevent")}
"""

DROP = """
DROP TRIGGER kici_count_spawn_failures ON agents_scalerevent;
DROP FUNCTION kici_count_spawn_failures();
DELETE FROM scalers_metriccounter WHERE name = 'kici_orch_scaler_spawn_failures_total';
"""


class Migration(migrations.Migration):
    dependencies = [("scalers", "0014_admission_guard"), ("agents", "0014_agent_fewer_indexes")]

    operations = [migrations.RunSQL(COUNT_FAILURES, DROP)]
