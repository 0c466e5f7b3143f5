"""The poller's wake-up (issue 13, item 6): messages at push speed, idle for free, on real Redis.

A caught-up member does not poll: a plain XREAD BLOCK (only a signal) on its shards' keys, from
the last id its fenced read saw, wakes it; the fenced read follows (pipelined right behind the
XREAD on its connection, or by the reader). The tests make every other
way in impossible (a poll pause and a block of an hour, no periodic reclaim) and count Redis
commands instead of timing anything:

* an entry on an idle shard reaches the handler, and an idle member sends no command at all;
* an entry appended between the fenced read and the start of the block is not missed;
* revoke, loss and stop end a blocked wake-up at once (it would otherwise block for an hour);
* fencing holds: a woken member whose shard moved reads nothing;
* a Redis restart under a blocked wake-up is survived, and the member blocks again after;
* on a cluster, shards of different hash slots block on connections of their own;
* where Redis refuses XREAD, the member falls back to polling (and says so);
* the fenced read pipelined behind a wake-up read falls back to the reader when it fails;
* shards read in one call are refused one by one;
* on a standalone Redis the poller goes around coredis (lean connections: the watch's own and
  one shared by its scripts), and either way a Redis that forgot its scripts is read on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
import trio
from redis.cluster import RedisCluster

from rsc.actors.store_connection import open_redis
from rsc.client.poller import Message, Poller, PollerSettings
from rsc.client.poller.wakeup import block_ms
from rsc.events.model import Layout, Shard, ShardState
from rsc.events.wire import owner_key
from tests.redis_servers import DurableServer

HOUR = 3600.0
#: Nothing but a wake-up can bring an entry in: no poll pause, block and reclaim shorter than an hour.
ONLY_WAKEUPS = PollerSettings(wake_block_s=HOUR, idle_sleep_s=HOUR, reclaim_every_s=HOUR)
MEMBER = "w0"


def own(client: Any, key: str, member: str = MEMBER) -> None:
    """Install `key` to `member` as the coordinator does (its owner token)."""
    token = f'{{"memberId":"{member}","incarnation":"{member}-inc","memberEpoch":1}}'
    client.hset(owner_key(key), "billing", token)


def layout(keys: list[str]) -> Layout:
    return Layout(1, tuple(Shard(i, k, ShardState.ACTIVE) for i, k in enumerate(keys)))


async def wait_for(condition: Any, seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.01)


@pytest.fixture
def nodes(redis_url: str) -> Iterator[list[redis.Redis]]:
    """A plain client on every primary behind `redis_url` (one on a standalone Redis)."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as plain:
        clustered = bool(plain.info("cluster").get("cluster_enabled"))
    if not clustered:
        clients = [redis.Redis.from_url(redis_url, decode_responses=True)]
    else:
        with RedisCluster.from_url(redis_url) as cluster:
            primaries = [(n.host, n.port) for n in cluster.get_primaries()]
        clients = [redis.Redis(host=h, port=p, decode_responses=True) for h, p in primaries]
    yield clients
    for client in clients:
        client.close()


def blocked_reads(nodes: list[redis.Redis]) -> list[str]:
    """The ids of the clients blocked in XREAD, on every node."""
    return [c["id"] for n in nodes for c in n.client_list() if c["cmd"] == "xread" and "b" in c["flags"]]


def reset_stats(nodes: list[redis.Redis]) -> None:
    for node in nodes:
        node.config_resetstat()


def calls(nodes: list[redis.Redis]) -> dict[str, int]:
    """Commands run since `reset_stats` (those run by scripts included), on every node."""
    total: dict[str, int] = {}
    for node in nodes:
        for name, stats in node.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            total[command] = total.get(command, 0) + int(stats["calls"])
    for ours in ("config|resetstat", "info", "client|list"):
        total.pop(ours, None)
    return total


def shard_keys(prefix: str, count: int, checker: Any) -> list[str]:
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(count)]
    for key in keys:
        checker.xgroup_create(key, "billing", "0", mkstream=True)
        own(checker, key)
    return keys


def caught_up(poller: Poller) -> bool:
    return bool(poller.shards) and all(s.tail is not None for s in poller.shards.values())


@contextlib.asynccontextmanager
async def running(redis_url: str, keys: list[str]) -> AsyncIterator[tuple[Poller, list[str]]]:
    """A running poller (`ONLY_WAKEUPS`, a lease for ever) that owns `keys`, and the ids it
    handled; stopped on exit."""
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    async with open_redis(redis_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset(range(len(keys))), layout(keys))
        yield poller, handled
        nursery.cancel_scope.cancel()


async def test_an_entry_on_an_idle_shard_wakes_the_member_which_sends_nothing_while_idle(
    redis_url: str, checker: Any, nodes: list[redis.Redis], prefix: str
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    keys = shard_keys(prefix, 4, checker)
    async with open_redis(redis_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset(range(4)), layout(keys))
        # One blocked read for the four keys on a standalone Redis, one per key (slot) on a cluster.
        expected = 1 if len(nodes) == 1 else 4
        await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == expected)

        reset_stats(nodes)
        await trio.sleep(1.0)  # idle: not one command (the old poller sent ~15 fenced reads a second)
        assert calls(nodes) == {}

        for key in (keys[2], keys[0], keys[2]):
            entry = checker.xadd(key, {"n": "1"})
            await wait_for(lambda entry=entry: entry in handled)  # the poll pause is an hour
        await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == expected)
        nursery.cancel_scope.cancel()
    assert len(handled) == 3


async def test_a_redis_that_forgot_its_scripts_is_read_on_and_standalone_goes_around_coredis(
    redis_url: str, checker: Any, nodes: list[redis.Redis], prefix: str
) -> None:
    keys = shard_keys(prefix, 4, checker)
    standalone = len(nodes) == 1
    async with running(redis_url, keys) as (poller, handled):
        await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == (1 if standalone else 4))
        # On a standalone Redis: the blocked read on the watch's lean connection, the scripts on
        # the poller's own; on a cluster: coredis for both.
        connections = [w.connection for w in poller.wakeups.watches.values()]
        assert all(c is not None for c in connections) is standalone
        assert (poller.scripts.lean is not None) is standalone
        for node in nodes:
            node.script_flush()  # as after a restart or a failover
        entries = [checker.xadd(key, {"n": "1"}) for key in keys]
        await wait_for(lambda: set(entries) <= set(handled))
        await wait_for(lambda: sum(checker.xpending(k, "billing")["pending"] for k in keys) == 0)  # acked
    assert poller.scripts.lean is None  # only while it runs


async def test_an_entry_appended_between_the_read_and_the_block_is_not_missed(
    standalone_url: str, sync_redis: redis.Redis, prefix: str
) -> None:
    """The block starts from the last id the fenced read saw, not from `$` when it starts."""
    handled: list[str] = []
    late: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    class AppendFirst:
        """The wake-up client, with an entry appended just before its first XREAD is sent
        (alone, or in a pipeline with the read behind it)."""

        def __init__(self, client: Any) -> None:
            self.client = client
            self.connection_pool = client.connection_pool

        def xread(self, streams: dict[str, str], **options: Any) -> Any:
            self.append()
            return self.client.xread(streams, **options)

        def pipeline(self, **options: Any) -> Any:
            self.append()
            return self.client.pipeline(**options)

        def append(self) -> None:
            if not late:
                late.append(sync_redis.xadd(key, {"n": "late"}))

    [key] = shard_keys(prefix, 1, sync_redis)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(
            r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS, wake_client=AppendFirst(r)
        )
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout([key]))
        await wait_for(lambda: late and late[0] in handled)  # blocking from `$`: an hour
        nursery.cancel_scope.cancel()
    assert handled == late


async def test_a_read_behind_a_wake_up_that_fails_leaves_the_shards_to_the_reader(
    standalone_url: str, sync_redis: redis.Redis, prefix: str
) -> None:
    """The fenced read pipelined behind the blocked XREAD runs by its sha: after the script
    cache was flushed (a Redis restart without persistence does that) it fails with NOSCRIPT,
    and the reader reads the woken shards with the script, loading it again."""
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    keys = shard_keys(prefix, 2, sync_redis)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset(range(2)), layout(keys))
        await wait_for(lambda: caught_up(poller) and len(blocked_reads([sync_redis])) == 1)
        sync_redis.script_flush()
        entry = sync_redis.xadd(keys[1], {"n": "1"})
        await wait_for(lambda: handled == [entry])
        await wait_for(lambda: caught_up(poller) and len(blocked_reads([sync_redis])) == 1)
        entry = sync_redis.xadd(keys[0], {"n": "2"})  # and the read behind the wake-up works again
        await wait_for(lambda: handled[-1:] == [entry])
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["lost", "revoke", "stop"])
async def test_revoke_loss_and_stop_end_a_blocked_wake_up_at_once(
    redis_url: str, checker: Any, nodes: list[redis.Redis], prefix: str, how: str
) -> None:
    keys = shard_keys(prefix, 2, checker)
    async with open_redis(redis_url) as r:
        async with trio.open_nursery() as nursery:
            poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", _ignore, ONLY_WAKEUPS)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset({0, 1}), layout(keys))
            expected = 1 if len(nodes) == 1 else 2
            await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == expected)
            before = set(blocked_reads(nodes))
            if how == "stop":
                nursery.cancel_scope.cancel()
            else:
                if how == "lost":
                    await poller.lost(frozenset({0}))
                else:
                    await poller.revoke(frozenset({0}), 30.0)

                # The read naming shard 0 ended at once (it blocks for an hour otherwise). On a
                # standalone Redis it named shard 1 too: shard 1 is watched by a new one.
                def after() -> bool:
                    now = blocked_reads(nodes)
                    return len(now) == 1 and (now[0] in before) == (expected == 2)

                await wait_for(after)
                watch = poller.shards[1].home.watch
                assert watch is not None
                assert watch.blocked_on == frozenset({1})
                await poller.lost(frozenset({1}))
                assert poller.wakeups.watches == {}
                await wait_for(lambda: blocked_reads(nodes) == [])
                nursery.cancel_scope.cancel()
        await wait_for(lambda: blocked_reads(nodes) == [])


async def test_a_woken_member_whose_shard_moved_reads_nothing(
    redis_url: str, checker: Any, nodes: list[redis.Redis], prefix: str
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    [key] = shard_keys(prefix, 1, checker)
    async with open_redis(redis_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset({0}), layout([key]))
        await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == 1)
        own(checker, key, "another")  # the coordinator moved the shard; this member does not know yet
        checker.xadd(key, {"n": "1"})
        # Woken, its fenced read was refused: kept, reported to the coordinator (which tells the
        # member to stop it), never read meanwhile.
        await wait_for(lambda: poller.stalled_shards() == {0})
        await trio.sleep(1.5)  # tried again meanwhile: refused each time
        assert 0 in poller.shards
        await poller.lost(frozenset({0}))  # what the member does once its heartbeat says so
        await wait_for(lambda: blocked_reads(nodes) == [])
        nursery.cancel_scope.cancel()
    assert handled == []
    [group] = checker.xinfo_groups(key)
    assert (group["pending"], group["lag"]) == (0, 1)  # not even delivered: left for the new owner


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
async def test_a_redis_restart_under_a_blocked_wake_up_is_survived(
    tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture, how: signal.Signals
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    caplog.set_level(logging.WARNING, "rsc.client.poller")
    fast_retries = attrs.evolve(ONLY_WAKEUPS.redis_backoff, cap_s=0.5)
    settings = attrs.evolve(ONLY_WAKEUPS, redis_backoff=fast_retries)
    with DurableServer(tmp_path / "redis") as server, contextlib.ExitStack() as clients:
        # redis-py clients, closed at the end (one left to the garbage collector failed the
        # test that made it, as an unclosed socket, whenever a collection found it there)
        sync = clients.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        [key] = shard_keys(prefix, 1, sync)
        async with (
            open_redis(server.url, connect_timeout_s=1, command_timeout_s=1) as r,
            open_redis(server.url, connect_timeout_s=1, command_timeout_s=HOUR) as wakeups,
            trio.open_nursery() as nursery,
        ):
            poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, settings, wake_client=wakeups)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset({0}), layout([key]))
            await wait_for(lambda: caught_up(poller) and len(blocked_reads([sync])) == 1)
            server.stop(how)
            await trio.sleep(1.0)  # the blocked read failed; the reads back off meanwhile
            server.start()
            sync = clients.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
            # It blocks again (not polling) and the next entry wakes it.
            await wait_for(lambda: caught_up(poller) and len(blocked_reads([sync])) == 1, 20)
            entry = sync.xadd(key, {"n": "after"})
            await wait_for(lambda: entry in handled)
            await wait_for(lambda: any("Redis answers again" in r.getMessage() for r in caplog.records), 10)
            nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable, retrying" in line for line in lines) == 1, lines
    assert not [r for r in caplog.records if r.exc_info], "no traceback for an outage"


async def test_on_a_cluster_each_hash_slot_blocks_on_a_connection_of_its_own(
    cluster_url: str, prefix: str
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.fields["n"])

    # Five shards in four slots: the last two share a hash tag, so one XREAD names both.
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(3)]
    keys += [f"{prefix}:{{{prefix}:shared}}:{i}" for i in range(2)]
    with RedisCluster.from_url(cluster_url, decode_responses=True) as checker:
        for key in keys:
            checker.xgroup_create(key, "billing", "0", mkstream=True)
            own(checker, key)
        primaries = [(n.host, n.port) for n in checker.get_primaries()]
        nodes = [redis.Redis(host=h, port=p, decode_responses=True) for h, p in primaries]
        async with open_redis(cluster_url) as r, trio.open_nursery() as nursery:
            poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, ONLY_WAKEUPS)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset(range(5)), layout(keys))
            await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == 4)
            assert sorted(len(w.shards) for w in poller.wakeups.watches.values()) == [1, 1, 1, 2]
            for n, key in enumerate(keys):
                checker.xadd(key, {"n": str(n)})
            await wait_for(lambda: len(handled) == 5)
            await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == 4)
            nursery.cancel_scope.cancel()
        for node in nodes:
            node.close()
    assert sorted(handled) == ["0", "1", "2", "3", "4"]


async def test_where_redis_refuses_xread_the_member_polls(
    standalone_url: str, sync_redis: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    caplog.set_level(logging.WARNING, "rsc.client.poller")
    user = f"noxread-{prefix}"
    sync_redis.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-xread"])
    [key] = shard_keys(prefix, 1, sync_redis)
    url = standalone_url.replace("redis://", f"redis://{user}:pw@")
    try:
        async with open_redis(url) as r, trio.open_nursery() as nursery:
            settings = attrs.evolve(ONLY_WAKEUPS, idle_sleep_s=0.05)
            poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, settings)
            await nursery.start(poller.run)
            poller.renewed(math.inf)
            await poller.assigned(frozenset({0}), layout([key]))
            entry = sync_redis.xadd(key, {"n": "1"})
            await wait_for(lambda: entry in handled)
            entry = sync_redis.xadd(key, {"n": "2"})
            await wait_for(lambda: entry in handled)
            nursery.cancel_scope.cancel()
    finally:
        sync_redis.acl_deluser(user)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis refused XREAD, polling instead" in line for line in lines) == 1, lines


async def test_an_unblocked_wake_up_blocks_again_without_polling(
    redis_url: str, checker: Any, nodes: list[redis.Redis], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """UNBLOCKED (what a Redis turning replica answers a blocked read; here `CLIENT UNBLOCK ...
    ERROR`) is a failover, not a refusal of XREAD: the member blocks again (on a new
    connection), says nothing of polling, and misses nothing."""
    caplog.set_level(logging.WARNING, "rsc.client.poller")
    keys = shard_keys(prefix, 2, checker)
    async with running(redis_url, keys) as (poller, handled):
        blocked = 1 if len(nodes) == 1 else 2
        await wait_for(lambda: caught_up(poller) and len(blocked_reads(nodes)) == blocked)
        before = {n: blocked_reads([n]) for n in nodes}
        for node, ids in before.items():
            for client in ids:
                node.execute_command("CLIENT", "UNBLOCK", client, "ERROR")
        old = {i for ids in before.values() for i in ids}
        # Blocked again: on a standalone Redis on a new connection (the lean one is closed, as
        # for a replica behind a virtual IP); coredis (a cluster) keeps its connection.
        await wait_for(
            lambda: (
                len(blocked_reads(nodes)) == blocked
                and (len(nodes) > 1 or not set(blocked_reads(nodes)) & old)
            )
        )
        entries = [checker.xadd(key, {"n": "1"}) for key in keys]
        await wait_for(lambda: set(entries) <= set(handled))
    assert not any("polling" in r.getMessage() for r in caplog.records)


async def test_shards_read_together_are_refused_one_by_one(
    standalone_url: str, sync_redis: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The shards of a standalone Redis are read (and acknowledged) in one call, each checked
    on its own: a shard that moved is kept unread and reported (its member is told to stop it)
    and one whose consumer group is gone is reported and retried until it is back, while the
    others go on."""
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.fields["n"])

    caplog.set_level(logging.WARNING, "rsc.client.poller")
    keys = shard_keys(prefix, 3, sync_redis)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        settings = attrs.evolve(
            ONLY_WAKEUPS, redis_backoff=attrs.evolve(ONLY_WAKEUPS.redis_backoff, cap_s=0.2)
        )
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, settings)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset(range(3)), layout(keys))
        await wait_for(lambda: caught_up(poller))
        own(sync_redis, keys[1], "another")
        sync_redis.xgroup_destroy(keys[2], "billing")  # its reads fail (NOGROUP) until it is back
        for n, key in enumerate(keys):
            sync_redis.xadd(key, {"n": str(n)})
        await wait_for(lambda: handled == ["0"] and poller.stalled_shards() == {1, 2})
        assert any("NOGROUP" in r.getMessage() for r in caplog.records)
        sync_redis.xgroup_create(keys[2], "billing", "0")
        await wait_for(lambda: handled == ["0", "2"])
        await wait_for(lambda: all(sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys))
        assert poller.stalled_shards() == {1}  # read again: no longer reported
        nursery.cancel_scope.cancel()
    assert sync_redis.xinfo_groups(keys[1])[0]["lag"] == 1  # left for its new owner


def test_a_wake_up_blocks_for_less_than_its_clients_command_timeout() -> None:
    class Client:
        def __init__(self, timeout: float | None) -> None:
            self.connection_pool = type("Pool", (), {"connection_kwargs": {"stream_timeout": timeout}})()

    assert block_ms(Client(None), 10.0) == 10_000
    assert block_ms(Client(5.0), 10.0) == 2_500  # the App's command client
    assert block_ms(Client(15.0), 10.0) == 10_000  # the App's wake-up client: 10 s + 5 s
    assert block_ms(Client(1.0), 10.0) == 500


async def _ignore(message: Message) -> None:
    return None


async def test_a_missed_wake_up_is_a_stall_found_reported_and_read_again(
    standalone_url: str, sync_redis: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The net under any stall of the reading path (issue 26, 1d; a chaos run once ended with
    entries unread on a shard its member held): here the wake-up reads are gone, so entries
    appended to caught-up shards would wait for ever. The stall check finds entries past what
    was read with no read for `stall_after_s`, says so, reports the shard to the coordinator
    (`stalled_shards`) and reads it again; the report ends with the read."""
    handled: list[str] = []

    async def handle(message: Message) -> None:
        handled.append(message.id)

    settings = attrs.evolve(ONLY_WAKEUPS, reclaim_every_s=0.2, stall_after_s=0.5)
    keys = shard_keys(prefix, 2, sync_redis)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        poller = Poller(r, "billing", MEMBER, f"{MEMBER}-inc", handle, settings)
        await nursery.start(poller.run)
        poller.renewed(math.inf)
        await poller.assigned(frozenset(range(2)), layout(keys))
        await wait_for(lambda: caught_up(poller))
        for watch in poller.wakeups.watches.values():
            watch.scope.cancel()  # no wake-up will come
        await trio.sleep(0.1)
        reported: list[frozenset[int]] = []
        stall = poller.reclaimer.stall

        def stalled(shard: Any, why: str) -> None:
            stall(shard, why)
            reported.append(poller.stalled_shards())  # what the next heartbeat says

        poller.reclaimer.stall = stalled  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, "rsc.client.poller"):
            entry = sync_redis.xadd(keys[1], {"n": "1"})
            await wait_for(lambda: bool(handled), 10)
        assert handled == [entry]
        assert reported == [frozenset({1})]
        assert poller.stalls == 1
        assert any("shard 1 stalled: entries past" in r.getMessage() for r in caplog.records)
        await wait_for(lambda: not poller.stalled_shards())  # the read succeeded: no more report
        nursery.cancel_scope.cancel()
