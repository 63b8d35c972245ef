"""The set-up helpers of ``scripts/lib.sh``, sourced as ``make run`` and ``make test`` source them."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import yaml

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


def test_sourcing_var_env_exports_what_set_up_generated(tmp_path):
    # The README's `. var/env` then curl: a command run from that shell (xargs sh -c, a script)
    # sees the token too.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lib.sh", tmp_path / "scripts" / "lib.sh")
    subprocess.run(
        ["bash", "-c", ". scripts/lib.sh; unset KICI_API_TOKEN; load_env; ensure_api_token >/dev/null"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    out = subprocess.run(
        ["env", "-u", "KICI_API_TOKEN", "sh", "-c", '. var/env; sh -c \'echo "token=$KICI_API_TOKEN"\''],
        cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert out.stdout.startswith("token=kici_"), out.stdout


def test_make_run_builds_the_firecracker_guest_only_for_a_config_with_a_firecracker_scaler(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lib.sh", tmp_path / "scripts" / "lib.sh")
    (tmp_path / "containers.yaml").write_text((ROOT / "examples" / "scalers.yaml").read_text())
    (tmp_path / "vms.yaml").write_text("scalers:\n  - name: vms\n    type: 'firecracker'  # the guest\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "more.yml").write_text("scalers:\n  - type: firecracker\n    name: more\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "c.yaml").write_text("scalers:\n  - type: container\n    name: firecracker\n")

    def uses(*args: str) -> bool:
        script = '. scripts/lib.sh; config_uses_firecracker "$@" && echo yes || echo no'
        out = subprocess.run(["bash", "-c", script, "x", *args], cwd=tmp_path, capture_output=True, text=True,
                             timeout=30, check=True)  # fmt: skip
        return out.stdout.split()[-1] == "yes"

    assert uses("vms.yaml") and uses("containers.yaml", "dir")
    assert not uses("containers.yaml") and not uses("containers.yaml", "other") and not uses("containers.yaml", "")
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    assert 'config_uses_firecracker "$KICI_SCALER_CONFIG_PATH"' in run_sh and "sandbox_agent/build_guest.sh" in run_sh


def test_the_default_configs_agent_settings_are_ones_the_agent_reads():
    """A ``KICI_*`` variable in ``examples/scalers.yaml``'s ``env`` that the console's agent does
    not read is a setting an operator copies and trusts but nothing obeys."""
    config = yaml.safe_load((ROOT / "examples" / "scalers.yaml").read_text())
    agent = (ROOT / "sandbox_agent" / "kici_agent.py").read_text()
    names = {
        name
        for scaler in config["scalers"]
        for label_set in scaler.get("labelSets", [])
        for name in (label_set.get("env") or {})
        if name.startswith("KICI_")
    }
    assert not {name for name in names if f'"{name}"' not in agent}
