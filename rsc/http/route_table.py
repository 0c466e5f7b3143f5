"""The OpenAPI document's route table: every route with its request and response types, and the
response types only the document names (`rsc.http.openapi` renders it; a test checks it matches
the app's URL map)."""

from __future__ import annotations

from typing import Any

import attrs

from rsc.events.group_position import ResetPlan
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
