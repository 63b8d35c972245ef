"""The console page's search of the whole log in Debian Chromium, under the pages' strict
Content-Security-Policy: a VM whose serial log holds 50,000 lines, of which the page loads only the
last 500, finds a line near the start and shows it by loading the page of lines around it (not
the 99 pages above it); a line number goes the same way; the page says what it holds of the log;
a finished agent's console shows its lines' times."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from agents.archive import write_archive
from agents.choices import AgentState
from agents.models import Agent
from scalers.models import LabelSet, Scaler
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.browser

LINES = 50_000
TIME = re.compile(r"\d\d:\d\d:\d\d\.\d{3}")


def _vm_agent(serial) -> Agent:
    vm = Scaler.objects.create(name="ui-search-fc", type="firecracker", max_agents=2)
    LabelSet.objects.create(scaler=vm, index=0, labels=["kvm"], normalized="kvm")
    return Agent.objects.create(
        agent_id=f"scaler-firecracker-5ea{uuid.uuid4().hex[:5]}",
        scaler=vm,
        state=AgentState.RUNNING,
        backend_context={"console_logs": {"serial": str(serial), "vmm": str(serial.with_name("vmm.log"))}},
    )


def loaded(page) -> int:
    return int(page.locator("#console-count").inner_text().split()[0])


def test_search_finds_a_line_near_the_start_of_a_50000_line_log_and_shows_it(browser_page, wait_live, tmp_path):
    serial = tmp_path / "serial-console.log"
    serial.write_bytes(b"".join(b"boot line %d of the guest\n" % n for n in range(1, LINES + 1)))
    agent = _vm_agent(serial)
    page = browser_page(csp=True)
    page.goto(f"/agents/{agent.agent_id}/console/")
    wait_live(page)
    page.locator(f"#L{LINES}").wait_for()
    summary = page.locator("#console-summary")
    expect(summary).to_contain_text("50,000 lines in the log: ")
    before = loaded(page)
    assert before < 10_000  # the last lines, far from line 123
    said = re.fullmatch(
        r"50,000 lines in the log: ([\d,]+) came over the live stream, ([\d,]+) loaded from the log;"
        r" ([\d,]+) not loaded \(they load on scroll; search covers them\)",
        summary.inner_text(),
    )
    assert said, summary.inner_text()
    live, read, missing = (int(part.replace(",", "")) for part in said.groups())
    assert live + read == before and missing == LINES - before

    # The search reads the whole log: line 123 was never loaded, yet it is listed with its excerpt.
    page.locator("body").press("/")
    page.keyboard.type("line 123 of")
    hit = page.locator("#console-hits-list button[data-line='123']")
    hit.wait_for()
    expect(page.locator("#console-hits-summary")).to_have_text("1 hit in the whole log (lines 1–50,000)")
    expect(hit.locator("mark")).to_have_text("line 123 of")
    expect(page.locator("#console-matches")).to_have_text("1 match in the whole log · 0 in the loaded lines")

    # Enter shows it: the page of lines around it loads, not the 99 pages above the loaded ones.
    page.locator("#console-search").press("Enter")
    target = page.locator("#L123.is-target")
    target.wait_for()
    expect(target.locator(".tx")).to_have_text("boot line 123 of the guest")
    expect(target.locator("mark")).to_have_text("line 123 of")
    assert loaded(page) <= before + 500, page.locator("#console-count").inner_text()
    assert page.url.endswith("#L123")
    expect(page.locator("#console-matches")).to_have_text("1 / 1 in the whole log · 1 in the loaded lines")

    # A line number goes the same way, line 1 included.
    page.locator("#console-goto").fill("1")
    page.locator("#console-goto").press("Enter")
    page.locator("#L1.is-target").wait_for()
    expect(page.locator("#L1 .tx")).to_have_text("boot line 1 of the guest")
    assert loaded(page) <= before + 1000
    page.locator("#console-goto").fill("30,000")
    page.locator("#console-goto").press("Enter")
    page.locator("#L30000.is-target").wait_for()
    assert loaded(page) <= before + 1500

    # Many hits: the first 200 are listed, the rest counted and listed on demand.
    page.locator("#console-search").fill("guest")
    expect(page.locator("#console-hits-summary")).to_have_text(
        "the first 200 of 50,000 hits in the whole log (lines 1–50,000)"
    )
    expect(page.locator("#console-hits-list button")).to_have_count(200)
    page.locator("#console-hits-more").click()
    expect(page.locator("#console-hits-list button")).to_have_count(400)
    page.locator("#console-hits-list button[data-line='350']").click()
    page.locator("#L350.is-target").wait_for()

    # A regular expression the server refuses says why, naming the field.
    page.locator("#console-regex").check()
    page.locator("#console-search").fill("(a+)+")
    expect(page.locator("#console-hits-summary")).to_contain_text("q: a repeat inside a repeat")
    page.locator("#console-search").fill(r"line 4{4}\d of")
    expect(page.locator("#console-hits-summary")).to_have_text("10 hits in the whole log (lines 1–50,000)")

    # A line written now arrives live, and the summary counts it.
    with serial.open("a") as out:
        out.write("agent: registered\n")
    expect(summary).to_contain_text(f"50,001 lines in the log: {live + 1:,} came over the live stream")
    errors = [e for e in page.js_errors if "status of 400" not in e]  # the refused expression's answer
    assert not errors, errors


def test_a_finished_console_shows_its_lines_times_and_searches_its_archive(browser_page):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    output = "".join(f"archived {i}\n" for i in range(1001, 3001)).encode()
    stamp = 1_800_000_000_000  # 2027-01-15 08:00:00.000 UTC
    write_archive(agent.agent_id, output, lines_before=1000, times=[(1001, 2000, stamp)])
    page = browser_page(csp=True)
    page.goto(f"/agents/{agent.agent_id}/console/")
    page.locator("#L3000").wait_for()
    expect(page.locator("#console-times")).to_be_checked()
    expect(page.locator("#L3000 .ts")).to_have_text("08:00:00.000")  # as the live console showed it
    expect(page.locator("#console-summary")).to_have_text(
        "3,000 lines in the output: 500 loaded from its archive;"
        " 1,500 not loaded (they load on scroll; search covers them); lines 1–1,000 no longer kept"
    )
    expect(page.locator("#console-summary")).not_to_contain_text("live stream")

    page.locator("body").press("/")
    page.keyboard.type("archived 1042")
    page.locator("#console-hits-list button[data-line='1042']").wait_for()
    expect(page.locator("#console-hits-list button[data-line='1042'] .ts")).to_have_text("08:00:00.000")
    page.locator("#console-search").press("Enter")
    page.locator("#L1042.is-target").wait_for()
    expect(page.locator("#L1042 .ts")).to_have_text("08:00:00.000")  # loaded from the archive, with its time
    assert not page.js_errors, page.js_errors


def test_terminal_colours_show_as_colours_and_other_escapes_never_show(browser_page):
    agent = make_agent(make_scaler("c"), state=AgentState.DESTROYED, reserve=False)
    output = (
        b"plain line\n"
        b"\x1b[31mred\x1b[0m then \x1b[1;92mbold bright green\x1b[m done\n"
        b"\x1b]0;a title\x07\x1b[2Kcleared \x1b[38;5;4mblue\x1b[39m \x1b[7minverse\x1b[27m\n"
    )
    write_archive(agent.agent_id, output, lines_before=0, times=[])
    page = browser_page(csp=True)
    page.goto(f"/agents/{agent.agent_id}/console/")
    page.locator("#L3").wait_for()
    expect(page.locator("#L2 .tx")).to_have_text("red then bold bright green done")
    expect(page.locator("#L2 .tx .a-f1")).to_have_text("red")
    expect(page.locator("#L2 .tx .a-f10.a-b")).to_have_text("bold bright green")
    expect(page.locator("#L3 .tx")).to_have_text("cleared blue inverse")
    expect(page.locator("#L3 .tx .a-f4")).to_have_text("blue")
    expect(page.locator("#L3 .tx .a-fi.a-gi")).to_have_text("inverse")
    red = page.locator("#L2 .tx .a-f1").evaluate("e => getComputedStyle(e).color")
    plain = page.locator("#L1 .tx").evaluate("e => getComputedStyle(e).color")
    assert red != plain, (red, plain)
    # A search over the shown text marks inside the colours.
    page.locator("body").press("/")
    page.keyboard.type("bright")
    expect(page.locator("#L2 .tx mark.a-f10")).to_have_text("bright")
    expect(page.locator("#L2 .tx")).to_have_text("red then bold bright green done")
    assert "\x1b" not in page.locator("#console-lines").inner_text()
    assert not page.js_errors, page.js_errors
