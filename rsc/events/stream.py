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

from rsc.events import quotas
from rsc.events.commands import (
    AbortMigration,
    AdvanceMigration,
    ChangeShardCount,
    CreateStream,
    DeleteStream,
    PauseProducers,
    ProducerHeartbeat,
    RegisterGroup,
    RestartTimers,
    ResumeMigration,
    ResumeProducers,
    RetireShards,
    StreamCommand,
    Tick,
    UnregisterGroup,
)
from rsc.events.errors import (
    AggregateNotFound,
    CorruptHistory,
    Deleted,
    InvalidCommand,
    MigrationConflict,
    NoMigration,
    NotEmpty,
    QuotaExceeded,
)
from rsc.events.events import (
    GroupRegistered,
    GroupUnregistered,
    MigrationAborted,
    MigrationPhaseChanged,
    MigrationResumed,
    MigrationStalled,
    MigrationStarted,
    ProducerAcknowledged,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    ReshardModeSet,
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
    Migration,
    MigrationPhase,
    PauseState,
    PhaseStarted,
    Producer,
    ReshardMode,
    Shard,
    ShardState,
    Stall,
    StartFrom,
    check_client,
    check_counter,
    check_id,
    check_name,
    is_plain_text,
)
from rsc.events.placement import place
from rsc.events.slots import Topology

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
    #: The running resharding, or the last one (DONE or ABORTED) until the next begins.
    migration: Migration | None = attrs.field(default=None, metadata={"omit_if_default": True})

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
            # A pause starts with nobody quiet: each producer reports it anew (a flag left from
            # an earlier pause says nothing about what the producer did since).
            paused = PauseState(event.reason, event.paused_at_ms)
            return attrs.evolve(state, paused=paused, producers=_unquiet(producers))
        case ProducersResumed():
            return attrs.evolve(state, paused=None, producers=_unquiet(producers))
        case ReshardModeSet():
            return attrs.evolve(state, reshard_mode=event.mode)
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
            return _reshard(state, command)
        case RetireShards():
            return _then_advance(state, _retire(state, command), command.now_ms)
        case AdvanceMigration():
            read = (command.migration_id, command.read_at_ms)
            return _advance(state, command.now_ms, command.evidence, command.topology, read)
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
            return _then_advance(state, _producer_heartbeat(state, command), command.now_ms)
        case PauseProducers():
            holding = _unswitched(state)
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
            holding = _unswitched(state)
            if holding is not None:
                raise MigrationConflict(
                    f"migration {holding.migration_id} keeps the producers paused until it switches "
                    f"the layout (phase {holding.phase.value}); abort it to resume them now"
                )
            return [ProducersResumed(command.now_ms)] if state.paused is not None else []
        case Tick():
            gone: list[StreamEvent] = [
                ProducerExpired(producer_id, command.now_ms)
                for producer_id in state.producers
                if expired(command.leases, producer_id, command.now_ms)
            ]
            gone = _then_advance(state, gone, command.now_ms)
            return gone + _stall_if_late(_fold(gone, state), command.now_ms)
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
    # Quiet means something only while the stream is paused: a heartbeat built before the
    # producer learnt of a resume still says quiesced, and is publishing again after it.
    quiesced = command.quiesced and state.paused is not None
    events: list[StreamEvent] = []
    if known is None and command.max_producers and len(state.producers) >= command.max_producers:
        raise QuotaExceeded(
            f"the stream has {command.max_producers} live producers, as many as this caller's "
            f"quota {quotas.PRODUCERS_PER_STREAM} allows; a producer may start once another stops",
            quotas.PRODUCERS_PER_STREAM,
            command.max_producers,
        )
    if known is None:
        registered = ProducerRegistered(
            command.producer_id, acked, quiesced, command.lease_ttl_ms, command.client, command.now_ms
        )
        events.append(registered)
    elif (known.acked_version, known.quiesced) != (acked, quiesced):
        events.append(ProducerAcknowledged(command.producer_id, acked, quiesced))
    # Its lease starts (a registration) or is renewed: liveness for the lease table.
    events.append(ProducerHeartbeated(command.producer_id, command.now_ms + command.lease_ttl_ms))
    return events


def _create(state: StreamState | None, command: CreateStream) -> list[StreamEvent]:
    check_name(command.stream_prefix, "streamPrefix")
    _check_count(command.shard_count)
    if state is not None and not state.deleted:
        return []  # idempotent: the stream exists, resharding is a separate command
    check_counter(command.metadata_version, "metadataVersion")
    if command.metadata_version < 1:
        raise InvalidCommand("a stream's first metadataVersion is at least 1")
    if command.found_keys:  # a lost stream rebuilt from the shard keys Redis still holds
        shards = tuple(Shard(i, key) for i, key in sorted(command.found_keys))
        if len({s.index for s in shards}) != len(shards) or len(shards) > MAX_SHARDS:
            raise InvalidCommand("found shard keys must have distinct indexes, at most MAX_SHARDS")
    else:
        indexes = range(command.shard_count)
        keys = place(command.stream_prefix, indexes, (), command.topology)
        shards = tuple(Shard(i, key) for i, key in zip(indexes, keys, strict=True))
    return [StreamCreated(command.stream_prefix, Layout(command.metadata_version, shards), command.now_ms)]


def _reshard(state: StreamState, command: ChangeShardCount) -> list[StreamEvent]:
    _check_count(command.shard_count)
    if command.mode is ReshardMode.QUIESCE and not command.migrations:
        raise InvalidCommand("reshardMode quiesce needs the feature level that journals migrations")
    events: list[StreamEvent] = []
    if command.migrations and command.mode is not state.reshard_mode:
        events.append(ReshardModeSet(command.mode))
    holding = _unswitched(state)
    if holding is not None:
        if (command.shard_count, command.mode) == (holding.to_count, holding.mode):
            return events  # the same request again: it is running
        then = (
            "resume or abort it first"
            if holding.stalled is not None
            else "wait until it switches, or abort it"
        )
        raise MigrationConflict(
            f"migration {holding.migration_id} ({holding.mode.value}, {holding.from_count} -> "
            f"{holding.to_count} shards) is in phase {holding.phase.value}: {then}"
        )
    active = len(state.layout.active)
    if command.shard_count == active:
        return events
    if not command.migrations:
        return events + _layout_change(state, command.shard_count, command.topology)
    previous = state.migration
    running = previous if previous is not None and previous.running else None
    migration = Migration(
        migration_id=previous.migration_id + 1 if previous is not None else 1,
        mode=command.mode,
        from_count=active,
        to_count=command.shard_count,
        from_version=state.layout.metadata_version,
        started_at_ms=command.now_ms,
        phases=(),
        bounds=command.bounds,
        supersedes=running.migration_id if running is not None else None,
    )
    if command.mode is ReshardMode.ONLINE:
        started = attrs.evolve(migration, phases=(PhaseStarted(MigrationPhase.SWITCHING, command.now_ms),))
        events.append(MigrationStarted(started))
        events.extend(_layout_change(state, command.shard_count, command.topology))
    else:
        pausing = PhaseStarted(MigrationPhase.PAUSING, command.now_ms)
        started = attrs.evolve(
            migration,
            phases=(pausing,),
            deadline_ms=command.now_ms + command.bounds.pausing_ms,
            paused_producers=state.paused is None,
        )
        events.append(MigrationStarted(started))
        if state.paused is None:
            reason = f"migration {started.migration_id}: {active} -> {command.shard_count} shards (quiesce)"
            events.append(ProducersPaused(reason, command.now_ms))
    return _then_advance(state, events, command.now_ms, command.topology)


def target_count(state: StreamState) -> int:
    """The shard count the stream is at or on its way to (the Admin API spec's `shardCount`):
    the target of a migration that has not switched the layout yet, else the ACTIVE count."""
    holding = _unswitched(state)
    return holding.to_count if holding is not None else state.shard_count


def waiting_for(state: StreamState) -> list[str]:
    """The producers the running migration waits for: those not quiesced (PAUSING, QUIESCED) or
    not yet on the current layout (SWITCHING, DRAINING)."""
    m = state.migration
    if m is None or not m.running:
        return []
    if m.phase in (MigrationPhase.PAUSING, MigrationPhase.QUIESCED):
        return sorted(p.producer_id for p in state.producers.values() if not p.quiesced)
    return stale_producers(state)


def _fold(events: list[StreamEvent], state: StreamState) -> StreamState:
    after = fold(events, state)
    assert after is not None  # events applied to a state
    return after


def _unswitched(state: StreamState) -> Migration | None:
    """The running migration if it has not changed the layout yet (it holds producers paused)."""
    m = state.migration
    return m if m is not None and m.running and not m.phase.switched else None


def _layout_change(state: StreamState, shard_count: int, topology: Topology | None) -> list[StreamEvent]:
    active = state.layout.active
    version = state.layout.metadata_version + 1
    if shard_count > len(active):
        start = max((s.index for s in state.layout.shards), default=-1) + 1
        indexes = range(start, start + shard_count - len(active))
        keys = place(state.stream_prefix, indexes, (s.key for s in active), topology)
        added = tuple(Shard(i, key) for i, key in zip(indexes, keys, strict=True))
        return [ShardsAdded(added, version)]
    if shard_count < len(active):
        return [ShardsDraining(frozenset(s.index for s in active[shard_count:]), version)]
    return []


def _then_advance(
    state: StreamState, events: list[StreamEvent], now_ms: int, topology: Topology | None = None
) -> list[StreamEvent]:
    """`events`, then whatever they let the migration move on to (nothing without one running)."""
    if not moving(state) and not any(isinstance(e, MigrationStarted) for e in events):
        return events
    return events + _advance(_fold(events, state), now_ms, None, topology)


def moving(state: StreamState | None) -> bool:
    """A migration runs and is not stalled: producers' heartbeats, expiries, retirements and
    ticks (its phase bound) may move it on."""
    m = state.migration if state is not None and not state.deleted else None
    return m is not None and m.running and m.stalled is None


def _advance(
    state: StreamState | None,
    now_ms: int,
    evidence: Mapping[int, DrainCheck] | None,
    topology: Topology | None,
    read: tuple[int, int] = (0, 0),
) -> list[StreamEvent]:
    """The phase changes the running migration makes now (`evidence`: of every readable shard,
    which QUIESCED waits for; None: not read this time). A stalled migration stays put."""
    out: list[StreamEvent] = []
    while state is not None:
        m = state.migration
        if m is None or not m.running or m.stalled is not None:
            break
        step = _step(state, m, now_ms, evidence, topology, read)
        if not step:
            break
        out.extend(step)
        state = fold(step, state)
    return out


def _step(
    state: StreamState,
    m: Migration,
    now_ms: int,
    evidence: Mapping[int, DrainCheck] | None,
    topology: Topology | None,
    read: tuple[int, int],
) -> list[StreamEvent]:
    """`read`: the migration the evidence was read for, and when its reading began."""
    read_for, read_at = read
    match m.phase:
        case MigrationPhase.PAUSING:
            if not quiet(state):
                return []
            deadline = now_ms + m.bounds.quiesced_ms
            return [MigrationPhaseChanged(MigrationPhase.QUIESCED, now_ms, deadline)]
        case MigrationPhase.QUIESCED:
            if evidence is None or not quiet(state) or not consumed(state, evidence):
                return []
            if read_for != m.migration_id or read_at < m.phases[-1].at_ms:
                return []  # read for another migration, or before this phase began
            events = _layout_change(state, m.to_count, topology)
            events.append(MigrationPhaseChanged(MigrationPhase.SWITCHING, now_ms))
            if m.paused_producers and state.paused is not None:
                events.append(ProducersResumed(now_ms))
            return events
        case MigrationPhase.SWITCHING:
            if stale_producers(state):
                return []
            following = MigrationPhase.DRAINING if state.layout.draining else MigrationPhase.DONE
            return [MigrationPhaseChanged(following, now_ms)]
        case MigrationPhase.DRAINING:
            return [] if state.layout.draining else [MigrationPhaseChanged(MigrationPhase.DONE, now_ms)]
        case _:
            return []


def quiet(state: StreamState) -> bool:
    """Every live producer reports `quiesced` (those that expired or left do not count)."""
    return all(p.quiesced for p in state.producers.values())


def consumed(state: StreamState, evidence: Mapping[int, DrainCheck]) -> bool:
    """Redis shows, on every readable shard, every group done: nothing pending, nothing left to
    deliver (so everything appended before the producers quiesced was handled)."""
    return all(
        (check := evidence.get(i)) is not None and check.drained for i in state.layout.readable_indexes
    )


def _stall_if_late(state: StreamState, now_ms: int) -> list[StreamEvent]:
    m = state.migration
    if m is None or not m.running or m.stalled is not None or m.deadline_ms is None:
        return []
    if now_ms < m.deadline_ms:
        return []
    bound = m.bounds.of(m.phase)
    if m.phase is MigrationPhase.PAUSING:
        waiting = sorted(p.producer_id for p in state.producers.values() if not p.quiesced)
        reason = f"producers {waiting} did not report quiesced within {bound} ms"
    else:
        reason = (
            f"the groups had not consumed and acknowledged everything on every shard within {bound} ms"
            " (or a producer stopped being quiesced)"
        )
    return [MigrationStalled(Stall(m.phase, now_ms, reason))]


def _resume_migration(state: StreamState, command: ResumeMigration) -> list[StreamEvent]:
    m = state.migration
    if m is None or not m.running or m.stalled is None:
        raise NoMigration("no stalled migration to resume")
    bound = m.bounds.of(m.phase)
    resumed = MigrationResumed(command.now_ms, None if bound is None else command.now_ms + bound)
    return [resumed, *_advance(_fold([resumed], state), command.now_ms, None, command.topology)]


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
