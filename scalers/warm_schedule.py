"""A warm pool's size by the clock: ``warmPool.schedule`` periods (days, ``from``-``to`` in
``warmPool.timeZone``, a size each), the first that matches the local time wins, else
``warmPool.size``. Pure: read from a scaler entry's ``warmPool`` as stored (validated on import by
``scalers.config.schema.WarmPool``).

A pool grows at a period's start (the warm tick spawns the deficit) and shrinks as its surplus
agents pass their idle timeout (``scalers.warm_pools.idle_check``), as it does after a config
change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class SizeNow:
    """The size in force at a moment, and the next change within a week (None: it never changes)."""

    size: int
    next_change_at: datetime | None = None
    next_size: int | None = None


def _clock(text: str) -> time | None:
    """``HH:MM`` as a time; ``24:00`` as None (the end of the day)."""
    if text == "24:00":
        return None
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def _minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def _period_covers(period: dict, local: datetime) -> bool:
    """Whether ``period`` holds at the local wall time ``local``. A period past midnight belongs to
    the day it starts on: its early hours are matched against the day before."""
    days = period.get("days") or WEEKDAYS
    start, end = period.get("from"), period.get("to")
    today = WEEKDAYS[local.weekday()]
    if start is None or end is None:  # the schema gives both or neither
        return today in days
    now_min = local.hour * 60 + local.minute
    a, b = _minutes(start), _minutes(end)
    if a < b:
        return today in days and a <= now_min < b
    yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
    return (today in days and now_min >= a) or (yesterday in days and now_min < b)


def size_at(warm: dict | None, at: datetime) -> int:
    """The size ``warm`` (a stored ``warmPool``) asks for at the aware moment ``at``."""
    warm = warm or {}
    default = int(warm.get("size") or 0)
    schedule = warm.get("schedule") or []
    if not schedule:
        return default
    local = at.astimezone(ZoneInfo(warm.get("timeZone") or "UTC"))
    for period in schedule:
        if _period_covers(period, local):
            return int(period["size"])
    return default


def _boundaries(warm: dict, at: datetime, days: int = 8) -> list[datetime]:
    """Every period start and end from the local day of ``at`` for ``days`` days, as aware moments
    after ``at``, sorted."""
    zone = ZoneInfo(warm.get("timeZone") or "UTC")
    local_day = at.astimezone(zone).date()
    moments: set[datetime] = set()
    for offset in range(days):
        day = local_day + timedelta(days=offset)
        moments.add(datetime.combine(day, time(0, 0), zone))
        for period in warm.get("schedule") or []:
            for key in ("from", "to"):
                if period.get(key) is None:
                    continue
                clock = _clock(period[key])
                moment = (
                    datetime.combine(day + timedelta(days=1), time(0, 0), zone)
                    if clock is None
                    else datetime.combine(day, clock, zone)
                )
                moments.add(moment)
    return sorted(m for m in moments if m > at)


def size_now(warm: dict | None, at: datetime) -> SizeNow:
    """The size at ``at`` and, when the schedule changes it within a week, when and to what."""
    size = size_at(warm, at)
    if not warm or not warm.get("schedule"):
        return SizeNow(size)
    for moment in _boundaries(warm, at):
        later = size_at(warm, moment)
        if later != size:
            return SizeNow(size, moment, later)
    return SizeNow(size)
