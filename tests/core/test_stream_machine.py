"""A hypothesis state machine over the stream aggregate.

Random creations, scale-outs and scale-ins (to 0 too) online and in quiesce
mode, retirements, migration advances with random Redis evidence, stalls (phase
bounds), resumes and aborts, group registrations, producer heartbeats (any
acknowledged version, quiesced or not), producers leaving and expiring, pauses,
resumes and deletions, every reshard naming its shards against one 3-primary
cluster topology. After every step: shard indexes are identities (0..n-1, never
reused), keys distinct, only DRAINING shards retire, the layout version moves
by exactly one per layout change and never otherwise, ACTIVE shards stay within
one of each other per primary, producers acknowledge only issued versions, the
lease table (fed by the events alone) holds exactly the live producers, and
replaying the durable events gives the state. For migrations: phases follow
PAUSING -> QUIESCED -> SWITCHING -> DRAINING -> DONE (online ones start at
SWITCHING; only the first two may end ABORTED); a migration that has not
switched keeps the producers paused and the layout's ACTIVE shards as they
were; QUIESCED is entered only with every producer quiesced; the layout
switches only with every producer quiesced and every readable shard drained
in Redis; DONE only with nothing draining and every producer on the layout; a
stalled migration moves only when resumed or aborted.
"""

from __future__ import annotations

import itertools

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rsc.events.commands import (
    AbortMigration,
    AdvanceMigration,
    ChangeShardCount,
    CreateStream,
    DeleteStream,
    PauseProducers,
    ProducerHeartbeat,
    RegisterGroup,
    ResumeMigration,
    ResumeProducers,
    RetireShards,
    StreamCommand,
    Tick,
    UnregisterGroup,
)
from rsc.events.errors import CoordinationError
from rsc.events.events import (
    MigrationPhaseChanged,
    ShardsAdded,
    ShardsDraining,
    ShardsRetired,
    StreamCreated,
    StreamEvent,
)
from rsc.events.liveness import Leases
from rsc.events.migration import quiet
from rsc.events.model import (
    DrainCheck,
    MigrationBounds,
    MigrationPhase,
    ReshardMode,
    ShardState,
    StartFrom,
)
from rsc.events.slots import SLOTS, Primary, Topology
from rsc.events.stream import StreamState, execute, fold
from rsc.events.stream_state import stale_producers

TOPOLOGY = Topology(
    tuple(
        Primary(f"10.0.0.{i}:6379", ((round(i * SLOTS / 3), round((i + 1) * SLOTS / 3) - 1),))
        for i in range(3)
    )
)
PRODUCERS = [f"api/{i}" for i in range(3)]
LEASE_MS = 1_000
LAYOUT_EVENTS = (StreamCreated, ShardsAdded, ShardsDraining, ShardsRetired)
BOUNDS = MigrationBounds(pausing_ms=2_000, quiesced_ms=3_000)
P = MigrationPhase
#: The phase each phase may be followed by.
NEXT = {
    P.PAUSING: {P.QUIESCED, P.ABORTED},
    P.QUIESCED: {P.SWITCHING, P.ABORTED},
    P.SWITCHING: {P.DRAINING, P.DONE},
    P.DRAINING: {P.DONE},
    P.DONE: set(),
    P.ABORTED: set(),
}


class StreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: StreamState | None = None
        self.leases = Leases()
        self.journal: list[StreamEvent] = []
        self.now = 0
        self.retired: set[int] = set()
        self.issued: set[int] = {0}  # layout versions the stream has had (0: none yet)
        self._names: dict[int, str] = {}  # shard index -> the key it names

    def run(self, command: StreamCommand) -> list[StreamEvent]:
        before = self.state
        try:
            self.state, events = self.execute(before, command)
        except CoordinationError:
            return []
        self.leases.apply(events)
        self.journal.extend(e for e in events if e.durable)
        layout_changes = sum(isinstance(e, LAYOUT_EVENTS) for e in events)
        if events and isinstance(events[0], StreamCreated):
            assert self.state.layout.metadata_version == 1
        elif before is not None:
            assert self.state.layout.metadata_version == before.layout.metadata_version + layout_changes
        assert layout_changes <= 1
        self.issued.add(self.state.layout.metadata_version)
        self.check_migration(before, command, events)
        return events

    def check_migration(
        self, before: StreamState | None, command: StreamCommand, events: list[StreamEvent]
    ) -> None:
        assert self.state is not None
        m = self.state.migration
        was = before.migration if before is not None and not before.deleted else None
        if m is None or self.state.deleted:
            return
        if was is not None and was.migration_id == m.migration_id:
            entered = [p.phase for p in m.phases[len(was.phases) :]]
            path = [was.phase, *entered]
            assert all(b in NEXT[a] for a, b in itertools.pairwise(path)), path
            if was.stalled is not None and not isinstance(command, ResumeMigration | AbortMigration):
                assert not entered  # stopped: it waits for an operator
        else:
            assert was is None or m.migration_id > was.migration_id
            assert m.phases[0].phase in (P.PAUSING, P.SWITCHING)
        state = before
        for event in events:  # each phase change, checked against the state it follows
            if isinstance(event, MigrationPhaseChanged) and state is not None:
                previous = state.migration.phase if state.migration is not None else None
                if event.phase is P.QUIESCED:
                    assert quiet(state)
                if event.phase is P.SWITCHING:  # checked against the state before the layout change
                    assert before is not None
                    assert isinstance(command, AdvanceMigration)
                    assert before.migration is not None
                    assert command.migration_id == before.migration.migration_id
                    assert command.read_at_ms >= before.migration.phases[-1].at_ms
                    assert quiet(before)
                    evidence = command.evidence
                    assert all(i in evidence and evidence[i].drained for i in before.layout.readable_indexes)
                if event.phase in (P.DRAINING, P.DONE) and previous is P.SWITCHING:
                    assert not stale_producers(state)
            state = fold([event], state)
            if isinstance(event, MigrationPhaseChanged) and event.phase is P.DONE:
                assert state is not None
                assert not state.layout.draining

    def execute(
        self, state: StreamState | None, command: StreamCommand
    ) -> tuple[StreamState, list[StreamEvent]]:
        return execute(state, command)

    # --- rules ------------------------------------------------------------

    @rule(count=st.integers(1, 12))
    def create(self, count: int) -> None:
        if self.state is None or self.state.deleted:
            self.retired = set()
            self.issued = {0}
        self.run(CreateStream("orders", count, self.now, TOPOLOGY))

    @rule(count=st.integers(0, 20), quiesce=st.booleans())
    def reshard(self, count: int, quiesce: bool) -> None:
        mode = ReshardMode.QUIESCE if quiesce else ReshardMode.ONLINE
        events = self.run(ChangeShardCount(count, mode, self.now, TOPOLOGY, BOUNDS, migrations=True))
        if self.state is None or self.state.deleted or not events:
            return
        m = self.state.migration
        if mode is ReshardMode.ONLINE and (m is None or m.phase.switched or not m.running):
            assert len(self.state.layout.active) == count
        elif m is not None and m.running and not m.phase.switched:
            assert m.to_count == count

    @rule(data=st.data())
    def advance_migration(self, data: st.DataObject) -> None:
        if self.state is None or self.state.deleted:
            return
        readable = sorted(self.state.layout.readable_indexes)
        partial = data.draw(st.integers(0, 3)) == 0  # mostly: every readable shard drained
        drained = st.booleans() if partial else st.just(True)
        evidence = {i: DrainCheck(data.draw(st.booleans()), data.draw(drained)) for i in readable}
        if partial and readable and data.draw(st.booleans()):  # evidence missing for one shard
            evidence.pop(data.draw(st.sampled_from(readable)))
        m = self.state.migration
        read_for = m.migration_id if m is not None else 0
        if data.draw(st.integers(0, 5)) == 0:  # evidence read for an earlier migration
            read_for -= 1
        self.run(AdvanceMigration(self.now, evidence, TOPOLOGY, read_for, self.now))

    @rule(abort=st.booleans())
    def resume_or_abort_migration(self, abort: bool) -> None:
        before = self.state.migration if self.state is not None else None
        events = self.run(AbortMigration(self.now) if abort else ResumeMigration(self.now, TOPOLOGY))
        if events and abort:
            assert before is not None
            assert not before.phase.switched
            assert self.state is not None
            assert self.state.migration is not None
            assert self.state.migration.phase is P.ABORTED
            if before.paused_producers:
                assert self.state.paused is None

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        if self.state is None or self.state.deleted:
            return
        draining = sorted(s.index for s in self.state.layout.shards if s.state is ShardState.DRAINING)
        chosen = frozenset(data.draw(st.lists(st.sampled_from(draining), unique=True)) if draining else [])
        evidence = {i: DrainCheck(data.draw(st.booleans()), data.draw(st.booleans())) for i in chosen}
        stale = stale_producers(self.state)
        if self.run(RetireShards(chosen, self.now, evidence)):
            # Never retired while evidence is missing or a live producer may still route to it.
            assert all(e.sealed and e.drained for e in evidence.values())
            assert not stale
            self.retired |= chosen

    @rule(group=st.sampled_from(["billing", "audit"]), register=st.booleans())
    def group(self, group: str, register: bool) -> None:
        self.run(RegisterGroup(group, StartFrom.EARLIEST) if register else UnregisterGroup(group))

    @rule(producer=st.sampled_from(PRODUCERS), ahead=st.integers(-2, 1), quiesced=st.booleans())
    def producer_heartbeat(self, producer: str, ahead: int, quiesced: bool) -> None:
        current = self.state.layout.metadata_version if self.state is not None else 0
        version = max(0, current + ahead)
        self.run(ProducerHeartbeat(producer, version, quiesced, self.now, LEASE_MS))

    @rule(producer=st.sampled_from(PRODUCERS))
    def producer_leaves(self, producer: str) -> None:
        self.run(ProducerHeartbeat(producer, 0, False, self.now, LEASE_MS, leave=True))
        if self.state is not None:
            assert producer not in self.state.producers

    @rule(advance=st.integers(0, 1_500))
    def tick(self, advance: int) -> None:
        self.now += advance
        self.run(Tick(self.now, self.leases))
        if self.state is not None:
            assert all(self.leases[p] > self.now for p in self.state.producers)

    @rule(pause=st.booleans())
    def pause_or_resume(self, pause: bool) -> None:
        self.run(PauseProducers("maintenance", self.now) if pause else ResumeProducers(self.now))

    @rule()
    def delete(self) -> None:
        events = self.run(DeleteStream(self.now))
        if events:
            assert self.state is not None
            assert self.state.deleted

    # --- invariants -------------------------------------------------------

    @invariant()
    def shards_are_identities_with_distinct_keys(self) -> None:
        if self.state is None or self.state.deleted:
            self._names: dict[int, str] = {}  # a stream created again starts over
            return
        shards = self.state.layout.shards
        assert [s.index for s in shards] == list(range(len(shards)))
        assert len({s.key for s in shards}) == len(shards)
        assert {s.index for s in shards if s.state is ShardState.RETIRED} == self.retired
        # Indexes are never reused: once an index names a key, it names that key for good (a
        # deleted and recreated stream starts over, with keys of its own).
        for shard in shards:
            assert self._names.setdefault(shard.index, shard.key) == shard.key, shard.index

    @invariant()
    def active_shards_spread_evenly_over_the_primaries(self) -> None:
        if self.state is None or self.state.deleted:
            return
        counts = TOPOLOGY.count(s.key for s in self.state.layout.active).values()
        assert max(counts) - min(counts) <= 1

    @invariant()
    def producers_acknowledge_only_issued_versions(self) -> None:
        if self.state is None:
            return
        assert all(p.acked_version in self.issued for p in self.state.producers.values())

    @invariant()
    def the_lease_table_holds_exactly_the_live_producers(self) -> None:
        producers = self.state.producers if self.state is not None else {}
        assert set(self.leases) == set(producers)

    @invariant()
    def a_migration_that_has_not_switched_holds_producers_and_layout(self) -> None:
        if self.state is None or self.state.deleted:
            return
        m = self.state.migration
        if m is not None and m.running and not m.phase.switched:
            assert self.state.paused is not None
            assert len(self.state.layout.active) == m.from_count

    @invariant()
    def the_journal_replays_to_the_state(self) -> None:
        if self.state is None:
            return
        replayed = fold(self.journal)
        assert replayed == self.state


StreamMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStreamMachine = StreamMachine.TestCase


def test_attrs_states_compare_by_value() -> None:
    """The replay invariant relies on value equality of states (a guard against eq=False creeping in)."""
    a = execute(None, CreateStream("orders", 2, 0, TOPOLOGY))[0]
    b = execute(None, CreateStream("orders", 2, 0, TOPOLOGY))[0]
    assert a == b
    assert attrs.evolve(a, paused=None) == b
