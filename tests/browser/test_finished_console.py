"""A finished agent's console in Debian Chromium: its archive is the same virtual list as a live
console, numbered by the lines' places in the agent's output; earlier lines load from the archive
when scrolled to, and a link to an early line leads to it after a reload."""

from __future__ import annotations

import pytest

from agents.archive import archive_path, write_archive
from agents.choices import AgentState
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.browser

LINES = 1800
BEFORE = 1000  # lines of the output cut before the archive's first one


def first_line(page) -> int:
    return int(page.locator("#console-root").get_attribute("data-first-line"))


def test_a_finished_agents_archive_loads_earlier_lines_and_keeps_its_numbers(browser_page):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    output = "".join(f"archived {i}\n" for i in range(BEFORE + 1, BEFORE + LINES + 1)).encode()
    write_archive(agent.agent_id, output, lines_before=BEFORE)
    assert archive_path(agent.agent_id).exists()
    last = BEFORE + LINES
    page = browser_page()
    page.goto(f"/agents/{agent.agent_id}/console/")
    page.locator("#sandbox-gone").wait_for()
    page.locator(f"#L{last}").wait_for()
    assert page.locator(f"#L{last} .tx").inner_text() == f"archived {last}"
    assert page.locator("[data-live-status]").inner_text() == "finished"
    assert first_line(page) == last - 499  # the last 500 lines, numbered in the output

    # Scrolled to the top, the gap above loads the archive's earlier lines, down to its first.
    page.keyboard.press("g")
    page.wait_for_function(f"+document.getElementById('console-root').dataset.firstLine === {last - 999}")
    assert page.locator(f"#L{last - 500} .tx").inner_text() == f"archived {last - 500}"  # just above the old top
    for first in (last - 1499, BEFORE + 1):
        page.keyboard.press("g")
        page.wait_for_function(f"+document.getElementById('console-root').dataset.firstLine === {first}")
    page.keyboard.press("g")
    page.locator("text=no earlier lines are kept").wait_for()  # the archive's first line is the top

    # Search finds a loaded line and jumps to it.
    page.fill("#console-search", f"archived {BEFORE + 42}")
    page.locator(f"#L{BEFORE + 42}").wait_for()

    # A link to an early line of the archive leads to it after a reload.
    page.evaluate(f"location.hash = '#L{BEFORE + 7}'")
    page.reload()
    target = page.locator(f"#L{BEFORE + 7}.is-target")
    target.wait_for()
    assert target.locator(".tx").inner_text() == f"archived {BEFORE + 7}"
    assert not page.js_errors, page.js_errors
