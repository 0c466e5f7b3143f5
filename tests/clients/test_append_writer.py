"""The trio producer's lean append writer (`rsc.client.append_writer`): the same replies and
errors as the coredis pipeline it replaces on a standalone Redis, the client's own credentials
and database, connections replaced when they fail, never reused half read; and both producers
treat a refusal of a Redis that may answer soon (`READONLY`...) as an outage, not a failure."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator

import attrs
import coredis
import pytest
import redis
import trio
from coredis.connection import TCPLocation

from rsc.actors.store_connection import open_redis
from rsc.client.append_calls import (
    SEALED_APPEND,
    Replies,
    appends,
    refusal,
    take_replies,
)
from rsc.client.append_writer import AppendWriter, Endpoint
from rsc.client.coordinator import Coordinator
from rsc.client.errors import RedisCommandFailed, RedisUnavailable
from rsc.client.producer import Producer, open_producer
from rsc.client.redis_calls import redis_call
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.events.wire import seal_key
from tests import redis_servers
from tests.httpkit import FAST, serve_on


@pytest.fixture
async def base_url(standalone_url: str) -> AsyncIterator[str]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield str(http.base_url)


def client_addresses(url: str) -> list[str]:
    """The addresses of the clients connected to `url`, but the one asking."""
    with redis.Redis.from_url(url, decode_responses=True) as r:
        me = r.client_id()
        return sorted(c["addr"] for c in r.client_list() if int(c["id"]) != me)


@pytest.mark.parametrize("lean", [True, False], ids=["lean-writer", "coredis-pipeline"])
async def test_appends_reply_the_same_through_the_lean_writer_or_coredis(
    lean: bool, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    """One reply per call in order: the ids written, a sealed shard's refusal and NOSCRIPT in
    place (what the producer classifies by code); the writer's connection is kept and reused."""
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(3)]
    messages = [({"n": str(n), "b": b"\x00\xff"}, None) for n in range(6)]
    calls = appends([(n, keys[n % 3]) for n in range(6)], messages)
    async with open_redis(standalone_url) as r:
        producer = Producer(Coordinator("http://127.0.0.1:9"), r, prefix)
        assert producer._writer is not None  # a standalone coredis client: the lean writer
        producer._writer.keep()  # as while `run` runs
        if not lean:
            producer._writer = None
        sync_redis.script_load(SEALED_APPEND)
        sync_redis.set(seal_key(keys[2]), "7")
        replies = await producer._send(calls)
        assert [len(r) for r in replies[:2]] == [2, 2]  # two ids each
        assert refusal(replies[2]) == "SEALED"
        assert [sync_redis.xlen(k) for k in keys] == [2, 2, 0]
        with redis.Redis.from_url(standalone_url) as raw:  # bytes went through as bytes
            assert raw.xrange(keys[0])[0][1][b"b"] == b"\x00\xff"
        sync_redis.script_flush()
        again = await producer._send_once(calls[:1])
        assert refusal(again[0]) == "NOSCRIPT"
        [written] = await producer._send(calls[:1])  # loaded and sent again, once
        assert len(written) == 2
        assert [sync_redis.xlen(k) for k in keys] == [4, 2, 0]
        if lean:
            assert producer._writer is not None
            assert len(producer._writer._idle) == 1  # the same connection, kept for the next batch
            before = client_addresses(standalone_url)
            await producer._send(calls[:1])
            assert client_addresses(standalone_url) == before  # no new connection
            await producer._writer.aclose()


async def test_the_writer_connects_with_the_clients_credentials_and_database(prefix: str) -> None:
    with redis_servers.standalone(password="s3cret") as url:
        with redis.Redis.from_url(url, decode_responses=True) as admin:
            admin.acl_setuser("appender", enabled=True, passwords=["+pw1"], commands=["+@all"], keys=["*"])
        user_url = url.replace("://:s3cret@", "://appender:pw1@") + "/3"
        async with open_redis(user_url) as r:
            writer = AppendWriter.for_client(r)
            assert writer is not None
            assert (writer.endpoint.username, writer.endpoint.db) == ("appender", 3)
            assert await writer.call([lambda: ("SET", f"{prefix}:k", "v")]) == ["OK"]
            await writer.aclose()
        with redis.Redis.from_url(url, db=3, decode_responses=True) as check:
            assert check.get(f"{prefix}:k") == "v"  # written as the user, in database 3

        wrong = url.replace("://:s3cret@", "://appender:wrong@")
        async with open_redis(url) as r:  # a client whose settings then fail: refused, not retried
            endpoint = Endpoint.of(r)
            assert endpoint is not None
            writer = AppendWriter(attrs.evolve(endpoint, username="appender", password="wrong"))
            with pytest.raises(RedisCommandFailed) as refused, redis_call("XADD"):
                await writer.call([lambda: ("PING",)])
            assert refused.value.code == "WRONGPASS"
            assert "wrong" not in str(refused.value).replace(wrong, "")  # no password in the words


async def test_a_connection_killed_under_the_writer_is_an_outage_then_replaced(
    standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    async with open_redis(standalone_url) as r:
        writer = AppendWriter.for_client(r)
        assert writer is not None
        writer.keep()
        assert await writer.call([lambda: ("CLIENT", "SETNAME", f"{prefix}-w")]) == ["OK"]
        (mine,) = [c["id"] for c in sync_redis.client_list() if c["name"] == f"{prefix}-w"]
        assert sync_redis.client_kill_filter(_id=mine) == 1
        with pytest.raises(RedisUnavailable), redis_call("XADD"):
            await writer.call([lambda: ("PING",)])
        assert writer._idle == []  # the broken connection is gone, not kept
        assert await writer.call([lambda: ("PING",)]) == ["PONG"]
        await writer.aclose()


async def test_a_redis_that_stops_answering_times_out_as_an_outage(prefix: str) -> None:
    with redis_servers.standalone() as url:
        async with open_redis(url, command_timeout_s=0.3) as r:
            writer = AppendWriter.for_client(r)
            assert writer is not None
            writer.keep()
            assert await writer.call([lambda: ("PING",)]) == ["PONG"]
            pid = redis_servers.server_pid(url)
            subprocess.run(["kill", "-STOP", str(pid)], check=True)
            try:
                with (
                    trio.fail_after(5),
                    pytest.raises(RedisUnavailable, match="no reply within"),
                    redis_call("XADD"),
                ):
                    await writer.call([lambda: ("PING",)])
            finally:
                subprocess.run(["kill", "-CONT", str(pid)], check=True)
            assert await writer.call([lambda: ("PING",)]) == ["PONG"]
            await writer.aclose()


async def test_a_producer_that_does_not_run_leaves_no_connection_open(
    base_url: str, standalone_url: str, prefix: str
) -> None:
    """Heartbeating by hand (no `run`): each publish's connection is closed when it ends, so
    nothing is left for the garbage collector; while `run` runs, one is kept, and closed after."""
    async with open_redis(standalone_url) as r, Coordinator(base_url) as coordinator:
        producer = Producer(coordinator, r, prefix, "no-run")
        await producer.heartbeat()
        before = client_addresses(standalone_url)  # (the coordinator's, once it made the stream)
        assert await producer.publish_many([({"n": "1"}, "k"), ({"n": "2"}, "j")])
        assert producer._writer is not None
        assert producer._writer._idle == []
        assert client_addresses(standalone_url) == before
        async with trio.open_nursery() as nursery:
            await nursery.start(producer.run)
            await producer.publish({"n": "3"}, "k")
            assert len(producer._writer._idle) == 1
            assert len(client_addresses(standalone_url)) == len(before) + 1
            await producer.aclose()
        assert producer._writer._idle == []
        assert client_addresses(standalone_url) == before


async def test_the_lean_writer_is_for_standalone_tcp_clients_only(
    cluster_url: str, standalone_url: str
) -> None:
    async with open_redis(cluster_url) as cluster:
        assert AppendWriter.for_client(cluster) is None  # coredis routes by slot
    async with open_redis(standalone_url) as r:
        assert AppendWriter.for_client(r) is not None
    unix = coredis.Redis(unix_socket_path="/tmp/nowhere.sock")
    assert AppendWriter.for_client(unix) is None
    behind_sentinel = coredis.Sentinel([TCPLocation("127.0.0.1", 1)]).primary_for("mymaster")
    assert AppendWriter.for_client(behind_sentinel) is None  # its pool follows the primary


def test_a_refusal_of_a_redis_that_may_answer_soon_is_sent_again_not_failed() -> None:
    calls = appends([(0, "s:0"), (1, "s:1")], [({"n": "0"}, None), ({"n": "1"}, None)])
    ids: list[str | None] = [None, None]
    readonly = redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica.")
    replies = take_replies(calls, [["1-0"], readonly], ids)
    assert replies == Replies(again=[1], resend=[calls[1]], unavailable=str(readonly))
    assert ids == ["1-0", None]
    assert refusal(coredis.exceptions.ResponseError("LOADING Redis is loading")) == "UNAVAILABLE"
    assert refusal(coredis.exceptions.ResponseError("WRONGTYPE Operation")) == "WRONGTYPE Operation"
    # A NOSCRIPT that outlived the reloads (a failover between load and call): as an outage,
    # retried with backoff until delivery_timeout_s, never sent again at once without end.
    for noscript in (
        redis.exceptions.NoScriptError("No matching script."),
        coredis.exceptions.NoScriptError("No matching script."),
    ):
        ids = [None, None]
        replies = take_replies(calls, [["1-0"], noscript], ids)
        assert replies.again == [1]
        assert replies.unavailable == str(noscript)


async def test_both_producers_wait_while_their_redis_is_a_read_only_replica(
    base_url: str, prefix: str
) -> None:
    """A failover to a node that is still a replica: publishes are retried (one outage line),
    then go through once it is promoted; nothing fails and nothing is written twice."""
    with redis_servers.standalone() as primary_url, redis_servers.standalone() as replica_url:
        primary = redis.Redis.from_url(primary_url)
        replica = redis.Redis.from_url(replica_url, decode_responses=True)
        replica.replicaof("127.0.0.1", primary.connection_pool.connection_kwargs["port"])

        async def promote_later() -> None:
            await trio.sleep(1.0)
            replica.replicaof("NO", "ONE")

        async with (
            Coordinator(base_url) as coordinator,
            open_redis(replica_url) as r,
            open_producer(coordinator, r, prefix, "ro/trio", delivery_timeout_s=20) as producer,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(promote_later)
            started = trio.current_time()
            ids = await producer.publish_many([({"n": str(n)}, f"k{n}") for n in range(20)])
            assert trio.current_time() - started >= 0.9
            assert len(ids) == 20
            assert sum(replica.xlen(k) for k in replica.scan_iter(f"{prefix}*", _type="stream")) == 20

        replica.replicaof("127.0.0.1", primary.connection_pool.connection_kwargs["port"])

        def sync_scenario() -> list[str]:
            with (
                redis.Redis.from_url(replica_url) as client,
                SyncCoordinator(base_url) as sync_coordinator,
                SyncProducer(
                    sync_coordinator, client, f"{prefix}s", "ro/sync", delivery_timeout_s=20
                ) as sync,
            ):
                return sync.publish_many([({"n": str(n)}, f"k{n}") for n in range(20)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(promote_later)
            sync_ids = await trio.to_thread.run_sync(sync_scenario)
        assert len(sync_ids) == 20
        total = sum(replica.xlen(k) for k in replica.scan_iter(f"{prefix}s*", _type="stream"))
        assert total == 20
        primary.close()
        replica.close()
