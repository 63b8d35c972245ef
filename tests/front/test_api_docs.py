"""The API reference page: the OpenAPI document rendered on the server, under the console's strict
content security policy (no inline script or style), for signed-in viewers."""

from __future__ import annotations

import re

import pytest

from front.templatetags.kici_ui import code_spans
from scalers.openapi import build_document

pytestmark = pytest.mark.django_db


def test_it_shows_every_operation_and_schema_of_the_document(viewer_client):
    response = viewer_client.get("/api-docs/")
    assert response.status_code == 200
    html = response.content.decode()
    document = build_document()
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            assert f'id="op-{op["operationId"]}"' in html
            assert f"<code>{method.upper()} {path}</code>" in html
    for name in document["components"]["schemas"]:
        assert f'id="schema-{name}"' in html
    # A type names the schema it refers to with a link to it; constraints are spelled out.
    assert '<a href="#schema-ScaleRequestBody">ScaleRequestBody</a>' in html
    assert "at most 64 items" in html and "Retry-After" in html
    assert 'href="/api/v1/openapi.json"' in html
    # The descriptions' `code spans` read as code, and nothing in them is taken as markup.
    assert "<code>Retry-After</code>" in html and "`Retry-After`" not in html


def test_a_code_span_is_escaped_before_it_is_marked():
    assert code_spans("a `<b>` and <i>") == "a <code>&lt;b&gt;</code> and &lt;i&gt;"


def test_it_keeps_the_strict_policy(viewer_client):
    response = viewer_client.get("/api-docs/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self';" in policy and "unsafe-inline" not in policy
    html = response.content.decode()
    assert " style=" not in html and "<style" not in html
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", html))
    assert "cdn" not in html.lower()


def test_it_sends_a_stranger_to_sign_in(client):
    response = client.get("/api-docs/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_it_refuses_a_signed_in_user_without_the_view_permission(outsider_client):
    assert outsider_client.get("/api-docs/").status_code == 403


def test_it_takes_no_query_parameter(viewer_client):
    response = viewer_client.get("/api-docs/?x=1")
    assert response.status_code == 400 and "x: unknown parameter" in response.content.decode()
