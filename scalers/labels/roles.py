"""Scaler roles: normalisation, the role labels an agent carries, which job kinds a scaler serves, SPEC (a.11)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from .canonical import dedupe

ROLE_BUILDER = "builder"
ROLE_INIT_RUNNER = "init-runner"
ROLE_ALL = "all"

JobKind = Literal["execution", "build", "init"]


def normalize_roles(roles: Sequence[str] | None) -> list[str] | None:
    """Normalise a scaler's ``roles`` (SPEC a.6): absent ⇒ ``None`` (all roles);
    containing ``all`` ⇒ ``None``; ``[]`` ⇒ ``[]``; otherwise the list, de-duplicated
    in first-seen order. Unknown role names are the schema's job to refuse."""
    if roles is None:
        return None
    roles = list(roles)
    if ROLE_ALL in roles:
        return None
    return dedupe(roles)


def role_labels(roles: Sequence[str] | None) -> list[str]:
    """Role labels an agent of this scaler carries, SPEC (a.11).

    ``None`` (all) ⇒ ``["kici:role:builder", "kici:role:init-runner"]``; ``[]`` ⇒ ``[]``;
    ``["builder"]`` ⇒ ``["kici:role:builder"]``. Order is always builder, init-runner.
    """
    roles = normalize_roles(roles)
    if roles is None:
        roles = [ROLE_BUILDER, ROLE_INIT_RUNNER]
    return [f"kici:role:{r}" for r in (ROLE_BUILDER, ROLE_INIT_RUNNER) if r in roles]


def roles_allow(roles: Sequence[str] | None, job_kind: JobKind) -> bool:
    """Whether a scaler with ``roles`` may serve a job of ``job_kind``, SPEC (a.11).

    ``execution`` jobs are always allowed; ``build`` (``__build__``) needs the
    builder role, ``init`` (``__init__``) the init-runner role; ``None`` means all.
    Raises ``ValueError`` for an unknown ``job_kind``.
    """
    if job_kind == "execution":
        return True
    roles = normalize_roles(roles)
    if job_kind == "build":
        return roles is None or ROLE_BUILDER in roles
    if job_kind == "init":
        return roles is None or ROLE_INIT_RUNNER in roles
    raise ValueError(f"unknown job kind {job_kind!r}; expected execution, build or init")
