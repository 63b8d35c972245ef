"""Label sets declared by two different scalers, SPEC (b) "Overlap detection"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .canonical import normalize_label_set


@dataclass(frozen=True)
class LabelSetOverlap:
    """Two different scalers declaring the same normalised label set, SPEC (b).

    ``labels`` is the normalised key (``docker,linux``); ``scaler1`` declared it
    first, ``scaler2`` again. ``scaler2_index``/``label_set_index`` locate the second
    declaration in config order (for error paths; not part of equality).
    """

    labels: str
    scaler1: str
    scaler2: str
    scaler2_index: int = field(default=-1, compare=False)
    label_set_index: int = field(default=-1, compare=False)

    @property
    def message(self) -> str:
        """The reference error text, SPEC (b)."""
        return f'Label set [{self.labels}] overlaps between scalers "{self.scaler1}" and "{self.scaler2}"'


def find_label_set_overlaps(scalers: Iterable[Any]) -> list[LabelSetOverlap]:
    """Cross-scaler label-set overlaps, SPEC (b) "Overlap detection".

    ``scalers`` yields ``(name, label_sets)`` pairs, where ``label_sets`` is an
    iterable of label lists, or objects with ``.name`` and ``.label_sets[].labels``
    (a ``ScalerEntry``). A normalised set declared by two *different* scaler names is
    an overlap ``LabelSetOverlap(labels, first_scaler, later_scaler)``; repeats inside
    one scaler are allowed. One overlap is reported per later declaration.
    """
    first_owner: dict[str, str] = {}
    overlaps: list[LabelSetOverlap] = []
    for scaler_index, scaler in enumerate(scalers):
        if isinstance(scaler, tuple):
            name, label_sets = scaler
            label_lists = [list(ls) for ls in label_sets]
        else:
            name = scaler.name
            label_lists = [list(ls.labels) for ls in scaler.label_sets]
        for ls_index, labels in enumerate(label_lists):
            key = normalize_label_set(labels)
            owner = first_owner.get(key)
            if owner is None:
                first_owner[key] = name
            elif owner != name:
                overlaps.append(LabelSetOverlap(key, owner, name, scaler_index, ls_index))
    return overlaps
