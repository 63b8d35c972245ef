"""Warm-pool sizes by the clock: ``warmPool.schedule`` periods in ``warmPool.timeZone``, validated
on import with the file, line and field; the pool's target follows them, and the scaler page shows
the size in force and the next change."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from scalers.config.loader import ConfigInvalid, parse_scalers_config_text
from scalers.importing import apply_scalers_config
from scalers.models import Scaler
from scalers.warm_pool_config import configured_pools, read_world
from scalers.warm_schedule import size_at, size_now

#: Weekdays 08:00-18:00 Berlin time: 5; Friday 22:00 to 02:00: 3; weekends: 0; else 1.
WARM = {
    "enabled": True,
    "size": 1,
    "timeZone": "Europe/Berlin",
    "schedule": [
        {"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00", "size": 5},
        {"days": ["fri"], "from": "22:00", "to": "02:00", "size": 3},
        {"days": ["sat", "sun"], "size": 0},
    ],
}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("moment", "size"),
    [
        (utc(2026, 12, 7, 7, 0), 5),  # Monday 08:00 in Berlin (UTC+1): the period starts
        (utc(2026, 12, 7, 6, 59), 1),  # 07:59: before it
        (utc(2026, 12, 7, 17, 0), 1),  # 18:00: its end is not in it
        (utc(2026, 12, 11, 21, 30), 3),  # Friday 22:30
        (utc(2026, 12, 12, 0, 30), 3),  # Saturday 01:30: Friday's night period, before the weekend's
        (utc(2026, 12, 12, 1, 0), 0),  # Saturday 02:00: the weekend
        (utc(2026, 7, 6, 6, 0), 5),  # a Monday in summer time (UTC+2): 08:00 local
    ],
)
def test_the_first_period_that_holds_at_the_local_time_gives_the_size(moment, size):
    assert size_at(WARM, moment) == size


def test_without_a_schedule_the_size_is_the_pools_size():
    assert size_at({"size": 4}, utc(2026, 12, 7, 12, 0)) == 4
    assert size_now({"size": 4}, utc(2026, 12, 7, 12, 0)).next_change_at is None


def test_the_next_change_is_the_first_boundary_where_the_size_differs():
    now = size_now(WARM, utc(2026, 12, 7, 12, 0))  # Monday 13:00 Berlin
    assert (now.size, now.next_change_at, now.next_size) == (5, utc(2026, 12, 7, 17, 0), 1)
    friday = size_now(WARM, utc(2026, 12, 11, 20, 0))  # Friday 21:00 Berlin
    assert (friday.size, friday.next_change_at, friday.next_size) == (1, utc(2026, 12, 11, 21, 0), 3)
    night = size_now(WARM, utc(2026, 12, 11, 23, 0))  # Saturday 00:00: still Friday's night period
    assert (night.size, night.next_change_at, night.next_size) == (3, utc(2026, 12, 12, 1, 0), 0)


def config_text(warm: str) -> str:
    return textwrap.dedent(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 5
            labelSets:
              - labels: [linux]
                image: a
                resources: {cpus: 1}
        """
    ) + textwrap.indent(textwrap.dedent(warm), "    ")


@pytest.mark.parametrize(
    ("warm", "line", "path", "message"),
    [
        ("warmPool:\n  schedule:\n    - {from: '25:00', to: '23:00', size: 1}\n", 12, "schedule.0.from", "pattern"),
        ("warmPool:\n  schedule:\n    - {from: '08:00', size: 1}\n", 12, "schedule.0", "both from and to"),
        ("warmPool:\n  schedule:\n    - {days: [monday], size: 1}\n", 12, "schedule.0.days.0", "'mon'"),
        ("warmPool:\n  schedule:\n    - {size: -1}\n", 12, "schedule.0.size", "greater than or equal to 0"),
        ("warmPool:\n  timeZone: Mars/Olympus\n", 11, "timeZone", "unknown time zone"),
        ("warmPool:\n  schedule:\n    - {size: 1, when: always}\n", 12, "schedule.0.when", "nrecognized"),
    ],
)
def test_a_bad_schedule_names_its_line_and_field(warm, line, path, message):
    with pytest.raises(ConfigInvalid) as info:
        parse_scalers_config_text(config_text(warm), "scalers.yaml")
    (problem,) = info.value.problems
    assert problem.path == f"scalers.0.warmPool.{path}", problem
    assert problem.line == line, problem
    assert message in problem.message, problem


@pytest.mark.django_db
def test_an_imported_schedule_sets_the_pool_target_and_the_scaler_page_shows_it(admin_client):
    warm = """\
        warmPool:
          enabled: true
          size: 1
          timeZone: Europe/Berlin
          schedule:
            - {days: [mon, tue, wed, thu, fri], from: "08:00", to: "18:00", size: 4}
        """
    apply_scalers_config(parse_scalers_config_text(config_text(warm), "scalers.yaml"), "scalers.yaml")
    (pool,) = configured_pools(read_world(), utc(2026, 12, 7, 12, 0))[0]
    assert pool.size == 4
    (pool,) = configured_pools(read_world(), utc(2026, 12, 7, 18, 0))[0]
    assert pool.size == 1
    expected = size_now(Scaler.objects.get(name="c").config["warmPool"], timezone.now())
    page = admin_client.get("/scalers/c/").content.decode()
    shown = page.split('id="warm-pool">')[1].split("</dd>")[0]
    assert (
        f"{expected.size} agents now (by its schedule, Europe/Berlin; otherwise 1), {expected.next_size} from " in shown
    )
    assert f"{expected.next_change_at.astimezone(ZoneInfo('Europe/Berlin')):%a %H:%M} Europe/Berlin" in shown
