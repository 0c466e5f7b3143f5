"""The stream aggregate: creation, scale-out, scale-in to DRAINING, retirement, producers."""

from __future__ import annotations

import attrs
import pytest

from rsc.events.commands import (
    ChangeShardCount,
    CreateStream,
    PauseProducers,
    ProducerHeartbeat,
    RegisterGroup,
    RestartTimers,
    ResumeProducers,
    RetireShards,
    SetRetention,
    StreamCommand,
    Tick,
)
from rsc.events.errors import AggregateNotFound, FeatureLevelNotSupported, InvalidCommand, ProducerFenced
from rsc.events.events import (
    ProducerAcknowledged,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
)
from rsc.events.liveness import Leases
from rsc.events.model import ClientInfo, DrainCheck, PauseState, ShardState, StartFrom
from rsc.events.retention import Retention, WhenFull
from rsc.events.stream import StreamState, decide, fold
from rsc.events.versions import RETENTION_LEVEL


def run(state: StreamState | None, *commands: StreamCommand, leases: Leases | None = None) -> StreamState:
    """Decide and fold each command; with `leases`, keep that lease table up to date too."""
    for command in commands:
        events = decide(state, command)
        state = fold(events, state)
        if leases is not None:
            leases.apply(events)
    assert state is not None
    return state


def test_create_gives_active_shards_with_distinct_keys() -> None:
    s = run(None, CreateStream("orders", 4))
    assert s.layout.metadata_version == 1
    assert [sh.index for sh in s.layout.active] == [0, 1, 2, 3]
    keys = [sh.key for sh in s.layout.shards]
    assert len(set(keys)) == 4
    assert all(k.startswith("orders:") and "{" in k for k in keys)
    assert decide(s, CreateStream("orders", 4)) == []


def test_scale_out_appends_shards_and_bumps_version_once() -> None:
    s = run(None, CreateStream("orders", 4), ChangeShardCount(8))
    assert s.layout.metadata_version == 2
    assert s.shard_count == 8
    assert decide(s, ChangeShardCount(8)) == []


def test_scale_in_drains_the_highest_shards_then_retires_them() -> None:
    s = run(None, CreateStream("orders", 4), ChangeShardCount(2))
    assert s.shard_count == 2
    assert {sh.index for sh in s.layout.shards if sh.state is ShardState.DRAINING} == {2, 3}
    assert s.layout.readable_indexes == {0, 1, 2, 3}
    with pytest.raises(InvalidCommand):
        decide(s, RetireShards(frozenset({0})))
    with pytest.raises(InvalidCommand, match="not sealed and drained"):
        decide(s, RetireShards(frozenset({2, 3}), 0, {2: DrainCheck(True, True), 3: DrainCheck(True, False)}))
    s = run(s, RetireShards(frozenset({2, 3}), 0, {2: DrainCheck(True, True), 3: DrainCheck(True, True)}))
    assert s.layout.readable_indexes == {0, 1}
    assert s.layout.metadata_version == 3
    s = run(s, ChangeShardCount(3))
    assert [sh.index for sh in s.layout.active] == [0, 1, 4]  # indexes are never reused


def test_a_stream_may_start_with_no_shard() -> None:
    """As after a scale-in to 0: nothing is writable until it is scaled out."""
    s = run(None, CreateStream("orders", 0), ChangeShardCount(2))
    assert [sh.index for sh in s.layout.active] == [0, 1]


def test_scale_in_to_zero() -> None:
    s = run(None, CreateStream("orders", 3), ChangeShardCount(0))
    assert s.shard_count == 0
    assert len(s.layout.readable_indexes) == 3


@pytest.mark.parametrize(
    "command",
    [
        CreateStream("bad{name}", 1),
        CreateStream("orders", 20_000),
        CreateStream("", 1),
    ],
)
def test_bad_creation_is_refused(command: CreateStream) -> None:
    with pytest.raises(InvalidCommand):
        decide(None, command)


def test_commands_need_a_stream_and_groups_register_once() -> None:
    with pytest.raises(AggregateNotFound):
        decide(None, ChangeShardCount(3))
    s = run(None, CreateStream("orders", 1), RegisterGroup("billing"))
    assert s.groups == {"billing": StartFrom.EARLIEST}
    assert decide(s, RegisterGroup("billing")) == []


# --- producers -----------------------------------------------------------


def beat(producer: str, version: int, now: int, quiesced: bool = False) -> ProducerHeartbeat:
    return ProducerHeartbeat(producer, version, quiesced, now_ms=now, lease_ttl_ms=1_000)


def test_a_producer_registers_once_then_renews_without_journaling() -> None:
    s = run(None, CreateStream("orders", 4))
    events = decide(s, beat("p1", 1, now=100))
    assert [type(e) for e in events] == [ProducerRegistered, ProducerHeartbeated]  # its lease starts
    leases = Leases()
    s = run(s, beat("p1", 1, now=100), leases=leases)
    assert dict(leases) == {"p1": 1_100}
    renewal = decide(s, beat("p1", 1, now=600))
    assert [type(e) for e in renewal] == [ProducerHeartbeated]
    assert not any(e.durable for e in renewal)
    assert run(s, beat("p1", 1, now=600), leases=leases) == s  # liveness only: the state stays
    assert dict(leases) == {"p1": 1_600}


def test_a_new_acknowledged_version_or_quiesced_flag_is_journaled() -> None:
    s = run(None, CreateStream("orders", 4), beat("p1", 1, now=0), ChangeShardCount(8))
    assert s.producers["p1"].acked_version == 1
    s = run(s, beat("p1", 2, now=10))
    assert s.producers["p1"].acked_version == 2
    assert decide(s, beat("p1", 2, now=15, quiesced=True)) == decide(s, beat("p1", 2, now=15))  # not paused
    s = run(s, PauseProducers("maintenance", 18))
    events = decide(s, beat("p1", 2, now=20, quiesced=True))
    assert ProducerAcknowledged("p1", 2, True) in events
    assert run(s, beat("p1", 2, now=20, quiesced=True)).producers["p1"].quiesced


def test_a_version_the_coordinator_never_issued_acknowledges_nothing() -> None:
    s = run(None, CreateStream("orders", 4), beat("p1", 7, now=0))
    assert s.producers["p1"].acked_version == 0


def test_producers_expire_on_the_tick_after_their_lease() -> None:
    leases = Leases()
    s = run(None, CreateStream("orders", 4), beat("p1", 1, now=0), beat("p2", 1, now=500), leases=leases)
    assert decide(s, Tick(999, leases)) == []
    s = run(s, Tick(1_000, leases), leases=leases)
    assert set(s.producers) == set(leases) == {"p2"}
    assert run(s, Tick(1_500, leases), leases=leases).producers == {}
    assert dict(leases) == {}


def test_a_producer_missing_from_the_lease_table_counts_as_expired() -> None:
    s = run(None, CreateStream("orders", 4), beat("p1", 1, now=0))
    assert decide(s, Tick(10, {})) == [ProducerExpired("p1", 10)]


def test_a_leaving_producer_is_forgotten_at_once_and_a_stranger_leaving_changes_nothing() -> None:
    s = run(None, CreateStream("orders", 4), beat("p1", 1, now=0), beat("p2", 1, now=0))
    leave = ProducerHeartbeat("p1", 1, False, now_ms=10, lease_ttl_ms=1_000, leave=True)
    assert decide(s, leave) == [ProducerLeft("p1", 10)]
    s = run(s, leave)
    assert set(s.producers) == {"p2"}
    assert decide(s, leave) == []  # already gone: idempotent, and no registration either


def test_recovery_gives_every_producer_a_whole_lease_again() -> None:
    s = run(None, CreateStream("orders", 4), beat("p1", 1, now=0))
    events = decide(s, RestartTimers(5_000))
    assert [type(e) for e in events] == [ProducerLeasesRestarted, ProducerHeartbeated]
    assert not any(e.durable for e in events)
    stale = Leases({"p1": 1_000, "gone": 2_000})  # what a table kept across a reload may say
    stale.apply(events)
    assert dict(stale) == {"p1": 6_000}
    assert decide(run(None, CreateStream("orders", 1)), RestartTimers(5_000)) == []


def test_pause_and_resume_are_idempotent_and_keep_the_first_reason() -> None:
    s = run(None, CreateStream("orders", 4), PauseProducers("maintenance", 10))
    assert s.paused == PauseState("maintenance", 10)
    assert decide(s, PauseProducers("again", 20)) == []
    s = run(s, ResumeProducers(30))
    assert s.paused is None
    assert decide(s, ResumeProducers(40)) == []


@pytest.mark.parametrize(
    "command",
    [
        ProducerHeartbeat("", 1, False, 0, 1_000),
        ProducerHeartbeat("x" * 257, 1, False, 0, 1_000),
        ProducerHeartbeat("p", -1, False, 0, 1_000),
        ProducerHeartbeat("p", 1, False, 0, 0),
        PauseProducers("", 0),
    ],
)
def test_bad_producer_commands_are_refused(command: StreamCommand) -> None:
    with pytest.raises(InvalidCommand):
        decide(run(None, CreateStream("orders", 4)), command)


def test_a_refusing_cap_takes_no_producer_that_would_not_check_it() -> None:
    """`whenFull: refuse` is checked by the append script of level-5 producers only: a stream
    with it refuses an older producer's registration (an already registered one keeps going
    once it is), and the policy is refused while such a producer is live."""
    refusing = Retention(max_entries_per_shard=10, when_full=WhenFull.REFUSE)
    old, new = ClientInfo("rsc-python", "0.1.0", 4), ClientInfo("rsc-python", "0.2.0", RETENTION_LEVEL)
    s = run(None, CreateStream("orders", 2), attrs.evolve(beat("p-old", 0, now=100), client=old))
    with pytest.raises(FeatureLevelNotSupported, match="p-old") as refused:
        decide(s, SetRetention(refusing))
    assert refused.value.details == {
        "blockers": [{"kind": "producer", "name": "p-old", "version": "0.1.0", "featureLevel": 4}]
    }
    assert decide(s, SetRetention(Retention(max_entries_per_shard=10)))  # drop-oldest needs nothing
    s = run(s, ProducerHeartbeat("p-old", 0, False, 100, 1_000, old, leave=True), SetRetention(refusing))
    with pytest.raises(FeatureLevelNotSupported, match="p-late"):
        decide(s, attrs.evolve(beat("p-late", 1, now=200), client=old))
    assert decide(s, attrs.evolve(beat("p-new", 1, now=200), client=new))


def test_producer_epochs_fence_an_older_process_and_outlive_the_stream() -> None:
    """Feature level 6: a new process (epoch 0) gets an epoch at least the time in ms, above
    every earlier one of the id; the older process is fenced; a leave of a fenced process
    leaves its successor be; a deleted and recreated stream never hands out an epoch again."""

    def hello(producer: str, epoch: int | None, now: int, leave: bool = False) -> ProducerHeartbeat:
        return attrs.evolve(beat(producer, 1, now=now), epoch=epoch, epochs=True, leave=leave)

    s = run(None, CreateStream("orders", 2))
    assert decide(s, attrs.evolve(beat("api", 1, now=5), epoch=0)) == [  # below level 6: none
        ProducerRegistered("api", 1, False, 1_000, ClientInfo(), 5),
        ProducerHeartbeated("api", 1_005),
    ]
    s = run(s, hello("api", 0, now=5_000))
    first = s.producers["api"].epoch
    assert first >= 5_000
    s = run(s, hello("api", first, now=5_100))  # a renewal: nothing journaled
    assert [type(e) for e in decide(s, hello("api", first, now=5_200))] == [ProducerHeartbeated]
    s = run(s, hello("api", 0, now=5_000))  # a second process of the id, the same millisecond
    second = s.producers["api"].epoch
    assert second > first
    with pytest.raises(ProducerFenced) as fenced:
        decide(s, hello("api", first, now=5_300))
    assert fenced.value.details == {"epoch": second}
    assert decide(s, hello("api", first, now=5_300, leave=True)) == []  # its successor stays
    s = run(s, hello("api", second, now=5_400, leave=True))
    assert "api" not in s.producers
    # the stream deleted and created again (its shard keys' records outlive it): higher epochs
    again = run(None, CreateStream("orders", 2), hello("api", 0, now=9_000))
    assert again.producers["api"].epoch > second
    # an epoch the stream does not know (state rebuilt) is taken back, and counted
    rebuilt = run(None, CreateStream("orders", 2), hello("api", 123_456, now=9_000))
    assert rebuilt.producers["api"].epoch == 123_456
    assert rebuilt.producer_epoch == 123_456
