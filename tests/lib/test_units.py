"""Durations and ages, formatted once for every page (lib.units)."""

import pytest

from lib.units import format_age, format_duration


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (59, "59s"), (75, "1m 15s"), (3600, "1h 0m"), (90000, "1d 1h"), ("n/a", "n/a")]
)
def test_a_duration_reads_in_its_two_largest_units(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "seconds, text", [(-3, "0s ago"), (12.9, "12s ago"), (300, "5m ago"), (11040, "3h 4m ago"), (3 * 86400, "3d ago")]
)
def test_an_age_reads_as_the_browser_keeps_counting_it(seconds, text):
    assert format_age(seconds) == text
