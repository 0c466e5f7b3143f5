"""The built-in poller's promises under faults, on real Redis (issue 12):

* exclusive handling: no handler call starts without a valid lease, and a call running when
  the lease ends is cancelled and handled again first once a heartbeat confirms the shard;
* order through a revoke: reading stops first, nothing read after the revoke began is
  handled, the handled entries are acknowledged before the revoke returns, and the next owner
  handles the rest in id order;
* Redis outages: the reader and the acker survive a Redis restart, log one line when it
  starts and one when it ends, and nothing is lost.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.poller import Message, Poller, PollerSettings
from rsc.client.poller.book import ReadState
from rsc.events.model import Layout, Shard, ShardState
from rsc.events.wire import owner_key
from tests.redis_servers import DurableServer

FAST_POLL = PollerSettings(retry_after_ms=100, reclaim_every_s=0.1, ack_every_s=0.005)


def own(sync_redis: redis.Redis, key: str, member: str) -> None:
    """Install `key` to `member` as the coordinator does (its owner token)."""
    token = f'{{"memberId":"{member}","incarnation":"{member}-inc","memberEpoch":1}}'
    sync_redis.hset(owner_key(key), "billing", token)


def layout(key: str) -> Layout:
    return Layout(1, (Shard(0, key, ShardState.ACTIVE),))


def entry_order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


async def wait_for(condition: Any, seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.01)


@pytest.fixture
def shard_key(prefix: str, sync_redis: redis.Redis) -> str:
    key = f"{prefix}:{{{prefix}:0}}"
    sync_redis.xgroup_create(key, "billing", "0", mkstream=True)
    return key


async def test_nothing_starts_without_a_valid_lease_and_a_call_cut_by_its_end_goes_first_again(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    starts: list[tuple[float, str]] = []
    done: list[str] = []
    third_may_end = trio.Event()  # the third call runs until the lease ends (however fast I/O is)

    async def handle(message: Message) -> None:
        starts.append((trio.current_time(), message.id))
        if message.id == ids[2]:
            await third_may_end.wait()
        done.append(message.id)

    own(sync_redis, shard_key, "w0")
    ids = [sync_redis.xadd(shard_key, {"n": str(n)}) for n in range(6)]
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, FAST_POLL)
        await nursery.start(poller.run)
        await poller.assigned(frozenset({0}), layout(shard_key))
        await trio.sleep(0.3)
        assert starts == []  # assigned, but no heartbeat has confirmed a lease yet

        until = trio.current_time() + 0.5
        poller.renewed(until)
        await trio.sleep(1.0)  # the lease ends at 0.5 s, in the third call (it waits for it)
        assert [i for _, i in starts] == ids[:3]
        assert all(t < until for t, _ in starts)
        assert done == ids[:2]  # the third was cancelled at the lease end
        assert poller.cut_by_lease == 1

        third_may_end.set()
        poller.renewed(math.inf)  # a heartbeat confirms the shard: the cut entry goes first
        await wait_for(lambda: len(done) == 6)
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()
    assert [i for _, i in starts] == [*ids[:3], *ids[2:]]
    assert done == ids


async def test_a_revoke_stops_reading_first_and_the_next_owner_goes_on_in_id_order(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    handled: list[tuple[str, str]] = []
    release = trio.Event()

    async def slow(message: Message) -> None:
        handled.append((message.member_id, message.id))
        await release.wait()

    async def fast(message: Message) -> None:
        handled.append((message.member_id, message.id))

    own(sync_redis, shard_key, "w0")
    before = [sync_redis.xadd(shard_key, {"n": str(n)}) for n in range(30)]
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        first = Poller(r, "billing", "w0", "w0-inc", slow, FAST_POLL)
        await nursery.start(first.run)
        first.renewed(math.inf)
        await first.assigned(frozenset({0}), layout(shard_key))
        await wait_for(lambda: handled and first.buffered == 29)  # one in flight, the rest queued

        revoked = trio.Event()

        async def revoke() -> None:
            await first.revoke(frozenset({0}), 30.0)
            revoked.set()

        nursery.start_soon(revoke)
        await trio.sleep(0.05)
        after = [sync_redis.xadd(shard_key, {"n": f"late{n}"}) for n in range(10)]
        await trio.sleep(0.2)  # a poller still reading the shard would read these now
        assert not revoked.is_set()  # the handler in flight finishes first
        release.set()
        await wait_for(revoked.is_set)
        assert handled == [("w0", before[0])]
        # The handled entry was acknowledged before the revoke returned; the 29 read but not
        # handled stay pending; the 10 added after the revoke began were not even read.
        assert sync_redis.xpending(shard_key, "billing")["pending"] == 29
        assert first.shards == {}

        own(sync_redis, shard_key, "w1")  # the coordinator installs the shard to the next owner
        second = Poller(r, "billing", "w1", "w1-inc", fast, FAST_POLL)
        await nursery.start(second.run)
        second.renewed(math.inf)
        await second.assigned(frozenset({0}), layout(shard_key))
        await wait_for(lambda: len(handled) == 40)
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()
    assert [i for _, i in handled] == before + after  # first handlings in id order
    assert {m for m, _ in handled[1:]} == {"w1"}


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
async def test_the_poller_survives_a_redis_restart_and_loses_nothing(
    tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture, how: signal.Signals
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)
        await trio.sleep(0.002)

    caplog.set_level(logging.WARNING, "rsc.client.poller")
    with DurableServer(tmp_path / "redis") as server, contextlib.ExitStack() as clients:
        sync = clients.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        key = f"{prefix}:{{{prefix}:0}}"
        sync.xgroup_create(key, "billing", "0", mkstream=True)
        own(sync, key, "w0")
        published = [sync.xadd(key, {"n": str(n)}) for n in range(200)]
        settings = attrs.evolve(FAST_POLL, redis_backoff=attrs.evolve(FAST_POLL.redis_backoff, cap_s=0.5))
        async with (
            open_redis(server.url, connect_timeout_s=1, command_timeout_s=1) as r,
            trio.open_nursery() as nursery,
        ):
            poller = Poller(r, "billing", "w0", "w0-inc", handle, settings)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset({0}), layout(key))
            await wait_for(lambda: len(handled) >= 50)
            server.stop(how)  # mid-stream: handled entries wait for their acknowledgement
            await trio.sleep(2)
            server.start()
            sync = clients.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
            published += [sync.xadd(key, {"n": f"after{n}"}) for n in range(100)]
            await wait_for(lambda: set(published) <= set(handled), 20)
            await wait_for(lambda: sync.xpending(key, "billing")["pending"] == 0, 10)
            # The outage is over once nothing failed for OUTAGE_OVER_S: said once.
            await wait_for(lambda: any("Redis answers again" in r.getMessage() for r in caplog.records), 10)
            nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable, retrying" in line for line in lines) == 1, lines
    assert sum("Redis answers again" in line for line in lines) == 1, lines
    assert not [r for r in caplog.records if r.exc_info], "no traceback for an outage"


async def test_entries_passed_on_unhandled_are_not_dead_lettered_and_a_stuck_one_is(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    """Deliveries count handler starts, not claims: five owners in turn each claim the whole
    backlog and start (and get stuck on) only its head. The head is dead-lettered once it was
    started `max_deliveries` times; the entries behind it, never handed to a handler, are not."""
    settings = attrs.evolve(FAST_POLL, max_deliveries=3)
    ids = [sync_redis.xadd(shard_key, {"n": str(n)}) for n in range(5)]
    handled: list[tuple[str, int, bool]] = []

    async def stuck(message: Message) -> None:
        handled.append((message.id, message.deliveries, message.redelivered))
        await trio.sleep_forever()

    async def fine(message: Message) -> None:
        handled.append((message.id, message.deliveries, message.redelivered))

    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        for owner in range(5):
            name = f"w{owner}"
            own(sync_redis, shard_key, name)  # the coordinator moved the shard
            poller = Poller(r, "billing", name, f"{name}-inc", fine if owner == 4 else stuck, settings)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset({0}), layout(shard_key))
            if owner < 4:
                await wait_for(lambda n=owner + 1: len(handled) == n)  # stuck on the head
                await poller.lost(frozenset({0}))
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()
    assert handled[:4] == [(ids[0], 1, False), (ids[0], 2, True), (ids[0], 3, True), (ids[1], 2, True)]
    assert handled[4:] == [(ids[1], 3, True), (ids[2], 2, True), (ids[3], 2, True), (ids[4], 2, True)]
    dead = sync_redis.xrange(f"{shard_key}:dlq")
    assert [(f["rscSourceId"], f["rscDeliveries"]) for _, f in dead] == [(ids[0], "4")]


async def test_entries_whose_read_reply_was_lost_are_handed_out_all_the_same(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    """A read that Redis executed but whose reply never arrived (a timeout, a dropped
    connection) left entries pending under this consumer, unseen: the next read returns them
    first. Simulated by reading for the poller's consumer name from outside."""
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    own(sync_redis, shard_key, "w0")
    first = sync_redis.xadd(shard_key, {"n": "0"})
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, FAST_POLL)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout(shard_key))
        await wait_for(lambda: handled == [first])
        with sync_redis.pipeline(transaction=True) as pipe:  # delivered to w0; the reply is "lost"
            for n in range(1, 4):
                pipe.xadd(shard_key, {"n": str(n)})
            pipe.xreadgroup("billing", "w0", {shard_key: ">"})
            *lost, _ = pipe.execute()
        later = sync_redis.xadd(shard_key, {"n": "4"})
        await wait_for(lambda: len(handled) == 5)
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()
    assert handled == [first, *lost, later]  # in id order, each once


async def test_entries_claimed_by_a_call_whose_reply_was_lost_do_not_stay_pending(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    """A reclaim (or any claim) that Redis executed but whose reply never arrived left entries
    pending under this consumer below what it has read: no read brings them back. The
    reclaimer hands out this consumer's own entries idle for `reclaim_idle_ms` that it does not
    hold itself. Simulated by claiming for the poller's consumer name from outside."""
    handled: list[str] = []
    slow = trio.Event()

    async def handle(message: Message) -> None:
        if message.fields.get("slow") == "1":
            await slow.wait()  # held by its handler meanwhile: never handed out twice
        handled.append(message.id)

    own(sync_redis, shard_key, "w0")
    settings = attrs.evolve(FAST_POLL, reclaim_idle_ms=300)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, settings)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout(shard_key))
        await wait_for(
            lambda: poller.shards[0].state is not ReadState.CLAIMING
        )  # its takeover's claim is done
        with sync_redis.pipeline(transaction=True) as pipe:  # read by a member that died with it
            pipe.xadd(shard_key, {"n": "0"})
            pipe.xreadgroup("billing", "gone-member", {shard_key: ">"})
            lost, _ = pipe.execute()
        later = sync_redis.xadd(shard_key, {"n": "1", "slow": "1"})
        await wait_for(lambda: poller.shards[0].last_read == later)  # w0 read past `lost`
        # The reclaim of `lost` ran in Redis, its reply was lost: pending under w0, below its last read.
        sync_redis.xclaim(shard_key, "billing", "w0", 0, [lost], justid=True)
        await trio.sleep(1.0)  # `later`, held by its handler past reclaim_idle_ms, is not handed out again
        slow.set()  # (one shard's entries are handled one at a time: `lost` waited behind it)
        await wait_for(lambda: lost in handled, 10)
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()
    assert sorted(handled) == sorted([lost, later])  # each once


async def test_fewer_workers_let_the_calls_in_flight_finish(
    standalone_url: str, sync_redis: redis.Redis, prefix: str
) -> None:
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(3)]
    started: list[tuple[str, str]] = []  # (shard key, entry id): ids are unique per key only
    finished: list[tuple[str, str]] = []

    async def handle(message: Message) -> None:
        started.append((message.key, message.id))
        await trio.sleep(0.3)
        finished.append((message.key, message.id))

    for key in keys:
        sync_redis.xgroup_create(key, "billing", "0", mkstream=True)
        own(sync_redis, key, "w0")
    ids = [(k, sync_redis.xadd(k, {"n": str(n)})) for n in range(9) for k in [keys[n % 3]]]
    three = Layout(1, tuple(Shard(i, k, ShardState.ACTIVE) for i, k in enumerate(keys)))
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, FAST_POLL)
        await nursery.start(poller.run)
        await poller.concurrency(3)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0, 1, 2}), three)
        await wait_for(lambda: len(started) == 3)  # three calls in flight, one per shard
        await poller.concurrency(1)
        await wait_for(lambda: len(finished) == 9)
        await wait_for(lambda: all(sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys))
        nursery.cancel_scope.cancel()
    assert sorted(started) == sorted(finished) == sorted(ids)  # none cut short, none run twice


async def test_a_refused_ack_is_kept_and_tried_again_at_the_refusal_pace(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    """An ack the owner token refuses (the shard moved, or Redis lost the token) is kept and sent
    again no sooner than `REFUSAL_RETRY_S` apart: not every `ack_every_s` (a regression of the
    poller's split sent one per 5 ms), and once the token is ours again it goes through."""
    release = trio.Event()

    async def handle(message: Message) -> None:
        await release.wait()

    own(sync_redis, shard_key, "w0")
    sync_redis.xadd(shard_key, {"n": "1"})
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, FAST_POLL)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout(shard_key))
        await wait_for(lambda: poller.shards[0].home.handling is not None)
        own(sync_redis, shard_key, "someone-else")
        acks = 0
        ack = poller.scripts.ack

        async def counted(chunk: Any) -> Any:
            nonlocal acks
            acks += 1
            return await ack(chunk)

        poller.scripts.ack = counted  # type: ignore[method-assign]
        release.set()
        await wait_for(lambda: 0 in poller.stalled_shards())
        await trio.sleep(1.0)
        assert 1 <= acks <= 4  # at the 0.5 s refusal pace (about 200 at the acker's own pace)
        assert sync_redis.xpending(shard_key, "billing")["pending"] == 1  # kept, not dropped
        own(sync_redis, shard_key, "w0")  # the coordinator writes the token back
        await wait_for(lambda: sync_redis.xpending(shard_key, "billing")["pending"] == 0)
        nursery.cancel_scope.cancel()


async def test_a_handler_past_the_revoke_budget_is_cancelled_and_the_revoke_completes(
    standalone_url: str, sync_redis: redis.Redis, shard_key: str
) -> None:
    """`revoke(shards, within_s)`: the member passes what the group's revoke timeout leaves
    (`MemberMachine.revoke_budget_s`); a handler still running then is cancelled, the revoke
    returns, and its entry stays pending for the next owner."""
    cancelled = trio.Event()

    async def stuck(message: Message) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    own(sync_redis, shard_key, "w0")
    sync_redis.xadd(shard_key, {"n": "0"})
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", stuck, FAST_POLL)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout(shard_key))
        await wait_for(lambda: poller.shards[0].home.handling is not None)
        with trio.fail_after(10):  # far above the budget: it returns by the budget
            await poller.revoke(frozenset({0}), 0.2)
        assert cancelled.is_set()
        assert poller.shards == {}
        assert sync_redis.xpending(shard_key, "billing")["pending"] == 1
        nursery.cancel_scope.cancel()
