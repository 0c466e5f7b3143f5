"""The OpenAPI 3 document, with schemas derived from the attrs types the server uses.

`ROUTES` lists every route with its request and response types; a test
checks that it matches the app's URL map and that real responses validate
against the schemas.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Mapping, Set
from typing import Any

import attrs
from quart import Response
from quart_trio import QuartTrio

from rsc import __version__
from rsc.events.codec import camel
from rsc.events.model import NAME_PATTERN
from rsc.http.admin.bodies import (
    STRICT_BODIES,
)
from rsc.http.authenticate import PUBLIC_PATHS
from rsc.http.pages import add_page_routes
from rsc.http.route_table import (  # noqa: F401  (re-exported: the document's types)
    CURSOR_SCHEMA,
    PAGE_QUERY,
    PENDING_LIMIT,
    ROUTES,
    AuditList,
    ErrorBody,
    GroupResource,
    GroupStatus,
    HeartbeatBatchRequest,
    HeartbeatBatchResponse,
    Route,
    Status,
    StreamList,
    StreamResource,
)


def schema_of(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of `tp` as the wire converter renders it; attrs classes go to `components`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = (
            schema_of(options[0], components)
            if len(options) == 1
            else {"anyOf": [schema_of(a, components) for a in options]}
        )
        return {"anyOf": [inner, {"type": "null"}]} if type(None) in args else inner
    if origin is typing.Literal:
        return {"type": "string", "enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is str:
        return {"type": "string"}
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return {"type": "object", "additionalProperties": schema_of(args[1], components)}
    if origin is tuple or (isinstance(origin, type) and issubclass(origin, Set)):
        return {"type": "array", "items": schema_of(args[0], components)}
    if attrs.has(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # placeholder against recursion
            hints = typing.get_type_hints(tp)
            fields = attrs.fields(tp)
            components[name] = {
                "type": "object",
                "properties": {camel(f.name): _field_schema(f, hints[f.name], components) for f in fields},
                "required": [camel(f.name) for f in fields if f.default is attrs.NOTHING],
            }
            if tp in STRICT_BODIES:
                components[name]["additionalProperties"] = False
        return {"$ref": f"#/components/schemas/{name}"}
    raise TypeError(f"no schema for {tp!r}")


def _field_schema(field: Any, tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The schema of one attrs field: its type's, with the field's `wire_field` constraints."""
    schema = schema_of(tp, components)
    for key, value in field.metadata.get("json_schema", {}).items():
        if key == "items":
            schema[key] = {**schema[key], **value}
        else:
            schema[key] = whole_value(value) if key == "pattern" else value
    return schema


def whole_value(pattern: str) -> str:
    """`pattern` anchored at the very end in every regex dialect.

    The server matches the whole value (`re.fullmatch`); in a JSON Schema (ECMAScript)
    `$` already means the end, but generators that read it as Python's `$` also
    allow a trailing newline. `(?![\\s\\S])` (nothing follows) means the same everywhere.
    """
    return pattern + r"(?![\s\S])" if pattern.endswith("$") else pattern


def _parameters(route: Route) -> list[dict[str, Any]]:
    names = [p.strip("{}") for p in route.path.split("/") if p.startswith("{")]
    params = [
        {
            "name": p,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": whole_value(NAME_PATTERN)},
        }
        for p in names
    ]
    return params + [{"in": "query", **q} for q in route.query]


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of every route."""
    components: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for route in ROUTES:
        operation: dict[str, Any] = {"summary": route.summary, "responses": {}}
        params = _parameters(route)
        if params:
            operation["parameters"] = params
        if route.request is not None:
            operation["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": schema_of(route.request, components)}},
            }
        ok: dict[str, Any] = {"description": "No content" if route.status == "204" else "OK"}
        if route.response is not None:
            ok["content"] = {route.content_type: {"schema": schema_of(route.response, components)}}
        elif route.content_type in ("text/plain", "text/html"):
            ok["content"] = {route.content_type: {"schema": {"type": "string"}}}
        operation["responses"][route.status] = ok
        error = {"content": {"application/json": {"schema": schema_of(ErrorBody, components)}}}
        operation["responses"]["4XX"] = {"description": "Refused (see `error`)", **error}
        operation["responses"]["503"] = {
            "description": "Redis unavailable, or this coordinator is a standby (`STANDBY`); retry",
            **error,
        }
        if route.admin:
            operation["security"] = [{"basic": []}]
        elif route.path not in PUBLIC_PATHS:
            # Bearer credentials (members, producers, monitors); the admin's Basic for views;
            # anonymous where the server's configuration allows it (docs/operations.md, Security).
            schemes: list[dict[str, list[str]]] = [{"bearer": []}]
            if route.method == "get":
                schemes.append({"basic": []})
            operation["security"] = [*schemes, {}]
        paths.setdefault(route.path, {})[route.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "rsc coordinator", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }


def add_openapi_route(app: QuartTrio) -> None:
    """Serve the document at `/openapi.json`."""
    text = json.dumps(document(), separators=(",", ":"))
    add_page_routes(app, document)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(text, content_type="application/json")
