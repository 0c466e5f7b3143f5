"""Both producers while the data plane's Redis restarts or stays down (issue 12): a publish
blocks and retries with backoff up to `delivery_timeout_s`, then raises `PublishFailed`;
nothing acknowledged is lost (the Redis keeps an AOF)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import attrs
import pytest
import redis
import trio
from redis.cluster import RedisCluster

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.errors import RedisCommandFailed
from rsc.client.producer import PublishFailed, open_producer
from rsc.client.producer_state import DeliveryRetries
from rsc.client.sync import SyncCoordinator, SyncProducer, _unavailable
from tests import redis_servers
from tests.httpkit import FAST, serve_on
from tests.redis_servers import DurableServer, server_pid

#: A delivery timeout no retry loop gets through in a test: "at once" is well before it.
AGES = 60.0


@pytest.fixture
async def base_url(standalone_url: str) -> AsyncIterator[str]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield str(http.base_url)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[DurableServer]:
    with DurableServer(tmp_path / "data") as server:
        yield server


def restart_later(server: DurableServer, after_s: float) -> threading.Thread:
    def restart() -> None:
        time.sleep(after_s)
        server.start()

    server.stop(signal.SIGKILL)
    thread = threading.Thread(target=restart)
    thread.start()
    return thread


def stored(server: DurableServer, entry_id: str) -> bool:
    with redis.Redis.from_url(server.url, decode_responses=True) as client:
        return any(client.xrange(key, entry_id, entry_id) for key in client.scan_iter(_type="stream"))


async def test_the_trio_producer_waits_out_a_restart_then_gives_up_on_a_long_outage(
    base_url: str, data: DurableServer, prefix: str
) -> None:
    async with (
        Coordinator(base_url) as coordinator,
        open_redis(data.url, connect_timeout_s=0.5, command_timeout_s=0.5) as r,
        open_producer(coordinator, r, prefix, "api/0", delivery_timeout_s=8) as producer,
    ):
        before = await producer.publish({"n": "0"}, key="k")
        restarted = restart_later(data, 1.5)
        started = trio.current_time()
        during = await producer.publish({"n": "1"}, key="k")  # blocks until Redis is back
        assert trio.current_time() - started >= 1.0
        await trio.to_thread.run_sync(restarted.join)
        assert stored(data, before)
        assert stored(data, during)

        producer.delivery_timeout_s = 1.0
        data.stop(signal.SIGKILL)
        started = trio.current_time()
        with pytest.raises(PublishFailed, match="may have been written"):
            await producer.publish({"n": "2"}, key="k")
        assert 0.5 <= trio.current_time() - started < 3
        data.start()
        assert await producer.publish({"n": "3"}, key="k")


async def test_the_sync_producer_waits_out_a_restart_then_gives_up_on_a_long_outage(
    base_url: str, data: DurableServer, prefix: str
) -> None:
    def scenario() -> None:
        with (
            redis.Redis.from_url(data.url, socket_timeout=0.5, socket_connect_timeout=0.5) as client,
            SyncCoordinator(base_url) as coordinator,
            SyncProducer(coordinator, client, prefix, "api/sync", delivery_timeout_s=8) as producer,
        ):
            before = producer.publish({"n": "0"}, key="k")
            restarted = restart_later(data, 1.5)
            started = time.monotonic()
            during = producer.publish({"n": "1"}, key="k")
            assert time.monotonic() - started >= 1.0
            restarted.join()
            assert stored(data, before)
            assert stored(data, during)

            producer.delivery_timeout_s = 1.0
            data.stop(signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(PublishFailed, match="may have been written"):
                producer.publish({"n": "2"}, key="k")
            assert 0.5 <= time.monotonic() - started < 3
            data.start()
            assert producer.publish({"n": "3"}, key="k")

    await trio.to_thread.run_sync(scenario)


async def test_a_command_redis_refuses_fails_at_once(base_url: str, data: DurableServer, prefix: str) -> None:
    async with (
        Coordinator(base_url) as coordinator,
        open_redis(data.url) as r,
        open_producer(coordinator, r, prefix, "api/0", delivery_timeout_s=AGES) as producer,
    ):
        key = producer.layout.active[0].key
        await r.set(key, "not a stream")  # XADD gets WRONGTYPE: retrying cannot help
        started = trio.current_time()
        with pytest.raises(PublishFailed, match="wrong kind of value"):
            await producer.publish_many([({"n": str(n)}, None) for n in range(8)])
        assert trio.current_time() - started < AGES / 2  # not retried until its delivery timeout


def test_delivery_retries_try_until_the_timeout_and_the_last_try_is_at_it() -> None:
    retries = DeliveryRetries(started=100.0, timeout_s=1.0, rng=random.Random(7))
    now, tries = 100.0, 1
    while (wait := retries.next_wait(now)) is not None:
        assert 0 <= wait <= 1.0
        now += wait
        tries += 1
    assert now == pytest.approx(101.0)  # gave up at the timeout, not before the next wait
    assert tries > 3


def outage_lines(caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    began = [line for line in warnings if "Redis unavailable, retrying" in line]
    ended = [line for line in warnings if "Redis answers again after" in line]
    assert len(warnings) == len(began) + len(ended), warnings  # nothing per publish or per retry
    return began, ended


async def test_an_outage_under_many_publishes_is_two_lines_per_producer(
    base_url: str, data: DurableServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty publishes blocked by one outage, in each producer: one line when it began, one
    when Redis answered again (with how many failures it did not log), not one per publish."""
    caplog.set_level(logging.INFO, "rsc.client")

    def sync_side() -> None:
        with (
            redis.Redis.from_url(data.url, socket_timeout=0.5, socket_connect_timeout=0.5) as client,
            SyncCoordinator(base_url) as coordinator,
            SyncProducer(coordinator, client, prefix, "api/sync", delivery_timeout_s=15) as producer,
        ):
            producer.publish({"n": "0"}, key="k")
            restarted = restart_later(data, 1.5)
            threads = [
                threading.Thread(target=producer.publish, args=({"n": str(n)}, f"k{n}")) for n in range(20)
            ]
            for thread in threads:
                thread.start()
            for thread in [*threads, restarted]:
                thread.join()
            time.sleep(1.1)  # past the settling time: the next success ends the outage
            producer.publish({"n": "last"}, key="k")

    await trio.to_thread.run_sync(sync_side)
    began, ended = outage_lines(caplog)
    assert (len(began), len(ended)) == (1, 1), (began, ended)
    assert began[0].startswith("api/sync: Redis unavailable")
    caplog.clear()

    async with (
        Coordinator(base_url) as coordinator,
        open_redis(data.url, connect_timeout_s=0.5, command_timeout_s=0.5) as r,
        open_producer(coordinator, r, prefix, "api/0", delivery_timeout_s=15) as producer,
    ):
        await producer.publish({"n": "0"}, key="k")
        restarted = restart_later(data, 1.5)
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(producer.publish, {"n": str(n)}, f"k{n}")
        await trio.to_thread.run_sync(restarted.join)
        await trio.sleep(1.1)
        await producer.publish({"n": "last"}, key="k")
    began, ended = outage_lines(caplog)
    assert (len(began), len(ended)) == (1, 1), (began, ended)
    assert began[0].startswith("api/0: Redis unavailable")
    assert "repeated failures not logged" in ended[0]


# --- a script reload, and redis-py's cluster errors ----------------------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[str]:
    """A 3-primary cluster of this module's own, whose nodes the tests pause (SIGSTOP).

    The coordinator stays on the session's standalone Redis (`base_url`); the producers write
    to this cluster: the shard keys carry their hash tags wherever they were named, and an
    append creates the stream it writes to."""
    with redis_servers.cluster() as url:
        yield url


def node_pids(url: str) -> dict[int, int]:
    """Port -> pid of each primary of the cluster at `url`."""
    with RedisCluster.from_url(url) as client:
        return {int(n.port): server_pid(f"redis://127.0.0.1:{n.port}") for n in client.get_primaries()}


@contextlib.contextmanager
def paused(pids: Iterable[int], resume_after_s: float | None = None) -> Iterator[None]:
    """The redis-servers `pids` stopped (SIGSTOP) for the block, or until `resume_after_s`."""
    pids = list(pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    timer = threading.Timer(resume_after_s, resume) if resume_after_s is not None else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        resume()


def flush_scripts(url: str) -> None:
    """Every primary forgets its scripts (as after a restart): the next append gets NOSCRIPT."""
    for port in node_pids(url):
        with redis.Redis(port=port) as node:
            node.script_flush()


async def test_a_script_reload_redis_cannot_answer_is_retried_by_both_producers(
    base_url: str, own_cluster: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An append meets NOSCRIPT and the reload (to every primary) finds one primary stopped:
    Redis is unavailable, so the publish retries within `delivery_timeout_s` and goes through,
    as for a failed append; not a bare `RedisUnavailable` (trio) nor `PublishFailed` at once (sync)."""
    caplog.set_level(logging.INFO, "rsc.client")
    pids = node_pids(own_cluster)
    checker = RedisCluster.from_url(own_cluster, decode_responses=True)
    async with (
        Coordinator(base_url) as coordinator,
        open_redis(own_cluster, connect_timeout_s=0.5, command_timeout_s=0.5) as r,
        open_producer(coordinator, r, prefix, "api/0", delivery_timeout_s=15) as producer,
    ):
        shard = producer.shard_key("k")
        other = next(p for p in pids if p != checker.get_node_from_key(shard).port)
        flush_scripts(own_cluster)
        with paused([pids[other]], resume_after_s=2.0):
            entry = await producer.publish({"n": "1"}, key="k")
        assert checker.xrange(shard, entry, entry) == [(entry, {"n": "1"})]
        assert any("api/0: Redis unavailable" in r.getMessage() for r in caplog.records)

    def sync_side() -> str:
        with (
            RedisCluster.from_url(own_cluster, socket_timeout=0.5, socket_connect_timeout=0.5) as client,
            SyncCoordinator(base_url) as sync_coordinator,
            SyncProducer(sync_coordinator, client, prefix, "api/sync", delivery_timeout_s=15) as sync,
        ):
            flush_scripts(own_cluster)
            with paused([pids[other]], resume_after_s=2.0):
                return sync.publish({"n": "2"}, key="k")

    entry = await trio.to_thread.run_sync(sync_side)
    assert checker.xrange(shard, entry, entry) == [(entry, {"n": "2"})]
    checker.close()


async def test_a_script_reload_redis_refuses_fails_at_once_in_both_producers(
    base_url: str, data: DurableServer, prefix: str
) -> None:
    """A user that may append but not load scripts: the append gets NOSCRIPT and the reload
    NOPERM. Retrying cannot help: `PublishFailed` at once, naming the refusal (the trio producer
    let `RedisCommandFailed` out)."""
    with redis.Redis.from_url(data.url) as admin:
        admin.acl_setuser("publisher", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"])
        admin.execute_command("ACL", "SETUSER", "publisher", "+@all", "-script|load")
    url = f"redis://publisher:pw@127.0.0.1:{data.port}"
    async with (
        Coordinator(base_url) as coordinator,
        open_redis(url) as r,
        open_producer(coordinator, r, prefix, "api/0", delivery_timeout_s=AGES) as producer,
    ):
        started = trio.current_time()
        with pytest.raises(PublishFailed, match=r"SCRIPT LOAD: .*no permissions .*'script\|load'") as failed:
            await producer.publish({"n": "1"}, key="k")
        assert trio.current_time() - started < AGES / 2  # not retried until its delivery timeout
        assert isinstance(failed.value.__cause__, RedisCommandFailed)

    def sync_side() -> None:
        with (
            redis.Redis.from_url(url) as client,
            SyncCoordinator(base_url) as sync_coordinator,
            SyncProducer(sync_coordinator, client, prefix, "api/sync", delivery_timeout_s=AGES) as sync,
        ):
            started = time.monotonic()
            with pytest.raises(PublishFailed, match=r"no permissions to run the 'script\|load'"):
                sync.publish({"n": "2"}, key="k")
            assert time.monotonic() - started < AGES / 2

    await trio.to_thread.run_sync(sync_side)


async def test_the_sync_producer_retries_while_no_cluster_node_answers(
    base_url: str, own_cluster: str, prefix: str
) -> None:
    """Every primary stopped: redis-py gives up with `RedisClusterUnreachableError`, which is no
    `RedisError`. The producer retries it as any outage within `delivery_timeout_s`, then raises
    `PublishFailed` (it let the raw error out)."""
    pids = node_pids(own_cluster)

    def scenario() -> None:
        with (
            RedisCluster.from_url(own_cluster, socket_timeout=0.5, socket_connect_timeout=0.5) as client,
            SyncCoordinator(base_url) as coordinator,
            SyncProducer(coordinator, client, prefix, "api/sync", delivery_timeout_s=20) as producer,
        ):
            producer.publish({"n": "0"}, key="k")
            with paused(pids.values(), resume_after_s=4.0):
                started = time.monotonic()
                assert producer.publish({"n": "1"}, key="k")  # blocks until the nodes answer
                assert time.monotonic() - started >= 3.0
            producer.delivery_timeout_s = 1.0
            with paused(pids.values()), pytest.raises(PublishFailed, match="may have been written") as failed:
                producer.publish({"n": "2"}, key="k")
            assert isinstance(failed.value.__cause__, redis.exceptions.RedisClusterException)
            assert producer.publish({"n": "3"}, key="k")

    await trio.to_thread.run_sync(scenario)


def test_redis_pys_cluster_errors_are_an_outage_unless_a_credential_or_a_misuse() -> None:
    """The classification the sync producer retries by, on redis-py's own exception instances."""
    unreachable = redis.exceptions.RedisClusterUnreachableError("Redis Cluster cannot be connected")
    unreachable.__cause__ = redis.exceptions.ConnectionError("Error 111 connecting")
    assert _unavailable(unreachable)
    assert _unavailable(redis.exceptions.SlotNotCoveredError('Slot "7" is not covered by the cluster.'))
    assert _unavailable(redis.exceptions.RedisClusterException("All slots are not covered after query"))
    refused = redis.exceptions.RedisClusterException("Redis Cluster cannot be connected")
    refused.__cause__ = redis.exceptions.AuthenticationError("invalid username-password pair")
    assert not _unavailable(refused)
    assert not _unavailable(redis.exceptions.CrossSlotTransactionError("keys in different slots"))
    assert not _unavailable(redis.exceptions.AuthenticationError("invalid username-password pair"))
    assert not _unavailable(redis.exceptions.ResponseError("NOPERM this user has no permissions"))
    assert _unavailable(redis.exceptions.ResponseError("LOADING Redis is loading the dataset"))
