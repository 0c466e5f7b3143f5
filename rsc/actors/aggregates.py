"""The two aggregates the actors own: a consumer group and a stream.

Each binds the pure core (`rsc.events`) to the journal format and to the
side effects its events imply on Redis.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from rsc.actors.actor import Actor, answers_first
from rsc.actors.dataset import DATA_LOSS
from rsc.actors.effects.port import Effects
from rsc.actors.effects.shard_keys import ShardKeys
from rsc.actors.errors import UnsupportedSchema
from rsc.actors.keys import AggregateId
from rsc.events import codec, group, migration, stream
from rsc.events.commands import GroupCommand, RestartTimers, StreamCommand, Tick
from rsc.events.events import (
    GroupCreated,
    GroupDeleted,
    GroupEvent,
    LayoutApplied,
    MemberEpochAdvanced,
    ShardsAdded,
    ShardsDraining,
    ShardsInstalled,
    ShardsReleased,
    ShardsReportedStalled,
    ShardsRetired,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
)
from rsc.events.group import GroupState
from rsc.events.group_position import MAX_SEQ
from rsc.events.model import GroupConfig, Layout, StartFrom
from rsc.events.stream import StreamState
from rsc.events.versions import EVENT_VERSIONS, MAX_FEATURE_LEVEL, UnsupportedEventVersion, upcast
from rsc.events.wire import OwnerToken

S = TypeVar("S")
E = TypeVar("E")

#: The actors of the two aggregates (`rsc.actors.registry` starts them).
GroupActor = Actor[GroupState, GroupCommand, GroupEvent]
StreamActor = Actor[StreamState, StreamCommand, StreamEvent]

#: Told of every persisted batch of a group's events (metrics); must not block or raise.
GroupObserver = Callable[[GroupState | None, GroupState, Sequence[GroupEvent]], None]


def start_ids(config: GroupConfig, shards: Iterable[tuple[int, str]]) -> dict[str, str]:
    """Where a new group's consumer group starts on each (index, key): `startAt` (a time, or
    given ids) where it says, else `startFrom`."""
    at = config.start_at
    out: dict[str, str] = {}
    for index, key in shards:
        start = start_id(config.start_from)
        if at is not None and at.time_ms is not None:
            start = "0" if at.time_ms == 0 else f"{at.time_ms - 1}-{MAX_SEQ}"
        elif at is not None and at.ids is not None:
            start = at.ids.get(str(index), start)
        out[key] = start
    return out


async def ensure_at(effects: ShardKeys, group: str, starts: Mapping[str, str]) -> None:
    """`ensure_consumer_groups` for keys that start at different ids (one call per id)."""
    by_start: dict[str, list[str]] = {}
    for key, start in starts.items():
        by_start.setdefault(start, []).append(key)
    for start, keys in by_start.items():
        await effects.ensure_consumer_groups(keys, group, start)


def start_id(start_from: StartFrom) -> str:
    """The XGROUP CREATE id for a group's start position."""
    return "0" if start_from is StartFrom.EARLIEST else "$"


@functools.cache
def _kinds_of(union: Any) -> frozenset[str]:
    """The event type names of a union (what a journal entry's `type` may say)."""
    return frozenset(t.__name__ for t in typing.get_args(union))


class _Journaled(Generic[S, E]):
    """The journal format of an aggregate: events and checkpoints as camelCase JSON."""

    event_union: Any
    state_type: type[S]

    def event_to_json(self, event: E) -> tuple[str, str]:
        return type(event).__name__, codec.to_json(event, self.event_union)

    def event_from_json(self, data: str, version: int = 1) -> E:
        """The event of a journal entry, its data of `version` upcast to today's version first
        (`UnsupportedSchema` for a version newer than this release reads)."""
        raw = json.loads(data)
        kind = raw.get(codec.TAG) if isinstance(raw, dict) else None
        if kind not in _kinds_of(self.event_union):
            raise UnsupportedSchema(
                f"event type {kind!r} is unknown to this release: written by a newer release at a "
                "higher feature level; run that release, or one newer"
            )
        if version != 1 or EVENT_VERSIONS:
            try:
                raw = upcast(str(raw.get(codec.TAG, "")), version, raw, EVENT_VERSIONS)
            except UnsupportedEventVersion as exc:
                raise UnsupportedSchema(str(exc)) from exc
        event: E = codec.converter.structure(raw, self.event_union)
        return event

    def checkpoint_json(self, state: S) -> str:
        return codec.to_json(state)

    def state_from_json(self, data: str) -> S:
        return codec.from_json(data, self.state_type)


class GroupAggregate(_Journaled[GroupState, GroupEvent]):
    """A consumer group: ticks for leases, owner tokens and consumer groups as effects."""

    event_union = GroupEvent
    state_type = GroupState

    def __init__(
        self,
        aggregate_id: AggregateId,
        effects: Effects,
        observe: GroupObserver | None = None,
        level: Callable[[], int] = lambda: MAX_FEATURE_LEVEL,
    ) -> None:
        self.aggregate_id = aggregate_id
        self.effects = effects
        self.observe = observe
        #: The deployment's finalized feature level (what the decisions may write).
        self.level = level

    def execute(
        self, state: GroupState | None, command: GroupCommand, leases: Mapping[str, int]
    ) -> tuple[GroupState, list[GroupEvent]]:
        return group.execute(state, command, self.level(), leases)

    def evolve(self, state: GroupState | None, event: GroupEvent) -> GroupState:
        return group.evolve(state, event)

    def tick(self, state: GroupState | None, leases: Mapping[str, int], now_ms: int) -> GroupCommand | None:
        if state is None or not (state.members or state.holds or state.quarantine):
            return None
        return Tick(now_ms, leases)

    def due_ms(self, state: GroupState | None, leases: Mapping[str, int]) -> int | None:
        return None if state is None else group.due_ms(state, leases)

    def recovered(self, state: GroupState, now_ms: int) -> GroupCommand | None:
        return RestartTimers(now_ms) if state.members else None

    async def after_persist(
        self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]
    ) -> None:
        """Create consumer groups for new shards, then bring the owner tokens of the shards
        installed or released to `after`.

        Tokens are written once per batch for the net change: a shard released
        by one member and installed to another in the same batch gets the new
        holder's token in one write. A token whose holder only advanced its epoch is
        rewritten once the batch is answered (`after_answer`): the data plane's scripts
        compare the member id and incarnation, which an epoch does not change.
        """
        if self.observe is not None:
            self.observe(before, after, events)
        keys = {s.index: s.key for s in after.layout.shards}
        touched: set[int] = set()
        for event in events:
            match event:
                case GroupDeleted():
                    dropped = before.layout.shards if before is not None else after.layout.shards
                    await self.effects.destroy_consumer_groups([s.key for s in dropped], after.group)
                case GroupCreated():
                    initial = [(i, keys[i]) for i in sorted(after.initial_shards)]
                    await ensure_at(self.effects, after.group, start_ids(after.config, initial))
                case LayoutApplied():
                    known = before.layout.readable_indexes if before else frozenset()
                    added = [keys[i] for i in sorted(event.layout.readable_indexes - known)]
                    await self.effects.ensure_consumer_groups(added, after.group, "0")
                case ShardsReleased() | ShardsInstalled():
                    touched.update(event.shards)
                case ShardsReportedStalled():
                    await self._heal(after, event)
        held = {keys[s]: t for s in touched if (t := token_of(after, s)) is not None}
        gone = {
            keys[s]: t for s in touched if s not in after.owners and (t := token_of(before, s)) is not None
        }
        if gone:
            await self.effects.clear_owners(after.group, gone)
        if held:
            await self.effects.set_owners(after.group, held)

    async def after_answer(self, after: GroupState, events: Sequence[GroupEvent]) -> None:
        """The token carries its holder's epoch: rewrite, from `after` (the state now), the
        tokens of what the members that advanced their epoch in `events` (one or more answered
        batches) hold now; one pass over the owners for all of them."""
        advanced = {e.member_id for e in events if type(e) is MemberEpochAdvanced}
        if not advanced:
            return
        await answers_first()
        keys = {s.index: s.key for s in after.layout.shards}
        held = {
            keys[s]: t
            for s, m in after.owners.items()
            if m in advanced and (t := token_of(after, s)) is not None
        }
        if held:
            await self.effects.set_owners(after.group, held)

    async def _heal(self, state: GroupState, event: ShardsReportedStalled) -> None:
        """A member cannot read shards installed to it: recreate what Redis lost of them (the
        key and consumer group at `0`, never `$`: all a recreated key holds was appended since
        the loss; the owner token). Idempotent: a report of a shard that was fine changes
        nothing."""
        keys = {s.index: s.key for s in state.layout.shards}
        shards = sorted(s for s in event.shards if state.owners.get(s) == event.member_id and s in keys)
        if not shards:
            return
        DATA_LOSS.shard(
            f"{self.aggregate_id}: member {event.member_id} cannot read shard(s) {shards} (key, "
            "consumer group or owner token gone, or its reads stalled: its log says which)"
        )
        await self.effects.ensure_consumer_groups([keys[s] for s in shards], state.group, "0")
        tokens = {keys[s]: t for s in shards if (t := token_of(state, s)) is not None}
        await self.effects.set_owners(state.group, tokens)

    async def repair(self, state: GroupState, after_loss: bool = False) -> None:
        if state.deleted:
            shard_keys = [s.key for s in state.layout.shards]
            await self.effects.destroy_consumer_groups(shard_keys, state.group)
            return
        keys = {s.index: s.key for s in state.layout.shards}
        readable = sorted(state.layout.readable_indexes)
        initial = [keys[i] for i in readable if i in state.initial_shards]
        later = [keys[i] for i in readable if i not in state.initial_shards]
        # After a loss a consumer group made now is one Redis lost: what is in its key was
        # appended since (and acknowledged to a producer), or survived; never skip it with `$`.
        # So is one missing from a group that has had a change since its creation (a member, a
        # layout): the creation's side effects ran before that (evicted, or lost while no
        # coordinator ran). Only a creation whose side effects may not have run starts at
        # `startFrom`.
        if after_loss or state.group_epoch > 0:
            await self.effects.ensure_consumer_groups(initial, state.group, "0")
        else:
            indexes = {key: i for i, key in keys.items()}
            await ensure_at(
                self.effects, state.group, start_ids(state.config, [(indexes[k], k) for k in initial])
            )
        await self.effects.ensure_consumer_groups(later, state.group, "0")
        await self.effects.sync_owners(state.group, keys.values(), expected_tokens(state))


def expected_tokens(state: GroupState) -> dict[str, OwnerToken]:
    """Shard key -> the owner token the current assignment implies."""
    keys = {s.index: s.key for s in state.layout.shards}
    return {keys[shard]: token for shard in state.owners if (token := token_of(state, shard)) is not None}


def token_of(state: GroupState | None, shard: int) -> OwnerToken | None:
    """The owner token of `shard` in `state` (None if nobody holds it)."""
    if state is None or shard not in state.owners:
        return None
    member = state.members[state.owners[shard]]
    return OwnerToken(member.member_id, member.incarnation, member.member_epoch)


LayoutListener = Callable[[str, Layout, Sequence[str]], None]


class StreamAggregate(_Journaled[StreamState, StreamEvent]):
    """A stream: shard keys and, on scale-out, every known group's consumer groups."""

    event_union = StreamEvent
    state_type = StreamState

    def __init__(
        self,
        aggregate_id: AggregateId,
        effects: Effects,
        on_layout: LayoutListener,
        retired_retention_ms: int | None = None,
    ) -> None:
        self.aggregate_id = aggregate_id
        self.effects = effects
        self.on_layout = on_layout
        #: How long a retired shard key is kept (None: until the stream is deleted).
        self.retired_retention_ms = retired_retention_ms

    def execute(
        self, state: StreamState | None, command: StreamCommand, leases: Mapping[str, int]
    ) -> tuple[StreamState, list[StreamEvent]]:
        return stream.execute(state, command)

    def evolve(self, state: StreamState | None, event: StreamEvent) -> StreamState:
        return stream.evolve(state, event)

    def tick(self, state: StreamState | None, leases: Mapping[str, int], now_ms: int) -> StreamCommand | None:
        # Producers' leases, and the bound of a migration's phase.
        due = state is not None and (bool(state.producers) or migration.moving(state))
        return Tick(now_ms, leases) if due else None

    def due_ms(self, state: StreamState | None, leases: Mapping[str, int]) -> int | None:
        # Every tick interval while it has producers or a migration moves (0: due at once).
        due = state is not None and (bool(state.producers) or migration.moving(state))
        return 0 if due else None

    def recovered(self, state: StreamState, now_ms: int) -> StreamCommand | None:
        return RestartTimers(now_ms) if state.producers else None

    async def after_answer(self, after: StreamState, events: Sequence[StreamEvent]) -> None:
        """Nothing: every side effect of a stream's events comes before its answers."""

    async def after_persist(
        self, before: StreamState | None, after: StreamState, events: Sequence[StreamEvent]
    ) -> None:
        for event in events:
            match event:
                case StreamDeleted():
                    gone = before.layout.shards if before is not None else after.layout.shards
                    await self.effects.delete_streams(s.key for s in gone)
                    await self.effects.unregister_stream(after.stream_prefix)
                case StreamCreated():
                    await self.effects.register_stream(after.stream_prefix)
                    await self.effects.ensure_streams(s.key for s in event.layout.shards)
                case ShardsAdded():
                    keys = [s.key for s in event.shards]
                    await self.effects.ensure_streams(keys)
                    for name in sorted(after.groups):
                        await self.effects.ensure_consumer_groups(keys, name, "0")
                case ShardsDraining():
                    keys = [s.key for s in after.layout.shards if s.index in event.indexes]
                    await self.effects.seal(keys, event.metadata_version)
                case ShardsRetired() if self.retired_retention_ms is not None:
                    keys = [s.key for s in after.layout.shards if s.index in event.indexes]
                    await self.effects.expire_streams(keys, self.retired_retention_ms)
        if (
            before is not None
            and not after.deleted
            and before.layout.metadata_version != after.layout.metadata_version
        ):
            self.on_layout(after.stream_prefix, after.layout, sorted(after.groups))

    async def repair(self, state: StreamState, after_loss: bool = False) -> None:
        if state.deleted:
            await self.effects.delete_streams(s.key for s in state.layout.shards)
            await self.effects.unregister_stream(state.stream_prefix)
            return
        await self.effects.register_stream(state.stream_prefix)
        await self.effects.ensure_streams(s.key for s in state.layout.shards if s.readable)
        draining = [s.key for s in state.layout.draining]
        if draining:  # sealed once they began to drain; again in case that write was lost
            await self.effects.seal(draining, state.layout.metadata_version)
        retired = [s.key for s in state.layout.shards if not s.readable]
        if retired and self.retired_retention_ms is not None:  # in case that write was lost
            await self.effects.expire_streams(retired, self.retired_retention_ms)
