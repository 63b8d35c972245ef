"""The console's browser-side security in Debian Chromium against a real daphne.

* A page served on another local port cannot open a live console with the operator's cookie
  (cookies are shared by every port of a host; the WebSocket's Origin is checked with its port).
* Signing out in one tab closes the live console open in another, within seconds.
* The main pages run under the Content-Security-Policy without a single violation (collected from
  ``securitypolicyviolation`` events and the console's "Content Security Policy" messages).
"""

from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import expect

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.browser

SECRET_LINE = "secret build output 5f1e"


def _vm_agent(tmp_path: Path) -> Agent:
    serial = tmp_path / "serial-console.log"
    serial.write_text(f"booting\n{SECRET_LINE}\n")
    (tmp_path / "vmm.log").write_text("")
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    vm = Scaler.objects.create(name="sec-fc", type="firecracker", max_agents=2)
    LabelSet.objects.create(scaler=vm, index=0, labels=["kvm"], normalized="kvm", host_access=["172.30.0.1:8000"])
    return Agent.objects.create(
        agent_id=f"scaler-firecracker-5ec{uuid.uuid4().hex[:5]}",
        scaler=vm,
        label_set=vm.label_sets.get(),
        state=AgentState.RUNNING,
        labels=["kvm"],
        backend_context={"console_logs": {"serial": str(serial), "vmm": str(tmp_path / "vmm.log")}},
    )


class _OtherPortPage(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server's name
        body = b"<!doctype html><title>another local service</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


OPEN_SOCKET = """([url, want]) => new Promise(resolve => {
  let got = "";
  const ws = new WebSocket(url);
  ws.onmessage = e => { got += e.data; if (got.includes(want)) resolve("streamed " + got); };
  ws.onclose = e => resolve("closed " + e.code + " " + got);
  setTimeout(() => resolve("timeout " + got), 5000);
})"""


def test_a_page_on_another_local_port_cannot_open_a_live_console(browser_page, live_daphne, tmp_path):
    agent = _vm_agent(tmp_path)
    page = browser_page(csp=True)
    ws_url = live_daphne.replace("http://", "ws://") + f"/ws/agents/{agent.agent_id}/console/serial/"
    # From the console's own page, the socket opens and streams the line.
    page.goto("/accounts/login/")
    own = page.evaluate(OPEN_SOCKET, [ws_url, SECRET_LINE])
    assert own.startswith("streamed"), own

    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherPortPage)
    thread = threading.Thread(target=server.serve_forever, name="other-port", daemon=True)
    thread.start()
    try:
        # Same host, another port: the browser sends the console's session cookie along.
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        other = page.evaluate(OPEN_SOCKET, [ws_url, SECRET_LINE])
    finally:
        server.shutdown()
        server.server_close()
    assert other.startswith("closed"), other
    assert SECRET_LINE not in other


def test_signing_out_in_one_tab_closes_the_live_console_in_another(browser_page, wait_live, tmp_path):
    agent = _vm_agent(tmp_path)
    console = browser_page(csp=True)
    console.goto(f"/agents/{agent.agent_id}/console/")
    wait_live(console)
    console.get_by_text(SECRET_LINE).wait_for()

    other = console.context.new_page()
    other.goto("/")
    other.get_by_role("button", name="Sign out").click()
    other.wait_for_url("**/accounts/login/")
    signed_out_at = time.monotonic()
    # The sign-out reaches the socket at once; the periodic re-check (3 s) is the fallback.
    expect(console.locator("[data-live-status]")).to_have_text("signed out", timeout=5000)
    assert time.monotonic() - signed_out_at < 5
    # It stays closed: the page does not reconnect on 4401 (a reconnect would be refused anyway).
    time.sleep(1.5)
    assert console.locator("[data-live-status]").inner_text() == "signed out"


COLLECT_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  var where = e.sourceFile + ":" + e.lineNumber;
  window.__cspViolations.push([e.violatedDirective, e.blockedURI, e.sample, where].join(" "));
});
"""

PERMS = ("operations.view_operation", "operations.request_operation")


def _check_policy(response, path: str) -> None:
    policy = response.headers.get("content-security-policy", "")
    directives = dict((part.strip().split(" ", 1) + [""])[:2] for part in policy.split(";") if part.strip())
    assert directives.get("default-src") == "'self'", (path, policy)
    assert directives.get("script-src") == "'self'", (path, policy)
    assert directives.get("connect-src") == "'self'", (path, policy)
    assert directives.get("frame-ancestors") == "'none'", (path, policy)
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, (path, policy)


def test_the_main_pages_run_under_the_csp_without_a_violation(browser_page, wait_live, live_daphne, chromium, tmp_path):
    agent = _vm_agent(tmp_path)
    scaler = agent.scaler
    page = browser_page(*PERMS, csp=True)
    page.context.add_init_script(COLLECT_VIOLATIONS)
    console_messages: list[str] = []
    page.on("console", lambda m: console_messages.append(m.text) if "Content Security Policy" in m.text else None)

    def clean(where: str) -> None:
        found = page.evaluate("window.__cspViolations") + console_messages
        assert found == [], (where, found)

    def visit(path: str, live: bool = True) -> None:
        response = page.goto(path)
        _check_policy(response, path)
        if live:
            wait_live(page)
        page.wait_for_load_state("networkidle")
        clean(path)

    visit("/")
    visit("/agents/")
    visit(f"/agents/{agent.agent_id}/")
    visit(f"/agents/{agent.agent_id}/console/")
    page.get_by_text(SECRET_LINE).wait_for()
    visit("/scalers/", live=False)
    visit(f"/scalers/{scaler.name}/")
    visit(f"/scalers/{scaler.name}/label-sets/0/host-access/", live=False)
    page.locator("#entries").fill("172.30.0.1:8000\n172.30.0.1:53")  # an htmx preview swap
    page.wait_for_load_state("networkidle")
    clean("host-access preview")
    visit("/operations/", live=False)
    visit("/events/", live=False)
    page.locator("select[name=scaler]").select_option(scaler.name)  # data-autosubmit
    try:
        page.wait_for_url(f"**/events/?*scaler={scaler.name}*", timeout=3000)
    finally:
        clean("events filter")
    page.wait_for_load_state("networkidle")
    clean("events filtered")

    anonymous = chromium.new_context(base_url=live_daphne)
    try:
        login = anonymous.new_page()
        login.add_init_script(COLLECT_VIOLATIONS)
        login.on("console", lambda m: console_messages.append(m.text) if "Content Security Policy" in m.text else None)
        _check_policy(login.goto("/accounts/login/"), "/accounts/login/")
        login.wait_for_load_state("networkidle")
        found = login.evaluate("window.__cspViolations") + console_messages
    finally:
        anonymous.close()
    assert found == [], ("/accounts/login/", found)
