"""Actors on real Redis (standalone and a 3-primary cluster): owner tokens follow
the assignment, recovery repairs, and a crash at any point loses nothing replied."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import attrs
import coredis
import pytest
import redis as redis_py
import trio
import trio.testing

from rsc.actors.actor import fold_loaded
from rsc.actors.aggregates import GroupAggregate, expected_tokens
from rsc.actors.deployment import Deployment
from rsc.actors.effects.inspection import topology_from_slots
from rsc.actors.effects.redis_effects import RedisEffects
from rsc.actors.errors import ActorStopped, CommandRefused, StoreUnavailable, TermFenced
from rsc.actors.keys import AggregateId, KeySpace, owner_key
from rsc.actors.redis_store import RedisStore
from rsc.actors.registry import Registry
from rsc.actors.store_connection import RedisClient
from rsc.events import codec, group
from rsc.events.commands import ChangeShardCount
from rsc.events.drain import DrainEvidence, GroupDrain, drained
from rsc.events.model import HeartbeatStatus, Timing
from rsc.events.wire import OwnerToken, seal_key
from rsc.http.metrics import Metrics
from rsc.resp import Multiplexed
from tests.actorkit import SETTINGS, Member, registry_on

LONG = attrs.evolve(SETTINGS, timing=Timing(heartbeat_interval_ms=1_000, lease_ttl_ms=60_000))


@pytest.fixture
async def registry(redis: RedisClient, lean: Multiplexed | None) -> AsyncIterator[Registry]:
    async with registry_on(
        RedisStore(redis, lean=lean, retention=100_000), RedisEffects(redis, lean=lean), LONG
    ) as reg:
        yield reg


def tokens_in_redis(client: redis_py.Redis, state: group.GroupState) -> dict[str, OwnerToken]:
    found = {}
    for shard in state.layout.shards:
        text = client.hget(owner_key(shard.key), state.group)
        if text is not None:
            found[shard.key] = codec.from_json(text, OwnerToken)
    return found


def assert_tokens_follow(client: redis_py.Redis, state: group.GroupState) -> None:
    """Redis holds a token for exactly each shard installed, naming its holder (member id and
    incarnation, what the data plane compares); its epoch is the holder's then or an earlier one
    (a member a target moves with it, feature level 8, keeps its tokens as they are)."""
    found, expected = tokens_in_redis(client, state), expected_tokens(state)
    assert {k: (t.member_id, t.incarnation) for k, t in found.items()} == {
        k: (t.member_id, t.incarnation) for k, t in expected.items()
    }
    assert all(found[k].member_epoch <= t.member_epoch for k, t in expected.items())


async def group_state(registry: Registry, prefix: str) -> group.GroupState:
    state = (await registry.group(prefix, "billing")).state
    assert state is not None
    return state


async def test_owner_tokens_follow_the_assignment_and_recovery_repairs(
    registry: Registry, checker: redis_py.Redis, prefix: str
) -> None:
    client = checker
    rng = random.Random(7)
    members = [Member(registry, prefix, "billing", f"10.0.0.{i}/w/0") for i in range(5)]
    live: list[Member] = []
    for step in range(40):
        move = rng.choice(["join", "join", "beat", "beat", "beat", "leave", "scale"])
        if move == "join" and len(live) < len(members):
            m = next(m for m in members if m not in live)
            live.append(m)
            await m.heartbeat()
        elif move == "leave" and live:
            await live.pop(rng.randrange(len(live))).leave()
        elif move == "scale" and step % 10 == 0:
            await registry.ask_stream(prefix, ChangeShardCount(6 + step // 10))
            await trio.sleep(0.05)
        for m in live:
            await m.heartbeat()
        # (a token whose holder only advanced its epoch is rewritten just after the answer)
        await trio.testing.wait_all_tasks_blocked(0.02)
        state = await group_state(registry, prefix)
        assert_tokens_follow(client, state)
        assert {m.member_id: m.owned for m in live} == {k: v.installed for k, v in state.members.items()}

    # Damage the tokens behind the coordinator's back, then restart the actor: recovery repairs.
    state = await group_state(registry, prefix)
    first, *_ = state.layout.shards
    client.hset(owner_key(first.key), "billing", codec.to_json(OwnerToken("intruder", "x", 1)))
    for shard in state.layout.shards[1:3]:
        client.hdel(owner_key(shard.key), "billing")
    registry.stop(AggregateId(prefix, "billing"))
    await trio.sleep(0.05)
    state = await group_state(registry, prefix)
    assert tokens_in_redis(client, state) == expected_tokens(state)
    groups = {g["name"] for shard in state.layout.shards for g in client.xinfo_groups(shard.key)}
    assert groups == {"billing"}


async def test_crash_at_random_points_loses_nothing_replied(
    registry: Registry, redis: RedisClient, lean: Multiplexed | None, checker: redis_py.Redis, prefix: str
) -> None:
    store = RedisStore(redis, lean=lean)
    aggregate = GroupAggregate(AggregateId(prefix, "billing"), RedisEffects(redis, lean=lean))
    rng = random.Random(11)
    replied: list[str] = []

    async def member_life(m: Member) -> None:
        """Join, beat and leave over and over, recording every persisted reply."""
        for _ in range(30):
            try:
                await (m.leave() if rng.random() < 0.15 else m.heartbeat())
            except ActorStopped:  # asked while the actor was being stopped: start over
                m.forget()
            await trio.sleep(rng.random() / 100)

    recorded = ReplyRecorder(registry, replied)
    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(member_life, Member(registry, prefix, "billing", f"10.0.1.{i}/w/0"))
        for _ in range(6):  # crash the actor at random points while members work
            await trio.sleep(rng.random() / 20)
            registry.stop(AggregateId(prefix, "billing"))
    recorded.close()

    loaded = await store.load(AggregateId(prefix, "billing"))
    journal = [e.data for e in await store.read(AggregateId(prefix, "billing")) if not e.is_checkpoint]
    missing = [event for event in replied if event not in journal]
    assert replied
    assert missing == []
    live = await group_state(registry, prefix)
    replayed = fold_loaded(aggregate, loaded)
    assert replayed is not None
    assert replayed == live
    assert_tokens_follow(checker, live)


class ReplyRecorder:
    """Wrap `registry.ask_group` to keep the JSON of every durable event a caller got back."""

    def __init__(self, registry: Registry, sink: list[str]) -> None:
        self.registry = registry
        self.original = registry.ask_group

        async def recording(stream: str, name: str, command: object, **options: Any) -> object:
            reply = await self.original(stream, name, command, **options)  # type: ignore[arg-type]
            sink.extend(aggregate_json(e) for e in reply.events if e.durable)
            return reply

        registry.ask_group = recording  # type: ignore[method-assign,assignment]

    def close(self) -> None:
        self.registry.ask_group = self.original  # type: ignore[method-assign]


def aggregate_json(event: object) -> str:
    return GroupAggregate(AggregateId("x"), None).event_to_json(event)[1]  # type: ignore[arg-type]


def test_event_json_is_stable() -> None:
    """The crash test compares events by their journal JSON; it must be canonical."""
    from rsc.events.events import ShardsInstalled

    a = aggregate_json(ShardsInstalled("m", frozenset({3, 1, 2})))
    assert json.loads(a)["shards"] == [1, 2, 3]
    assert a == aggregate_json(ShardsInstalled("m", frozenset({2, 3, 1})))


async def test_shard_stats_and_primary_nodes(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    effects = RedisEffects(redis, lean=lean)
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(12)]
    await effects.ensure_consumer_groups(keys, "billing", "0")
    await redis.xadd(keys[0], {"n": "1"})
    stats = await effects.shard_stats(keys)
    assert stats[keys[0]].length == 1
    assert stats[keys[0]].groups[0].group == "billing"
    assert stats[keys[0]].groups[0].lag == 1
    missing = f"{prefix}:{{{prefix}:gone}}"  # a key Redis lost (or not made yet): empty, no error
    assert (await effects.shard_stats([missing]))[missing].length == 0
    assert (await effects.shard_stats([missing]))[missing].groups == ()
    await redis.set(missing, "x")  # another refusal (WRONGTYPE) is raised
    with pytest.raises(CommandRefused, match=r"WRONGTYPE|wrong kind"):
        await effects.shard_stats([missing])
    nodes = {s.primary_node for s in stats.values()}
    if isinstance(redis, coredis.RedisCluster):
        assert None not in nodes  # every key is mapped to a primary
        assert len(nodes) > 1  # 12 keys over 3 primaries land on more than one
    else:
        assert nodes == {None}


async def test_pipelined_scripts_survive_a_script_flush(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    """Effects pipeline their scripts as EVALSHA without asking Redis first whether it holds
    them; after Redis lost its scripts (a restart, a failover, SCRIPT FLUSH) the NOSCRIPT
    answer loads them and the calls go again."""
    effects = RedisEffects(redis, lean=lean)
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(4)]
    await effects.ensure_streams(keys)
    await effects.ensure_consumer_groups(keys, "billing", "0")
    tokens = {key: OwnerToken("m1", "inc-1", 1) for key in keys}
    await effects.set_owners("billing", tokens)
    await redis.script_flush()
    await effects.ensure_consumer_groups(keys, "audit", "0")
    await effects.set_owners("billing", {key: OwnerToken("m2", "inc-1", 2) for key in keys})
    assert set((await effects.owners("billing", keys)).values()) == {OwnerToken("m2", "inc-1", 2)}
    evidence = await effects.drain_evidence(keys)  # a read, the same way
    assert set(evidence) == set(keys)


async def test_stream_counts_count_pending_creations_once(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    """The quota check's read: streams registered and created by an owner, plus the creations
    under way that Redis does not record yet (the registry's set and the creators' are in
    different slots on a cluster: one pipeline, no transaction)."""
    effects = RedisEffects(redis, lean=lean, keys=KeySpace(f"{prefix}:"))
    await effects.register_stream("done")
    await effects.record_created("ann", "done")
    await effects.register_stream("half")  # registered, its creator not recorded yet
    assert await effects.stream_counts("ann", []) == (2, 1)
    pending = [("done", "ann"), ("half", "ann"), ("new", "ann"), ("other", "bob"), ("new", "bob")]
    # total: done, half and the two not registered (new, other); ann: done, half and new
    assert await effects.stream_counts("ann", pending) == (4, 3)
    assert await effects.stream_counts("bob", pending) == (4, 2)
    assert await effects.stream_counts("carl", pending) == (4, 0)


async def test_pruning_deletes_only_departed_consumers_with_nothing_pending(
    redis: RedisClient, lean: Multiplexed | None, checker: redis_py.Redis, prefix: str
) -> None:
    """Live members' consumers stay, a departed one with entries pending stays until they are
    claimed, a departed idle one goes; a missing key or group is skipped, not an error."""
    effects = RedisEffects(redis, lean=lean)
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(6)]
    await effects.ensure_consumer_groups(keys[:4], "billing", "0")
    await effects.ensure_consumer_groups([keys[4]], "audit", "0")  # no billing group there
    for key in keys[:4]:
        await redis.xadd(key, {"n": "1"})
        for consumer in ("live-a", "gone-idle", "gone-busy"):
            await redis.xgroup_createconsumer(key, "billing", consumer)
        await redis.xreadgroup("billing", "gone-busy", streams={key: ">"}, count=10)
    gone = await effects.prune_consumers(keys, "billing", ["live-a", "live-b"])
    assert gone == 4
    for key in keys[:4]:
        names = {c["name"] for c in checker.xinfo_consumers(key, "billing")}
        assert names == {"live-a", "gone-busy"}
    assert await effects.prune_consumers(keys, "billing", ["live-a"]) == 0  # nothing more to do
    for key in keys[:4]:  # the new owner claims the entries: then it goes too
        checker.xautoclaim(key, "billing", "live-a", 0, "0")
    assert await effects.prune_consumers(keys, "billing", ["live-a"]) == 4
    assert {c["name"] for c in checker.xinfo_consumers(keys[0], "billing")} == {"live-a"}


async def test_drain_evidence_holds_only_with_nothing_pending_or_undelivered(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    """Read on the key's own node: an empty or missing key is drained; an entry not yet read, or
    one read and not acknowledged (even after XDEL emptied the key), is not; a key that holds
    entries must have each of the stream's groups; the seal is seen."""
    effects = RedisEffects(redis, lean=lean)
    key = f"{prefix}:{{{prefix}:0}}"
    missing = f"{prefix}:{{{prefix}:1}}"
    await effects.ensure_consumer_groups([key], "billing", "0")
    seen = await effects.drain_evidence([key, missing])
    assert seen[missing] == DrainEvidence(False, False, ())
    assert drained(seen[key], ["billing"])
    assert not seen[key].sealed
    entry = await redis.xadd(key, {"n": "1"})
    seen = await effects.drain_evidence([key])
    assert seen[key].groups == (GroupDrain("billing", 0, True),)  # undelivered
    assert not drained(seen[key], ["billing"])
    await redis.xreadgroup("billing", "m", streams={key: ">"}, count=10)
    await redis.xdel(key, [entry])  # the key is empty, the entry still pending
    seen = await effects.drain_evidence([key])
    assert seen[key].exists
    assert seen[key].groups == (GroupDrain("billing", 1, False),)
    assert not drained(seen[key], ["billing"])
    await redis.xack(key, "billing", [entry])
    await redis.set(seal_key(key), "3")
    seen = await effects.drain_evidence([key])
    assert seen[key].sealed
    assert not seen[key].exists  # nothing in it, nothing pending: drained whatever the groups
    assert drained(seen[key], ["billing", "audit"])
    kept = await redis.xadd(key, {"n": "2"})  # read and acknowledged, still in the key
    await redis.xreadgroup("billing", "m", streams={key: ">"}, count=10)
    await redis.xack(key, "billing", [kept])
    seen = await effects.drain_evidence([key])
    assert seen[key].exists
    assert drained(seen[key], ["billing"])
    assert not drained(seen[key], ["billing", "audit"])  # a group of the stream missing on the key
    await redis.delete([seal_key(key)])


async def test_the_topology_reads_the_same_from_cluster_shards_and_cluster_slots(
    redis: RedisClient, lean: Multiplexed | None, checker: redis_py.Redis
) -> None:
    topology = await RedisEffects(redis, lean=lean).topology()
    if not isinstance(redis, coredis.RedisCluster):
        assert topology is None
        return
    assert topology is not None
    # CLUSTER SLOTS is the fallback for clusters older than Redis 7 (no CLUSTER SHARDS)
    with pytest.warns(DeprecationWarning, match="cluster_shards"):  # coredis, on Redis 7
        slots = await redis.cluster_slots()
    assert topology_from_slots(slots) == topology
    primaries = {f"{n.host}:{n.port}" for n in checker.get_primaries()}  # type: ignore[attr-defined]
    assert {p.node for p in topology.primaries} == primaries
    assert sorted(r for p in topology.primaries for r in p.ranges) == [
        (0, 5460),
        (5461, 10922),
        (10923, 16383),
    ]


class FailingStore(RedisStore):
    """A `RedisStore` whose next append fails once armed: refused, or applied with its reply lost."""

    def __init__(self, redis: RedisClient, lean: Multiplexed | None) -> None:
        super().__init__(redis, lean=lean)
        self.fail_next: str | None = None

    async def append(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        failure, self.fail_next = self.fail_next, None
        if failure == "refused":
            raise StoreUnavailable("appending: Redis refused (injected)")
        appended = await super().append(*args, **kwargs)
        if failure == "reply lost":
            raise StoreUnavailable("appending: Redis timed out (injected, the write went through)")
        return appended


@pytest.mark.parametrize("failure", ["refused", "reply lost"])
async def test_a_failed_write_does_not_fence_live_members(
    redis: RedisClient, lean: Multiplexed | None, prefix: str, failure: str
) -> None:
    """After a write fails, the actor reloads; every member keeps a lease it can renew.

    The reloaded state meets the lease table only after a `RestartTimers`: a tick
    on the leases the journal implies (the joins') would fence the members heard
    since, and a tick on the table kept from before the reload would fence a
    member whose join was written although its reply was lost (`c`).
    """
    timing = Timing(heartbeat_interval_ms=200, lease_ttl_ms=2_000, revoke_timeout_ms=10_000)
    store = FailingStore(redis, lean)
    async with registry_on(
        store, RedisEffects(redis, lean=lean), attrs.evolve(SETTINGS, timing=timing)
    ) as registry:
        a = Member(registry, prefix, "billing", "a")
        b = Member(registry, prefix, "billing", "b")
        started = trio.current_time()
        while trio.current_time() - started < 2.5:  # past the leases the joins gave
            await a.heartbeat()
            await b.heartbeat()
            await trio.sleep(0.2)
        store.fail_next = failure
        with pytest.raises(StoreUnavailable):
            await Member(registry, prefix, "billing", "c").heartbeat()  # a join writes: it fails
        await trio.sleep(1.0)  # two ticks, well within the leases a and b renewed last
        state = await group_state(registry, prefix)
        joined = {"c"} if failure == "reply lost" else set()
        assert set(state.members) == {"a", "b"} | joined
        assert (await a.heartbeat()).status is not HeartbeatStatus.FENCED


async def test_metrics_go_on_sampling_a_stream_whose_actors_stopped(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    """Every worker gone and the actors stopped for being idle: the stream's lag series stay
    (sampled from the last layout seen), and sampling starts no actor."""
    async with registry_on(RedisStore(redis, lean=lean), RedisEffects(redis, lean=lean), LONG) as registry:
        stream = await registry.stream(prefix, create=True, shard_count=2)
        await registry.group(prefix, "billing")
        key = stream.state.layout.shards[0].key
        metrics = Metrics(Deployment(registry))
        await metrics.sample()
        assert metrics.samples[(prefix, 0)].groups == {"billing": (0, 0)}
        for aggregate in [a for a in registry.actors if a.stream_prefix == prefix]:
            registry.stop(aggregate)
        await redis.xadd(key, {"n": "1"})
        await metrics.sample()
        assert metrics.samples[(prefix, 0)].groups == {"billing": (0, 1)}
        assert metrics.samples[(prefix, 0)].length == 1
        assert not [a for a in registry.actors if a.stream_prefix == prefix]


async def test_a_standby_that_takes_over_looks_at_streams_made_while_it_waited(
    redis: RedisClient, lean: Multiplexed | None, prefix: str
) -> None:
    """A standby's drain watcher sees every load fenced. Streams the active coordinator
    created and scaled in meanwhile, with no member or producer left to start an actor for
    them, must still be looked at once it takes over: their drained shards retire (the
    all-expired path) and their lag is in the metrics."""
    active = False
    token = 10**12  # above the first coordinator's (it has none: 0)

    def term() -> int:
        if not active:
            raise TermFenced("a standby")
        return token

    quick = attrs.evolve(LONG, drain_check_s=0.2)
    keys = KeySpace(f"{prefix}-ns:")  # a deployment of its own: only its streams are looked at
    store = RedisStore(redis, lean=lean, fence_token=term, keys=keys)
    effects = RedisEffects(redis, lean=lean, fence_token=term, keys=keys)
    async with registry_on(store, effects, quick) as standby:
        metrics = Metrics(Deployment(standby))
        await trio.sleep(0.5)  # rounds of the standby's drain watcher: every load fenced
        async with registry_on(
            RedisStore(redis, lean=lean, keys=keys), RedisEffects(redis, lean=lean, keys=keys), LONG
        ) as first:
            stream = await first.stream(prefix, create=True, shard_count=2)
            await first.group(prefix, "billing")
            key = stream.state.layout.shards[0].key
            await first.ask_stream(prefix, ChangeShardCount(1, migrations=True))
            assert [s.state.value for s in stream.state.layout.shards] == ["ACTIVE", "DRAINING"]
        await redis.xadd(key, {"n": "1"})
        await trio.sleep(0.5)
        # no actor of it runs in the standby (one of its drain watcher's fenced loads may be
        # starting at this very moment, and fails: it is not kept)
        assert not [a for a in standby.running() if a.aggregate.aggregate_id.stream_prefix == prefix]
        active = True  # it takes over; nobody asks it anything about the stream
        with trio.fail_after(10):
            while (prefix, 0) not in metrics.samples:
                await trio.sleep(0.2)
                await metrics.sample()
        assert metrics.samples[(prefix, 0)].groups == {"billing": (0, 1)}
        taken = await standby.stream(prefix, create=False)
        with trio.fail_after(10):
            while taken.state.layout.draining:
                await trio.sleep(0.2)
        assert [s.state.value for s in taken.state.layout.shards] == ["ACTIVE", "RETIRED"]
        for aggregate in [a for a in standby.actors if a.stream_prefix == prefix]:
            standby.stop(aggregate)  # idle: the series stay
        await metrics.sample()
        assert metrics.samples[(prefix, 0)].length == 1
        standby.stop_all()  # the term ends: a standby reports nothing
        await metrics.sample()
        assert (prefix, 0) not in metrics.samples
