"""The API reference page (``/api-docs/``): the OpenAPI document of ``/api/v1``
(``scalers.openapi.build_document``) rendered on the server, so it needs no script and keeps the
console's content security policy; the document itself is at ``/api/v1/openapi.json``.

Each operation shows its method and path, bearer scheme, parameters, request body and answers;
each schema its properties with their types (a reference is a link to its schema), whether
required, their constraints and their description.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.shortcuts import render
from django.views.decorators.http import require_GET

from lib.errors import error_page
from lib.query import check_parameters
from scalers.openapi import build_document

from .common import viewer_required

_REF_PREFIX = "#/components/schemas/"

#: JSON Schema keywords shown as constraints, and how they read.
_CONSTRAINTS = (
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("pattern", "matches {}"),
    ("format", "format {}"),
    ("default", "default {}"),
)


@dataclass
class Segment:
    """A piece of a type's text: ``ref`` names the schema it links to, if any."""

    text: str
    ref: str = ""


@dataclass
class Row:
    name: str
    type: list[Segment]
    required: bool = False
    constraints: list[str] = field(default_factory=list)
    description: str = ""


def _ref_name(schema: dict) -> str:
    return schema.get("$ref", "").removeprefix(_REF_PREFIX)


def type_segments(schema: dict) -> list[Segment]:
    """The type of ``schema`` as text and links: ``array of Label``, ``ResourceRequest | null``."""
    if name := _ref_name(schema):
        return [Segment(name, name)]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            out: list[Segment] = []
            for i, alternative in enumerate(schema[key]):
                if i:
                    out.append(Segment(" | "))
                out.extend(type_segments(alternative))
            return out
    if "const" in schema:
        return [Segment(json.dumps(schema["const"]))]
    if "enum" in schema:
        return [Segment("one of " + ", ".join(str(v) for v in schema["enum"]))]
    if schema.get("type") == "array":
        return [Segment("array of "), *type_segments(schema.get("items", {}))]
    if schema.get("type") == "object" and "properties" not in schema:
        return [Segment("object")]
    return [Segment(str(schema.get("type", "any")))]


def constraints(schema: dict) -> list[str]:
    """The constraints of ``schema``, of its alternatives and of its items, in words."""
    found = [
        text.format(json.dumps(schema[key]) if key == "default" else schema[key])
        for key, text in _CONSTRAINTS
        if key in schema
    ]
    for alternative in schema.get("anyOf", []) + schema.get("oneOf", []):
        found.extend(constraints(alternative))
    if isinstance(schema.get("items"), dict):
        found.extend(f"each {c}" for c in constraints(schema["items"]))
    return found


def _property_rows(schema: dict) -> list[Row]:
    required = set(schema.get("required", ()))
    return [
        Row(name, type_segments(prop), name in required, constraints(prop), prop.get("description", ""))
        for name, prop in schema.get("properties", {}).items()
    ]


def _operations(document: dict) -> list[dict]:
    schemes = document["components"]["securitySchemes"]
    out = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            security = [
                {"name": name, "roles": roles, "description": schemes[name]["description"]}
                for requirement in op.get("security", [])
                for name, roles in requirement.items()
            ]
            body = op.get("requestBody")
            out.append(
                {
                    "id": op["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "tags": op.get("tags", []),
                    "security": security,
                    "parameters": [
                        Row(
                            f"{p['name']} ({p['in']})",
                            type_segments(p["schema"]),
                            p.get("required", False),
                            constraints(p["schema"]),
                            p.get("description", ""),
                        )
                        for p in op.get("parameters", [])
                    ],
                    "body": body
                    and {
                        "required": body.get("required", False),
                        "type": type_segments(body["content"]["application/json"]["schema"]),
                    },
                    "responses": [
                        {
                            "status": status,
                            "description": answer["description"],
                            "type": type_segments(answer["content"]["application/json"]["schema"])
                            if "content" in answer
                            else [],
                            "headers": sorted(answer.get("headers", {})),
                        }
                        for status, answer in sorted(op["responses"].items())
                    ],
                }
            )
    return out


@require_GET
@viewer_required
def api_docs(request):
    """The API reference page (module doc); 400 naming any query parameter (it takes none)."""
    try:
        check_parameters(request.GET)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    document = build_document()
    schemas = [
        {
            "name": name,
            "description": schema.get("description", ""),
            "type": type_segments(schema) if "properties" not in schema else [],
            "open": schema.get("additionalProperties", True) is not False,
            "rows": _property_rows(schema),
        }
        for name, schema in sorted(document["components"]["schemas"].items())
    ]
    return render(
        request,
        "api/docs.html",
        {"info": document["info"], "operations": _operations(document), "schemas": schemas, "nav": "api"},
    )
