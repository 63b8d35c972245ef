"""Canonical forms of labels and label sets, and the reserved ``kici:`` prefix, SPEC (a.7), (a.10), (b)."""

from __future__ import annotations

from collections.abc import Iterable

#: Prefix reserved for auto-injected labels, SPEC (a.10). Compared case-insensitively.
RESERVED_PREFIX = "kici:"


def canonicalize_labels(labels: Iterable[str]) -> list[str]:
    """Trim and lower-case each label, keeping order and length (duplicates kept).

    ``canonicalize_labels([" Linux", "GPU", "gpu"]) == ["linux", "gpu", "gpu"]``.
    Source: SPEC (a.7) ``canonicalizeLabels``.
    """
    return [str(label).strip().lower() for label in labels]


def normalize_label_set(labels: Iterable[str]) -> str:
    """Canonical key of a label set: lower-case, de-duplicate, sort, join with ``,``.

    ``normalize_label_set(["Docker", "linux", "linux"]) == "docker,linux"`` and
    ``normalize_label_set([]) == ""``. Labels are also trimmed, so the key agrees
    with :func:`canonicalize_labels`. Source: SPEC (b) ``normalizeLabelSet``.
    """
    return ",".join(sorted({label.strip().lower() for label in labels}))


def is_reserved_label(label: str) -> bool:
    """True when ``label`` starts with the reserved ``kici:`` prefix (case-insensitive,
    after trimming). SPEC (a.10)."""
    return label.strip().lower().startswith(RESERVED_PREFIX)


def dedupe(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in first-seen order."""
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
