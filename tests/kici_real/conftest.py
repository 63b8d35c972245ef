"""Fixtures for the end-to-end tests with the real KiCI (tests/support/kici_real.py): the cached
build, and a real orchestrator with its own database in a network namespace of its own."""

from __future__ import annotations

import pytest

from tests.support.kici_real import (
    KiciRealBuildError,
    ensure_build,
    own_database,
    private_netns,
    run_orchestrator,
)
from tests.support.root import IN_CI, require_root


@pytest.fixture(scope="session")
def kici_real_build():
    """The real orchestrator, kici-admin and agent, built once per bundle and harness version.
    Needs root (the parts run in a network namespace); a failed build fails in CI, skips elsewhere."""
    require_root()
    try:
        return ensure_build()
    except KiciRealBuildError as error:
        if IN_CI:
            pytest.fail(str(error))
        pytest.skip(str(error))


@pytest.fixture
def kici_orchestrator(kici_real_build, tmp_path):
    """A real orchestrator (independent mode, leader, ready for agents) in a fresh network
    namespace with only ``lo``, on its own PostgreSQL database; all of it removed at the end."""
    with private_netns() as netns, own_database() as database_url:
        with run_orchestrator(kici_real_build, netns, tmp_path / "orchestrator", database_url) as orchestrator:
            yield orchestrator
