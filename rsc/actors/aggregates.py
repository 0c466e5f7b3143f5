"""The two aggregates the actors own: a consumer group and a stream.

Each binds the pure core (`rsc.events`) to the journal format and to the
side effects its events imply on Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rsc.actors.effects import Effects
from rsc.actors.keys import AggregateId
from rsc.events import codec, group, stream
from rsc.events.commands import GroupCommand, RestartTimers, StreamCommand, Tick
from rsc.events.events import (
    GroupCreated,
    GroupEvent,
    LayoutApplied,
    MemberEpochAdvanced,
    ShardsAdded,
    ShardsInstalled,
    ShardsReleased,
    StreamCreated,
    StreamEvent,
)
from rsc.events.group import GroupState
from rsc.events.model import Layout, StartFrom
from rsc.events.stream import StreamState
from rsc.events.wire import OwnerToken


def start_id(start_from: StartFrom) -> str:
    """The XGROUP CREATE id for a group's start position."""
    return "0" if start_from is StartFrom.EARLIEST else "$"


class GroupAggregate:
    """A consumer group: ticks for leases, owner tokens and consumer groups as effects."""

    def __init__(self, aggregate_id: AggregateId, effects: Effects) -> None:
        self.aggregate_id = aggregate_id
        self.effects = effects

    def execute(self, state: GroupState | None, command: GroupCommand) -> tuple[GroupState, list[GroupEvent]]:
        return group.execute(state, command)

    def event_to_json(self, event: GroupEvent) -> tuple[str, str]:
        return type(event).__name__, codec.to_json(event, GroupEvent)

    def event_from_json(self, data: str) -> GroupEvent:
        return codec.from_json(data, GroupEvent)  # type: ignore[arg-type]

    def evolve(self, state: GroupState | None, event: GroupEvent) -> GroupState:
        return group.evolve(state, event)

    def checkpoint_json(self, state: GroupState) -> str:
        return codec.to_json(group.without_liveness(state))

    def state_from_json(self, data: str) -> GroupState:
        return codec.from_json(data, GroupState)

    def tick(self, state: GroupState | None, now_ms: int) -> GroupCommand | None:
        return Tick(now_ms) if state is not None and state.members else None

    def recovered(self, state: GroupState, now_ms: int) -> GroupCommand | None:
        return RestartTimers(now_ms) if state.members else None

    async def after_persist(
        self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]
    ) -> None:
        keys = {s.index: s.key for s in after.layout.shards}
        for event in events:
            match event:
                case GroupCreated():
                    readable = [keys[i] for i in sorted(after.initial_shards)]
                    await self.effects.ensure_consumer_groups(
                        readable, after.group, start_id(after.config.start_from)
                    )
                case LayoutApplied():
                    known = before.layout.readable_indexes if before else frozenset()
                    added = [keys[i] for i in sorted(event.layout.readable_indexes - known)]
                    await self.effects.ensure_consumer_groups(added, after.group, "0")
                case ShardsReleased():
                    token = OwnerToken(event.member_id, _incarnation(before, after, event.member_id), 0)
                    await self.effects.clear_owners(after.group, {keys[s]: token for s in event.shards})
                case ShardsInstalled():
                    await self._write_tokens(after, event.member_id, event.shards)
                case MemberEpochAdvanced():
                    # The token carries the holder's current epoch, so rewrite what it holds.
                    member = after.members.get(event.member_id)
                    if member is not None:
                        await self._write_tokens(
                            after, event.member_id, member.installed & after.owners.keys()
                        )

    async def _write_tokens(self, state: GroupState, member_id: str, shards: Iterable[int]) -> None:
        member = state.members.get(member_id)
        if member is None:
            return  # it left or was fenced later in the same batch; its release follows
        keys = {s.index: s.key for s in state.layout.shards}
        token = OwnerToken(member.member_id, member.incarnation, member.member_epoch)
        tokens = {keys[s]: token for s in shards if state.owners.get(s) == member_id}
        if tokens:
            await self.effects.set_owners(state.group, tokens)

    async def repair(self, state: GroupState) -> None:
        keys = {s.index: s.key for s in state.layout.shards}
        readable = sorted(state.layout.readable_indexes)
        initial = [keys[i] for i in readable if i in state.initial_shards]
        later = [keys[i] for i in readable if i not in state.initial_shards]
        await self.effects.ensure_consumer_groups(initial, state.group, start_id(state.config.start_from))
        await self.effects.ensure_consumer_groups(later, state.group, "0")
        await self.effects.sync_owners(state.group, keys.values(), expected_tokens(state))


def expected_tokens(state: GroupState) -> dict[str, OwnerToken]:
    """Shard key -> the owner token the current assignment implies."""
    keys = {s.index: s.key for s in state.layout.shards}
    tokens = {}
    for shard, member_id in state.owners.items():
        member = state.members[member_id]
        tokens[keys[shard]] = OwnerToken(member_id, member.incarnation, member.member_epoch)
    return tokens


def _incarnation(before: GroupState | None, after: GroupState, member_id: str) -> str:
    for state in (before, after):
        if state is not None and member_id in state.members:
            return state.members[member_id].incarnation
    if before is not None and member_id in before.fenced:
        return before.fenced[member_id].incarnation
    return after.fenced[member_id].incarnation if member_id in after.fenced else ""


LayoutListener = Callable[[str, Layout, Sequence[str]], None]


class StreamAggregate:
    """A stream: shard keys and, on scale-out, every known group's consumer groups."""

    def __init__(self, aggregate_id: AggregateId, effects: Effects, on_layout: LayoutListener) -> None:
        self.aggregate_id = aggregate_id
        self.effects = effects
        self.on_layout = on_layout

    def execute(
        self, state: StreamState | None, command: StreamCommand
    ) -> tuple[StreamState, list[StreamEvent]]:
        return stream.execute(state, command)

    def event_to_json(self, event: StreamEvent) -> tuple[str, str]:
        return type(event).__name__, codec.to_json(event, StreamEvent)

    def event_from_json(self, data: str) -> StreamEvent:
        return codec.from_json(data, StreamEvent)  # type: ignore[arg-type]

    def evolve(self, state: StreamState | None, event: StreamEvent) -> StreamState:
        return stream.evolve(state, event)

    def checkpoint_json(self, state: StreamState) -> str:
        return codec.to_json(state)

    def state_from_json(self, data: str) -> StreamState:
        return codec.from_json(data, StreamState)

    def tick(self, state: StreamState | None, now_ms: int) -> StreamCommand | None:
        return None

    def recovered(self, state: StreamState, now_ms: int) -> StreamCommand | None:
        return None

    async def after_persist(
        self, before: StreamState | None, after: StreamState, events: Sequence[StreamEvent]
    ) -> None:
        for event in events:
            match event:
                case StreamCreated():
                    await self.effects.register_stream(after.stream_prefix)
                    await self.effects.ensure_streams(s.key for s in event.layout.shards)
                case ShardsAdded():
                    keys = [s.key for s in event.shards]
                    await self.effects.ensure_streams(keys)
                    for name in sorted(after.groups):
                        await self.effects.ensure_consumer_groups(keys, name, "0")
        if before is not None and before.layout.metadata_version != after.layout.metadata_version:
            self.on_layout(after.stream_prefix, after.layout, sorted(after.groups))

    async def repair(self, state: StreamState) -> None:
        await self.effects.register_stream(state.stream_prefix)
        await self.effects.ensure_streams(s.key for s in state.layout.shards if s.readable)
