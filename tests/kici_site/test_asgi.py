"""The web process's entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = "import gc; import kici_site.asgi; print(gc.get_freeze_count(), len(gc.get_objects()))"


def test_the_startup_heap_is_out_of_the_collectors_reach():
    """Loading the ASGI application freezes what it loaded: a full collection then walks only
    what requests made (the framework's heap, walked each time, stalls every request in
    flight)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    frozen, tracked = int(out[0]), int(out[1])
    assert frozen > 50_000, f"only {frozen} objects frozen"
    assert tracked < 1_000, f"{tracked} objects still tracked by the collector"
