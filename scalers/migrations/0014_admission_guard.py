from django.db import migrations

# A batch decided against the usage snapshot its console's previous batch left (no round trip to
# read one) sends this check first, under the admission lock: it fails the transaction, before
# anything is written, unless the state under the lock is still that snapshot. SQLSTATE KA001
# tells that failure apart from every other (scalers.admission.ledger.SNAPSHOT_MOVED).
GUARD = """
CREATE FUNCTION kici_admission_guard(unchanged boolean) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF unchanged IS NOT TRUE THEN
    RAISE EXCEPTION 'the admission snapshot moved' USING ERRCODE = 'KA001';
  END IF;
  RETURN true;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("scalers", "0013_scalerequest_fewer_indexes")]

    operations = [migrations.RunSQL(GUARD, "DROP FUNCTION kici_admission_guard(boolean)")]
