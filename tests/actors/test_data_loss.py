"""Redis losing data under the actors (issue 26), on fakes in virtual time and on real Redis:
what the active coordinator holds is written back (never forgotten), at a revision above
every one written before; side effects are repaired as after a loss (consumer groups at `0`);
tokens keep growing across a lost counter; the lease is taken back when it vanished."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
import trio.testing

from rsc import journal
from rsc.actors.dataset import DATA_LOSS, EVERYTHING, ROLLBACK, DatasetWatch
from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.keys import AggregateId, KeySpace
from rsc.actors.leadership import Acquired, Leadership, MemoryLease, RedisLease
from rsc.actors.redis_store import RedisStore
from rsc.actors.store import MemoryStore
from rsc.connect import RedisClient, open_redis
from rsc.events.errors import UnknownStream
from rsc.events.model import HeartbeatStatus
from tests.actorkit import SETTINGS, TIMING, Member, registry_on

Clock = trio.testing.MockClock
GROUP = AggregateId("orders", "billing")
STREAM = AggregateId("orders")


@pytest.fixture
async def lease_redis(redis_url: str) -> AsyncIterator[RedisClient]:
    async with open_redis(redis_url) as client:
        yield client


async def test_everything_lost_is_written_back_from_memory(autojump_clock: Clock) -> None:
    store, effects = MemoryStore(), MemoryEffects()
    async with registry_on(store, effects) as registry:
        a, b = Member(registry, "orders", "billing", "a"), Member(registry, "orders", "billing", "b")
        for _ in range(4):
            await a.heartbeat()
            await b.heartbeat()
        group_actor = await registry.group("orders", "billing")
        before = group_actor.state
        group_revision = await store.revision(GROUP)
        stream_revision = await store.revision(STREAM)
        assert group_revision > 0
        assert stream_revision > 0
        store.lose()  # a restart without persistence, FLUSHALL
        effects.consumer_groups.clear()
        effects.tokens.clear()
        registry.corrections.check_all(EVERYTHING, "test: everything lost")
        await trio.sleep(0.1)
        assert await store.revision(GROUP) == group_revision + 1  # above every revision written
        assert await store.revision(STREAM) == stream_revision + 1
        entries = await store.read(GROUP)
        assert [e.kind for e in entries] == ["Checkpoint"]
        assert entries[0].restored
        assert group_actor.state == before
        # Repaired as after a loss: every consumer group again, at 0 (never `$`), tokens back.
        assert len(effects.consumer_groups) == 6
        assert set(effects.consumer_groups.values()) == {"0"}
        assert {t.member_id for t in effects.tokens.values()} == {"a", "b"}
        # The members never noticed: same epoch, same shards, OK.
        owned = a.owned | b.owned
        assert (await a.heartbeat()).status is HeartbeatStatus.OK
        assert (await b.heartbeat()).status is HeartbeatStatus.OK
        assert a.owned | b.owned == owned == frozenset(range(6))
        # The journal written back verifies, with events after it too (`rsc journal verify`).
        c = Member(registry, "orders", "billing", "c")
        await c.heartbeat()
        verdict = await journal.verify(store, GROUP)
        assert verdict.ok, verdict.problems
        assert (await store.read(GROUP))[0].kind == "Checkpoint"
        # A reload now finds what was written back.
        registry.stop(GROUP)
        reloaded = await registry.group("orders", "billing")
        assert reloaded.state is not None
        assert set(reloaded.state.members) == {"a", "b", "c"}


async def test_a_rollback_found_by_a_write_is_corrected_not_adopted(autojump_clock: Clock) -> None:
    """An older copy (a lagging replica promoted, an older RDB): the next write conflicts with a
    lower revision, which only a loss can make; the actor writes its state back and goes on."""
    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        older = store.snapshot()
        b = Member(registry, "orders", "billing", "b")
        for _ in range(4):
            await a.heartbeat()
            await b.heartbeat()
        actor = await registry.group("orders", "billing")
        known = actor.revision
        store.roll_back(older)
        assert await store.revision(GROUP) < known
        c = Member(registry, "orders", "billing", "c")
        assert (await c.heartbeat()).status is not HeartbeatStatus.UNKNOWN_MEMBER  # a write
        assert actor.restores == 1
        assert actor.state is not None
        assert set(actor.state.members) == {"a", "b", "c"}  # b was not forgotten
        assert await store.revision(GROUP) > known


async def test_a_term_that_ends_in_a_failover_remembers_what_it_wrote(autojump_clock: Clock) -> None:
    """A failover to a lagging replica takes longer than the coordinator lease: the term ends
    (every actor stops) and the next term of the same process finds the older copy. What the
    process held is newer than anything stored: it is written back, not adopted."""
    DATA_LOSS.reset()
    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        older = store.snapshot()
        b = Member(registry, "orders", "billing", "b")
        for _ in range(4):
            await a.heartbeat()
            await b.heartbeat()
        known = (await registry.group("orders", "billing")).revision
        registry.stop_all()  # the term ended
        store.roll_back(older)  # the promoted replica's copy
        actor = await registry.group("orders", "billing")  # the next term
        assert actor.restores == 1
        assert actor.state is not None
        assert set(actor.state.members) == {"a", "b"}  # b was not forgotten
        assert await store.revision(GROUP) > known
        assert DATA_LOSS.counts["aggregate"] >= 1
        # Stored at least as far as it knew (as when another coordinator moved it on): adopted.
        registry.stop_all()
        c = Member(registry, "orders", "billing", "c")
        await c.heartbeat()
        again = await registry.group("orders", "billing")
        assert again.restores == 0
        assert again.state is not None
        assert set(again.state.members) == {"a", "b", "c"}
    DATA_LOSS.reset()


async def test_a_write_failed_during_the_outage_does_not_reload_an_emptied_store(
    autojump_clock: Clock,
) -> None:
    """A restart without persistence: a write fails while Redis is down, then Redis answers
    empty. The reload that follows a failed write must not adopt the empty store."""
    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        for _ in range(3):
            await a.heartbeat()
        actor = await registry.group("orders", "billing")
        store.lose()
        b = Member(registry, "orders", "billing", "b")
        await b.heartbeat()  # its join conflicts (revision 0 stored): written back, then decided
        assert actor.state is not None
        assert set(actor.state.members) == {"a", "b"}
        assert actor.restores == 1


async def test_the_sweep_finds_an_aggregate_lost_alone(autojump_clock: Clock) -> None:
    store = MemoryStore()
    async with registry_on(store, settings=attrs.evolve(SETTINGS, sweep_per_round=1)) as registry:
        a = Member(registry, "orders", "billing", "a")
        for _ in range(3):
            await a.heartbeat()
        revision = await store.revision(GROUP)
        store.lose([GROUP])  # evicted, say; the stream's keys survive
        await trio.sleep(3)  # two actors, one a second
        assert await store.revision(GROUP) == revision + 1


async def test_tokens_keep_growing_across_a_lost_counter(autojump_clock: Clock) -> None:
    lease = MemoryLease()
    for _ in range(3):  # terms come and go: the counter is at 3
        got = await lease.acquire("x", None, 3_000)
        assert isinstance(got, Acquired)
        await lease.release("x", got.token)
    first = Leadership(lease, 3_000, holder_id="first")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        token = first.token()
        assert token == 4
        lease.lose_everything()  # the lease and the counter: a restart without persistence
        lost: list[str] = []
        first.on_lease_lost = lost.append
        await trio.sleep(1.5)  # the next renewal finds the lease gone and takes it back
        assert first.active
        assert first.token() > token
        assert lost
        # A standby that only saw the holder's token never gets one at or below it either.
        second = Leadership(lease, 3_000, holder_id="second")
        second.highest_seen = last = first.token()
        nursery.cancel_scope.cancel()
    lease.lose_everything()
    outcome = await lease.acquire("second", None, 3_000, second.highest_seen)
    assert isinstance(outcome, Acquired)
    assert outcome.token > last


async def test_redis_lease_acquire_starts_above_the_floor_and_retake(lease_redis: RedisClient) -> None:
    keys = KeySpace("rsc-test-loss:")
    lease = RedisLease(lease_redis, keys)
    first = await lease.acquire("a", None, 5_000)
    assert isinstance(first, Acquired)
    await lease_redis.delete([keys.coordinator_lease, keys.coordinator_token])  # lost
    assert not await lease.renew("a", first.token, None, 5_000)
    retaken = await lease.retake("a", None, 5_000, floor=first.token + 10)
    assert retaken == first.token + 11
    assert await lease_redis.get(keys.coordinator_token) == str(first.token + 11)
    # Another holder in the lease: no retake.
    await lease_redis.set(keys.coordinator_lease, json.dumps({"holder": "b", "token": 99, "url": ""}))
    assert await lease.retake("a", None, 5_000, floor=0) is None
    await lease_redis.delete([keys.coordinator_lease, keys.coordinator_token])


async def test_redis_store_restore_is_one_checkpoint_above_and_fenced(lease_redis: RedisClient) -> None:
    keys = KeySpace("rsc-test-loss:")
    store = RedisStore(lease_redis, fence_token=lambda: 5, keys=keys)
    aggregate = AggregateId("loss", "g")
    await store.append(aggregate, 0, [("GroupConfigured", "{}")] * 3)
    restored = await store.restore(aggregate, 3, 10, '{"x": 1}', "test")
    assert restored.revision == 10
    loaded = await store.load(aggregate)
    assert loaded.revision == 10
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.data == '{"x": 1}'
    assert loaded.events == ()
    entries = await store.read(aggregate)
    assert [(e.kind, e.revision, e.restored) for e in entries] == [("Checkpoint", 10, "test")]
    lower = RedisStore(lease_redis, fence_token=lambda: 4, keys=keys)
    with pytest.raises(Exception, match="newer coordinator term"):
        await lower.restore(aggregate, 10, 11, "{}", "test")
    await lease_redis.delete([keys.snapshot(aggregate), keys.journal(aggregate), keys.checkpoints(aggregate)])


async def test_dataset_watch_tells_loss_from_rollback(lease_redis: RedisClient) -> None:
    keys = KeySpace("rsc-test-watch:")
    await lease_redis.delete([keys.dataset])

    async def no_streams() -> bool:
        return False

    noticed: list[tuple[str, str]] = []
    DATA_LOSS.reset()
    DATA_LOSS.listeners.append(lambda kind, what: noticed.append((kind, what)))
    watch = DatasetWatch(lease_redis, keys.dataset, active=lambda: True, has_streams=no_streams)
    assert await watch.check() == "absent"  # a first start: nothing lost
    assert await watch.check() == "ok"
    copy = await lease_redis.hgetall(keys.dataset)  # an older RDB of this dataset
    assert await watch.check() == "ok"
    assert noticed == []
    await lease_redis.hset(keys.dataset, copy)
    assert await watch.check() == "behind"
    assert [k for k, _ in noticed] == [ROLLBACK]
    assert await watch.check() == "ok"
    await lease_redis.delete([keys.dataset])  # FLUSHALL
    assert await watch.check() == "absent"
    assert [k for k, _ in noticed] == [ROLLBACK, EVERYTHING]
    assert DATA_LOSS.details()["counts"] == {EVERYTHING: 1, ROLLBACK: 1}
    # A term ended (a failover longer than the lease); the next term of this process still
    # sees a rollback, but adopts quietly a dataset another coordinator marked anew meanwhile.
    copy = await lease_redis.hgetall(keys.dataset)
    assert await watch.check() == "ok"
    await lease_redis.hset(keys.dataset, copy)
    watch.new_term = True
    assert await watch.check() == "behind"
    assert [k for k, _ in noticed][-1] == ROLLBACK
    await lease_redis.hset(keys.dataset, {"id": "marked-by-another", "seq": "999"})
    watch.new_term = True
    assert await watch.check() == "first"  # adopted as a first check is
    assert len(noticed) == 3  # nothing more noticed
    assert await watch.check() == "ok"
    DATA_LOSS.reset()
    await lease_redis.delete([keys.dataset])


async def test_a_stream_and_group_lost_with_the_coordinators_memory_are_rebuilt_from_the_fleet(
    autojump_clock: Clock,
) -> None:
    """Redis lost everything and the coordinator restarted too (or a standby took over): nothing
    remembers the stream but its members and producers. A member that knows layout version V
    rebuilds it at V + 1 (a layout change for every party) with the shard keys Redis holds
    (producers routing by the old layout recreated them), its group at `0`. The rebuilt group
    learns the member held its shards from its report and takes it in holding them: nothing is
    dropped, nothing is read twice at once (a key sealed before the loss stays DRAINING)."""
    DATA_LOSS.reset()
    effects = MemoryEffects()
    async with registry_on(MemoryStore(), effects) as first:
        a = Member(first, "orders", "billing", "a")
        for _ in range(3):
            await a.heartbeat()
        actor = await first.group("orders", "billing")
        assert actor.state is not None
        lost_layout = actor.state.layout
        assert a.owned == frozenset(range(6))
    # A new coordinator over an emptied Redis; the shard keys are back (producers appended),
    # and one of them is sealed (it was DRAINING when Redis lost the stream).
    effects.consumer_groups.clear()
    effects.tokens.clear()
    effects.registered.clear()
    sealed_key = lost_layout.shards[5].key
    effects.sealed[sealed_key] = 1
    version = a.machine.metadata_version
    assert version == lost_layout.metadata_version
    async with registry_on(MemoryStore(), effects) as second:
        request = a.machine.request(second.clock.now_ms() / 1000)
        command = request.to_command(second.clock.now_ms())
        reply = await second.ask_group(
            "orders", "billing", command, create=False, seen_version=request.metadata_version
        )
        from rsc.events.respond import respond

        answer = respond(reply.state, command, reply.events)
        assert answer.status in (HeartbeatStatus.OK, HeartbeatStatus.REVOKE_PENDING)  # taken in
        assert answer.assignment.assigned == frozenset(range(6))
        a.machine.receive(request, answer, second.clock.now_ms() / 1000)
        assert a.owned == frozenset(range(6))  # it dropped nothing
        a.registry = second  # the same process, talking to the new coordinator
        for _ in range(3):
            response = await a.heartbeat()
        assert response.status is HeartbeatStatus.OK
        assert a.owned == frozenset(range(6))
        assert response.metadata_version == version + 1  # above what the fleet knew
        stream = await second.stream("orders")
        assert stream.state is not None
        assert [s.key for s in stream.state.layout.shards] == [s.key for s in lost_layout.shards]
        states = {s.key: s.state.value for s in stream.state.layout.shards}
        assert states.pop(sealed_key) == "DRAINING"  # never ACTIVE again: producers met its seal
        assert set(states.values()) == {"ACTIVE"}
        assert set(effects.consumer_groups.values()) == {"0"}  # never `$`
        assert DATA_LOSS.counts["rebuilt"] == 2  # the stream, then the group


async def test_a_producer_that_knows_a_lost_stream_rebuilds_it_above_its_version(
    autojump_clock: Clock,
) -> None:
    from rsc.events.commands import ProducerHeartbeat
    from rsc.events.respond import respond_producer

    effects = MemoryEffects()
    effects.shard_keys.update(f"orders:{{orders:{i}}}" for i in (0, 1, 3))  # 2 got nothing since
    async with registry_on(MemoryStore(), effects) as registry:
        command = ProducerHeartbeat("p1", 7, False, registry.clock.now_ms(), 5_000)
        reply = await registry.ask_stream("orders", command, seen_version=7)
        answer = respond_producer(reply.state, command, 1_000)
        assert answer.metadata_version == 8
        assert answer.layout is not None
        assert [s.index for s in answer.layout.shards] == [0, 1, 2, 3]  # the gap is filled
        # A stream nobody has seen is still created as before (version 1, the default count).
        fresh = ProducerHeartbeat("p2", 0, False, registry.clock.now_ms(), 5_000)
        reply = await registry.ask_stream("new", fresh)
        assert reply.state.layout.metadata_version == 1
        assert len(reply.state.layout.shards) == 6


async def test_a_consumer_group_evicted_before_a_restart_comes_back_at_0_even_for_latest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A group reading from `latest` had members; Redis then lost one of its consumer groups
    (evicted) while no coordinator ran. The next coordinator's repair recreates it at `0`, not
    at `$`: `$` would skip what was appended since the loss (acknowledged to producers)."""
    from rsc.events.model import GroupConfig, StartFrom

    store, effects = MemoryStore(), MemoryEffects()
    async with registry_on(store, effects) as first:
        await first.group("orders", "billing", GroupConfig(start_from=StartFrom.LATEST))
        assert set(effects.consumer_groups.values()) == {"$"}  # as created
        a = Member(first, "orders", "billing", "a")
        for _ in range(3):
            await a.heartbeat()
        assert a.owned
    evicted = sorted(effects.consumer_groups)[0]
    del effects.consumer_groups[evicted]
    async with registry_on(store, effects) as second:
        await second.group("orders", "billing")
        assert effects.consumer_groups[evicted] == "0"
    # A creation whose side effects may not have run (no member ever) still starts at `$`.
    async with registry_on(store, effects) as third:
        await third.group("orders", "new", GroupConfig(start_from=StartFrom.LATEST))
    made = [k for k in effects.consumer_groups if k[1] == "new"]
    del effects.consumer_groups[made[0]]
    async with registry_on(store, effects) as fourth:
        await fourth.group("orders", "new")
        assert effects.consumer_groups[made[0]] == "$"


async def test_after_a_loss_members_that_cannot_report_stalls_are_fenced_and_rejoin(
    autojump_clock: Clock,
) -> None:
    """A 0.1.0 member (client feature level 1) drops a shard whose owner token Redis lost and
    never says so: after a loss the coordinator fences it (REMOVED, a reason it knows), it
    rejoins and reads afresh. A newer member, which reports what it cannot read, is not fenced
    and keeps its shards."""
    from rsc.events.model import ClientInfo, FenceReason

    store, effects = MemoryStore(), MemoryEffects()
    async with registry_on(store, effects) as registry:
        new = Member(registry, "orders", "billing", "new")
        old = Member(registry, "orders", "billing", "old")
        old.machine.client = ClientInfo("rsc-python", "0.1.0")  # feature level 1
        for _ in range(4):
            await new.heartbeat()
            await old.heartbeat()
        assert new.owned
        assert old.owned
        owned = new.owned
        registry.corrections.check_all("identity", "test: Redis restarted with its data")  # nothing lost
        await trio.sleep(0.1)
        assert (await old.heartbeat()).status is HeartbeatStatus.OK  # not fenced for that
        store.lose()
        registry.corrections.check_all(EVERYTHING, "test: everything lost")
        await trio.sleep(0.1)
        answer = await old.heartbeat()
        assert answer.status is HeartbeatStatus.FENCED
        assert answer.fence_reason is FenceReason.REMOVED
        # it keeps its shards; the old one's wait a lease (quarantined: it may still handle them)
        assert (await new.heartbeat()).status in (HeartbeatStatus.OK, HeartbeatStatus.REVOKE_PENDING)
        assert owned <= new.owned
        for _ in range(TIMING.lease_ttl_ms // 1000 + 2):  # it rejoins and gets shards again
            await old.heartbeat()
            await new.heartbeat()
            await trio.sleep(1)
        assert old.owned


async def test_a_feature_record_lost_before_the_first_write_comes_back_at_its_level(
    lease_redis: RedisClient,
) -> None:
    """The record says level 1 (N-1 parts run); this coordinator read it at start-up and has
    written nothing since (heartbeats are not journaled). Redis then loses it: it comes back at
    level 1, whether the correction or the next write recreates it, never at the newest."""
    from rsc.actors.features import Features
    from rsc.coordinator_process import check_feature_level

    keys = KeySpace("rsc-test-features-loss:")
    await lease_redis.delete([keys.features])
    await lease_redis.hset(keys.features, {"level": "1", "written": "1"})
    features = Features(lease_redis, 3, keys=keys)
    await check_feature_level(features)
    await lease_redis.delete([keys.features])  # FLUSHALL
    await features.restore()
    restored = await features.peek()
    assert restored is not None
    assert restored.level == 1
    await lease_redis.delete([keys.features])  # again, and the next read (a new term) finds it gone
    await features.load()
    again = await features.peek()
    assert again is not None
    assert again.level == 1
    await lease_redis.delete([keys.features])


async def test_what_a_term_remembers_is_forgotten_once_another_coordinator_held_the_lease(
    autojump_clock: Clock,
) -> None:
    """Another coordinator was active since (it may have written more, which Redis then lost):
    this process's memory of its last term is stale, and is not written back."""
    from rsc.actors.leadership import Leadership, MemoryLease

    store = MemoryStore()
    async with registry_on(store) as registry:
        a = Member(registry, "orders", "billing", "a")
        await a.heartbeat()
        older = store.snapshot()
        for _ in range(3):
            await Member(registry, "orders", "billing", f"m{_}").heartbeat()
        registry.stop_all()
        lease = MemoryLease()
        other, this = Leadership(lease, 1_000, holder_id="other"), Leadership(lease, 1_000, holder_id="this")
        this.on_other_holder = registry.forget_terms
        await other._attempt()  # the other coordinator takes the lease
        await this._attempt()  # sees the other one's lease
        assert not registry.memory
        store.roll_back(older)
        actor = await registry.group("orders", "billing")
        assert actor.restores == 0  # adopted, not overwritten with the stale memory


async def test_looking_for_shard_keys_is_bounded_whatever_the_names_asked_about(
    autojump_clock: Clock,
) -> None:
    """A heartbeat that claims a layout of a stream Redis does not hold makes the coordinator
    look for its shard keys (a SCAN of the keyspace): at most EVIDENCE_SCANS_PER_MINUTE a minute
    for all names together, and a name found without keys not again for EVIDENCE_RETRY_MS."""
    from rsc.actors.corrections import EVIDENCE_SCANS_PER_MINUTE
    from rsc.events.commands import ProducerHeartbeat

    class Counting(MemoryEffects):
        scans = 0

        async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
            Counting.scans += 1
            return await super().find_shard_keys(stream_prefix)

    settings = attrs.evolve(SETTINGS, auto_create_streams=False)
    async with registry_on(MemoryStore(), Counting(), settings) as registry:
        for n in range(3 * EVIDENCE_SCANS_PER_MINUTE):
            command = ProducerHeartbeat("p", 7, False, registry.clock.now_ms(), 5_000)
            with pytest.raises(UnknownStream):
                await registry.ask_stream(f"never{n}", command, seen_version=7)
            with pytest.raises(UnknownStream):  # the same name again: not looked at again
                await registry.ask_stream(f"never{n}", command, seen_version=7)
        assert Counting.scans == EVIDENCE_SCANS_PER_MINUTE
        await trio.sleep(61)
        command = ProducerHeartbeat("p", 7, False, registry.clock.now_ms(), 5_000)
        with pytest.raises(UnknownStream):
            await registry.ask_stream("later", command, seen_version=7)
        assert Counting.scans == EVIDENCE_SCANS_PER_MINUTE + 1


async def test_a_join_that_comes_first_after_a_loss_rebuilds_from_the_shard_keys(
    autojump_clock: Clock,
) -> None:
    """Redis lost the stream while no coordinator ran, and the first heartbeat is a join (a
    restarted worker knows no layout): the shard keys producers appended to since are there, so
    the stream is rebuilt from them (not made anew with the default count beside them), and
    its group reads them from `0`."""
    from rsc.events.model import GroupConfig, StartFrom

    effects = MemoryEffects()
    effects.shard_keys.update(f"orders:{{orders:{i}}}" for i in range(8))  # 8 shards, not 6
    async with registry_on(MemoryStore(), effects) as registry:
        await registry.group("orders", "billing", GroupConfig(start_from=StartFrom.LATEST))
        stream = await registry.stream("orders")
        assert stream.state is not None
        assert [s.key for s in stream.state.layout.shards] == [f"orders:{{orders:{i}}}" for i in range(8)]
        assert set(effects.consumer_groups.values()) == {"0"}  # never `$`
        assert DATA_LOSS.counts["rebuilt"] >= 1
    DATA_LOSS.reset()


async def test_shard_keys_only_a_lost_layout_named_are_drained_without_an_operator(
    autojump_clock: Clock,
) -> None:
    """Redis came back from an older copy (6 shards) while producers routed by a newer layout
    (8 shards) and appended to shards 6 and 7: once a party reports the newer version, those
    keys are added DRAINING (sealed, every group's consumer group at `0`): read to their end
    and retired, never routed to, and nobody has to rescale by hand."""
    from rsc.events.model import ShardState

    effects = MemoryEffects()
    async with registry_on(MemoryStore(), effects) as registry:
        stream = await registry.stream("orders")
        await registry.group("orders", "billing")
        assert stream.state is not None
        before = stream.state.layout
        assert len(before.shards) == 6
        effects.shard_keys.update(f"orders:{{orders:{i}}}" for i in (6, 7))  # appended under v2
        assert await registry.feature_level() >= 2  # (read once a term: seals exist from 2)
        registry.behind_the_fleet("orders")
        registry.behind_the_fleet("orders")  # (asked again meanwhile: one look)
        await trio.sleep(1)
        state = (await registry.stream("orders")).state
        assert state is not None
        states = {s.index: s.state for s in state.layout.shards}
        assert states == {
            **dict.fromkeys(range(6), ShardState.ACTIVE),
            6: ShardState.DRAINING,
            7: ShardState.DRAINING,
        }
        assert state.layout.metadata_version == before.metadata_version + 2
        assert [s.index for s in state.layout.active] == list(range(6))  # producers never routed there
        keys = {f"orders:{{orders:{i}}}" for i in (6, 7)}
        assert keys <= set(effects.sealed)
        assert all(effects.consumer_groups[k, "billing"] == "0" for k in keys)
        # read to their end (nothing left in them here), they retire; a later look adds nothing
        autojump_clock.jump(11)
        registry.behind_the_fleet("orders")
        await trio.sleep(30)
        again = (await registry.stream("orders")).state
        assert again is not None
        assert [s.key for s in again.layout.shards] == [s.key for s in state.layout.shards]
        assert {s.index for s in again.layout.shards if s.state is ShardState.RETIRED} == {6, 7}
