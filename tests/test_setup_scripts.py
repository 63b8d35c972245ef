"""The set-up helpers of ``scripts/lib.sh``, sourced as ``make run`` and ``make test`` source them."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generating_the_secrets_keeps_them_private_and_leaves_the_callers_umask_alone(tmp_path):
    # A fresh clone: no .secret_key, no var/env. The secrets are written 0600, and what runs after
    # (pytest, the console, the jailed VMs' chroots) keeps the caller's umask.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lib.sh", tmp_path / "scripts" / "lib.sh")
    script = (
        "umask 022; . scripts/lib.sh; unset SECRET_KEY KICI_API_TOKEN; load_env; ensure_api_token >/dev/null; umask"
    )
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split()[-1] == "0022"
    for name in (".secret_key", "var/env"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
