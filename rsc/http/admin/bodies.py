"""The Admin API's wire types, and the parsing of its bodies and query parameters.

Request bodies are strict: a field a body type does not have is refused (400, naming it and
the closest known name), so a typo never silently resets a field to its default. A `PATCH`
is a JSON Merge Patch (RFC 7396) of a flat spec.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, TypeVar

import attrs
from quart import request

from rsc.events import codec
from rsc.events.errors import InvalidCommand
from rsc.events.group_position import ResetTarget, ToIds, ToTime, parse_target
from rsc.events.migration import target_count
from rsc.events.model import (
    MAX_STATIC_HOLD_MS,
    STREAM_ID_PATTERN,
    TEXT_PATTERN,
    GroupConfig,
    ReshardMode,
    StartAt,
    StartFrom,
    wire_field,
)
from rsc.events.retention import MAX_ENTRIES, MAX_RETENTION_MS, Keep, Retention, WhenFull
from rsc.events.stream import MAX_CONCURRENCY, MAX_REASON, MAX_SHARDS, StreamState
from rsc.events.versions import MAX_FEATURE_LEVEL, Party
from rsc.http.errors import ApiError
from rsc.http.json_io import json_body, structure

T = TypeVar("T")


@attrs.frozen
class StreamSpec:
    #: 0: no writable shard (a scale-in to nothing, or a stream to scale out later).
    shard_count: int = wire_field(minimum=0, maximum=MAX_SHARDS)
    reshard_mode: ReshardMode = ReshardMode.ONLINE
    #: What the coordinator trims of the shard keys (feature level 5). Left out of a `PUT`: a
    #: new stream gets the default (at level 5), an existing one keeps its own; left out of
    #: an answer while the stream has none (it keeps everything).
    retention: Retention | None = wire_field(None, nullable=True, omit_if_default=True)


@attrs.frozen
class PauseRequest:
    """Optional body of `POST .../pause`: why producers are paused (shown in the stream view)."""

    reason: str = wire_field("admin", minLength=1, maxLength=MAX_REASON, pattern=TEXT_PATTERN)


@attrs.frozen
class ResetRequest:
    """Body of `POST .../groups/{g}/reset` (feature level 7): where to put the group on every
    ACTIVE shard; `dryRun` (the default) answers the plan and changes nothing; `force` resets a
    group that has members (it is paused meanwhile)."""

    to: ResetTarget
    dry_run: bool = True
    force: bool = False


def reset_request(body: object) -> ResetRequest:
    """A reset's body, checked. Raises `ApiError` 400 (`INVALID_REQUEST`) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "INVALID_REQUEST", "the body must be a JSON object")
    unknown = sorted(set(body) - {"to", "dryRun", "force"})
    if unknown:
        raise ApiError(400, "INVALID_REQUEST", f"unknown field(s) {unknown}: to, dryRun, force")
    if "to" not in body:
        raise ApiError(400, "INVALID_REQUEST", "to is required")
    for flag in ("dryRun", "force"):
        if flag in body and not isinstance(body[flag], bool):
            raise ApiError(400, "INVALID_REQUEST", f"{flag} must be true or false")
    try:
        target = parse_target(body["to"])
    except InvalidCommand as exc:
        raise ApiError(400, "INVALID_REQUEST", str(exc)) from exc
    return ResetRequest(target, bool(body.get("dryRun", True)), bool(body.get("force", False)))


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
class RetentionPatch:
    """A merge patch of a stream's retention policy: the fields to change; null: the default."""

    keep: Keep | None = None
    max_age_ms: int | None = wire_field(None, minimum=1, maximum=MAX_RETENTION_MS, nullable=True)
    max_entries_per_shard: int | None = wire_field(None, minimum=1, maximum=MAX_ENTRIES, nullable=True)
    when_full: WhenFull | None = None
    inactive_group_ms: int | None = wire_field(None, minimum=1, maximum=MAX_RETENTION_MS, nullable=True)
    dead_letter_max_entries: int | None = wire_field(None, minimum=1, maximum=MAX_ENTRIES, nullable=True)


@attrs.frozen
class StreamPatch:
    """Body of `PATCH /v1/admin/streams/{p}` (RFC 7396): the fields to change; null: default."""

    shard_count: int | None = wire_field(None, minimum=0, maximum=MAX_SHARDS, nullable=True)
    reshard_mode: ReshardMode | None = None
    #: A merge patch of the policy (its fields); null: the default policy.
    retention: RetentionPatch | None = wire_field(None, nullable=True)


@attrs.frozen
class GroupPatch:
    """Body of `PATCH .../groups/{g}` (RFC 7396): the fields to change; null: default."""

    max_concurrency: int | None = wire_field(None, minimum=1, maximum=MAX_CONCURRENCY, nullable=True)
    start_from: StartFrom | None = None
    static_hold_ms: int | None = wire_field(None, minimum=0, maximum=MAX_STATIC_HOLD_MS, nullable=True)
    start_at: ToTime | ToIds | None = None


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
    #: The cursor of the next page (shard by shard, oldest first), null on the last one.
    next_cursor: str | None = None


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
    #: Where a new group starts, finer than `startFrom` (feature level 7; at creation only):
    #: `{"timeMs": T}` or `{"ids": {"<shard>": "<id>"}}`. Left out while null.
    start_at: ToTime | ToIds | None = attrs.field(default=None, metadata={"omit_if_default": True})


def spec_of(config: GroupConfig) -> GroupSpec:
    """The Admin API's spec of a group's config."""
    at = config.start_at
    start_at = (
        None if at is None else ToTime(at.time_ms) if at.time_ms is not None else ToIds(dict(at.ids or {}))
    )
    return GroupSpec(config.max_concurrency, config.start_from, config.static_hold_ms, start_at)


def config_of(spec: GroupSpec) -> GroupConfig:
    """The group config a spec asks for."""
    at = spec.start_at
    start_at = None
    if isinstance(at, ToTime):
        start_at = StartAt(time_ms=at.time_ms)
    elif isinstance(at, ToIds):
        start_at = StartAt(ids={str(int(k)): v for k, v in at.ids.items()})
    return GroupConfig(spec.max_concurrency, spec.start_from, spec.static_hold_ms, start_at)


def stream_spec(state: StreamState) -> StreamSpec:
    """The Admin API's spec of a stream: the shard count it is at or on its way to, its mode."""
    return StreamSpec(target_count(state), state.reshard_mode, state.retention)


#: Admin request bodies: a field they do not have is refused (`strict`), so their schemas
#: say `additionalProperties: false`.
STRICT_BODIES: frozenset[type] = frozenset(
    {
        StreamSpec,
        StreamPatch,
        Retention,
        RetentionPatch,
        GroupSpec,
        GroupPatch,
        PauseRequest,
        AbortRequest,
        ReplayRequest,
        FeatureChange,
        ResetRequest,
        ToTime,
        ToIds,
    }
)


def strict(data: Any, as_type: type[T]) -> T:
    """`data` as `as_type`, refusing fields it does not have (400, naming each, with the
    closest known name), so a typo never silently resets a field to its default.

    Raises `ApiError` (400 `INVALID_REQUEST`) for a body that is not an object, has unknown
    fields (at the top, or in an object of the spec such as `retention`) or does not fit
    `as_type`."""
    if not isinstance(data, dict):
        raise ApiError(400, "INVALID_REQUEST", "the body must be a JSON object")
    _refuse_unknown(data, as_type, "")
    for name, inner in NESTED_BODIES.items():
        if isinstance(data.get(name), dict) and name in _field_names(as_type):
            _refuse_unknown(data[name], inner, f"{name}.")
    return structure(data, as_type)


#: Objects inside admin bodies whose fields are checked as strictly as the body's own.
NESTED_BODIES: dict[str, type] = {"retention": Retention}


def _field_names(as_type: type) -> list[str]:
    return [codec.camel(a.name) for a in attrs.fields(as_type)]


def _refuse_unknown(data: dict[str, Any], as_type: type, path: str) -> None:
    known = _field_names(as_type)
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
            f"unknown field(s) {', '.join(path + h for h in hints)}; the fields are {', '.join(known)}",
            {"unknown": [path + u for u in unknown], "fields": known},
        )


def merge_patch_body(data: Any, as_type: type[Any]) -> dict[str, Any]:
    """A JSON Merge Patch (RFC 7396) of a flat spec: an object of known fields.

    Raises `ApiError` (400 `INVALID_REQUEST`) for anything else."""
    if not isinstance(data, dict):
        raise ApiError(400, "INVALID_REQUEST", "a merge patch of a spec must be a JSON object")
    strict_keys(data, as_type)
    return data


def strict_keys(data: dict[str, Any], as_type: type[Any]) -> None:
    """The unknown-field check of `strict` alone (values may still be null: a merge patch).

    Raises `ApiError` (400 `INVALID_REQUEST`) as `strict` does."""
    known = {codec.camel(a.name) for a in attrs.fields(as_type)}
    if set(data) - known:
        strict({k: v for k, v in data.items() if k not in known} | {}, as_type)


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7396: each field given replaces the target's, null removes it (so the spec's
    default applies), and an object is merged into the target's object field by field."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict):
            inner = merged.get(key)
            merged[key] = merge_patch(inner if isinstance(inner, dict) else {}, value)
        else:
            merged[key] = value
    return merged


async def optional_body(as_type: type[T]) -> T:
    """The JSON body as `as_type`, or its defaults when the body is empty.

    Raises `ApiError` (400) as `strict` and `json_body` do."""
    data = await request.get_data(as_text=False)
    return strict(await json_body(), as_type) if data.strip() else as_type()


def one_value(name: str) -> str | None:
    """The query parameter `name`, given at most once.

    Raises `ApiError` (400 `INVALID_REQUEST`) if it is repeated: which one was meant?"""
    values = request.args.getlist(name)
    if len(values) > 1:
        raise ApiError(400, "INVALID_REQUEST", f"query parameter {name!r} is given {len(values)} times")
    return values[0] if values else None


def int_query(name: str, default: int | None, lowest: int, highest: int) -> int | None:
    """The integer query parameter `name` (`default` when absent), from `lowest` to `highest`.

    Raises `ApiError` (400 `INVALID_REQUEST`) for anything else, or if it is repeated."""
    text = one_value(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,20}", text) or not lowest <= int(text) <= highest:
        raise ApiError(
            400, "INVALID_REQUEST", f"{name} must be an integer from {lowest} to {highest}, not {text[:40]!r}"
        )
    return int(text)
