"""Memory strings."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.units import InvalidMemoryFormat, format_memory, parse_memory


@pytest.mark.parametrize(
    "text, expected",
    [
        ("512m", 536870912),
        ("512M", 536870912),
        ("2g", 2147483648),
        ("2G", 2147483648),
        ("1024k", 1048576),
        ("1024K", 1048576),
        ("1.5g", 1610612736),
        ("512 m", 536870912),  # whitespace between number and unit is allowed
        ("0.1k", 102),  # floored
        ("0m", 0),
    ],
)
def test_it_parses_binary_units(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "512",  # no unit
        "abc",
        "",
        "512b",
        "4Gi",  # two-letter units
        "2GB",
        " 2g",  # leading space
        "2g ",  # trailing space
        "2g\n",
        "-1g",
        ".5g",
        "1.g",
        "1e3m",
        "٣g",  # a non-ASCII digit
        "2 g g",
    ],
)
def test_it_refuses_anything_else_with_the_memory_format_message(text):
    with pytest.raises(InvalidMemoryFormat) as info:
        parse_memory(text)
    assert str(info.value) == (f'Invalid memory format: "{text}". Expected format like "512m", "2g", or "1024k".')
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [512, 2.5, None, True])
def test_it_refuses_non_strings(value):
    with pytest.raises(InvalidMemoryFormat, match="Invalid memory format"):
        parse_memory(value)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from("kmgKMG"))
def test_whole_numbers_multiply_exactly(number, unit):
    assert parse_memory(f"{number}{unit}") == number * 1024 ** ("kmg".index(unit.lower()) + 1)


@pytest.mark.parametrize(
    "num_bytes, text",
    [(2147483648, "2g"), (536870912, "512m"), (1048576, "1m"), (1536, "1.5k"), (512, "512b")],
)
def test_format_memory_picks_the_largest_exact_unit(num_bytes, text):
    assert format_memory(num_bytes) == text
