"""Error pages have the console's frame (styling, navigation) and say what went wrong in words;
500.html is static (no request, no database)."""

from __future__ import annotations

import pytest
from django.template.loader import render_to_string

from operations.services import create_operation, reject_operation
from tests.support.operations import login

pytestmark = pytest.mark.django_db


def assert_framed(response, status: int) -> str:
    assert response.status_code == status, response.status_code
    text = response.content.decode()
    assert "kici.css" in text and 'class="topbar"' in text, text[:500]
    assert f"HTTP {status}" in text
    return text


def test_an_unknown_agent_is_a_styled_404_with_navigation(client, users):
    login(client, users["viewer"])
    text = assert_framed(client.get("/agents/scaler-container-deadbeef/"), 404)
    assert 'aria-label="Sections"' in text and "/agents/scaler-container-deadbeef/" in text


def test_an_unknown_address_is_a_styled_404(client, users):
    login(client, users["viewer"])
    assert_framed(client.get("/no/such/page/"), 404)


def test_a_missing_permission_is_a_styled_403_that_names_the_account(client, users):
    login(client, users["outsider"])
    text = assert_framed(client.get("/agents/"), 403)
    assert "ops-outsider" in text


def test_a_get_of_the_plan_form_target_is_a_styled_405(client, users):
    login(client, users["operator"])
    response = client.get("/operations/plan/")
    text = assert_framed(response, 405)
    assert response["Allow"] == "POST" and "GET request" in text


def test_a_csrf_failure_is_the_styled_403(csrf_client, users, config_file):
    op = create_operation("config-reload", {}, users["operator"])
    login(csrf_client, users["approver"])
    text = assert_framed(csrf_client.post(f"/operations/{op.pk}/approve/", {"note": "x"}), 403)
    assert "nothing was changed" in text


def test_a_refused_rejection_is_titled_in_plain_words(client, users, config_file):
    op = create_operation("config-reload", {}, users["operator"])
    reject_operation(op, users["approver"])
    login(client, users["approver"])
    response = client.post(f"/operations/{op.pk}/reject/", {"note": "again"})
    assert response.status_code == 409
    text = response.content.decode()
    assert "Not rejected" in text and "rejectd" not in text


def test_the_500_page_renders_without_a_request_or_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        html = render_to_string("500.html")
    assert "kici.css" in html and "Server error" in html and 'href="/"' in html


HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "results"}


def assert_fragment(response, status: int) -> str:
    """An htmx request's error: the alert fragment in place of its target (lib.errors.error_page)."""
    assert response.status_code == status, response.status_code
    assert response["HX-Reswap"] == "outerHTML"
    text = response.content.decode()
    assert 'class="topbar"' not in text and "<html" not in text, text[:500]
    assert text.lstrip().startswith('<div id="results" class="alert alert-err') and f"(HTTP {status})" in text
    return text


def test_an_htmx_request_gets_each_refusal_as_a_fragment_in_its_target(client, users):
    login(client, users["outsider"])
    assert "Not allowed (HTTP 403)" in assert_fragment(client.get("/agents/", **HTMX), 403)
    login(client, users["viewer"])
    assert_fragment(client.get("/agents/scaler-container-deadbeef/", **HTMX), 404)
    assert_fragment(client.get("/agents/?q=%00", **HTMX), 400)
    assert "does not accept a GET" in assert_fragment(client.get("/operations/plan/", **HTMX), 405)


def test_a_boosted_navigation_still_gets_the_page(client, users):
    login(client, users["viewer"])
    response = client.get("/agents/scaler-container-deadbeef/", HTTP_HX_BOOSTED="true", **HTMX)
    assert_framed(response, 404)
