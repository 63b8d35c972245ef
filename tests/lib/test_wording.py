"""Refused values are written as the caller wrote them: readable in any script, never hiding what
cannot be seen."""

from lib.wording import json_text


def test_letters_of_any_script_are_shown_as_written():
    assert json_text("tök én 漢字") == '"tök én 漢字"'
    assert json_text(["Ω", 1, None]) == '["Ω", 1, null]'


def test_what_cannot_be_seen_is_escaped():
    # A bidi override, a zero-width space, a no-break space, a control, a line separator.
    assert json_text("a\u202eb\u200bc\u00a0d\x07e\u2028") == '"a\\u202eb\\u200bc\\u00a0d\\u0007e\\u2028"'
    assert json_text("\U000e0041") == '"\\udb40\\udc41"'  # a tag character: invisible, above the BMP


def test_long_values_are_cut_and_marked():
    assert json_text("x" * 100) == '"' + "x" * 56 + "..."


def test_visible_text_escapes_what_cannot_be_seen_and_keeps_the_layout():
    from lib.wording import visible_text

    assert visible_text("a\u202eb\u2066c\u200bd\u00a0e\x1bf\r") == "a\\u202eb\\u2066c\\u200bd\\u00a0e\\u001bf\\r"
    assert visible_text("tök\tén\n漢字") == "tök\tén\n漢字"
