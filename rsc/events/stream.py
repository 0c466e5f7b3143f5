"""The stream aggregate: the layout of one logical stream and its resharding.

Rules:

* `metadata_version` bumps on every layout change, and only then.
* Shard indexes are identities: never reused. Scale-out appends new ACTIVE
  shards after the highest index; scale-in turns the highest ACTIVE shards
  DRAINING; a DRAINING shard becomes RETIRED only by `RetireShards`, which the
  caller sends once Redis-level drain evidence is in.
* Shard key names are chosen by the aggregate (`placement`: spread over the
  cluster's primaries, the topology being an input of the command; here for
  a new stream, in `migration` for a scale-out) and stored in the layout;
  clients never compute them.
* Producers register by heartbeat. Registration, a change of the layout
  version a producer acknowledges (or of its `quiesced` flag), expiry and the
  pause state are journaled. Leases are not part of the state
  (`rsc.events.liveness`): every heartbeat, a registration's included, emits
  `ProducerHeartbeated`, the driver keeps the lease table, and a `Tick`
  brings it in to expire those whose lease ended. They restart in full on
  recovery, as members' do.

This module is the aggregate's API and its decisions per command (creation,
groups, producers' heartbeats, pauses, retirements, an operator's resume or
abort of a migration, ticks); beside it, `stream_state` holds the state and
`evolve`, and `migration` resharding and its phases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import assert_never

from rsc.events import codec, quotas
from rsc.events.commands import (
    AbortMigration,
    AdoptShardKeys,
    AdvanceMigration,
    ChangeShardCount,
    CreateStream,
    DeleteStream,
    PauseProducers,
    ProducerHeartbeat,
    RecordRetentionLoss,
    RegisterGroup,
    RestartTimers,
    ResumeMigration,
    ResumeProducers,
    RetireShards,
    SetRetention,
    StreamCommand,
    Tick,
    UnregisterGroup,
)
from rsc.events.errors import (
    AggregateNotFound,
    Deleted,
    FeatureLevelNotSupported,
    InvalidCommand,
    MigrationConflict,
    NoMigration,
    NotEmpty,
    ProducerFenced,
    QuotaExceeded,
)
from rsc.events.events import (
    GroupRegistered,
    GroupUnregistered,
    MigrationAborted,
    MigrationResumed,
    ProducerAcknowledged,
    ProducerEpochAssigned,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    RetentionLoss,
    RetentionSet,
    ShardsAdded,
    ShardsDraining,
    ShardsRetired,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
)
from rsc.events.liveness import expired
from rsc.events.migration import advance, moving, reshard, stall_if_late, then_advance, unswitched
from rsc.events.model import (
    ClientInfo,
    DrainCheck,
    Layout,
    Shard,
    ShardState,
    check_client,
    check_counter,
    check_id,
    check_name,
    is_plain_text,
)
from rsc.events.placement import place
from rsc.events.stream_state import StreamState, evolve, fold, folded, stale_producers
from rsc.events.versions import RETENTION_LEVEL, Party

#: The aggregate's API: its state, deciding and applying events, what the Admin API and the
#: drain watcher ask of it, and the limits on what it is asked.
__all__ = [
    "MAX_CONCURRENCY",
    "MAX_REASON",
    "MAX_SHARDS",
    "StreamState",
    "decide",
    "evolve",
    "execute",
    "fold",
    "retirable",
]

#: One shard per Redis Cluster hash slot is the most that can ever help.
MAX_SHARDS = 16_384
#: The longest pause reason kept.
MAX_REASON = 200
#: The most workers one member may be told to run (`maxConcurrency`).
MAX_CONCURRENCY = 1_024


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
            _check_count(command.shard_count)
            return reshard(state, command)
        case RetireShards():
            return then_advance(state, _retire(state, command), command.now_ms)
        case AdoptShardKeys():
            return _adopt_keys(state, command)
        case AdvanceMigration():
            read = (command.migration_id, command.read_at_ms)
            return advance(state, command.now_ms, command.evidence, command.topology, read)
        case ResumeMigration():
            return _resume_migration(state, command)
        case AbortMigration():
            return _abort_migration(state, command)
        case RegisterGroup():
            check_name(command.group, "consumerGroup")
            if state.groups.get(command.group) == command.start_from:
                return []
            return [GroupRegistered(command.group, command.start_from)]
        case ProducerHeartbeat():
            return then_advance(state, _producer_heartbeat(state, command), command.now_ms)
        case PauseProducers():
            holding = unswitched(state)
            if holding is not None and holding.paused_producers:
                raise MigrationConflict(
                    f"migration {holding.migration_id} holds the producers paused and resumes them "
                    f"when it switches the layout (phase {holding.phase.value}); pause them again "
                    "after that, or abort it"
                )
            if state.paused is not None:
                return []  # idempotent: the first pause's reason and time stay
            if not (command.reason and is_plain_text(command.reason, MAX_REASON)):
                raise InvalidCommand(
                    f"a pause needs a reason of 1-{MAX_REASON} characters, no control characters"
                )
            return [ProducersPaused(command.reason, command.now_ms)]
        case ResumeProducers():
            holding = unswitched(state)
            if holding is not None:
                raise MigrationConflict(
                    f"migration {holding.migration_id} keeps the producers paused until it switches "
                    f"the layout (phase {holding.phase.value}); abort it to resume them now"
                )
            return [ProducersResumed(command.now_ms)] if state.paused is not None else []
        case SetRetention():
            if command.retention.refuses:
                producers = [(p.producer_id, p.client) for p in state.producers.values()]
                _check_producers_check_the_cap(state.stream_prefix, producers)
            return [] if state.retention == command.retention else [RetentionSet(command.retention)]
        case RecordRetentionLoss():
            indexes = {s.index for s in state.layout.shards}
            return [
                RetentionLoss(command.shard, group, lost, command.now_ms)
                for group, lost in command.losses
                if lost > 0 and command.shard in indexes
            ]
        case Tick():
            gone: list[StreamEvent] = [
                ProducerExpired(producer_id, command.now_ms)
                for producer_id in state.producers
                if expired(command.leases, producer_id, command.now_ms)
            ]
            gone = then_advance(state, gone, command.now_ms)
            return gone + stall_if_late(folded(gone, state), command.now_ms)
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
        superseded = known is not None and command.epochs and 0 < (command.epoch or 0) < known.epoch
        if known is None or superseded:  # a fenced process leaving leaves its successor be
            return []
        return [ProducerLeft(command.producer_id, command.now_ms)]
    # Quiet means something only while the stream is paused: a heartbeat built before the
    # producer learnt of a resume still says quiesced, and is publishing again after it.
    quiesced = command.quiesced and state.paused is not None
    events: list[StreamEvent] = []
    if known is None and state.retention is not None and state.retention.refuses:
        _check_producers_check_the_cap(state.stream_prefix, [(command.producer_id, command.client)])
    if known is None and command.max_producers and len(state.producers) >= command.max_producers:
        raise QuotaExceeded(
            f"the stream has {command.max_producers} live producers, as many as this caller's "
            f"quota {quotas.PRODUCERS_PER_STREAM} allows; a producer may start once another stops",
            quotas.PRODUCERS_PER_STREAM,
            command.max_producers,
        )
    epoch = _producer_epoch(state, command)
    new_process = epoch is not None and (known is None or known.epoch != epoch)
    if known is None or new_process:
        registered = ProducerRegistered(
            command.producer_id, acked, quiesced, command.lease_ttl_ms, command.client, command.now_ms
        )
        events.append(registered)
    elif (known.acked_version, known.quiesced) != (acked, quiesced):
        events.append(ProducerAcknowledged(command.producer_id, acked, quiesced))
    if new_process and epoch is not None:
        events.append(ProducerEpochAssigned(command.producer_id, epoch))
    # Its lease starts (a registration) or is renewed: liveness for the lease table.
    events.append(ProducerHeartbeated(command.producer_id, command.now_ms + command.lease_ttl_ms))
    return events


def _producer_epoch(state: StreamState, command: ProducerHeartbeat) -> int | None:
    """The epoch the producer appends with after this heartbeat (None: no epochs: below
    feature level 6, or a client that asks for none). A new process (epoch 0) gets the next
    one of the stream, at least the time in ms (epochs of an earlier incarnation of the stream,
    whose records in Redis may outlive it, are lower), fencing an older process of the same id;
    a process already holding one keeps it, or is refused (`ProducerFenced`) when a newer
    process took its id since. An epoch
    the stream does not know (its producer expired, or the coordinator's state was rebuilt) is
    taken back as it is: the data plane refuses what is older than its shards saw."""
    if not command.epochs or command.epoch is None:
        return None
    known = state.producers.get(command.producer_id)
    if command.epoch == 0:  # never lower than now in ms: unique across a deleted and recreated
        # stream, a rebuilt one, a restored older copy (whose records in Redis outlive them)
        return max(state.producer_epoch + 1, command.now_ms)
    if known is not None and known.epoch > command.epoch:
        raise ProducerFenced(
            f"producer {command.producer_id!r} epoch {command.epoch} is fenced: another process "
            f"registered the id since (epoch {known.epoch}); this one must stop",
            known.epoch,
        )
    return command.epoch


def _check_producers_check_the_cap(stream_prefix: str, producers: Iterable[tuple[str, ClientInfo]]) -> None:
    """A stream whose retention refuses appends to full shards takes no producer whose client
    does not check the cap (below feature level 5 it runs the append script without it and
    would go past it). Raises `FeatureLevelNotSupported`, naming them."""
    old = [
        Party("producer", producer_id, client.version, client.feature_level)
        for producer_id, client in producers
        if client.feature_level < RETENTION_LEVEL
    ]
    if old:
        names = ", ".join(f"{p.name} ({p.version}, up to level {p.feature_level})" for p in old)
        raise FeatureLevelNotSupported(
            f"stream {stream_prefix!r}'s retention refuses appends to full shards (whenFull refuse), "
            f"which only producers of feature level {RETENTION_LEVEL} or above check; not {names}: "
            "upgrade them, or choose whenFull drop-oldest",
            [codec.wire.unstructure(p) for p in old],
        )


def _create(state: StreamState | None, command: CreateStream) -> list[StreamEvent]:
    check_name(command.stream_prefix, "streamPrefix")
    _check_count(command.shard_count)
    if state is not None and not state.deleted:
        return []  # idempotent: the stream exists, resharding is a separate command
    check_counter(command.metadata_version, "metadataVersion")
    if command.metadata_version < 1:
        raise InvalidCommand("a stream's first metadataVersion is at least 1")
    if command.found_keys:  # a lost stream rebuilt from the shard keys Redis still holds
        shards = tuple(
            Shard(i, key, ShardState.DRAINING if i in command.sealed else ShardState.ACTIVE)
            for i, key in sorted(command.found_keys)
        )
        if len({s.index for s in shards}) != len(shards) or len(shards) > MAX_SHARDS:
            raise InvalidCommand("found shard keys must have distinct indexes, at most MAX_SHARDS")
    else:
        indexes = range(command.shard_count)
        keys = place(command.stream_prefix, indexes, (), command.topology)
        shards = tuple(Shard(i, key) for i, key in zip(indexes, keys, strict=True))
    created: list[StreamEvent] = [
        StreamCreated(command.stream_prefix, Layout(command.metadata_version, shards), command.now_ms)
    ]
    if command.retention is not None:
        created.append(RetentionSet(command.retention))
    return created


def _adopt_keys(state: StreamState, command: AdoptShardKeys) -> list[StreamEvent]:
    """Add the found keys the layout has neither by index nor by name, ACTIVE then DRAINING at
    once (two existing events: keys and consumer groups at `0` are made, then sealed), so that
    no producer is ever routed to them and every group reads them to their end. Nothing while a
    migration moves (it changes the layout itself; asked again later)."""
    layout = state.layout
    indexes, keys = {s.index for s in layout.shards}, {s.key for s in layout.shards}
    new = tuple(Shard(i, k) for i, k in sorted(command.found) if i not in indexes and k not in keys)
    if not new or moving(state) or len(layout.shards) + len(new) > MAX_SHARDS:
        return []
    version = layout.metadata_version
    check_counter(version + 2, "metadataVersion")
    return [ShardsAdded(new, version + 1), ShardsDraining(frozenset(s.index for s in new), version + 2)]


def _resume_migration(state: StreamState, command: ResumeMigration) -> list[StreamEvent]:
    m = state.migration
    if m is None or not m.running or m.stalled is None:
        raise NoMigration("no stalled migration to resume")
    bound = m.bounds.of(m.phase)
    resumed = MigrationResumed(command.now_ms, None if bound is None else command.now_ms + bound)
    return [resumed, *advance(folded([resumed], state), command.now_ms, None, command.topology)]


def _abort_migration(state: StreamState, command: AbortMigration) -> list[StreamEvent]:
    m = state.migration
    if m is None or not m.running:
        raise NoMigration("no running migration to abort")
    if m.phase.switched:
        raise MigrationConflict(
            f"migration {m.migration_id} already changed the layout (phase {m.phase.value}); "
            "reshard again to undo it"
        )
    if not is_plain_text(command.reason, MAX_REASON) or not command.reason:
        raise InvalidCommand(f"an abort needs a reason of 1-{MAX_REASON} characters, no control characters")
    events: list[StreamEvent] = [MigrationAborted(command.now_ms, command.reason)]
    if m.paused_producers and state.paused is not None:
        events.append(ProducersResumed(command.now_ms))
    return events


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
