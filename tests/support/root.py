"""Tests that need root (network namespaces, nft, TAPs): fail in CI, which runs as root; skip elsewhere."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def require_root() -> None:
    """Fail (in CI) or skip (elsewhere) a test that needs root for netns/nft/TAPs."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("this test needs root (netns, nft, TAPs) and CI runs as root")
        pytest.skip("needs root")
