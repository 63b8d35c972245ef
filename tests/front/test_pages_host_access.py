"""The label-set host-access editor: live validation (POST-only, side-effect-free preview), the
effective list, the rule diff for live agents, and applying only through a planned operation."""

from __future__ import annotations

import ipaddress
import time
from html import unescape

import pytest

from agents.choices import AgentState
from agents.models import Agent
from front.host_access_editor import check_lines, known_host_addresses, plan_host_access_change
from network.host_access import host_access_warnings
from scalers.models import LabelSet, Scaler

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
#: A socket listening on every IPv4 address of the host.
WILDCARD = (ipaddress.ip_address("0.0.0.0"),)
BASE = "/scalers/ci/label-sets/0/host-access/"


@pytest.fixture(autouse=True)
def _console_url(settings):
    settings.KICI_CONSOLE_URL = "http://172.30.0.1:8000"
    settings.KICI_STORAGE_URL = None


@pytest.fixture
def label_set():
    scaler = Scaler.objects.create(name="ci", type="container", max_agents=5)
    return LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")


def _live_agent(label_set, n=1, host_access=None, ip="172.30.0.21"):
    return Agent.objects.create(
        agent_id=f"scaler-container-{n:08x}",
        scaler=label_set.scaler,
        label_set=label_set,
        state=AgentState.RUNNING,
        ip=ip,
        host_access=host_access if host_access is not None else ["172.30.0.1:53", "*:8000"],
    )


BAD_ENTRIES = [
    ("ci.example.com:443", "Hostnames are not accepted"),
    ("*:0", "outside 1-65535"),
    ("*:65536", "outside 1-65535"),
    (":53", 'has no address before the ":": write "*:53"'),
    ("192.168.1.256", "not a valid IPv4 address: octet 256 is above 255"),
    ("fd00::1", 'is an IPv6 address without brackets: write "[fd00::1]"'),
    ("127.0.0.1 :8000", 'has whitespace inside it: did you mean "127.0.0.1:8000"?'),
    ("*:-1", "has port -1, outside 1-65535"),
    ("10.0.0.1/24", "host bits set"),
]


@pytest.mark.parametrize("entry,reason", BAD_ENTRIES)
def test_the_preview_refuses_a_bad_entry_with_the_entry_and_the_reason(viewer_client, label_set, entry, reason):
    response = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": f"172.30.0.1:53\n{entry}"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and html.lstrip().startswith('<div id="preview"')
    bad = unescape(html[html.index('class="entry-bad"') :])
    assert entry in bad and reason in bad
    assert "nothing can be applied" in html
    assert 'id="apply"' not in html  # the Apply button is disabled


LONG = "1" * 5000


@pytest.mark.parametrize(
    "entry", [LONG, f"*:{LONG}", f"10.0.0.0/{LONG}", f"{LONG}.0.0.1", f"172.30.0.1:{LONG}", f"[fd00::1]:{LONG}"]
)
def test_a_huge_entry_is_refused_by_its_length_not_a_server_error(viewer_client, label_set, entry):
    response = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": entry}, **HTMX)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert "characters long; an entry is at most 64" in html and 'id="apply"' not in html
    assert LONG not in html  # the entry is not echoed whole


def test_an_empty_entry_between_commas_is_refused(viewer_client, label_set):
    html = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": "5000, ,6000"}, **HTMX).content.decode()
    assert "hostAccess entry is empty" in unescape(html)


def test_the_preview_is_post_only_and_changes_nothing(viewer_client, label_set):
    assert viewer_client.get(BASE + "preview").status_code == 405
    viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": "10.0.0.5:443"}, **HTMX)
    label_set.refresh_from_db()
    assert label_set.host_access is None


def test_the_editor_requires_the_view_permission(client, outsider, label_set):
    assert client.post(BASE + "preview", {"entries": "5000"}).status_code == 302  # to the login page
    client.force_login(outsider)
    assert client.post(BASE + "preview", {"entries": "5000"}).status_code == 403
    assert client.get(BASE).status_code == 403


def test_the_default_mode_shows_the_default_list(viewer_client, label_set):
    html = viewer_client.get(BASE).content.decode()
    effective = html[html.index('id="effective"') :]
    effective = effective[: effective.index("</ul>")]
    assert "<li>172.30.0.1:53</li>" in effective and "<li>172.30.0.1:8000</li>" in effective
    assert "*:8000" not in effective, "the console port is opened on the agents' gateway only"
    assert 'value="default" checked' in html


def test_entries_typed_in_the_default_mode_are_said_to_be_ignored(operator_client, label_set):
    """The default mode applies the default list whatever the textarea holds: an entry typed there
    beyond it is named as ignored (the page's script picks "Explicit list" as one types)."""
    typed = "172.30.0.1:53\n172.30.0.1:8000\n172.30.0.1:5000"
    answer = operator_client.post(BASE + "preview", {"mode": "default", "entries": typed}, **HTMX)
    html = unescape(answer.content.decode())
    assert 'The default mode ignores the typed entries [172.30.0.1:5000]: choose "Explicit list"' in html, html
    assert 'id="preview-warnings"' not in html, "a note: nothing it names is applied, nothing to confirm"
    untouched = operator_client.post(BASE + "preview", {"mode": "default", "entries": "172.30.0.1:53"}, **HTMX)
    assert "ignores the typed entries" not in untouched.content.decode()
    page = operator_client.get(BASE).content.decode()
    assert 'data-picks="mode-explicit"' in page and 'id="mode-explicit"' in page


def test_the_editors_examples_are_entries_that_work_on_this_host(viewer_client, label_set):
    # Examples on foreign addresses (10.0.0.1:5000, 192.168.1.40) each drew the editor's own
    # "opens nothing on this host" warning once typed; they name the agents' gateway now.
    html = viewer_client.get(BASE).content.decode()
    label = html[html.index('<label for="entries"') :]
    label = label[: label.index("</label>")]
    assert "<code>172.30.0.1:5000</code>" in label and "networkPolicy" in label
    for example in ("10.0.0.1:5000", "10.98.0.0/24:443", "192.168.1.40"):
        assert example not in label
    preview = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": "5000\n*:5000\n172.30.0.1:5000"})
    assert "opens nothing" not in preview.content.decode()


def test_the_preview_shows_the_effective_list_and_the_rule_diff_for_live_agents(viewer_client, label_set):
    agent = _live_agent(label_set)
    html = viewer_client.post(
        BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:53\n10.98.0.0/24:443"}, **HTMX
    ).content.decode()
    assert "TCP and UDP port 443 on host addresses in 10.98.0.0/24" in html
    effective = html[html.index('id="effective"') :]
    assert "10.98.0.0/24:443" in effective[: effective.index("</ul>")]
    assert agent.agent_id in html and "1 of 1 live agent would get different input rules" in html
    assert '<span class="add">+ input: ip daddr 10.98.0.0/24 tcp dport 443 accept</span>' in html
    assert '<span class="del">- input: meta nfproto ipv4 tcp dport 8000 accept</span>' in html
    assert '<span class="same">  input: ip daddr 172.30.0.1 udp dport 53 accept</span>' in html


def test_reordered_entries_are_no_change_and_a_real_change_beside_a_reorder_is_only_that(label_set):
    label_set.host_access = ["172.30.0.1:53", "*:8000"]
    label_set.save()
    agent = _live_agent(label_set, host_access=["172.30.0.1:53", "*:8000"])

    plan = plan_host_access_change(label_set, "explicit", "*:8000\n172.30.0.1:53")
    assert plan.unchanged, "the same entries in another order"
    (diff,) = plan.diffs
    assert diff.agent == agent and not diff.changed
    assert {op for op, _ in diff.lines} == {"same"}
    assert plan_host_access_change(label_set, "explicit", "8000\n172.30.0.1:53").unchanged, "8000 is *:8000"

    plan = plan_host_access_change(label_set, "explicit", "*:9000\n*:8000\n172.30.0.1:53")
    assert not plan.unchanged
    (diff,) = plan.diffs
    assert [(op, line) for op, line in diff.lines if op != "same"] == [
        ("add", "input: meta nfproto ipv4 tcp dport 9000 accept"),
        ("add", "input: meta nfproto ipv4 udp dport 9000 accept"),
    ]


def test_an_explicit_empty_list_is_valid_and_says_what_it_means(viewer_client, label_set):
    html = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": ""}, **HTMX).content.decode()
    assert "no</b> port on the host" in html
    assert "nothing can be applied" not in html


def test_the_plan_ignores_blank_lines_and_marks_duplicates():
    checks = check_lines("5000\n\n  \n*:5000\n5000")
    assert [c.text for c in checks] == ["5000", "*:5000", "5000"]
    assert [c.duplicate for c in checks] == [False, False, True]
    assert all(c.ok for c in checks)


def test_the_plan_says_when_nothing_changes(label_set):
    assert plan_host_access_change(label_set, "default", "").unchanged
    label_set.host_access = ["5000"]
    label_set.save()
    assert plan_host_access_change(label_set, "explicit", "5000").unchanged
    assert not plan_host_access_change(label_set, "explicit", "5001").unchanged
    assert plan_host_access_change(label_set, "sideways", "").errors == [
        'mode: must be one of default, explicit, got "sideways"'
    ]


@pytest.mark.parametrize("form", [{"mode": "bogus", "entries": "5000"}, {}], ids=["bad mode", "empty form"])
def test_apply_with_a_bad_mode_names_the_mode_and_applies_nothing(operator_client, label_set, form):
    from operations.models import Operation

    response = operator_client.post(BASE + "apply", form)
    assert response.status_code == 422
    shown = unescape(response.content.decode())
    mode = form.get("mode", "")
    assert f'Nothing was applied: mode: must be one of default, explicit, got "{mode}".' in shown
    assert "fix the entries marked below" not in shown
    assert not Operation.objects.exists()


def test_apply_with_a_bad_entry_applies_nothing(operator_client, label_set):
    from operations.models import Operation

    response = operator_client.post(BASE + "apply", {"mode": "explicit", "entries": "ci.example.com:443"})
    assert response.status_code == 422
    assert b"Nothing was applied" in response.content and b"Hostnames are not accepted" in response.content
    label_set.refresh_from_db()
    assert label_set.host_access is None
    assert Operation.objects.count() == 0


def test_apply_needs_the_request_permission(viewer_client, label_set):
    from operations.models import Operation

    response = viewer_client.post(BASE + "apply", {"mode": "explicit", "entries": "10.0.0.5:443"})
    assert response.status_code == 403
    assert Operation.objects.count() == 0


def test_apply_of_an_unchanged_list_is_refused(operator_client, label_set):
    response = operator_client.post(BASE + "apply", {"mode": "default", "entries": ""})
    assert response.status_code == 422 and b"already has" in response.content


def test_apply_plans_an_operation_and_redirects_to_it(operator_client, label_set):
    from operations.models import Operation

    entries = {"mode": "explicit", "entries": "172.30.0.1:53\n10.0.0.5:443\n*:8000"}
    # 10.0.0.5 is no address of this host: the entry opens nothing, and is applied only knowingly.
    refused = operator_client.post(BASE + "apply", entries)
    assert refused.status_code == 422 and b"confirm the 1 warning below first" in refused.content
    assert b'name="confirm_warnings"' in refused.content and not Operation.objects.exists()
    response = operator_client.post(BASE + "apply", {**entries, "confirm_warnings": "1"})
    operation = Operation.objects.get()
    assert response.status_code == 302 and response.url == f"/operations/{operation.pk}/"
    assert operation.kind == "host-access-apply" and operation.status == "planned"
    assert operation.params["host_access"] == ["172.30.0.1:53", "10.0.0.5:443", "*:8000"]
    assert operation.label_set_id == label_set.pk
    label_set.refresh_from_db()
    assert label_set.host_access is None  # nothing changes before approval and a run
    # The operation names the label set as the editor does: by its index in the scaler.
    page = operator_client.get(response.url).content.decode()
    assert f"label set [{label_set.index}]" in page and f"label set #{label_set.pk}" not in page


def test_apply_back_to_the_default_sends_none(operator_client, label_set):
    from operations.models import Operation

    label_set.host_access = ["5000"]
    label_set.save()
    response = operator_client.post(BASE + "apply", {"mode": "default", "entries": "5000"})
    assert response.status_code == 302
    assert Operation.objects.get().params["host_access"] is None


def test_a_loopback_entry_is_warned_about_but_does_not_block_apply(operator_client, label_set, settings):
    html = unescape(
        operator_client.post(
            BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:53\n127.0.0.1:5432\n*:8000"}, **HTMX
        ).content.decode()
    )
    warnings = html[html.index('id="preview-warnings"') :]
    warnings = warnings[: warnings.index("</div>")]
    assert "1 warning" in warnings and "Apply asks you to confirm you have read them" in warnings
    assert (
        'line 2: hostAccess entry "127.0.0.1:5432" names the host\'s loopback (127.0.0.1): agents cannot reach'
        in warnings
    )
    assert "nothing can be applied" not in html
    assert 'id="apply"' in html  # Apply stays enabled
    plan = plan_host_access_change(label_set, "explicit", "[::1]\n*:8000")
    assert plan.ok and plan.warnings and plan.warnings[0].startswith("line 1: ")


def test_a_loopback_entry_in_the_default_list_is_warned_about(viewer_client, label_set, settings):
    settings.KICI_STORAGE_URL = "http://127.0.0.1:9000"  # filesystem storage on the console's loopback
    plan = plan_host_access_change(label_set, "default", "")
    assert plan.ok and plan.effective[-1] == "127.0.0.1:9000"
    assert plan.warnings == [f"default entry: {w}" for w in host_access_warnings(["127.0.0.1:9000"])]


def test_an_entry_opening_the_consoles_redis_or_operator_listener_is_warned_about(
    operator_client, label_set, settings, monkeypatch
):
    settings.REDIS_URL = "redis://127.0.0.1:6379/12"
    settings.KICI_OPERATOR_LISTEN = [("192.168.1.10", 8000)]
    # Redis listens on every address of the host (dialed on loopback, reached on the gateway too).
    monkeypatch.setattr("front.host_access_editor.tcp_listening", lambda: {6379: WILDCARD, 5432: WILDCARD})
    html = unescape(
        operator_client.post(
            BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:53\n172.30.0.1:6379\n*:8000"}, **HTMX
        ).content.decode()
    )
    warnings = html[html.index('id="preview-warnings"') :]
    warnings = warnings[: warnings.index("</div>")]
    assert "2 warnings" in warnings, warnings
    redis = 'line 2: hostAccess entry "172.30.0.1:6379" opens the console\'s own Redis (REDIS_URL) on 127.0.0.1:6379'
    assert redis in warnings
    assert (
        'line 3: hostAccess entry "*:8000" opens the console\'s own operator listener (KICI_OPERATOR_LISTEN) on '
        "192.168.1.10:8000" in warnings
    )
    assert 'id="apply"' in html  # a warning never blocks Apply
    plan = plan_host_access_change(label_set, "default", "")
    assert not [w for w in plan.warnings if "console's own" in w], plan.warnings


def _refusal_fragment(response, status):
    """The htmx error answer: the status, an alert keeping the target's id, swapped outerHTML."""
    assert response.status_code == status, response.content[:300]
    assert response["HX-Reswap"] == "outerHTML"
    html = unescape(response.content.decode())
    assert "<html" not in html and 'class="topbar"' not in html
    assert html.lstrip().startswith('<div id="preview" class="alert alert-err')
    assert 'id="apply"' not in html and "<button" not in html  # nothing left to apply from
    return html


def test_a_nul_in_the_preview_is_an_error_fragment_naming_the_field_and_the_value(viewer_client, label_set):
    data = {"mode": "explicit", "entries": "172.30.0.1:53\n10.0.0.1:22\x00"}
    response = viewer_client.post(BASE + "preview", data, HTTP_HX_TARGET="preview", **HTMX)
    html = _refusal_fragment(response, 400)
    assert "entries contains a NUL byte" in html and "'172.30.0.1:53\\n10.0.0.1:22\\x00'" in html


def test_a_preview_of_a_label_set_gone_is_an_error_fragment(viewer_client, label_set):
    response = viewer_client.post(
        "/scalers/ci/label-sets/7/host-access/preview", {"mode": "default"}, HTTP_HX_TARGET="preview", **HTMX
    )
    assert "No LabelSet matches" in _refusal_fragment(response, 404)


def test_without_htmx_a_nul_is_still_the_styled_page(viewer_client, label_set):
    response = viewer_client.post(BASE + "apply", {"mode": "explicit", "entries": "22\x00"})
    assert response.status_code == 400 and 'class="topbar"' in response.content.decode()
    assert "HX-Reswap" not in response


def test_a_nul_deep_in_a_long_entry_list_is_quoted_around_it(viewer_client, label_set):
    entries = "\n".join(f"10.0.0.{n}:22" for n in range(1, 40)) + "\n10.9.9.9:2\x002\n" + "5000\n" * 30
    response = viewer_client.post(
        BASE + "preview", {"mode": "explicit", "entries": entries}, HTTP_HX_TARGET="preview", **HTMX
    )
    html = _refusal_fragment(response, 400)
    assert "10.9.9.9:2\\x002" in html and "…'" in html and "'…" in html and "10.0.0.1:22" not in html


def test_a_range_holding_no_host_address_is_warned_to_open_nothing(operator_client, label_set):
    """The range is one that holds none of this machine's addresses as they are now (another
    test's or another checkout's veths may hold any private range)."""
    addresses, error = known_host_addresses(label_set.scaler)
    assert not error and ipaddress.ip_address("172.30.0.1") in addresses
    empty = next(
        net
        for net in map(ipaddress.ip_network, ("10.0.0.0/8", "198.18.0.0/15", "100.64.0.0/10", "240.0.0.0/4"))
        if not [a for a in addresses if a in net]
    )
    html = unescape(
        operator_client.post(
            BASE + "preview", {"mode": "explicit", "entries": f"172.30.0.1:53\n{empty}:22\n*:8000"}, **HTMX
        ).content.decode()
    )
    warnings = html[html.index('id="preview-warnings"') :]
    warnings = warnings[: warnings.index("</div>")]
    assert "1 warning" in warnings
    assert f'line 2: hostAccess entry "{empty}:22" holds none of this host\'s addresses (' in warnings
    assert "so this entry opens nothing" in warnings
    assert 'id="apply"' in html  # a warning never blocks Apply
    plan = plan_host_access_change(label_set, "explicit", f"{empty.network_address + 5}:443\n*:8000")
    assert plan.ok and "opens nothing" in plan.warnings[0]


def test_an_operation_with_warnings_is_approved_only_with_them_confirmed(operator_client, approver, label_set):
    """The editor's confirmation is not the approver's: the operation carries the warnings, its
    pages show them, and every way of approving (page, bulk, CLI, a sweep's policy) refuses
    until a person confirms them."""
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.test import Client

    from operations.models import Operation
    from operations.services import WarningsNotConfirmed, approve_operation, auto_approve

    entries = {"mode": "explicit", "entries": "172.30.0.1:53\n10.0.0.5:443\n*:8000", "confirm_warnings": "1"}
    assert operator_client.post(BASE + "apply", entries).status_code == 302
    operation = Operation.objects.get()
    assert len(operation.warnings) == 1 and '"10.0.0.5:443" holds none of this host' in operation.warnings[0]
    page = unescape(operator_client.get(f"/operations/{operation.pk}/").content.decode())
    assert 'id="operation-warnings"' in page and '"10.0.0.5:443" holds none of this host' in page

    approver_client = Client()
    approver_client.force_login(approver)
    confirm = unescape(approver_client.get(f"/operations/{operation.pk}/approve/").content.decode())
    assert 'name="confirm_warnings"' in confirm and '"10.0.0.5:443" holds none of this host' in confirm
    refused = approver_client.post(f"/operations/{operation.pk}/approve/", {"note": "x"})
    assert refused.status_code == 409 and b"has 1 warning" in refused.content
    bulk = approver_client.post("/operations/approve/", {"op": [str(operation.pk)]})
    assert bulk.status_code == 409 and b"approved only on its own" in bulk.content
    with pytest.raises(CommandError, match="has 1 warning"):
        call_command("operations", "approve", str(operation.pk), "--user", approver.get_username(), "--run-now")
    with pytest.raises(WarningsNotConfirmed):
        auto_approve(operation)
    operation.refresh_from_db()
    assert operation.status == "planned" and operation.approved_by is None

    # Confirmed, the same approval goes through (here without a worker: approved, not enqueued).
    approve_operation(operation, approver, warnings_confirmed=True, require_worker=False, enqueue=False)
    operation.refresh_from_db()
    assert operation.status == "approved" and operation.approved_by == approver


def test_an_operation_without_warnings_needs_no_confirmation(operator_client, label_set):
    from operations.models import Operation

    response = operator_client.post(BASE + "apply", {"mode": "explicit", "entries": "172.30.0.1:53\n*:8000"})
    assert response.status_code == 302
    assert Operation.objects.get().warnings == []


@pytest.mark.parametrize("entries", ["", "172.30.0.1:53", "10.0.0.1:8000", "*:9000"])
def test_an_explicit_list_that_closes_the_console_port_is_warned_about_in_editor_and_operation(
    operator_client, label_set, entries
):
    """An explicit list replaces the default, which opens the console's port: without it new
    agents cannot register and running ones are lost, so the editor and the operation say so."""
    from operations.models import Operation

    plan = plan_host_access_change(label_set, "explicit", entries)
    console = [w for w in plan.warnings if "does not open the console's port 8000" in w]
    assert plan.ok and len(console) == 1 and "cannot register" in console[0]
    refused = operator_client.post(BASE + "apply", {"mode": "explicit", "entries": entries})
    assert refused.status_code == 422 and b'name="confirm_warnings"' in refused.content
    confirmed = {"mode": "explicit", "entries": entries, "confirm_warnings": "1"}
    assert operator_client.post(BASE + "apply", confirmed).status_code == 302
    assert any("does not open the console's port 8000" in w for w in Operation.objects.get().warnings)
    for covering in ("*:8000", "172.30.0.1:8000", "172.30.0.0/16", "*"):
        warnings = plan_host_access_change(label_set, "explicit", covering).warnings
        assert not [w for w in warnings if "console's port" in w], covering


def test_an_apply_without_a_mode_is_refused_naming_it(operator_client, label_set):
    """A form without ``mode`` used to be planned as an explicit empty list."""
    from operations.models import Operation

    response = operator_client.post(BASE + "apply", {"entries": ""})
    assert response.status_code == 422
    assert 'mode: must be one of default, explicit, got ""' in unescape(response.content.decode())
    assert not Operation.objects.exists()


def test_a_preview_over_the_byte_limit_is_refused_unparsed_with_413_naming_the_limit(viewer_client, label_set):
    """A 0.6 MB paste answered a 32 MB preview and slowed every request; now it is refused before
    any entry is parsed, and the answer stays small."""
    from front.host_access_editor import MAX_TEXT_BYTES

    entries = "\n".join(f"10.0.{n // 250}.{n % 250 + 1}:22" for n in range(40000))  # about 0.6 MB
    assert len(entries) > 500_000
    started = time.monotonic()
    response = viewer_client.post(
        BASE + "preview", {"mode": "explicit", "entries": entries}, HTTP_HX_TARGET="preview", **HTMX
    )
    html = _refusal_fragment(response, 413)
    assert f"entries are at most {MAX_TEXT_BYTES} bytes" in html
    assert len(response.content) < 8192 and time.monotonic() - started < 1.0


def test_a_preview_over_the_entry_limit_is_refused_with_422_naming_the_limit(viewer_client, operator_client, label_set):
    entries = ",".join(["5000"] * 257)  # small in bytes, many entries
    response = viewer_client.post(
        BASE + "preview", {"mode": "explicit", "entries": entries}, HTTP_HX_TARGET="preview", **HTMX
    )
    html = _refusal_fragment(response, 422)
    assert "entries: at most 256 are accepted, got 257; nothing was done" in html
    assert len(response.content) < 8192
    refused = operator_client.post(BASE + "apply", {"mode": "explicit", "entries": entries})
    assert refused.status_code == 422 and b"at most 256 are accepted, got 257" in refused.content


def test_a_preview_at_the_limits_answers_in_bounded_size(viewer_client, label_set):
    entries = "\n".join(f"172.30.0.1:{port}" for port in range(1000, 1256))  # 256 entries
    response = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": entries}, **HTMX)
    assert response.status_code == 200 and "nothing can be applied" not in response.content.decode()
    assert len(response.content) < 1_000_000


def test_the_preview_lists_a_bounded_number_of_agent_diffs(viewer_client, label_set):
    """Each diff lists every rule of the agent's input chain: with 256 entries and a fleet, the
    answer grew with the fleet. The first 20 are listed, the rest counted."""
    for n in range(1, 41):
        _live_agent(label_set, n=n, ip=f"172.30.1.{n}")
    entries = "\n".join(f"172.30.0.1:{port}" for port in range(1000, 1256))
    response = viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": entries}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "40 of 40 live agents would get different input rules" in html
    assert html.count('class="agent-diff"') == 20 and "and 20 more live agents, not listed here." in html
    assert len(response.content) < 1_000_000, len(response.content)


def test_switching_to_an_explicit_list_starts_from_the_list_in_force(viewer_client, label_set):
    html = unescape(viewer_client.get(BASE).content.decode())
    assert 'value="default" checked' in html
    text = html[html.index('<textarea id="entries"') :]
    text = text[text.index(">") + 1 : text.index("</textarea>")]
    assert text.splitlines() == ["172.30.0.1:53", "172.30.0.1:8000"], "the default in force, as resolved"
    # The radio's change posts the form as it is: the explicit list starts from those entries.
    preview = unescape(
        viewer_client.post(BASE + "preview", {"mode": "explicit", "entries": text}, **HTMX).content.decode()
    )
    assert "An empty explicit list" not in preview
    effective = preview[preview.index('id="effective"') :]
    assert "<li>172.30.0.1:53</li>" in effective and "<li>172.30.0.1:8000</li>" in effective

    LabelSet.objects.filter(pk=label_set.pk).update(host_access=["*:9000"])
    html = unescape(viewer_client.get(BASE).content.decode())
    assert 'value="explicit" checked' in html and ">*:9000</textarea>" in html


def test_an_entry_with_a_warning_gets_no_green_ok(viewer_client, label_set):
    html = unescape(
        viewer_client.post(
            BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:53\n0.0.0.0/0"}, **HTMX
        ).content.decode()
    )
    rows = html[html.index('<tbody id="entry-checks">') :]
    rows = rows[: rows.index("</tbody>")].split("</tr>")
    warned = next(row for row in rows if "0.0.0.0/0" in row)
    assert 'class="entry-warn"' in warned and '<span class="badge b-amber">warning</span>' in warned
    assert "b-green" not in warned and ">ok<" not in warned
    fine = next(row for row in rows if "172.30.0.1:53" in row)
    assert 'class="entry-ok"' in fine and '<span class="badge b-green">ok</span>' in fine


def test_a_redis_listening_on_loopback_only_is_not_warned_about(operator_client, label_set, settings, monkeypatch):
    settings.REDIS_URL = "redis://127.0.0.1:6379/12"
    settings.KICI_OPERATOR_LISTEN = []
    loopback = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
    monkeypatch.setattr("front.host_access_editor.tcp_listening", lambda: {6379: loopback})
    answer = operator_client.post(BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:6379"}, **HTMX)
    html = unescape(answer.content.decode())
    assert "172.30.0.1:6379" in html and "Redis (REDIS_URL)" not in html, html
    monkeypatch.setattr("front.host_access_editor.tcp_listening", lambda: {6379: WILDCARD})
    answer = operator_client.post(BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1:6379"}, **HTMX)
    assert "Redis (REDIS_URL)" in unescape(answer.content.decode())


def test_a_preview_reads_the_hosts_listening_sockets_once(operator_client, label_set, settings, monkeypatch):
    """The kernel's socket tables are read once per preview, however many services and entries."""
    from network import host_access

    monkeypatch.setitem(settings.DATABASES["default"], "HOST", "127.0.0.1")
    settings.REDIS_URL = "redis://127.0.0.1:6379/12"
    opened = []

    def counting_open(path, *args, **kwargs):
        opened.append(path)
        return open(path, *args, **kwargs)

    monkeypatch.setattr(host_access, "open", counting_open, raising=False)
    entries = "172.30.0.1:53\n172.30.0.1:6379\n*:5432\n0.0.0.0/0"
    for mode in ("explicit", "default"):
        opened.clear()
        answer = operator_client.post(BASE + "preview", {"mode": mode, "entries": entries}, **HTMX)
        assert answer.status_code == 200
        assert sorted(opened) == ["/proc/net/tcp", "/proc/net/tcp6"], (mode, opened)


def test_the_advice_about_an_exposed_database_names_the_agents_gateway(
    operator_client, label_set, settings, monkeypatch
):
    """docker0 (172.17.0.1) sorts before the agents' bridge: the advice names the bridge's gateway."""
    monkeypatch.setitem(settings.DATABASES["default"], "HOST", "127.0.0.1")
    settings.KICI_OPERATOR_LISTEN = []
    monkeypatch.setattr("front.host_access_editor.tcp_listening", lambda: {6379: WILDCARD, 5432: WILDCARD})
    monkeypatch.setattr(
        "front.host_access_editor.host_addresses",
        lambda: [ipaddress.ip_address(a) for a in ("127.0.0.1", "172.17.0.1")],
    )
    answer = operator_client.post(BASE + "preview", {"mode": "explicit", "entries": "0.0.0.0/0"}, **HTMX)
    html = unescape(answer.content.decode())
    exposed = "PostgreSQL (DATABASE_URL) on 127.0.0.1:5432, listening on 0.0.0.0:5432, to the agents at 172.30.0.1"
    assert exposed in html, html
    assert '(e.g. "172.30.0.1:53")' in html and "172.17.0.1:" not in html


def test_the_bare_gateway_is_warned_about_like_a_wide_entry(operator_client, label_set, settings, monkeypatch):
    """``172.30.0.1`` is every port of the host as agents see it: warned about, naming what listens."""
    settings.KICI_OPERATOR_LISTEN = []
    lo = (ipaddress.ip_address("127.0.0.1"),)
    # The console's Redis named, not the suite's (make test's listens on another port).
    settings.REDIS_URL = "redis://127.0.0.1:6379/12"
    monkeypatch.setattr("front.host_access_editor.tcp_listening", lambda: {22: WILDCARD, 5432: lo, 6379: lo})
    answer = operator_client.post(BASE + "preview", {"mode": "explicit", "entries": "172.30.0.1"}, **HTMX)
    html = unescape(answer.content.decode())
    assert 'line 1: hostAccess entry "172.30.0.1" opens every port on this host\'s address 172.30.0.1' in html, html
    assert "(listening there now: 22 on 0.0.0.0)" in html
