"""Resharding: a change of shard count, its layout change and its migration's phases.

`reshard` starts one (`ChangeShardCount`): below the feature level that journals
migrations, the layout changes at once; from it, a `Migration` is recorded and
moves through PAUSING -> QUIESCED (quiesce mode) -> SWITCHING -> DRAINING ->
DONE, each phase entered at a recorded time (docs/protocol.md, Resharding).
`advance` makes every phase change the state allows now, `then_advance` after
other events (a producer's heartbeat, an expiry, a retirement), and
`stall_if_late` stops a migration past its phase's bound until an operator
resumes or aborts it. New shards' keys are placed here (`placement`).

The rules it keeps: phases only move forward; a migration that has not changed
the layout keeps the producers paused and the ACTIVE shards as they were;
QUIESCED and the switch need every live producer quiesced and, for the switch,
Redis evidence, read for this migration after QUIESCED began, that every
readable shard is consumed; DONE needs nothing DRAINING; a stalled migration
stays put.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from rsc.events.commands import ChangeShardCount
from rsc.events.errors import InvalidCommand, MigrationConflict
from rsc.events.events import (
    MigrationPhaseChanged,
    MigrationStalled,
    MigrationStarted,
    ProducersPaused,
    ProducersResumed,
    ReshardModeSet,
    ShardsAdded,
    ShardsDraining,
    StreamEvent,
)
from rsc.events.model import (
    DrainCheck,
    Migration,
    MigrationPhase,
    PhaseStarted,
    ReshardMode,
    Shard,
    Stall,
)
from rsc.events.placement import place
from rsc.events.slots import Topology
from rsc.events.stream_state import StreamState, fold, folded, stale_producers


def reshard(state: StreamState, command: ChangeShardCount) -> list[StreamEvent]:
    """The events of a change of shard count (the caller checked its range): the mode, stored
    when it changes; then, below the level that journals migrations, the layout change at
    once, else a new migration (superseding a running one that already switched the layout).
    While a migration has not switched, the same request again adds nothing and another is
    refused (`MigrationConflict`)."""
    if command.mode is ReshardMode.QUIESCE and not command.migrations:
        raise InvalidCommand("reshardMode quiesce needs the feature level that journals migrations")
    events: list[StreamEvent] = []
    if command.migrations and command.mode is not state.reshard_mode:
        events.append(ReshardModeSet(command.mode))
    holding = unswitched(state)
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
    return then_advance(state, events, command.now_ms, command.topology)


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


def target_count(state: StreamState) -> int:
    """The shard count the stream is at or on its way to (the Admin API spec's `shardCount`):
    the target of a migration that has not switched the layout yet, else the ACTIVE count."""
    holding = unswitched(state)
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


def unswitched(state: StreamState) -> Migration | None:
    """The running migration if it has not changed the layout yet (it holds producers paused)."""
    m = state.migration
    return m if m is not None and m.running and not m.phase.switched else None


def moving(state: StreamState | None) -> bool:
    """A migration runs and is not stalled: producers' heartbeats, expiries, retirements and
    ticks (its phase bound) may move it on."""
    m = state.migration if state is not None and not state.deleted else None
    return m is not None and m.running and m.stalled is None


def then_advance(
    state: StreamState, events: list[StreamEvent], now_ms: int, topology: Topology | None = None
) -> list[StreamEvent]:
    """`events`, then whatever they let the migration move on to (nothing without one running)."""
    if not moving(state) and not any(isinstance(e, MigrationStarted) for e in events):
        return events
    return events + advance(folded(events, state), now_ms, None, topology)


def advance(
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


def stall_if_late(state: StreamState, now_ms: int) -> list[StreamEvent]:
    """The running migration stalls if its phase's bound has passed at `now_ms`: it moves no
    further until an operator resumes or aborts it."""
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
