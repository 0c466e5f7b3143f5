"""Both producers while the data plane's Redis restarts or stays down (issue 12): a publish
blocks and retries with backoff up to `delivery_timeout_s`, then raises `PublishFailed`;
nothing acknowledged is lost (the Redis keeps an AOF)."""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
import redis
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import PublishFailed, open_producer
from rsc.client.producer_state import DeliveryRetries
from rsc.client.sync import SyncCoordinator, SyncProducer
from tests.httpkit import FAST, serve_on
from tests.redis_servers import DurableServer


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
        open_producer(coordinator, r, prefix, "api/0") as producer,
    ):
        key = producer.layout.active[0].key
        await r.set(key, "not a stream")  # XADD gets WRONGTYPE: retrying cannot help
        started = trio.current_time()
        with pytest.raises(PublishFailed, match="wrong kind of value"):
            await producer.publish_many([({"n": str(n)}, None) for n in range(8)])
        assert trio.current_time() - started < 1


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
