"""Console frames: rows rendered by the page's own ``lines`` partial, wrapped for an out-of-band swap."""

from __future__ import annotations

from django.template import TemplateDoesNotExist
from django.template.loader import get_template

from live.streams import Line

CONSOLE_TBODY_ID = "console-lines"
ROW_TEMPLATES = ("agents/console.html#lines", "agents/console_lines.html#lines")
FALLBACK_TEMPLATE = "agents/console_lines.html"

_row_template = None


def _rows_template():
    global _row_template
    if _row_template is None:
        for name in ROW_TEMPLATES:
            try:
                _row_template = get_template(name)
                break
            except TemplateDoesNotExist:
                continue
    return _row_template


def render_console_rows(lines: list[Line]) -> str:
    """Rows for ``lines`` from the console ``lines`` partial (see :mod:`agents.consumers`)."""
    return _rows_template().render({"lines": lines})


def render_console_frame(lines: list[Line], *, replace: bool) -> str:
    """One console frame: the rows wrapped for an out-of-band swap into ``#console-lines``."""
    swap = "innerHTML" if replace else "beforeend"
    return f'<tbody id="{CONSOLE_TBODY_ID}" hx-swap-oob="{swap}">{render_console_rows(lines)}</tbody>'
