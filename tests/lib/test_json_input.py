"""Untrusted JSON: what is refused and how it is said."""

from __future__ import annotations

import pytest

from lib.json_input import JsonRefused, parse_json, parse_json_object


def test_a_key_given_twice_in_one_object_is_refused_at_any_depth():
    with pytest.raises(JsonRefused, match="key 'labels' appears twice in one object"):
        parse_json('{"labels": ["windows"], "labels": ["linux"]}')
    with pytest.raises(JsonRefused, match="key 'cpus' appears twice"):
        parse_json('{"resources": {"cpus": 1, "cpus": 64}}')
    assert parse_json('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]  # one key per object is fine


def test_an_overlong_integer_is_refused_in_the_clients_terms_not_pythons():
    with pytest.raises(ValueError) as caught:
        parse_json_object('{"n": ' + "9" * 5000 + "}")
    assert str(caught.value) == "body refused: a number has 5000 digits (at most 4300)"
    assert "sys.set_int_max_str_digits" not in str(caught.value)
    assert parse_json('{"n": -' + "9" * 4300 + "}")["n"] < 0


def test_the_other_refusals_keep_their_wording():
    with pytest.raises(ValueError, match="^body is not valid JSON: "):
        parse_json_object("{not json")
    with pytest.raises(ValueError, match="^body must be a JSON object$"):
        parse_json_object("[1]")
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json("[" * 100_000 + "]" * 100_000)
    assert parse_json_object(b"") == {}
