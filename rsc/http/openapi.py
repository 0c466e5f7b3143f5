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
from rsc.events.group_position import ResetPlan
from rsc.events.model import NAME_PATTERN
from rsc.events.scaling import Scale
from rsc.events.stream import MAX_SHARDS
from rsc.events.wire import (
    HeartbeatRequest,
    HeartbeatResponse,
    ProducerHeartbeatRequest,
    ProducerHeartbeatResponse,
    omitted_unless_set,
)
from rsc.http import views
from rsc.http.admin.bodies import (
    STRICT_BODIES,
    AbortRequest,
    DeadLetterEntries,
    DeadLetters,
    FeatureChange,
    FeaturesStatus,
    GroupPatch,
    GroupSpec,
    PauseRequest,
    Replayed,
    ReplayRequest,
    ResetRequest,
    StreamPatch,
    StreamSpec,
)
from rsc.http.audit import AuditRecord
from rsc.http.authenticate import PUBLIC_PATHS
from rsc.http.pages import add_page_routes


@attrs.frozen
class ErrorBody:
    error: str
    message: str
    request_id: str
    details: Any = None


@attrs.frozen
class Route:
    method: str
    path: str
    summary: str
    request: Any = None
    response: Any = None
    admin: bool = False
    content_type: str = "application/json"
    body_required: bool = True
    query: tuple[dict[str, Any], ...] = ()
    status: str = "200"


@attrs.frozen
class HeartbeatBatchRequest:
    """Each item is a `HeartbeatRequest`; an item that is not gets an error object in its place."""

    heartbeats: tuple[dict[str, Any], ...]


@attrs.frozen
class HeartbeatBatchResponse:
    responses: tuple[HeartbeatResponse | ErrorBody, ...]


@attrs.frozen
class StreamList:
    streams: tuple[views.StreamSummary, ...]
    #: Only with `limit`: the cursor of the next page, null on the last one.
    next_cursor: str | None = omitted_unless_set()


#: A list's cursor: opaque, base64url without padding.
CURSOR_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}

#: How many of a group's oldest pending entries.
PENDING_LIMIT: dict[str, Any] = {
    "name": "limit",
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
    "description": "at most this many entries (1-1000, default 20)",
}

#: The query of a list in pages (`rsc.http.paging`).
PAGE_QUERY: tuple[dict[str, Any], ...] = (
    {
        "name": "limit",
        "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        "description": "at most this many items (1-1000); without it, the whole list",
    },
    {
        "name": "cursor",
        "schema": CURSOR_SCHEMA,
        "description": "nextCursor of the previous page, as it is (400 INVALID_CURSOR otherwise)",
    },
)


@attrs.frozen
class StreamResource:
    spec: StreamSpec
    status: views.StreamView
    revision: int


@attrs.frozen
class GroupStatus:
    group_epoch: int
    assignment_epoch: int
    members: int
    #: Paused by an operator (feature level 7), why and since when.
    paused: bool = False
    paused_reason: str | None = None
    paused_at_ms: int | None = None


@attrs.frozen
class GroupResource:
    spec: GroupSpec
    status: GroupStatus
    revision: int


@attrs.frozen
class AuditList:
    records: tuple[AuditRecord, ...]
    #: The cursor of the next, older page; null when no older record matches.
    next_cursor: str | None = None


@attrs.frozen
class Status:
    status: str


S = "/v1/streams/{streamPrefix}"
A = "/v1/admin/streams/{streamPrefix}"
ROUTES = (
    Route("post", "/v1/heartbeat", "One member's heartbeat", HeartbeatRequest, HeartbeatResponse),
    Route(
        "post",
        "/v1/heartbeats",
        "The heartbeats of one process's members",
        HeartbeatBatchRequest,
        HeartbeatBatchResponse,
    ),
    Route(
        "post",
        "/v1/producers/heartbeat",
        "A producer registers, acknowledges its layout version, and gets routing metadata",
        ProducerHeartbeatRequest,
        ProducerHeartbeatResponse,
    ),
    Route("get", f"{S}/routing", "Routing metadata for producers", None, views.RoutingView),
    Route(
        "get",
        "/v1/streams",
        "Streams and their groups, sorted by prefix; in pages with `limit` (then `nextCursor` and a "
        '`Link: <...>; rel="next"` header), the whole list without it',
        None,
        StreamList,
        query=PAGE_QUERY,
    ),
    Route("get", S, "A stream's layout and groups", None, views.StreamView),
    Route(
        "get",
        f"{S}/groups/{{consumerGroup}}",
        "A group's epochs, members and assignments; members in pages with `limit` (sorted by id; "
        "the assignments, revokes and holds of the page's members; `nextCursor` and `Link`)",
        None,
        views.GroupView,
        query=PAGE_QUERY,
    ),
    Route(
        "get",
        f"{S}/groups/{{consumerGroup}}/scale",
        "What the group wants, for KEDA's metrics-api scaler: lag (null when Redis cannot tell), "
        "pending, shards, members, desiredMembers (never above shards; idle shards are no work; a "
        "paused group wants no more), desiredReplicas for membersPerReplica",
        None,
        Scale,
        query=(
            {
                "name": "membersPerReplica",
                "schema": {"type": "integer", "minimum": 1, "maximum": 1024},
                "description": "members one worker process runs (a listener's concurrency); default 1",
            },
        ),
    ),
    Route(
        "get",
        f"{S}/groups/{{consumerGroup}}/pending",
        "The group's oldest pending entries: id, member, age, idle time, deliveries (never the "
        "fields: the Admin API's .../pending has them)",
        None,
        views.PendingList,
        query=(PENDING_LIMIT,),
    ),
    Route("get", A, "A stream's spec and status (ETag)", None, StreamResource, admin=True),
    Route(
        "put",
        A,
        "Create a stream, or reshard it (scale out or in, online or in quiesce mode: a migration; "
        "409 MIGRATION_IN_PROGRESS while a quiesce migration has not switched the layout)",
        StreamSpec,
        StreamResource,
        admin=True,
    ),
    Route(
        "patch",
        A,
        "Change only the fields given of a stream's spec (JSON Merge Patch, RFC 7396: null means "
        "the default, and leaves shardCount, which has none, as it is); creates the stream if it "
        "does not exist and shardCount is given (else 404)",
        StreamPatch,
        StreamResource,
        admin=True,
    ),
    Route(
        "get",
        f"{A}/dlq",
        "Each shard's dead-letter stream and how many entries it holds",
        None,
        DeadLetters,
        admin=True,
    ),
    Route(
        "get",
        f"{A}/dlq/entries",
        "Dead-lettered entries, shard by shard, oldest first: original id, deliveries, fields; in "
        "pages (`limit`, default 100; `nextCursor` and a `Link` header)",
        None,
        DeadLetterEntries,
        admin=True,
        query=(
            {"name": "shard", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SHARDS}},
            {
                "name": "limit",
                "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                "description": "1-1000, default 100",
            },
            {
                "name": "cursor",
                "schema": CURSOR_SCHEMA,
                "description": "nextCursor of the previous page as it is (else 400 INVALID_CURSOR)",
            },
        ),
    ),
    Route(
        "post",
        f"{A}/dlq/replay",
        "Append dead letters to their (ACTIVE) shard again and remove them, atomically per shard",
        ReplayRequest,
        Replayed,
        admin=True,
        body_required=False,
    ),
    Route(
        "delete",
        A,
        "Delete a stream and its shard keys (409 NOT_EMPTY while it has groups or live producers)",
        None,
        None,
        admin=True,
        status="204",
    ),
    Route(
        "post",
        f"{A}/pause",
        "Pause the stream's producers (quiescence by hand)",
        PauseRequest,
        StreamResource,
        admin=True,
        body_required=False,
    ),
    Route(
        "post", f"{A}/resume", "Let the stream's producers publish again", None, StreamResource, admin=True
    ),
    Route(
        "post",
        f"{A}/migration/resume",
        "Resume a stalled migration: its phase gets a new bound from now (409 NO_MIGRATION if none "
        "is stalled)",
        None,
        StreamResource,
        admin=True,
    ),
    Route(
        "post",
        f"{A}/migration/abort",
        "Abort a migration that has not changed the layout yet; producers it paused resume "
        "(409 MIGRATION_IN_PROGRESS once it has switched, NO_MIGRATION if none runs)",
        AbortRequest,
        StreamResource,
        admin=True,
        body_required=False,
    ),
    Route(
        "post",
        f"{A}/groups/{{consumerGroup}}/pause",
        "Pause a group (feature level 7): its members keep heartbeating but hold no shard, "
        "nothing is delivered (409 FEATURE_LEVEL_REQUIRED below the level)",
        PauseRequest,
        GroupResource,
        admin=True,
        body_required=False,
    ),
    Route(
        "get",
        f"{A}/groups/{{consumerGroup}}/pending",
        "The group's oldest pending entries with their fields (limit: 1-1000, default 20)",
        None,
        views.PendingList,
        admin=True,
        query=(PENDING_LIMIT,),
    ),
    Route(
        "post",
        f"{A}/groups/{{consumerGroup}}/reset",
        "A reset of the group's position on every ACTIVE shard: the plan (dryRun, the default), "
        "or the reset (feature level 7; 409 NOT_EMPTY while it has members unless force, "
        "MIGRATION_IN_PROGRESS while the stream migrates)",
        ResetRequest,
        ResetPlan,
        admin=True,
    ),
    Route(
        "post",
        f"{A}/groups/{{consumerGroup}}/resume",
        "Resume a paused group: it is assigned again",
        None,
        GroupResource,
        admin=True,
    ),
    Route(
        "get",
        f"{A}/groups/{{consumerGroup}}",
        "A group's spec and status (ETag)",
        None,
        GroupResource,
        admin=True,
    ),
    Route(
        "put",
        f"{A}/groups/{{consumerGroup}}",
        "Create or configure a group",
        GroupSpec,
        GroupResource,
        admin=True,
    ),
    Route(
        "patch",
        f"{A}/groups/{{consumerGroup}}",
        "Change only the fields given of a group's spec (JSON Merge Patch); creates the group if "
        "it does not exist; startFrom cannot change (409 IMMUTABLE_FIELD)",
        GroupPatch,
        GroupResource,
        admin=True,
    ),
    Route(
        "delete",
        f"{A}/groups/{{consumerGroup}}",
        "Delete a group and its Redis consumer groups (409 NOT_EMPTY while it has live members)",
        None,
        None,
        admin=True,
        status="204",
    ),
    Route(
        "delete",
        f"{A}/groups/{{consumerGroup}}/members/{{memberId}}",
        "Remove a member by hand: a live one is fenced (REMOVED; its shards move once its lease can "
        "have ended), a static member's hold ends; 404 UNKNOWN_MEMBER otherwise",
        None,
        None,
        admin=True,
        status="204",
    ),
    Route(
        "get",
        "/v1/admin/audit",
        "Audit records, newest first, in pages (`limit`, default 100; `nextCursor` and a `Link` "
        "header for the next, older page)",
        None,
        AuditList,
        admin=True,
        query=(
            {"name": "caller", "schema": {"type": "string"}},
            {"name": "method", "schema": {"type": "string"}},
            {"name": "status", "schema": {"type": "integer", "minimum": 100, "maximum": 599}},
            {"name": "pathPrefix", "schema": {"type": "string"}},
            {"name": "outcome", "schema": {"type": "string", "enum": ["ok", "denied", "rejected", "error"]}},
            {
                "name": "limit",
                "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                "description": "1-1000, default 100",
            },
            {"name": "requestId", "schema": {"type": "string"}, "description": "the request's X-Request-Id"},
            {
                "name": "cursor",
                "schema": CURSOR_SCHEMA,
                "description": "nextCursor of the previous (newer) page, as it is (else 400 INVALID_CURSOR)",
            },
        ),
    ),
    Route(
        "get",
        "/v1/admin/features",
        "The finalized feature level and what every coordinator, member and producer supports",
        None,
        FeaturesStatus,
        admin=True,
    ),
    Route(
        "put",
        "/v1/admin/features",
        "Finalize a feature level (raise once all support it; lower while nothing above is written)",
        FeatureChange,
        FeaturesStatus,
        admin=True,
    ),
    Route(
        "get",
        "/v1/version",
        "Server version, protocol versions and their lifecycle, feature levels",
        None,
        views.VersionView,
    ),
    Route("get", "/healthz", "Liveness", None, Status),
    Route("get", "/readyz", "Readiness (Redis answers)", None, Status),
    Route("get", "/metrics", "Prometheus metrics", None, None, content_type="text/plain"),
    Route("get", "/", "Redirects to the dashboard (/ui)", None, None, content_type="text/html", status="302"),
    Route(
        "get",
        "/ui",
        "The live dashboard (HTML; polls the views every second)",
        None,
        None,
        content_type="text/html",
    ),
    Route("get", "/docs", "This document in Swagger UI (HTML)", None, None, content_type="text/html"),
    Route(
        "get", "/docs/openapi.json", "This document as Swagger UI reads it (labelled OpenAPI 3.0)", None, None
    ),
    Route(
        "get",
        "/docs/static/{name}",
        "Swagger UI's static files",
        None,
        None,
        content_type="application/octet-stream",
    ),
    Route("get", "/openapi.json", "This document", None, None),
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
