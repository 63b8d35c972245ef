"""Query results as dicts, JSON columns decoded."""

from __future__ import annotations

import json


def dict_rows(cursor, sql: str, params=()) -> list[dict]:
    """Run ``sql`` and return its rows as ``{column: value}``; the JSON columns admission reads
    (``config``, ``labels``, ``mandatory_labels``, ``roles``) are decoded when they come back as text."""
    cursor.execute(sql, params)
    cols = [c[0] for c in cursor.description]
    out = []
    for r in cursor.fetchall():
        d = dict(zip(cols, r))
        for k, v in d.items():
            if k in ("config", "labels", "mandatory_labels", "roles") and isinstance(v, str):
                d[k] = json.loads(v)
        out.append(d)
    return out
