"""The Admin API: declarative stream and group specs behind Basic Auth, audited.

Resources are idempotent: `PUT` the desired spec, `GET` spec + status with
an `ETag` (the aggregate's journal revision), `If-Match` honoured (412 on a
mismatch). Every request under `/v1/admin/` is audited, whatever happens.
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from rsc import __version__
from rsc.actors.errors import ActorStopped, StoreError
from rsc.actors.features import FeatureLevelMoved
from rsc.actors.registry import Registry
from rsc.events import codec, quotas
from rsc.events.commands import ConfigureGroup, PauseProducers, RemoveMember, ResumeProducers
from rsc.events.errors import AggregateNotFound, CoordinationError, QuotaExceeded, UnknownGroup, UnknownStream
from rsc.events.model import (
    MAX_STATIC_HOLD_MS,
    STREAM_ID_PATTERN,
    TEXT_PATTERN,
    GroupConfig,
    ReshardMode,
    Shard,
    ShardState,
    StartFrom,
    wire_field,
)
from rsc.events.quotas import Quota
from rsc.events.stream import MAX_CONCURRENCY, MAX_REASON, MAX_SHARDS, target_count
from rsc.events.versions import MAX_FEATURE_LEVEL, MIGRATION_LEVEL, SEAL_LEVEL, STATIC_LEVEL, Party, blockers
from rsc.events.wire import dead_letter_key
from rsc.http.app import json_body, json_response, structure
from rsc.http.audit import AuditFilter, AuditLog, AuditRecord
from rsc.http.authenticate import AdminAccount, Gate, basic_credentials
from rsc.http.errors import ApiError
from rsc.http.throttle import Blocked
from rsc.http.views import stream_view

log = logging.getLogger("rsc.admin")
T = TypeVar("T")
OUTCOMES = ("ok", "denied", "rejected", "error", "throttled")
__all__ = ["AdminAccount", "add_admin_routes"]


@attrs.frozen
class StreamSpec:
    #: 0: no writable shard (a scale-in to nothing, or a stream to scale out later).
    shard_count: int = wire_field(minimum=0, maximum=MAX_SHARDS)
    reshard_mode: ReshardMode = ReshardMode.ONLINE


@attrs.frozen
class PauseRequest:
    """Optional body of `POST .../pause`: why producers are paused (shown in the stream view)."""

    reason: str = wire_field("admin", minLength=1, maxLength=MAX_REASON, pattern=TEXT_PATTERN)


@attrs.frozen
class EmptyRequest:
    """The optional body of `resume` and `migration/resume`: nothing (`{}`), and nothing else."""


@attrs.frozen
class AbortRequest:
    """Optional body of `POST .../migration/abort`: why (kept in the migration's outcome)."""

    reason: str = wire_field(
        "aborted by an operator", minLength=1, maxLength=MAX_REASON, pattern=TEXT_PATTERN
    )


@attrs.frozen
class StreamPatch:
    """Body of `PATCH /v1/admin/streams/{p}` (RFC 7396): the fields to change; null: default."""

    shard_count: int | None = wire_field(None, minimum=0, maximum=MAX_SHARDS, nullable=True)
    reshard_mode: ReshardMode | None = None


@attrs.frozen
class GroupPatch:
    """Body of `PATCH .../groups/{g}` (RFC 7396): the fields to change; null: default."""

    max_concurrency: int | None = wire_field(None, minimum=1, maximum=MAX_CONCURRENCY, nullable=True)
    start_from: StartFrom | None = None
    static_hold_ms: int | None = wire_field(None, minimum=0, maximum=MAX_STATIC_HOLD_MS, nullable=True)


@attrs.frozen
class ReplayRequest:
    """Body of `POST .../dlq/replay`: which dead letters go back (all shards' oldest by default)."""

    shard: int | None = wire_field(None, minimum=0, maximum=MAX_SHARDS, nullable=True)
    ids: tuple[str, ...] = wire_field((), maxItems=1_000, items={"pattern": STREAM_ID_PATTERN})
    limit: int = wire_field(100, minimum=1, maximum=1_000)


@attrs.frozen
class DeadLetterShard:
    shard: int
    key: str
    length: int


@attrs.frozen
class DeadLetters:
    """`GET .../dlq`: each readable or retired shard's dead-letter stream and its length."""

    stream_prefix: str
    shards: tuple[DeadLetterShard, ...]
    total: int


@attrs.frozen
class DeadLetter:
    shard: int
    id: str
    original_id: str
    deliveries: int
    fields: dict[str, str]


@attrs.frozen
class DeadLetterEntries:
    stream_prefix: str
    entries: tuple[DeadLetter, ...]


@attrs.frozen
class Replayed:
    """`POST .../dlq/replay`: how many went back, and per entry its shard, its dead-letter id
    and its new id on the shard."""

    replayed: int
    entries: tuple[tuple[int, str, str], ...]
    skipped_shards: tuple[int, ...] = ()


@attrs.frozen
class FeatureChange:
    """Body of `PUT /v1/admin/features`: the feature level to finalize."""

    level: int = wire_field(enforce=False, minimum=1, maximum=MAX_FEATURE_LEVEL)


@attrs.frozen
class FeaturesStatus:
    """`GET`/`PUT /v1/admin/features`: the finalized level, the highest written (the floor for
    lowering), what this coordinator supports, and every coordinator, live member and live
    producer with the highest level it supports."""

    level: int
    written: int
    supported: tuple[int, int]
    parties: tuple[Party, ...]
    #: The parties that keep the level from being raised to `supported[1]` now.
    blocking_highest: tuple[Party, ...]
    previous: int | None = None


@attrs.frozen
class GroupSpec:
    max_concurrency: int = wire_field(1, minimum=1, maximum=MAX_CONCURRENCY)
    start_from: StartFrom = StartFrom.EARLIEST
    #: How long a static member's shards wait for it after it stopped (null: one member lease).
    #: Feature level 4; left out while null.
    static_hold_ms: int | None = wire_field(
        None, minimum=0, maximum=MAX_STATIC_HOLD_MS, nullable=True, omit_if_default=True
    )


def spec_of(config: GroupConfig) -> GroupSpec:
    """The Admin API's spec of a group's config."""
    return GroupSpec(config.max_concurrency, config.start_from, config.static_hold_ms)


#: Admin request bodies: a field they do not have is refused (`strict`), so their schemas
#: say `additionalProperties: false`.
STRICT_BODIES: frozenset[type] = frozenset(
    {StreamSpec, StreamPatch, GroupSpec, GroupPatch, PauseRequest, AbortRequest, ReplayRequest, FeatureChange}
)

#: The query parameters of `GET /v1/admin/audit`.
AUDIT_FILTERS = frozenset({"caller", "method", "status", "pathPrefix", "outcome", "limit", "requestId"})


def add_admin_routes(
    app: QuartTrio,
    registry: Registry,
    account: AdminAccount,
    audit: AuditLog,
    coordinators: Callable[[], Awaitable[list[Party]]] | None = None,
) -> None:
    """Register `/v1/admin/...` on `app` (made by `create_app`): logins go through the app's
    gate, whose throttle also counts wrong admin credentials sent to other paths.
    `coordinators` lists the running coordinators (for feature level changes)."""
    gate: Gate = app.extensions["rsc.gate"]
    throttle = gate.throttle

    @app.before_request
    async def authenticate() -> None:
        if not request.path.startswith("/v1/admin/"):
            return
        g.caller = None
        g.revision = None
        gate.refuse_if_throttled()
        header = request.headers.get("Authorization", "")
        g.caller = caller_name(basic_credentials(header)[0], account)
        if not account.enabled:
            raise ApiError(403, "ADMIN_DISABLED", "no admin password is configured (RSC_ADMIN_PASSWORD)")
        # Every refusal counts, with credentials or without: each is an audit record, so an
        # address gets a few individually and then one aggregated record per window.
        if gate.admin_login(header, count_missing=True) is None:
            if basic_credentials(header)[0] is None:
                raise ApiError(401, "UNAUTHENTICATED", "no credentials: admin endpoints need HTTP Basic auth")
            # The same words for an unknown user and a wrong password: no user names leak.
            raise ApiError(401, "UNAUTHENTICATED", "wrong user name or password")

    @app.after_request
    async def record(response: Response) -> Response:
        if request.path.startswith("/v1/admin/"):
            if response.status_code == 401:
                response.headers["WWW-Authenticate"] = admin_challenge()
            if response.status_code == 429 and getattr(g, "error_code", None) != "QUOTA_EXCEEDED":
                return response  # throttled logins: counted, and audited once per address and window
            await _audit(audit, response)
        return response

    async def flush_throttled() -> None:
        for blocked in throttle.expired(trio.current_time()):
            await _audit_blocked(audit, blocked)

    async def flush_forever() -> None:
        while True:
            await trio.sleep(min(throttle.window_s, 5.0))
            await flush_throttled()

    @app.before_serving
    async def start_flushing() -> None:
        app.add_background_task(flush_forever)

    @app.after_serving
    async def last_flush() -> None:
        for blocked in throttle.expired(float("inf")):
            await _audit_blocked(audit, blocked)

    _add_stream_routes(app, registry)
    _add_group_routes(app, registry)
    _add_pause_routes(app, registry)
    _add_migration_routes(app, registry)
    _add_dead_letter_routes(app, registry)
    _add_feature_routes(app, registry, coordinators or _no_coordinators)

    @app.get("/v1/admin/audit")
    async def read_audit() -> Response:
        args = request.args
        unknown = sorted(set(args) - AUDIT_FILTERS)
        if unknown:  # a misspelt filter would silently return everything
            raise ApiError(
                400,
                "INVALID_REQUEST",
                f"unknown query parameter(s) {', '.join(map(repr, unknown))}; "
                f"the filters are {', '.join(sorted(AUDIT_FILTERS))}",
            )
        if args.get("outcome", "ok") not in OUTCOMES:
            raise ApiError(400, "INVALID_REQUEST", f"outcome must be one of {', '.join(OUTCOMES)}")
        for name in AUDIT_FILTERS:
            _one_value(name)
        wanted = AuditFilter(
            caller=args.get("caller"),
            method=args.get("method"),
            status=_int_query("status", None, 100, 599),
            path_prefix=args.get("pathPrefix"),
            outcome=args.get("outcome"),
            request_id=args.get("requestId"),
            limit=_int_query("limit", 100, 1, 1_000) or 100,
        )
        return json_response({"records": await audit.read(wanted)})


def _add_stream_routes(app: QuartTrio, registry: Registry) -> None:
    """`PUT` (the whole spec), `PATCH` (a merge patch), `GET` and `DELETE` of a stream."""
    quota: Quota = app.extensions["rsc.admin_quota"]  # the admin's: the deployment's own

    @app.get("/v1/admin/streams/<stream_prefix>")
    async def get_stream(stream_prefix: str) -> Response:
        return await _stream_resource(registry, stream_prefix)

    @app.put("/v1/admin/streams/<stream_prefix>")
    async def put_stream(stream_prefix: str) -> Response:
        spec = strict(await json_body(), StreamSpec)
        await _apply_stream(registry, stream_prefix, spec, quota)
        return await _stream_resource(registry, stream_prefix)

    @app.patch("/v1/admin/streams/<stream_prefix>")
    async def patch_stream(stream_prefix: str) -> Response:
        patch = _merge_patch_body(await json_body(), StreamPatch)
        if patch.get("shardCount", 0) is None:
            del patch["shardCount"]  # it has no default: null leaves it as it is
        current = await _existing_stream(registry, stream_prefix)
        if current is None and "shardCount" not in patch:
            raise ApiError(
                404,
                "UNKNOWN_STREAM",
                f"no stream {stream_prefix!r}: create it with a shardCount (PUT or PATCH)",
            )
        spec_now = codec.wire.unstructure(_stream_spec(current.state)) if current is not None else {}
        spec = strict(merge_patch(spec_now, patch), StreamSpec)
        await _apply_stream(registry, stream_prefix, spec, quota)
        return await _stream_resource(registry, stream_prefix)

    @app.delete("/v1/admin/streams/<stream_prefix>")
    async def delete_stream(stream_prefix: str) -> Response:
        actor = await _conditional_stream(registry, stream_prefix)
        expect = _check_if_match(actor.revision)
        await registry.delete_stream(stream_prefix, expect)
        g.revision = actor.revision
        return Response(b"", status=204)


async def _apply_stream(registry: Registry, stream_prefix: str, spec: StreamSpec, quota: Quota) -> None:
    """Bring the stream to `spec`: create it, or reshard it and store its mode. A missing
    stream with `If-Match` is 412 and nothing is created; otherwise the revision `If-Match`
    names is checked atomically with the change (`PreconditionFailed`). The deployment's
    quotas hold for the admin too (`QuotaExceeded`: 429, audited as refused)."""
    level = (await registry.store.features.current()).level
    if spec.reshard_mode is ReshardMode.QUIESCE and level < MIGRATION_LEVEL:
        raise _level_required(
            f"reshardMode quiesce runs a journaled migration, which needs feature level {MIGRATION_LEVEL}",
            MIGRATION_LEVEL,
            level,
        )
    actor = await _existing_stream(registry, stream_prefix)
    limit = quota.limits.shards_per_stream
    # (A stream already above a lowered quota may still change its mode, or shrink.)
    if spec.shard_count > limit and (actor is None or spec.shard_count > target_count(actor.state)):
        raise QuotaExceeded(
            f"shardCount {spec.shard_count} is above the quota {quotas.SHARDS_PER_STREAM} ({limit})",
            quotas.SHARDS_PER_STREAM,
            limit,
        )
    only_new = _check_if_none_match(actor, f"stream {stream_prefix!r}")
    if actor is None:
        _missing_with_if_match(f"stream {stream_prefix!r}")
        actor = await _stream_actor(registry, stream_prefix, spec.shard_count, only_new, quota)
        expect = None
    else:
        expect = _check_if_match(actor.revision)
    state = actor.state
    if spec.shard_count < state.shard_count and level < SEAL_LEVEL:
        raise _level_required(
            f"scale-in seals the shards it drains, which needs feature level {SEAL_LEVEL} "
            "(every producer checks seals)",
            SEAL_LEVEL,
            level,
        )
    migrations = level >= MIGRATION_LEVEL
    changes_mode = migrations and spec.reshard_mode is not state.reshard_mode
    if spec.shard_count != target_count(state) or changes_mode:
        await registry.change_shard_count(
            stream_prefix, spec.shard_count, spec.reshard_mode, migrations, expect=expect
        )


def _missing_with_if_match(what: str) -> None:
    """A resource that does not exist fails any `If-Match` (RFC 9110 13.1.1): 412, not 404."""
    if _precondition("If-Match") is not None:
        raise ApiError(412, "PRECONDITION_FAILED", f"there is no {what} (If-Match)")


async def _conditional_stream(registry: Registry, stream_prefix: str) -> Any:
    """The stream's actor for a change of an existing stream: 404 if there is none, or 412
    if the request has an `If-Match`; nothing is created."""
    actor = await _existing_stream(registry, stream_prefix)
    if actor is None:
        _missing_with_if_match(f"stream {stream_prefix!r}")
        raise ApiError(404, "UNKNOWN_STREAM", f"stream {stream_prefix!r} does not exist")
    return actor


async def _existing_stream(registry: Registry, stream_prefix: str) -> Any:
    """The stream's actor, or None if there is no such stream (nothing is created)."""
    try:
        return await registry.stream(stream_prefix, create=False)
    except UnknownStream:
        return None


def _stream_spec(state: Any) -> StreamSpec:
    return StreamSpec(target_count(state), state.reshard_mode)


def _add_group_routes(app: QuartTrio, registry: Registry) -> None:
    """`PUT` (the whole spec), `PATCH` (a merge patch), `GET` and `DELETE` of a group."""
    quota: Quota = app.extensions["rsc.admin_quota"]  # the admin's: the deployment's own

    @app.get("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>")
    async def get_group(stream_prefix: str, consumer_group: str) -> Response:
        return await _group_resource(registry, stream_prefix, consumer_group, create=None)

    @app.put("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>")
    async def put_group(stream_prefix: str, consumer_group: str) -> Response:
        spec = strict(await json_body(), GroupSpec)
        config = await _apply_group(registry, stream_prefix, consumer_group, spec, quota)
        return await _group_resource(registry, stream_prefix, consumer_group, create=config)

    @app.patch("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>")
    async def patch_group(stream_prefix: str, consumer_group: str) -> Response:
        patch = _merge_patch_body(await json_body(), GroupPatch)
        actor = await _existing_group(registry, stream_prefix, consumer_group)
        now = codec.wire.unstructure(spec_of(actor.state.config)) if actor is not None else {}
        spec = strict(merge_patch(now, patch), GroupSpec)
        config = await _apply_group(registry, stream_prefix, consumer_group, spec, quota)
        return await _group_resource(registry, stream_prefix, consumer_group, create=config)

    @app.delete("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>")
    async def delete_group(stream_prefix: str, consumer_group: str) -> Response:
        stream = await _conditional_stream(registry, stream_prefix)
        if consumer_group not in stream.state.groups:
            _missing_with_if_match(f"group {consumer_group!r} of {stream_prefix!r}")
            raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
        actor = await _existing_group(registry, stream_prefix, consumer_group)  # never creates
        if actor is None:
            # Deleted, and still listed by the stream: a delete that stopped between its two
            # writes. Finishing it is this DELETE's work (nothing to compare `If-Match` with).
            _missing_with_if_match(f"group {consumer_group!r} of {stream_prefix!r}")
            await registry.delete_group(stream_prefix, consumer_group)
            return Response(b"", status=204)
        expect = _check_if_match(actor.revision)
        await registry.delete_group(stream_prefix, consumer_group, expect)
        g.revision = actor.revision
        return Response(b"", status=204)

    @app.delete("/v1/admin/streams/<stream_prefix>/groups/<consumer_group>/members/<path:member_id>")
    async def remove_member(stream_prefix: str, consumer_group: str, member_id: str) -> Response:
        """Remove a member by hand: a live one is fenced (`REMOVED`; its shards move once its
        lease can have ended), a static member's hold ends (its shards move now)."""
        actor = await _existing_group(registry, stream_prefix, consumer_group)
        if actor is None:
            raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
        expect = _check_if_match(actor.revision)
        command = RemoveMember(member_id, registry.clock.now_ms())
        try:
            await registry.ask_group(stream_prefix, consumer_group, command, create=False, expect=expect)
        except (UnknownGroup, UnknownStream):
            raise
        except AggregateNotFound as exc:
            raise ApiError(404, "UNKNOWN_MEMBER", f"{exc} (nor one whose shards are held for it)") from exc
        g.revision = actor.revision  # the group's, after the removal (audited)
        return Response(b"", status=204)


async def _apply_group(
    registry: Registry, stream_prefix: str, group: str, spec: GroupSpec, quota: Quota
) -> GroupConfig:
    """Create the group with `spec`, or change it (`startFrom` only when creating: 409
    `IMMUTABLE_FIELD`); `If-Match` as for streams."""
    config = GroupConfig(spec.max_concurrency, spec.start_from, spec.static_hold_ms)
    if spec.static_hold_ms is not None:
        level = (await registry.store.features.current()).level
        if level < STATIC_LEVEL:
            raise _level_required(
                f"staticHoldMs applies to static members, which need feature level {STATIC_LEVEL}",
                STATIC_LEVEL,
                level,
            )
    actor = await _existing_group(registry, stream_prefix, group)
    only_new = _check_if_none_match(actor, f"group {group!r} of {stream_prefix!r}")
    if actor is None:
        _missing_with_if_match(f"group {group!r} of {stream_prefix!r}")
        # A group reads a stream that exists: a misspelt stream name is a 404, not a new stream.
        await _stream_actor(registry, stream_prefix, None)
        # A member's join may create the group first (with the default config): then
        # this is a change of the group it made, checked and applied below.
        actor = await registry.group(stream_prefix, group, config=config, only_new=only_new, quota=quota)
        expect = None
    else:
        expect = _check_if_match(actor.revision)
    stored = actor.state.config
    if stored.start_from is not config.start_from:
        raise ApiError(
            409,
            "IMMUTABLE_FIELD",
            f"startFrom is {stored.start_from.value!r}: it applies when a group is created and cannot "
            "change (delete the group and create it again to start elsewhere)",
            {"field": "startFrom", "stored": stored.start_from.value},
        )
    # Never creates: a group deleted meanwhile is not brought back with the default config.
    configure = ConfigureGroup(config, registry.clock.now_ms())
    await registry.ask_group(stream_prefix, group, configure, create=False, expect=expect)
    return config


async def _existing_group(registry: Registry, stream_prefix: str, group: str) -> Any:
    """The group's actor, or None if there is no such group (nothing is created)."""
    try:
        return await registry.group(stream_prefix, group, create=False)
    except (UnknownGroup, UnknownStream):
        return None


def strict(data: Any, as_type: type[T]) -> T:
    """`data` as `as_type`, refusing fields it does not have (400, naming each, with the
    closest known name), so a typo never silently resets a field to its default."""
    if not isinstance(data, dict):
        raise ApiError(400, "INVALID_REQUEST", "the body must be a JSON object")
    known = [codec.camel(a.name) for a in attrs.fields(as_type)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            close = close or [k for k in known if k.lower() == name.lower()]
            hints.append(repr(name) + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"unknown field(s) {', '.join(hints)}; the fields are {', '.join(known)}",
            {"unknown": unknown, "fields": known},
        )
    return structure(data, as_type)


def _merge_patch_body(data: Any, as_type: type[Any]) -> dict[str, Any]:
    """A JSON Merge Patch (RFC 7396) of a flat spec: an object of known fields."""
    if not isinstance(data, dict):
        raise ApiError(400, "INVALID_REQUEST", "a merge patch of a spec must be a JSON object")
    strict_keys(data, as_type)
    return data


def strict_keys(data: dict[str, Any], as_type: type[Any]) -> None:
    """The unknown-field check of `strict` alone (values may still be null: a merge patch)."""
    known = {codec.camel(a.name) for a in attrs.fields(as_type)}
    if set(data) - known:
        strict({k: v for k, v in data.items() if k not in known} | {}, as_type)


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7396 on a flat object: each field given replaces the target's, null removes it
    (so the spec's default applies)."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _add_pause_routes(app: QuartTrio, registry: Registry) -> None:
    """Producer quiescence by hand: producers see `paused`, flush, and acknowledge `quiesced`."""

    @app.post("/v1/admin/streams/<stream_prefix>/pause")
    async def pause(stream_prefix: str) -> Response:
        body = await _optional_body(PauseRequest)
        actor = await _conditional_stream(registry, stream_prefix)
        expect = _check_if_match(actor.revision)
        command = PauseProducers(body.reason, registry.clock.now_ms())
        await registry.ask_stream(stream_prefix, command, expect=expect)
        return await _stream_resource(registry, stream_prefix)

    @app.post("/v1/admin/streams/<stream_prefix>/resume")
    async def resume(stream_prefix: str) -> Response:
        await _optional_body(EmptyRequest)
        actor = await _conditional_stream(registry, stream_prefix)
        expect = _check_if_match(actor.revision)
        await registry.ask_stream(stream_prefix, ResumeProducers(registry.clock.now_ms()), expect=expect)
        return await _stream_resource(registry, stream_prefix)


def _add_migration_routes(app: QuartTrio, registry: Registry) -> None:
    """Resume a stalled migration, or abort one that has not changed the layout yet."""

    @app.post("/v1/admin/streams/<stream_prefix>/migration/resume")
    async def resume_migration(stream_prefix: str) -> Response:
        await _optional_body(EmptyRequest)
        actor = await _conditional_stream(registry, stream_prefix)
        expect = _check_if_match(actor.revision)
        await registry.resume_migration(stream_prefix, expect)
        return await _stream_resource(registry, stream_prefix)

    @app.post("/v1/admin/streams/<stream_prefix>/migration/abort")
    async def abort_migration(stream_prefix: str) -> Response:
        body = await _optional_body(AbortRequest)
        actor = await _conditional_stream(registry, stream_prefix)
        expect = _check_if_match(actor.revision)
        await registry.abort_migration(stream_prefix, body.reason, expect)
        return await _stream_resource(registry, stream_prefix)


def _add_dead_letter_routes(app: QuartTrio, registry: Registry) -> None:
    """The dead-letter streams of a stream's shards: count, read, replay."""

    @app.get("/v1/admin/streams/<stream_prefix>/dlq")
    async def dead_letters(stream_prefix: str) -> Response:
        shards = await _dead_letter_shards(registry, stream_prefix)
        counts = await registry.effects.dead_letter_counts(s.key for s in shards)
        listed = tuple(DeadLetterShard(s.index, dead_letter_key(s.key), counts.get(s.key, 0)) for s in shards)
        return json_response(DeadLetters(stream_prefix, listed, sum(d.length for d in listed)))

    @app.get("/v1/admin/streams/<stream_prefix>/dlq/entries")
    async def dead_letter_entries(stream_prefix: str) -> Response:
        args = request.args
        unknown = sorted(set(args) - {"shard", "limit"})
        if unknown:
            raise ApiError(
                400, "INVALID_REQUEST", f"unknown query parameter(s) {unknown}; known: shard, limit"
            )
        wanted = _int_query("shard", None, 0, MAX_SHARDS)
        limit = _int_query("limit", 100, 1, 1_000) or 100
        entries: list[DeadLetter] = []
        for shard in await _dead_letter_shards(registry, stream_prefix, wanted):
            for entry_id, fields in await registry.effects.dead_letters(shard.key, limit - len(entries)):
                original = fields.pop("rscSourceId", "")
                deliveries = int(fields.pop("rscDeliveries", "0") or 0)
                entries.append(DeadLetter(shard.index, entry_id, original, deliveries, fields))
            if len(entries) >= limit:
                break
        return json_response(DeadLetterEntries(stream_prefix, tuple(entries)))

    @app.post("/v1/admin/streams/<stream_prefix>/dlq/replay")
    async def replay(stream_prefix: str) -> Response:
        body = await _optional_body(ReplayRequest)
        replayed: list[tuple[int, str, str]] = []
        shards = await _dead_letter_shards(registry, stream_prefix, body.shard)
        for shard in shards:
            left = body.limit - len(replayed)
            if shard.state is not ShardState.ACTIVE or left <= 0:
                continue  # no new entries go to a shard that drains or retired
            done = await registry.effects.replay_dead_letters(shard.key, body.ids, left)
            replayed.extend((shard.index, old, new) for old, new in done)
        others = [s for s in shards if s.state is not ShardState.ACTIVE]
        counts = await registry.effects.dead_letter_counts(s.key for s in others)
        skipped = tuple(s.index for s in others if counts.get(s.key))
        return json_response(Replayed(len(replayed), tuple(replayed), skipped))


async def _dead_letter_shards(registry: Registry, stream_prefix: str, only: int | None = None) -> list[Shard]:
    actor = await _stream_actor(registry, stream_prefix, None)
    shards = [s for s in actor.state.layout.shards if only is None or s.index == only]
    if only is not None and not shards:
        raise ApiError(404, "NOT_FOUND", f"stream {stream_prefix!r} has no shard {only}")
    return shards


def _level_required(why: str, required: int, level: int) -> ApiError:
    return ApiError(
        409,
        "FEATURE_LEVEL_REQUIRED",
        f"{why}; the deployment is at {level} (PUT /v1/admin/features)",
        {"required": required, "finalized": level},
    )


async def _optional_body(as_type: type[T]) -> T:
    """The JSON body as `as_type`, or its defaults when the body is empty."""
    data = await request.get_data(as_text=False)
    return strict(await json_body(), as_type) if data.strip() else as_type()


async def _stream_actor(
    registry: Registry,
    stream_prefix: str,
    shard_count: int | None,
    only_new: bool = False,
    quota: Quota | None = None,
) -> Any:
    try:
        return await registry.stream(
            stream_prefix,
            create=shard_count is not None,
            shard_count=shard_count,
            only_new=only_new,
            quota=quota,
        )
    except UnknownStream as exc:
        raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc


async def _stream_resource(registry: Registry, stream_prefix: str) -> Response:
    actor = await _stream_actor(registry, stream_prefix, None)
    state = actor.state
    g.revision = actor.revision
    body = {
        "spec": _stream_spec(state),
        "status": stream_view(state, actor.leases, registry.clock.now_ms()),
        "revision": actor.revision,
    }
    return _with_etag(json_response(body), actor.revision)


async def _group_resource(
    registry: Registry, stream_prefix: str, consumer_group: str, create: GroupConfig | None
) -> Response:
    stream = await _stream_actor(registry, stream_prefix, None)
    if create is None and consumer_group not in stream.state.groups:
        raise ApiError(404, "UNKNOWN_GROUP", f"no group {consumer_group!r} reads {stream_prefix!r}")
    # Never creates (a read, or the answer to a write that a DELETE may have followed).
    actor = await registry.group(stream_prefix, consumer_group, create=False)
    state = actor.state
    assert state is not None  # registry.group refuses a group that does not exist
    g.revision = actor.revision
    body = {
        "spec": spec_of(state.config),
        "status": {
            "groupEpoch": state.group_epoch,
            "assignmentEpoch": state.assignment_epoch,
            "members": len(state.members),
        },
        "revision": actor.revision,
    }
    return _with_etag(json_response(body), actor.revision)


def _with_etag(response: Response, revision: int) -> Response:
    response.headers["ETag"] = f'"{revision}"'
    return response


def _one_value(name: str) -> str | None:
    """The query parameter `name`, given at most once (400 if repeated: which one was meant?)."""
    values = request.args.getlist(name)
    if len(values) > 1:
        raise ApiError(400, "INVALID_REQUEST", f"query parameter {name!r} is given {len(values)} times")
    return values[0] if values else None


def _int_query(name: str, default: int | None, lowest: int, highest: int) -> int | None:
    """The integer query parameter `name` (`default` when absent), from `lowest` to `highest`."""
    text = _one_value(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,20}", text) or not lowest <= int(text) <= highest:
        raise ApiError(
            400, "INVALID_REQUEST", f"{name} must be an integer from {lowest} to {highest}, not {text[:40]!r}"
        )
    return int(text)


#: An entity tag (RFC 9110 8.8.3): optionally weak, quoted, no quote or control inside.
_ETAG = re.compile(r'(W/)?"([\x21\x23-\x7e]*)"')


def _precondition(name: str) -> tuple[bool, list[tuple[bool, str]]] | None:
    """The `If-Match` / `If-None-Match` header (every line of it, as one list, RFC 9110 5.3):
    None if absent, else (`*`, [(weak, tag), ...]); 400 for anything else, so that a mistyped
    precondition is never silently a write without one."""
    lines = request.headers.getlist(name)
    if not lines:
        return None
    items = [item.strip() for line in lines for item in line.split(",")]
    items = [item for item in items if item]
    if not items:
        raise ApiError(400, "INVALID_REQUEST", f'{name} is empty: give * or entity tags such as "3"')
    if items == ["*"]:
        return True, []
    tags = []
    for item in items:
        found = _ETAG.fullmatch(item)
        if found is None:
            raise ApiError(
                400,
                "INVALID_REQUEST",
                f'{name} must be * or entity tags such as "3" (the ETag of a read), not {item[:40]!r}',
            )
        tags.append((found.group(1) is not None, found.group(2)))
    return False, tags


def _check_if_none_match(actor: Any, what: str) -> bool:
    """`If-None-Match`: `*` refuses (412) a resource that exists, and the create that follows
    is refused too if another one creates it first (True: create only); a list of entity tags
    (weak comparison) refuses a resource at one of them."""
    wanted = _precondition("If-None-Match")
    if wanted is None:
        return False
    every, tags = wanted
    if every:
        if actor is not None:
            raise ApiError(412, "PRECONDITION_FAILED", f"{what} exists (If-None-Match: *)")
        return True
    if actor is not None and str(actor.revision) in {tag for _, tag in tags}:
        raise ApiError(412, "PRECONDITION_FAILED", f"{what} is at revision {actor.revision} (If-None-Match)")
    return False


def _check_if_match(revision: int) -> int | None:
    """Refuse (412) if `If-Match` names other revisions than `revision` (strong comparison: a
    weak tag never matches); the revision the write must still find when the actor decides it
    (checked there again, atomically), or None."""
    wanted = _precondition("If-Match")
    if wanted is None or wanted[0]:
        return None
    strong = {tag for weak, tag in wanted[1] if not weak}
    if str(revision) not in strong:
        shown = ", ".join(("W/" if weak else "") + f'"{tag}"' for weak, tag in wanted[1])
        raise ApiError(412, "PRECONDITION_FAILED", f"the resource is at revision {revision}, not {shown}")
    return revision


def caller_name(user: str | None, account: AdminAccount) -> str | None:
    """What the audit records as the caller: the user if it is the admin account's, else a keyed hash.

    A password typed into the user field must never be stored, nor anything a dictionary
    could be checked against offline: an unknown user name is recorded only as
    `unknown-user:<12 hex of an HMAC-SHA256 keyed by the admin password's hash>`, the same
    for the same name while the password stays, so repeated attempts can be told apart.
    """
    if user is None or user == account.user:
        return user
    key = ("rsc-audit:" + account.secret_digest).encode()
    return "unknown-user:" + hmac.new(key, user.encode(), hashlib.sha256).hexdigest()[:12]


def admin_challenge() -> str:
    """The admin's 401 challenge: HTTP Basic, except for a page's script (`X-Requested-With:
    XMLHttpRequest`, as `/ui` sends), where a Basic challenge would make the browser open its
    own login dialog over the page (and hold the request): the page asks for it itself."""
    if request.headers.get("X-Requested-With") == "XMLHttpRequest":
        return 'RscBasic realm="rsc admin"'
    return 'Basic realm="rsc admin"'


def _outcome(status: int, code: str | None = None) -> str:
    if status < 400:
        return "ok"
    if code == "QUOTA_EXCEEDED":  # refused for what it asked, not for how often
        return "rejected"
    if status == 429:
        return "throttled"
    if status in (401, 403):
        return "denied"
    return "rejected" if status < 500 else "error"


async def _audit(audit: AuditLog, response: Response) -> None:
    try:
        data = await request.get_data(as_text=False)
        body = data if isinstance(data, bytes) else data.encode()
    except Exception:  # the body may be unreadable (too large): fingerprint nothing
        body = b""
    entry = AuditRecord(
        time_ms=audit_now_ms(),
        request_id=getattr(g, "request_id", ""),
        caller=getattr(g, "caller", None),
        remote_address=request.remote_addr,
        method=request.method,
        path=request.path,
        status=response.status_code,
        outcome=_outcome(response.status_code, getattr(g, "error_code", None)),
        body_sha256=hashlib.sha256(body).hexdigest(),
        revision=getattr(g, "revision", None),
    )
    try:
        await audit.record(entry)
    except Exception:
        log.exception("could not write the audit record %s", entry)


async def _audit_blocked(audit: AuditLog, blocked: Blocked) -> None:
    """One record for every admin request an address had refused with 429 in one window."""
    entry = AuditRecord(
        time_ms=audit_now_ms(),
        request_id="",
        caller=None,
        remote_address=blocked.address,
        method="*",
        path="/v1/admin/",
        status=429,
        outcome="throttled",
        body_sha256=hashlib.sha256(b"").hexdigest(),
        count=blocked.blocked,
    )
    try:
        await audit.record(entry)
    except Exception:
        log.exception("could not write the audit record %s", entry)


def audit_now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _no_coordinators() -> list[Party]:
    return []


async def live_parties(registry: Registry) -> list[Party]:
    """Every live member and live producer of every stream, with its client's feature level."""
    parties: list[Party] = []
    for prefix in await registry.stream_prefixes():
        try:
            actor = await registry.stream(prefix, create=False)
        except UnknownStream:
            continue
        state = actor.state
        if state is None:
            continue
        for producer in state.producers.values():
            client = producer.client
            parties.append(
                Party("producer", f"{prefix}/{producer.producer_id}", client.version, client.feature_level)
            )
        for name in sorted(state.groups):
            try:
                group = await registry.group(prefix, name, create=False)
            except (UnknownGroup, UnknownStream):
                continue
            if group.state is None:
                continue
            for member in group.state.members.values():
                client = member.client
                parties.append(
                    Party(
                        "member", f"{prefix}/{name}/{member.member_id}", client.version, client.feature_level
                    )
                )
    return parties


def _add_feature_routes(
    app: QuartTrio, registry: Registry, coordinators: Callable[[], Awaitable[list[Party]]]
) -> None:
    features = registry.store.features

    async def status(previous: int | None = None) -> FeaturesStatus:
        state = await features.load()
        parties = (*await coordinators(), *await live_parties(registry))
        return FeaturesStatus(
            state.level,
            state.written,
            (1, MAX_FEATURE_LEVEL),
            parties,
            blockers(MAX_FEATURE_LEVEL, parties),
            previous,
        )

    @app.get("/v1/admin/features")
    async def get_features() -> Response:
        return json_response(await status())

    @app.put("/v1/admin/features")
    async def put_features() -> Response:
        change = strict(await json_body(), FeatureChange)
        if change.level < 1:
            raise ApiError(400, "INVALID_REQUEST", "level must be at least 1")
        if change.level > MAX_FEATURE_LEVEL:
            raise ApiError(
                400,
                "UNSUPPORTED_FEATURE_LEVEL",
                f"feature level {change.level} is unknown to this coordinator ({__version__}), "
                f"which supports 1 to {MAX_FEATURE_LEVEL}",
                {"supported": [1, MAX_FEATURE_LEVEL]},
            )
        state = await features.load()
        if change.level > state.level:
            waiting = blockers(change.level, [*await coordinators(), *await live_parties(registry)])
            if waiting:
                names = ", ".join(
                    f"{p.kind} {p.name} ({p.version}, up to {p.feature_level})" for p in waiting
                )
                raise ApiError(
                    409,
                    "FEATURE_LEVEL_NOT_SUPPORTED",
                    f"cannot finalize feature level {change.level}: not supported by {names}; "
                    "upgrade (or stop) them first",
                    {"blockers": [codec.wire.unstructure(p) for p in waiting]},
                )
        try:
            final = await features.finalize(change.level, g.caller or "admin", expected=state.level)
        except FeatureLevelMoved as exc:
            raise ApiError(
                409,
                "FEATURE_LEVEL_IN_USE",
                f"cannot finalize feature level {change.level}: {exc}",
                {"level": exc.level, "written": exc.written},
            ) from exc
        try:
            return json_response(await status(previous=state.level))
        except (StoreError, ActorStopped, CoordinationError) as exc:  # done: say so, even so
            log.warning("feature level %d finalized; listing the parties failed: %s", final.level, exc)
            supported = (1, MAX_FEATURE_LEVEL)
            return json_response(FeaturesStatus(final.level, final.written, supported, (), (), state.level))
