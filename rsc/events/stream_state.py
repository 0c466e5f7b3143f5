"""The stream aggregate's state, and how each event changes it.

`StreamState` is the layout of one logical stream, the groups that read it, its
live producers, its pause and its migration (the running one, or the last).
`evolve(state, event)` applies one event and `fold` a sequence of them, from
`None` (nothing yet); neither changes what it is given, and an event that
cannot follow the state raises `CorruptHistory`. `stale_producers` is the one
question both retirement and migrations ask of producers.

The rule it keeps: the state changes by events only, and each event's effect
is here (the deciding is `stream`'s and `migration`'s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import assert_never

import attrs

from rsc.events.errors import CorruptHistory
from rsc.events.events import (
    GroupRegistered,
    GroupUnregistered,
    MigrationAborted,
    MigrationPhaseChanged,
    MigrationResumed,
    MigrationStalled,
    MigrationStarted,
    ProducerAcknowledged,
    ProducerEpochAssigned,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    ReshardModeSet,
    RetentionLoss,
    RetentionSet,
    ShardsAdded,
    ShardsDraining,
    ShardsRetired,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
)
from rsc.events.model import (
    Layout,
    Migration,
    MigrationPhase,
    PauseState,
    PhaseStarted,
    Producer,
    ReshardMode,
    ShardState,
    StartFrom,
)
from rsc.events.retention import KEEP_ALL, Retention


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
    #: The running resharding, or the last one (DONE or ABORTED) until the next begins.
    migration: Migration | None = attrs.field(default=None, metadata={"omit_if_default": True})
    #: The retention policy (feature level 5); None: none stored, the stream keeps everything.
    retention: Retention | None = attrs.field(default=None, metadata={"omit_if_default": True})
    #: The highest producer epoch given on this stream (feature level 6; 0: none yet).
    producer_epoch: int = attrs.field(default=0, metadata={"omit_if_default": True})

    @property
    def policy(self) -> Retention:
        """The retention the coordinator applies: the stored one, else keep everything."""
        return KEEP_ALL if self.retention is None else self.retention

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
        case ProducerEpochAssigned():
            producer = attrs.evolve(_producer(state, event.producer_id), epoch=event.epoch)
            return attrs.evolve(
                state,
                producers={**producers, event.producer_id: producer},
                producer_epoch=max(state.producer_epoch, event.epoch),
            )
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
            # A pause starts with nobody quiet: each producer reports it anew (a flag left from
            # an earlier pause says nothing about what the producer did since).
            paused = PauseState(event.reason, event.paused_at_ms)
            return attrs.evolve(state, paused=paused, producers=_unquiet(producers))
        case ProducersResumed():
            return attrs.evolve(state, paused=None, producers=_unquiet(producers))
        case ReshardModeSet():
            return attrs.evolve(state, reshard_mode=event.mode)
        case RetentionSet():
            return attrs.evolve(state, retention=event.retention)
        case RetentionLoss():
            return state  # a record: the count is kept in Redis beside the shard
        case MigrationStarted():
            return attrs.evolve(state, migration=event.migration)
        case MigrationPhaseChanged():
            m = _migration(state)
            phases = (*m.phases, PhaseStarted(event.phase, event.at_ms))
            moved = attrs.evolve(m, phases=phases, deadline_ms=event.deadline_ms, stalled=None)
            return attrs.evolve(state, migration=moved)
        case MigrationStalled():
            return attrs.evolve(state, migration=attrs.evolve(_migration(state), stalled=event.stall))
        case MigrationResumed():
            resumed = attrs.evolve(_migration(state), stalled=None, deadline_ms=event.deadline_ms)
            return attrs.evolve(state, migration=resumed)
        case MigrationAborted():
            m = _migration(state)
            phases = (*m.phases, PhaseStarted(MigrationPhase.ABORTED, event.at_ms))
            aborted = attrs.evolve(m, phases=phases, deadline_ms=None, stalled=None, outcome=event.reason)
            return attrs.evolve(state, migration=aborted)
        case _:
            assert_never(event)


def _migration(state: StreamState) -> Migration:
    if state.migration is None or not state.migration.running:
        raise CorruptHistory("a migration event with no running migration")
    return state.migration


def _unquiet(producers: Mapping[str, Producer]) -> Mapping[str, Producer]:
    if not any(p.quiesced for p in producers.values()):
        return producers
    return {k: attrs.evolve(p, quiesced=False) for k, p in producers.items()}


def _producer(state: StreamState, producer_id: str) -> Producer:
    producer = state.producers.get(producer_id)
    if producer is None:
        raise CorruptHistory(f"no producer {producer_id!r}")
    return producer


def _restate(state: StreamState, indexes: frozenset[int], to: ShardState, version: int) -> StreamState:
    shards = tuple(attrs.evolve(s, state=to) if s.index in indexes else s for s in state.layout.shards)
    return attrs.evolve(state, layout=attrs.evolve(state.layout, shards=shards, metadata_version=version))


def fold(events: Iterable[StreamEvent], state: StreamState | None = None) -> StreamState | None:
    """Apply `events` in order, starting from `state` (None: from nothing)."""
    for event in events:
        state = evolve(state, event)
    return state


def folded(events: list[StreamEvent], state: StreamState) -> StreamState:
    """`state` with `events` applied (the deciding rules' look ahead: a state stays a state)."""
    after = fold(events, state)
    assert after is not None  # events applied to a state
    return after


def stale_producers(state: StreamState) -> list[str]:
    """Live producers still routing with an older layout than the current one (it may still
    route to a DRAINING shard): no shard retires until each has caught up or expired."""
    version = state.layout.metadata_version
    return sorted(p.producer_id for p in state.producers.values() if p.acked_version != version)
