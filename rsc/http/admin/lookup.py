"""Finding the stream or group an Admin API request names: its actor, or None, or a refusal.

Nothing here creates an aggregate unless asked to (`stream_actor` with a shard count).
"""

from __future__ import annotations

from rsc.actors.deployment import Deployment, GroupActor, StreamActor
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.events.model import GroupConfig
from rsc.events.quotas import Quota
from rsc.events.stream import StreamState
from rsc.http.admin.preconditions import missing_with_if_match
from rsc.http.errors import ApiError


def stream_state(actor: StreamActor) -> StreamState:
    """The state of a stream's actor (loaded once the actor answers; a stream deleted since is
    gone). Raises `ApiError` (404 `UNKNOWN_STREAM`) when it has none."""
    state = actor.state
    if state is None or state.deleted:
        raise ApiError(
            404, "UNKNOWN_STREAM", f"stream {actor.aggregate.aggregate_id.stream_prefix!r} does not exist"
        )
    return state


def group_config(actor: GroupActor | None) -> GroupConfig | None:
    """The config of a group's actor, None when there is no such group (or it was deleted)."""
    state = actor.state if actor is not None else None
    return None if state is None or state.deleted else state.config


async def existing_stream(deployment: Deployment, stream_prefix: str) -> StreamActor | None:
    """The stream's actor, or None if there is no such stream (nothing is created).

    Raises `StoreError` if the stream cannot be read."""
    try:
        return await deployment.stream(stream_prefix, create=False)
    except UnknownStream:
        return None


async def conditional_stream(deployment: Deployment, stream_prefix: str) -> StreamActor:
    """The stream's actor for a change of an existing stream; nothing is created.

    Raises `ApiError`: 404 `UNKNOWN_STREAM` if there is none, or 412 if the request has an
    `If-Match`."""
    actor = await existing_stream(deployment, stream_prefix)
    if actor is None:
        missing_with_if_match(f"stream {stream_prefix!r}")
        raise ApiError(404, "UNKNOWN_STREAM", f"stream {stream_prefix!r} does not exist")
    return actor


async def stream_actor(
    deployment: Deployment,
    stream_prefix: str,
    shard_count: int | None,
    only_new: bool = False,
    quota: Quota | None = None,
) -> StreamActor:
    """The stream's actor; created with `shard_count` shards if it is given (`only_new`,
    `quota`: see `Registry.stream`).

    Raises `ApiError` (404 `UNKNOWN_STREAM`) for a stream that does not exist and is not
    created; `PreconditionFailed`, `QuotaExceeded` and `StoreError` as `Registry.stream`."""
    try:
        return await deployment.stream(
            stream_prefix,
            create=shard_count is not None,
            shard_count=shard_count,
            only_new=only_new,
            quota=quota,
        )
    except UnknownStream as exc:
        raise ApiError(404, "UNKNOWN_STREAM", str(exc)) from exc


async def existing_group(deployment: Deployment, stream_prefix: str, group: str) -> GroupActor | None:
    """The group's actor, or None if there is no such group (nothing is created).

    Raises `StoreError` if the group cannot be read."""
    try:
        return await deployment.group(stream_prefix, group, create=False)
    except (UnknownGroup, UnknownStream):
        return None
