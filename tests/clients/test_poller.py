"""The built-in poller on real Redis, behind a real coordinator: consume, fence, dead-letter, take over."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import redis
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.errors import Fenced
from rsc.client.member import Member
from rsc.client.poller import Handler, Message, Poller, PollerSettings
from rsc.events.model import Layout, Shard, ShardState
from rsc.events.wire import owner_key
from tests.httpkit import FAST, serve_on

FAST_POLL = PollerSettings(retry_after_ms=100, reclaim_every_s=0.1, max_deliveries=2)


@pytest.fixture
async def base_url(standalone_url: str) -> AsyncIterator[str]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield str(http.base_url)


async def shard_keys(base_url: str, prefix: str) -> list[str]:
    async with httpx.AsyncClient(base_url=base_url) as http:
        routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
    return [s["key"] for s in routing["shards"]]


async def wait_for(condition: object, seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.02)


@attrs.frozen
class Running:
    """A coordinator client, a Redis client and a nursery; members started here stop with the block."""

    coordinator: Coordinator
    redis: Any
    nursery: trio.Nursery
    prefix: str

    async def member(
        self, name: str, handler: Handler, settings: PollerSettings = FAST_POLL
    ) -> tuple[Member, Poller]:
        incarnation = f"{name}-inc"
        poller = Poller(self.redis, "billing", name, incarnation, handler, settings)
        await self.nursery.start(poller.run)
        member = Member(self.coordinator, self.prefix, "billing", name, poller, incarnation=incarnation)
        await self.nursery.start(member.run)
        return member, poller


@contextlib.asynccontextmanager
async def running(base_url: str, redis_url: str, prefix: str) -> AsyncIterator[Running]:
    async with (
        Coordinator(base_url) as coordinator,
        open_redis(redis_url) as r,
        trio.open_nursery() as nursery,
    ):
        yield Running(coordinator, r, nursery, prefix)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("workers", [1, 4])
async def test_consumes_everything_and_acks(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis, workers: int
) -> None:
    seen: list[tuple[int, str]] = []

    async def handle(message: Message) -> None:
        await trio.sleep(0.001 * (int(message.fields["n"]) % 3))  # workers interleave
        seen.append((message.shard, message.fields["n"]))

    async with running(base_url, standalone_url, prefix) as env:
        member, poller = await env.member("w0", handle)
        await poller.concurrency(workers)  # as maxConcurrency from the coordinator would
        await wait_for(lambda: len(member.owned) == 4)
        keys = await shard_keys(base_url, prefix)
        for n in range(200):
            sync_redis.xadd(keys[n % 4], {"n": str(n)})
        await wait_for(lambda: len(seen) == 200)
        await wait_for(lambda: all(sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys))
        member.stop()
        await member.wait_left()
    assert sorted(int(n) for _, n in seen) == list(range(200))
    for shard in range(4):  # per-shard order kept
        mine = [int(n) for s, n in seen if s == shard]
        assert mine == sorted(mine)


async def test_a_busy_shard_does_not_starve_the_others(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    order: list[int] = []

    async def handle(message: Message) -> None:
        order.append(message.shard)
        await trio.sleep(0.001)

    async with running(base_url, standalone_url, prefix) as env:
        member, _ = await env.member("w0", handle, attrs.evolve(FAST_POLL, batch=10, prefetch=20))
        await wait_for(lambda: len(member.owned) == 4)
        keys = await shard_keys(base_url, prefix)
        for n in range(500):  # shard 0 is hot
            sync_redis.xadd(keys[0], {"n": str(n)})
        for k in keys[1:]:
            sync_redis.xadd(k, {"n": "cold"})
        await wait_for(lambda: len(order) == 503)
    # The three cold entries are handled early, not after the 500 hot ones.
    assert max(i for i, shard in enumerate(order) if shard != 0) < 100


async def test_failing_entries_are_retried_then_dead_lettered(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []

    async def handle(message: Message) -> None:
        attempts.append(message.id)
        if message.fields["n"] == "poison":
            raise ValueError("cannot handle this")

    async with running(base_url, standalone_url, prefix) as env:
        member, poller = await env.member("w0", handle)
        await wait_for(lambda: len(member.owned) == 4)
        key = (await shard_keys(base_url, prefix))[1]
        poison = sync_redis.xadd(key, {"n": "poison"})
        sync_redis.xadd(key, {"n": "fine"})
        await wait_for(lambda: poller.dead_lettered == 1)
    assert attempts.count(poison) == 2  # max_deliveries
    assert poller.failed == 2
    failures = [r.getMessage() for r in caplog.records if "handler failed" in r.getMessage()]
    assert failures == [
        f"w0: handler failed on {key} {poison} (delivery {n} of 2): ValueError: cannot handle this"
        for n in (1, 2)
    ]  # one line each, no traceback at WARNING
    assert all(r.exc_info is None for r in caplog.records if "handler failed" in r.getMessage())
    [moved] = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert (
        moved == f"w0: dead-lettered {key} {poison} after 2 failed deliveries (max_deliveries 2) to {key}:dlq"
    )
    dead = sync_redis.xrange(f"{key}:dlq")
    assert dead[0][1] == {"rscSourceId": poison, "rscDeliveries": "3", "n": "poison"}
    assert sync_redis.xpending(key, "billing")["pending"] == 0


async def test_takeover_claims_what_earlier_owners_left_pending(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.fields["n"])

    async with running(base_url, standalone_url, prefix) as env:
        first, _ = await env.member("w0", handle)
        await wait_for(lambda: len(first.owned) == 4)
        keys_before = await shard_keys(base_url, prefix)
        first.stop()
        await first.wait_left()
        # An earlier owner read these and died before acknowledging them.
        for n in range(5):
            sync_redis.xadd(keys_before[2], {"n": f"left-{n}"})
        sync_redis.xreadgroup("billing", "10.9.9.9/old/0", {keys_before[2]: ">"})
        assert sync_redis.xpending(keys_before[2], "billing")["pending"] == 5
        no_reclaim = attrs.evolve(FAST_POLL, reclaim_every_s=3600)  # only the takeover claims them
        await env.member("w1", handle, no_reclaim)
        await wait_for(lambda: len(handled) == 5)
        await wait_for(lambda: sync_redis.xpending(keys_before[2], "billing")["pending"] == 0)
    assert sorted(handled) == [f"left-{n}" for n in range(5)]


async def test_a_refused_ack_is_kept_reported_and_healed_by_the_coordinator(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    """A shard whose owner token names another member (Redis rolled it back, or it moved) is not
    dropped behind the member's back (its member would report it owned, read by nobody, for
    good): the ack is kept, the shard reported in `stalledShards`, and the coordinator, for
    which it is this member's, writes the token back; the kept ack then goes through. (That
    the scripts refuse a foreign token is `test_the_scripts_check_the_owner_token`.)"""
    release = trio.Event()

    async def handle(message: Message) -> None:
        await release.wait()

    async with running(base_url, standalone_url, prefix) as env:
        member, poller = await env.member("w0", handle)
        await wait_for(lambda: len(member.owned) == 4)
        key = (await shard_keys(base_url, prefix))[0]
        sync_redis.xadd(key, {"n": "1"})
        await wait_for(lambda: poller.shards[0].home.handling is not None)
        # Another member now owns shard 0 (as after this one was fenced and the shard moved).
        sync_redis.hset(owner_key(key), "billing", '{"memberId":"other","incarnation":"x","memberEpoch":9}')
        seen_stalled = False

        def healed() -> bool:
            nonlocal seen_stalled
            seen_stalled = seen_stalled or 0 in poller.stalled_shards()
            return sync_redis.xpending(key, "billing")["pending"] == 0

        release.set()
        await wait_for(healed)
        assert 0 in poller.shards
        assert '"memberId":"w0"' in sync_redis.hget(owner_key(key), "billing").replace(" ", "")


async def test_the_scripts_check_the_owner_token(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    async with running(base_url, standalone_url, prefix) as env:
        # The real poller never acks: if it reads or claims the entry, it stays pending all the same.
        member, poller = await env.member("w0", _hold)
        await wait_for(lambda: len(member.owned) == 4)
        key = (await shard_keys(base_url, prefix))[3]
        # Added and read in one transaction: pending under "w0" before the running poller sees it.
        with sync_redis.pipeline(transaction=True) as pipe:
            pipe.xadd(key, {"n": "1"})
            pipe.xreadgroup("billing", "w0", {key: ">"}, count=1)
            entry, _ = pipe.execute()
        assert sync_redis.xpending(key, "billing")["pending"] == 1
        shard = poller.shards[3]
        impostor = Poller(env.redis, "billing", "w0", "another-incarnation", _ignore)
        someone_else = Poller(env.redis, "billing", "someone-else", "another-incarnation", _ignore)
        with pytest.raises(Fenced):
            await impostor.scripts.claim(shard, 0, 10, "0-0")
        with pytest.raises(Fenced):  # an entry idle under another consumer name: checked, refused
            await someone_else.scripts.reclaim(shard, 0, 10)
        # Reads and acknowledgements take several shards at once: a refusal per shard.
        [read] = await impostor.scripts.read([(shard, 10)])
        assert isinstance(read.refused, Fenced)
        assert "owned by another member" in str(read.refused)
        [acked] = await impostor.scripts.ack([(shard, [entry])])
        assert isinstance(acked, Fenced)
        assert sync_redis.xpending(key, "billing")["pending"] == 1
        assert await poller.scripts.ack([(shard, [entry])]) == [1]  # the owner's own ack goes through


async def _ignore(message: Message) -> None:
    return None


async def _hold(message: Message) -> None:
    await trio.sleep_forever()


async def test_entries_idle_under_other_consumers_are_reclaimed(
    base_url: str, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.fields["n"])

    settings = attrs.evolve(FAST_POLL, reclaim_idle_ms=300)
    async with running(base_url, standalone_url, prefix) as env:
        member, _ = await env.member("w0", handle, settings)
        await wait_for(lambda: len(member.owned) == 4)
        key = (await shard_keys(base_url, prefix))[1]
        await trio.sleep(0.3)  # the takeover claim is done
        # A stale process (another consumer name) reads it first (atomically here), then dies.
        pipe = sync_redis.pipeline(transaction=True)
        pipe.xadd(key, {"n": "ghosted"})
        pipe.xreadgroup("billing", "10.9.9.9/ghost/0", {key: ">"})
        pipe.execute()
        assert sync_redis.xpending(key, "billing")["consumers"][0]["name"] == "10.9.9.9/ghost/0"
        await wait_for(lambda: handled == ["ghosted"])
        await wait_for(lambda: sync_redis.xpending(key, "billing")["pending"] == 0)  # acks are batched


async def test_drain_progress_of_draining_shards(
    standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    release = trio.Event()

    async def handle(message: Message) -> None:
        await release.wait()

    key = f"{prefix}:{{{prefix}:0}}"
    sync_redis.xgroup_create(key, "billing", "0", mkstream=True)
    token = '{"memberId":"w0","incarnation":"w0-inc","memberEpoch":1}'
    sync_redis.hset(owner_key(key), "billing", token)  # as the coordinator does when it installs the shard
    layout = Layout(3, (Shard(0, key, ShardState.DRAINING),))
    for n in range(3):
        sync_redis.xadd(key, {"n": str(n)})
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", "w0", "w0-inc", handle, attrs.evolve(FAST_POLL, reclaim_every_s=0.05))
        await nursery.start(poller.run)
        poller.renewed(math.inf)  # as the member runtime does after each successful heartbeat
        await poller.assigned(frozenset({0}), layout)
        await wait_for(lambda: [(p.shard, p.pending, p.lag) for p in poller.drain_progress()] == [(0, 3, 0)])
        release.set()
        await wait_for(lambda: [(p.shard, p.pending, p.lag) for p in poller.drain_progress()] == [(0, 0, 0)])
        nursery.cancel_scope.cancel()
