"""The Admin API's changes that take more than one command, or Redis as it is now.

Deleting a group (the group records its deletion, then the stream forgets it) and a stream,
resharding (new shards named over the cluster's primaries as they are now), resuming and
aborting migrations. Each goes through the registry's actors; none creates an aggregate.

Imports `rsc.actors.registry` (the actors it asks) and `rsc.events`; nothing imports it
below `rsc.http`.
"""

from __future__ import annotations

from rsc.actors.actor import Reply
from rsc.actors.keys import AggregateId
from rsc.actors.registry import Registry
from rsc.events.commands import (
    AbortMigration,
    ChangeShardCount,
    DeleteGroup,
    DeleteStream,
    RegisterGroup,
    ResumeMigration,
    UnregisterGroup,
)
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.events.events import StreamEvent
from rsc.events.model import ReshardMode
from rsc.events.stream import StreamState


async def delete_group(registry: Registry, stream_prefix: str, group: str, expect: int | None = None) -> None:
    """Delete a group without live members and its Redis consumer groups.

    The group records its deletion first, then the stream forgets it. A member joining
    meanwhile creates the group afresh, and the stream learns it again. Raises `NotEmpty`
    (live members), `UnknownGroup`, `UnknownStream`, `PreconditionFailed` (not at revision
    `expect`), `StoreError`, `ActorStopped`."""
    try:
        await registry.ask_group(
            stream_prefix, group, DeleteGroup(registry.clock.now_ms()), create=False, expect=expect
        )
    except UnknownGroup:
        # Deleted already, but the stream may still list it: a delete that stopped between
        # its two writes (a failed write, a term that ended) is finished here.
        stream = await registry.stream(stream_prefix, create=False)
        if stream.state is None or group not in stream.state.groups:
            raise
    await registry.ask_stream(stream_prefix, UnregisterGroup(group), create=False)
    actor = registry.running_actor(AggregateId(stream_prefix, group))
    state = actor.state if actor is not None else None
    if state is not None and not state.deleted:  # re-created by a join meanwhile
        await registry.ask_stream(stream_prefix, RegisterGroup(group, state.config.start_from))


async def change_shard_count(
    registry: Registry,
    stream_prefix: str,
    shard_count: int,
    mode: ReshardMode = ReshardMode.ONLINE,
    migrations: bool = False,
    expect: int | None = None,
) -> Reply[StreamState, StreamEvent]:
    """Reshard (or store `mode`); new shards are named to spread over the cluster's
    primaries as they are now. `migrations`: the feature level journals migrations.

    Raises the core's refusal (`InvalidCommand`, `MigrationConflict`), `UnknownStream`,
    `PreconditionFailed` (not at revision `expect`), `StoreError`, `ActorStopped`."""
    topology = await registry.effects.topology()
    bounds = registry.settings.migration_bounds
    command = ChangeShardCount(shard_count, mode, registry.clock.now_ms(), topology, bounds, migrations)
    return await registry.ask_stream(stream_prefix, command, create=False, expect=expect)


async def resume_migration(
    registry: Registry, stream_prefix: str, expect: int | None = None
) -> Reply[StreamState, StreamEvent]:
    """Resume a stalled migration.

    Raises `NoMigration` if none is stalled, `UnknownStream`, `PreconditionFailed`,
    `StoreError`, `ActorStopped`."""
    command = ResumeMigration(registry.clock.now_ms(), await registry.effects.topology())
    return await registry.ask_stream(stream_prefix, command, create=False, expect=expect)


async def abort_migration(
    registry: Registry, stream_prefix: str, reason: str, expect: int | None = None
) -> Reply[StreamState, StreamEvent]:
    """Abort a migration that has not changed the layout yet; producers resume.

    Raises `NoMigration` (none running), `MigrationConflict` (past its switch),
    `InvalidCommand` (the reason), `UnknownStream`, `PreconditionFailed`, `StoreError`,
    `ActorStopped`."""
    command = AbortMigration(registry.clock.now_ms(), reason)
    return await registry.ask_stream(stream_prefix, command, create=False, expect=expect)


async def delete_stream(registry: Registry, stream_prefix: str, expect: int | None = None) -> None:
    """Delete a stream without groups or live producers, and its shard keys.

    Raises `NotEmpty` (groups or live producers), `UnknownStream` (also when another request
    deleted it meanwhile), `PreconditionFailed`, `StoreError`, `ActorStopped`."""
    reply = await registry.ask_stream(
        stream_prefix, DeleteStream(registry.clock.now_ms()), create=False, expect=expect
    )
    if not reply.events:  # deleted by another request meanwhile: not this one's 204
        raise UnknownStream(f"stream {stream_prefix!r} does not exist")
    registry.layouts.pop(stream_prefix, None)
