"""The stream aggregate: the layout of one logical stream and its resharding.

Rules:

* `metadata_version` bumps on every layout change, and only then.
* Shard indexes are identities: never reused. Scale-out appends new ACTIVE
  shards after the highest index; scale-in turns the highest ACTIVE shards
  DRAINING; a DRAINING shard becomes RETIRED only by `RetireShards`, which the
  caller sends once Redis-level drain evidence is in.
* Shard key names are chosen here (`placement`: spread over the cluster's
  primaries, the topology being an input of the command) and stored in the
  layout; clients never compute them.
* Producers register by heartbeat. Registration, a change of the layout
  version a producer acknowledges (or of its `quiesced` flag), expiry and the
  pause state are journaled. Leases are not part of the state
  (`rsc.events.liveness`): every heartbeat, a registration's included, emits
  `ProducerHeartbeated`, the driver keeps the lease table, and a `Tick`
  brings it in to expire those whose lease ended. They restart in full on
  recovery, as members' do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import assert_never

import attrs

from rsc.events.commands import (
    ChangeShardCount,
    CreateStream,
    DeleteStream,
    PauseProducers,
    ProducerHeartbeat,
    RegisterGroup,
    RestartTimers,
    ResumeProducers,
    RetireShards,
    StreamCommand,
    Tick,
    UnregisterGroup,
)
from rsc.events.errors import AggregateNotFound, CorruptHistory, Deleted, InvalidCommand, NotEmpty
from rsc.events.events import (
    GroupRegistered,
    GroupUnregistered,
    ProducerAcknowledged,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    ShardsAdded,
    ShardsDraining,
    ShardsRetired,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
)
from rsc.events.liveness import expired
from rsc.events.model import (
    DrainCheck,
    Layout,
    PauseState,
    Producer,
    ReshardMode,
    Shard,
    ShardState,
    StartFrom,
    check_client,
    check_counter,
    check_id,
    check_name,
    is_plain_text,
)
from rsc.events.placement import place

#: One shard per Redis Cluster hash slot is the most that can ever help.
MAX_SHARDS = 16_384
#: The longest pause reason kept.
MAX_REASON = 200
#: The most workers one member may be told to run (`maxConcurrency`).
MAX_CONCURRENCY = 1_024


@attrs.frozen
class StreamState:
    """The layout of one logical stream and the groups that read it."""

    stream_prefix: str
    layout: Layout
    created_at_ms: int
    reshard_mode: ReshardMode = ReshardMode.ONLINE
    groups: Mapping[str, StartFrom] = attrs.field(factory=dict)
    producers: Mapping[str, Producer] = attrs.field(factory=dict)
    paused: PauseState | None = None
    #: Deleted by the Admin API (its shard keys with it): created afresh on next use.
    deleted: bool = False

    @property
    def shard_count(self) -> int:
        """The number of ACTIVE shards: what producers route over."""
        return len(self.layout.active)


def evolve(state: StreamState | None, event: StreamEvent) -> StreamState:
    """Apply one event; raise `CorruptHistory` if it cannot follow `state`."""
    if state is None or state.deleted:
        if not isinstance(event, StreamCreated):
            raise CorruptHistory(f"{type(event).__name__} before StreamCreated")
        return StreamState(event.stream_prefix, event.layout, event.created_at_ms)
    producers = state.producers
    match event:
        case StreamCreated():
            raise CorruptHistory("StreamCreated twice")
        case ShardsAdded():
            layout = Layout(event.metadata_version, state.layout.shards + event.shards, state.layout.routing)
            return attrs.evolve(state, layout=layout)
        case ShardsDraining():
            return _restate(state, event.indexes, ShardState.DRAINING, event.metadata_version)
        case ShardsRetired():
            return _restate(state, event.indexes, ShardState.RETIRED, event.metadata_version)
        case GroupRegistered():
            return attrs.evolve(state, groups={**state.groups, event.group: event.start_from})
        case GroupUnregistered():
            return attrs.evolve(state, groups={k: v for k, v in state.groups.items() if k != event.group})
        case StreamDeleted():
            if state.groups or state.producers:
                raise CorruptHistory("stream deleted with groups or producers")
            return attrs.evolve(state, deleted=True, paused=None)
        case ProducerRegistered():
            producer = Producer(
                event.producer_id,
                event.acked_version,
                event.quiesced,
                event.lease_ttl_ms,
                event.registered_at_ms,
                event.client,
            )
            return attrs.evolve(state, producers={**producers, event.producer_id: producer})
        case ProducerAcknowledged():
            producer = _producer(state, event.producer_id)
            changed = attrs.evolve(producer, acked_version=event.acked_version, quiesced=event.quiesced)
            return attrs.evolve(state, producers={**producers, event.producer_id: changed})
        case ProducerHeartbeated():
            _producer(state, event.producer_id)  # liveness only: the lease table takes the deadline
            return state
        case ProducerExpired() | ProducerLeft():
            _producer(state, event.producer_id)
            return attrs.evolve(
                state, producers={k: p for k, p in producers.items() if k != event.producer_id}
            )
        case ProducerLeasesRestarted():
            return state  # liveness only: the heartbeats that follow restart each lease
        case ProducersPaused():
            return attrs.evolve(state, paused=PauseState(event.reason, event.paused_at_ms))
        case ProducersResumed():
            return attrs.evolve(state, paused=None)
        case _:
            assert_never(event)


def _producer(state: StreamState, producer_id: str) -> Producer:
    producer = state.producers.get(producer_id)
    if producer is None:
        raise CorruptHistory(f"no producer {producer_id!r}")
    return producer


def fold(events: Iterable[StreamEvent], state: StreamState | None = None) -> StreamState | None:
    """Apply `events` in order, starting from `state` (None: from nothing)."""
    for event in events:
        state = evolve(state, event)
    return state


def _restate(state: StreamState, indexes: frozenset[int], to: ShardState, version: int) -> StreamState:
    shards = tuple(attrs.evolve(s, state=to) if s.index in indexes else s for s in state.layout.shards)
    return attrs.evolve(state, layout=attrs.evolve(state.layout, shards=shards, metadata_version=version))


def decide(state: StreamState | None, command: StreamCommand) -> list[StreamEvent]:
    """Return the events `command` causes; raise a `CoordinationError` to refuse it."""
    if isinstance(command, CreateStream):
        return _create(state, command)
    if state is None:
        raise AggregateNotFound("the stream does not exist")
    if state.deleted:
        if isinstance(command, DeleteStream | Tick | RestartTimers):
            return []
        raise Deleted(f"stream {state.stream_prefix!r} was deleted")
    match command:
        case UnregisterGroup():
            return [GroupUnregistered(command.group)] if command.group in state.groups else []
        case DeleteStream():
            if state.groups or state.producers:
                raise NotEmpty(
                    f"the stream has {len(state.groups)} group(s) and {len(state.producers)} live "
                    "producer(s); delete the groups and stop the producers first"
                )
            return [StreamDeleted(command.now_ms)]
        case ChangeShardCount():
            return _change_shard_count(state, command)
        case RetireShards():
            return _retire(state, command)
        case RegisterGroup():
            check_name(command.group, "consumerGroup")
            if state.groups.get(command.group) == command.start_from:
                return []
            return [GroupRegistered(command.group, command.start_from)]
        case ProducerHeartbeat():
            return _producer_heartbeat(state, command)
        case PauseProducers():
            if state.paused is not None:
                return []  # idempotent: the first pause's reason and time stay
            if not (command.reason and is_plain_text(command.reason, MAX_REASON)):
                raise InvalidCommand(
                    f"a pause needs a reason of 1-{MAX_REASON} characters, no control characters"
                )
            return [ProducersPaused(command.reason, command.now_ms)]
        case ResumeProducers():
            return [ProducersResumed(command.now_ms)] if state.paused is not None else []
        case Tick():
            return [
                ProducerExpired(producer_id, command.now_ms)
                for producer_id in state.producers
                if expired(command.leases, producer_id, command.now_ms)
            ]
        case RestartTimers():
            if not state.producers:
                return []
            restarted: list[StreamEvent] = [ProducerLeasesRestarted(command.now_ms)]
            restarted.extend(
                ProducerHeartbeated(p.producer_id, command.now_ms + p.lease_ttl_ms)
                for p in state.producers.values()
            )
            return restarted
        case _:
            assert_never(command)


def _producer_heartbeat(state: StreamState, command: ProducerHeartbeat) -> list[StreamEvent]:
    check_id(command.producer_id, "producerId")
    check_client(command.client)
    check_counter(command.metadata_version, "metadataVersion")
    if command.lease_ttl_ms <= 0:
        raise InvalidCommand("the producer lease must be positive")
    if command.metadata_version < 0:
        raise InvalidCommand("metadataVersion must not be negative")
    # A version above the stored one routes with a layout this coordinator does not
    # have (metadata lost or restored): it acknowledges nothing.
    current = state.layout.metadata_version
    acked = command.metadata_version if command.metadata_version <= current else 0
    known = state.producers.get(command.producer_id)
    if command.leave:
        return [] if known is None else [ProducerLeft(command.producer_id, command.now_ms)]
    events: list[StreamEvent] = []
    if known is None:
        registered = ProducerRegistered(
            command.producer_id, acked, command.quiesced, command.lease_ttl_ms, command.client, command.now_ms
        )
        events.append(registered)
    elif (known.acked_version, known.quiesced) != (acked, command.quiesced):
        events.append(ProducerAcknowledged(command.producer_id, acked, command.quiesced))
    # Its lease starts (a registration) or is renewed: liveness for the lease table.
    events.append(ProducerHeartbeated(command.producer_id, command.now_ms + command.lease_ttl_ms))
    return events


def _create(state: StreamState | None, command: CreateStream) -> list[StreamEvent]:
    check_name(command.stream_prefix, "streamPrefix")
    _check_count(command.shard_count)
    if state is not None and not state.deleted:
        return []  # idempotent: the stream exists, resharding is a separate command
    indexes = range(command.shard_count)
    keys = place(command.stream_prefix, indexes, (), command.topology)
    shards = tuple(Shard(i, key) for i, key in zip(indexes, keys, strict=True))
    return [StreamCreated(command.stream_prefix, Layout(1, shards), command.now_ms)]


def _change_shard_count(state: StreamState, command: ChangeShardCount) -> list[StreamEvent]:
    _check_count(command.shard_count)
    active = state.layout.active
    version = state.layout.metadata_version + 1
    if command.shard_count > len(active):
        start = max((s.index for s in state.layout.shards), default=-1) + 1
        count = command.shard_count - len(active)
        indexes = range(start, start + count)
        keys = place(state.stream_prefix, indexes, (s.key for s in active), command.topology)
        added = tuple(Shard(i, key) for i, key in zip(indexes, keys, strict=True))
        return [ShardsAdded(added, version)]
    if command.shard_count < len(active):
        draining = frozenset(s.index for s in active[command.shard_count :])
        return [ShardsDraining(draining, version)]
    return []


def _retire(state: StreamState, command: RetireShards) -> list[StreamEvent]:
    states = {s.index: s.state for s in state.layout.shards}
    wrong = sorted(i for i in command.indexes if states.get(i) is not ShardState.DRAINING)
    if wrong:
        raise InvalidCommand(f"only DRAINING shards can be retired, not {wrong}")
    if not command.indexes:
        return []
    missing = sorted(i for i in command.indexes if not _evidence_holds(command.evidence.get(i)))
    if missing:
        raise InvalidCommand(f"shards {missing} are not sealed and drained (Redis evidence)")
    stale = stale_producers(state)
    if stale:
        raise InvalidCommand(
            f"producers {stale} have not acknowledged layout v{state.layout.metadata_version} yet"
        )
    return [ShardsRetired(command.indexes, state.layout.metadata_version + 1)]


def _evidence_holds(check: DrainCheck | None) -> bool:
    return check is not None and check.sealed and check.drained


def stale_producers(state: StreamState) -> list[str]:
    """Live producers still routing with an older layout than the current one (it may still
    route to a DRAINING shard): no shard retires until each has caught up or expired."""
    version = state.layout.metadata_version
    return sorted(p.producer_id for p in state.producers.values() if p.acked_version != version)


def retirable(state: StreamState, evidence: Mapping[int, DrainCheck]) -> frozenset[int]:
    """The DRAINING shards `RetireShards` would retire now with `evidence` (none while a live
    producer has not caught up with the current layout)."""
    if stale_producers(state):
        return frozenset()
    return frozenset(s.index for s in state.layout.draining if _evidence_holds(evidence.get(s.index)))


def _check_count(count: int) -> None:
    if not 0 <= count <= MAX_SHARDS:
        raise InvalidCommand(f"shardCount must be between 0 and {MAX_SHARDS}")


def execute(state: StreamState | None, command: StreamCommand) -> tuple[StreamState, list[StreamEvent]]:
    """Decide `command` and apply its events: the new state and what happened."""
    events = decide(state, command)
    new_state = fold(events, state)
    if new_state is None:
        raise AggregateNotFound("the stream does not exist")
    return new_state, events
