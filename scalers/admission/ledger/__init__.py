"""Database side of admission: the lock, the usage snapshot, and writing a decided batch.

Every function here runs inside the caller's transaction on the caller's connection
(:mod:`scalers.admission.decide` opens it). SQL is written out because these few statements run
once per *batch* on the hot path; everything else uses the ORM.

The lock (SPEC c.2 "under one mutex", shared by every console process on the database):
``SELECT ... FROM scalers_configstate WHERE id = 1 FOR UPDATE``. Chosen over a transaction-level
advisory lock because the same statement returns the global caps, and because a config import
that updates that row is serialised with admission for free. Reads that follow the lock are
separate statements, so under READ COMMITTED they see every transaction committed before the
lock was granted (a sub-select in the locking statement would keep its pre-wait snapshot).

Modules, one job each (every name is importable from ``scalers.admission.ledger``):
:mod:`~scalers.admission.ledger.lock` (the lock and the config row),
:mod:`~scalers.admission.ledger.snapshot` (World and Usage after the lock),
:mod:`~scalers.admission.ledger.warm` (idle warm agents), :mod:`~scalers.admission.ledger.counters`
(metric counters) and :mod:`~scalers.admission.ledger.batch` (the one-statement batch write).
"""

from .batch import AGENT_ROW, AGENT_ROW_TYPES, RESERVATION_ROW, RESERVATION_ROW_TYPES, write_batch
from .counters import add_to_counters, counter_increment, increment_counters, label_key
from .lock import ConfigMissing, lock_admission, read_config
from .snapshot import load_snapshot, load_world, lock_and_snapshot
from .warm import bind_warm_agent, idle_warm_agents

__all__ = [
    "AGENT_ROW",
    "AGENT_ROW_TYPES",
    "RESERVATION_ROW",
    "RESERVATION_ROW_TYPES",
    "ConfigMissing",
    "add_to_counters",
    "bind_warm_agent",
    "counter_increment",
    "idle_warm_agents",
    "increment_counters",
    "label_key",
    "load_snapshot",
    "load_world",
    "lock_admission",
    "lock_and_snapshot",
    "read_config",
    "write_batch",
]
