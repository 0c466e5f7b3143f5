"""Migrations in the stream core: quiesce mode's phases, bounds, stalls, resume and abort;
online migrations; what a running migration allows; the journal format of a migration."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from rsc.events import codec
from rsc.events.commands import (
    AbortMigration,
    AdvanceMigration,
    ChangeShardCount,
    CreateStream,
    PauseProducers,
    ProducerHeartbeat,
    ResumeMigration,
    ResumeProducers,
    RetireShards,
    StreamCommand,
    Tick,
)
from rsc.events.errors import InvalidCommand, MigrationConflict, NoMigration
from rsc.events.events import (
    MigrationAborted,
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
from rsc.events.liveness import Leases
from rsc.events.migration import target_count, waiting_for
from rsc.events.model import DrainCheck, MigrationBounds, MigrationPhase, ReshardMode, ShardState
from rsc.events.stream import StreamState, decide, fold

Q = ReshardMode.QUIESCE
BOUNDS = MigrationBounds(pausing_ms=5_000, quiesced_ms=10_000)
LEASE = 60_000
DRAINED = DrainCheck(sealed=False, drained=True)
BUSY = DrainCheck(sealed=False, drained=False)


class Stream:
    """A stream state driven command by command, keeping the events and the lease table."""

    def __init__(self, shards: int = 4, producers: tuple[str, ...] = ("p1", "p2")) -> None:
        self.state: StreamState | None = None
        self.leases = Leases()
        self.run(CreateStream("orders", shards, 0))
        for p in producers:
            self.beat(p)

    def run(self, command: StreamCommand) -> list[StreamEvent]:
        events = decide(self.state, command)
        self.state = fold(events, self.state)
        self.leases.apply(events)
        return events

    @property
    def s(self) -> StreamState:
        assert self.state is not None
        return self.state

    def beat(self, producer: str, quiesced: bool = False, now: int = 0) -> list[StreamEvent]:
        version = self.s.layout.metadata_version
        return self.run(ProducerHeartbeat(producer, version, quiesced, now, LEASE))

    def advance(self, now: int, evidence: Mapping[int, DrainCheck] | None = None) -> list[StreamEvent]:
        """The drain watcher's `AdvanceMigration`: evidence read at `now` for the running migration."""
        m = self.s.migration
        read_for = m.migration_id if m is not None else 0
        return self.run(AdvanceMigration(now, evidence or {}, None, read_for, now))

    def evidence(self, check: DrainCheck = DRAINED) -> dict[int, DrainCheck]:
        return dict.fromkeys(self.s.layout.readable_indexes, check)

    @property
    def phase(self) -> MigrationPhase:
        assert self.s.migration is not None
        return self.s.migration.phase


def phases(events: list[StreamEvent]) -> list[MigrationPhase]:
    return [e.phase for e in events if isinstance(e, MigrationPhaseChanged)]


def test_quiesce_scale_in_pauses_waits_for_quiet_and_consumption_then_switches_and_resumes() -> None:
    s = Stream(4)
    events = s.run(ChangeShardCount(2, Q, 100, bounds=BOUNDS, migrations=True))
    assert [type(e) for e in events] == [ReshardModeSet, MigrationStarted, ProducersPaused]
    m = s.s.migration
    assert m is not None
    assert (m.migration_id, m.mode, m.from_count, m.to_count, m.deadline_ms) == (1, Q, 4, 2, 5_100)
    assert (s.phase, s.s.paused is not None, target_count(s.s), s.s.shard_count) == (
        MigrationPhase.PAUSING,
        True,
        2,
        4,
    )
    assert waiting_for(s.s) == ["p1", "p2"]
    # Producers are held: resuming them by hand is refused while the migration holds them.
    with pytest.raises(MigrationConflict):
        decide(s.s, ResumeProducers(150))
    assert phases(s.beat("p1", quiesced=True, now=200)) == []
    assert phases(s.beat("p2", quiesced=True, now=300)) == [MigrationPhase.QUIESCED]
    assert s.s.migration is not None
    assert s.s.migration.deadline_ms == 10_300
    # QUIESCED waits for Redis: missing or partial evidence moves nothing.
    assert s.advance(400) == []
    assert s.advance(400, {0: DRAINED, 1: DRAINED, 2: DRAINED}) == []
    assert s.advance(400, s.evidence() | {3: BUSY}) == []
    # A producer that stops being quiesced is waited for too.
    s.beat("p1", quiesced=False, now=450)
    assert s.advance(460, s.evidence()) == []
    s.beat("p1", quiesced=True, now=470)
    version = s.s.layout.metadata_version
    events = s.advance(500, s.evidence())
    assert [type(e) for e in events] == [ShardsDraining, MigrationPhaseChanged, ProducersResumed]
    assert (s.phase, s.s.paused, s.s.shard_count, s.s.layout.metadata_version) == (
        MigrationPhase.SWITCHING,
        None,
        2,
        version + 1,
    )
    # SWITCHING waits until every producer routes with the new layout.
    assert phases(s.beat("p1", now=600)) == []
    assert waiting_for(s.s) == ["p2"]
    assert phases(s.beat("p2", now=700)) == [MigrationPhase.DRAINING]
    sealed = {i: DrainCheck(True, True) for i in (2, 3)}
    assert phases(s.run(RetireShards(frozenset({2, 3}), 800, sealed))) == [MigrationPhase.DONE]
    m = s.s.migration
    assert m is not None
    assert [p.phase for p in m.phases] == [
        MigrationPhase.PAUSING,
        MigrationPhase.QUIESCED,
        MigrationPhase.SWITCHING,
        MigrationPhase.DRAINING,
        MigrationPhase.DONE,
    ]
    assert [p.at_ms for p in m.phases] == [100, 300, 500, 700, 800]
    assert not m.running


def test_quiesce_scale_out_without_producers_runs_through_on_the_first_evidence() -> None:
    s = Stream(0, producers=())
    events = s.run(ChangeShardCount(3, Q, 10, bounds=BOUNDS, migrations=True))
    assert phases(events) == [MigrationPhase.QUIESCED]  # nobody to wait for
    events = s.advance(20, {})
    kinds = [type(e) for e in events]
    assert kinds == [ShardsAdded, MigrationPhaseChanged, ProducersResumed, MigrationPhaseChanged]
    assert phases(events) == [MigrationPhase.SWITCHING, MigrationPhase.DONE]
    assert (s.s.shard_count, s.s.paused) == (3, None)


def test_a_phase_that_runs_out_of_time_stops_until_an_operator_resumes_it() -> None:
    s = Stream(2)
    s.run(ChangeShardCount(4, Q, 0, bounds=BOUNDS, migrations=True))
    s.beat("p1", quiesced=True, now=1_000)
    assert s.run(Tick(4_999, s.leases)) == []
    [stalled] = s.run(Tick(5_000, s.leases))
    assert isinstance(stalled, MigrationStalled)
    assert stalled.stall.phase is MigrationPhase.PAUSING
    assert "p2" in stalled.stall.reason
    assert s.run(Tick(6_000, s.leases)) == []  # stalled once
    # Stopped: even with every producer quiet now, nothing moves on its own.
    assert phases(s.beat("p2", quiesced=True, now=6_500)) == []
    assert (s.phase, s.s.paused is not None, s.s.shard_count) == (MigrationPhase.PAUSING, True, 2)
    events = s.run(ResumeMigration(7_000))
    assert phases(events) == [MigrationPhase.QUIESCED]
    assert s.s.migration is not None
    assert (s.s.migration.stalled, s.s.migration.deadline_ms) == (None, 17_000)
    # QUIESCED's own bound: consumption never finished.
    [stalled] = s.run(Tick(17_000, s.leases))
    assert isinstance(stalled, MigrationStalled)
    assert stalled.stall.phase is MigrationPhase.QUIESCED
    assert s.advance(17_500, s.evidence()) == []  # stopped
    events = s.run(ResumeMigration(18_000))
    assert phases(events) == []  # resumed; the evidence comes with the next advance
    assert phases(s.advance(18_100, s.evidence())) == [MigrationPhase.SWITCHING]


def test_resume_needs_a_stalled_migration() -> None:
    s = Stream(2)
    with pytest.raises(NoMigration):
        decide(s.s, ResumeMigration(0))
    s.run(ChangeShardCount(1, Q, 0, bounds=BOUNDS, migrations=True))
    with pytest.raises(NoMigration):
        decide(s.s, ResumeMigration(0))  # running, not stalled


def test_abort_before_the_switch_resumes_producers_and_leaves_the_layout() -> None:
    s = Stream(4)
    layout = s.s.layout
    s.run(ChangeShardCount(2, Q, 0, bounds=BOUNDS, migrations=True))
    with pytest.raises(InvalidCommand):
        decide(s.s, AbortMigration(10, "\x1b[2J"))
    events = s.run(AbortMigration(10, "the window closed"))
    assert [type(e) for e in events] == [MigrationAborted, ProducersResumed]
    assert (s.phase, s.s.layout, s.s.paused, target_count(s.s)) == (MigrationPhase.ABORTED, layout, None, 4)
    assert s.s.migration is not None
    assert s.s.migration.outcome == "the window closed"
    with pytest.raises(NoMigration):
        decide(s.s, AbortMigration(20))


def test_abort_after_the_switch_is_refused() -> None:
    s = Stream(4, producers=())
    s.run(ChangeShardCount(2, Q, 0, bounds=BOUNDS, migrations=True))
    s.advance(1, s.evidence())
    assert s.phase is MigrationPhase.DRAINING
    with pytest.raises(MigrationConflict, match="already changed the layout"):
        decide(s.s, AbortMigration(2))


def test_a_stream_paused_by_an_operator_stays_paused_after_the_migration() -> None:
    s = Stream(2, producers=())
    s.run(PauseProducers("maintenance", 0))
    events = s.run(ChangeShardCount(3, Q, 0, bounds=BOUNDS, migrations=True))
    assert not any(isinstance(e, ProducersPaused) for e in events)
    assert s.s.migration is not None
    assert not s.s.migration.paused_producers
    events = s.advance(1, s.evidence())
    assert not any(isinstance(e, ProducersResumed) for e in events)
    assert s.s.paused is not None
    assert s.s.paused.reason == "maintenance"


def test_a_reshard_while_a_migration_holds_producers_is_refused_unless_it_is_the_same() -> None:
    s = Stream(4)
    s.run(ChangeShardCount(2, Q, 0, bounds=BOUNDS, migrations=True))
    assert s.run(ChangeShardCount(2, Q, 5, bounds=BOUNDS, migrations=True)) == []  # the same request again
    for count, mode in ((3, Q), (2, ReshardMode.ONLINE), (4, ReshardMode.ONLINE)):
        with pytest.raises(MigrationConflict, match="migration 1"):
            decide(s.s, ChangeShardCount(count, mode, 5, migrations=True))


def test_online_migrations_switch_at_once_and_a_later_one_supersedes_a_draining_one() -> None:
    s = Stream(8)
    events = s.run(ChangeShardCount(4, now_ms=0, migrations=True))
    assert [type(e) for e in events] == [MigrationStarted, ShardsDraining]
    assert (s.phase, s.s.shard_count) == (MigrationPhase.SWITCHING, 4)
    s.beat("p1", now=1)
    s.beat("p2", now=2)
    assert s.phase is MigrationPhase.DRAINING
    s.run(ChangeShardCount(6, now_ms=3, migrations=True))
    m = s.s.migration
    assert m is not None
    assert (m.migration_id, m.supersedes, m.from_count, m.to_count, s.s.shard_count) == (2, 1, 4, 6, 6)
    assert {x.index for x in s.s.layout.draining} == {4, 5, 6, 7}
    assert {x.index for x in s.s.layout.active} == {0, 1, 2, 3, 8, 9}  # indexes never reused


def test_an_online_scale_out_with_producers_up_to_date_is_done_when_they_acknowledge() -> None:
    s = Stream(2, producers=("p1",))
    s.run(ChangeShardCount(3, now_ms=0, migrations=True))
    assert s.phase is MigrationPhase.SWITCHING
    assert phases(s.beat("p1", now=5)) == [MigrationPhase.DONE]


def test_below_the_migration_level_a_reshard_records_nothing_and_quiesce_is_refused() -> None:
    s = Stream(4)
    events = s.run(ChangeShardCount(2, now_ms=0, migrations=False))
    assert [type(e) for e in events] == [ShardsDraining]
    assert s.s.migration is None
    with pytest.raises(InvalidCommand):
        decide(s.s, ChangeShardCount(1, Q, 0, migrations=False))


def test_only_the_mode_is_stored_when_the_count_stays() -> None:
    s = Stream(2)
    assert [type(e) for e in s.run(ChangeShardCount(2, Q, 0, migrations=True))] == [ReshardModeSet]
    assert (s.s.reshard_mode, s.s.migration) == (Q, None)


def test_a_producer_expiring_counts_as_quiet() -> None:
    s = Stream(2)
    s.run(ChangeShardCount(1, Q, 0, bounds=BOUNDS, migrations=True))
    s.beat("p1", quiesced=True, now=100)
    # p2's lease ends at LEASE (it registered at 0): expired, it no longer counts. The expiry
    # moves the migration on before its bound is looked at.
    events = s.run(Tick(LEASE, s.leases))
    assert phases(events) == [MigrationPhase.QUIESCED]
    assert "p2" not in s.s.producers


def test_a_migration_round_trips_through_a_checkpoint_and_is_absent_before_the_first() -> None:
    s = Stream(4)
    assert "migration" not in codec.to_json(s.s)  # checkpoints of older releases stay the same
    s.run(ChangeShardCount(2, Q, 0, bounds=BOUNDS, migrations=True))
    s.run(Tick(BOUNDS.pausing_ms, s.leases))
    text = codec.to_json(s.s)
    assert codec.from_json(text, StreamState) == s.s
    assert s.s.layout.shards[3].state is ShardState.ACTIVE


def test_a_quiet_flag_from_an_earlier_pause_does_not_count() -> None:
    """A producer quiet under an operator's pause, resumed, heartbeats once more with the
    flag it built before it learnt of the resume (it publishes again): a quiesce migration
    started then must wait for it to report quiet under its own pause."""
    s = Stream(2, producers=("p1",))
    s.run(PauseProducers("maintenance", 0))
    s.beat("p1", quiesced=True, now=10)
    assert s.s.producers["p1"].quiesced
    s.run(ResumeProducers(20))
    assert not s.s.producers["p1"].quiesced  # a resume ends every producer's quiet
    s.beat("p1", quiesced=True, now=30)  # built before it saw the resume
    assert not s.s.producers["p1"].quiesced  # not paused: quiet means nothing
    events = s.run(ChangeShardCount(1, Q, 40, bounds=BOUNDS, migrations=True))
    assert phases(events) == []
    assert s.phase is MigrationPhase.PAUSING
    assert phases(s.beat("p1", quiesced=True, now=50)) == [MigrationPhase.QUIESCED]


def test_evidence_read_for_another_migration_or_before_quiesced_began_is_ignored() -> None:
    s = Stream(2, producers=())
    s.run(ChangeShardCount(1, Q, 100, bounds=BOUNDS, migrations=True))
    assert s.phase is MigrationPhase.QUIESCED
    stale = AdvanceMigration(200, s.evidence(), None, migration_id=1, read_at_ms=99)
    assert s.run(stale) == []  # read before the producers were quiet
    other = AdvanceMigration(200, s.evidence(), None, migration_id=7, read_at_ms=150)
    assert s.run(other) == []
    fresh = AdvanceMigration(200, s.evidence(), None, migration_id=1, read_at_ms=100)
    assert MigrationPhase.SWITCHING in phases(s.run(fresh))


def test_an_operator_cannot_pause_over_a_migrations_own_pause() -> None:
    s = Stream(2)
    s.run(ChangeShardCount(1, Q, 0, bounds=BOUNDS, migrations=True))
    with pytest.raises(MigrationConflict, match="holds the producers paused"):
        decide(s.s, PauseProducers("maintenance", 1))
