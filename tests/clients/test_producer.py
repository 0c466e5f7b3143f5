"""The trio producer against a real coordinator and Redis: routing, scale-out, pause."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import redis
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorUnavailable, RscError
from rsc.client.producer import Producer, ProducerPaused, PublishFailed, open_producer
from rsc.events.routing import route
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as client:
        yield client


async def test_routes_by_key_and_follows_a_scale_out(
    http: httpx.AsyncClient, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    async with (
        Coordinator(str(http.base_url)) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
    ):
        producer = Producer(coordinator, r, prefix, "api/0")
        await nursery.start(producer.run)
        assert producer.layout.metadata_version == 1
        for n in range(40):
            await producer.publish({"n": str(n)}, key=f"customer-{n % 10}")
        for n in range(10):
            key = f"customer-{n}".encode()
            entries = sync_redis.xrange(route(producer.layout, key).key)
            assert sum(1 for _, f in entries if f["n"] in {str(n + 10 * i) for i in range(4)}) == 4
        ids = await producer.publish_many([({"k": "none"}, None) for _ in range(8)])
        assert len(ids) == 8
        entry = await producer.publish({"k": "keyed"}, key="customer-3")
        shard = route(producer.layout, b"customer-3").key
        assert sync_redis.xrange(shard, entry, entry) == [(entry, {"k": "keyed"})]  # the id XADD gave
        assert all(sync_redis.xlen(s.key) > 0 for s in producer.layout.active)  # keyless: round robin

        assert (
            await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 8}, auth=AUTH)
        ).status_code == 200
        with trio.fail_after(10):
            while producer.layout.metadata_version != 2:
                await trio.sleep(0.05)
        assert len(producer.layout.active) == 8
        view = (await http.get(f"/v1/streams/{prefix}")).json()
        with trio.fail_after(10):  # the producer acknowledges v2 in its next heartbeat
            while not view["producers"] or not view["producers"][0]["upToDate"]:
                await trio.sleep(0.05)
                view = (await http.get(f"/v1/streams/{prefix}")).json()
        moved = [n for n in range(1000) if route(producer.layout, b"%d" % n).index >= 4]
        assert 300 < len(moved) < 700  # about half of the keys now go to the 4 new shards
        nursery.cancel_scope.cancel()


async def test_waits_while_paused_then_raises_or_goes_on(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    async with (
        Coordinator(str(http.base_url)) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
    ):
        producer = Producer(coordinator, r, prefix, "api/0", pause_timeout_s=0.5)
        await nursery.start(producer.run)
        await http.post(f"/v1/admin/streams/{prefix}/pause", auth=AUTH)
        with trio.fail_after(10):
            while not producer.paused:
                await trio.sleep(0.05)
        with pytest.raises(ProducerPaused):
            await producer.publish({"n": "1"}, key="k")
        with trio.fail_after(10):  # it reports quiesced: nothing of its own in flight
            while (await http.get(f"/v1/streams/{prefix}")).json()["producersSummary"]["quiesced"] != 1:
                await trio.sleep(0.05)
        waiting = trio.Event()

        async def publish_when_resumed() -> None:
            producer.pause_timeout_s = 10
            waiting.set()
            await producer.publish({"n": "2"}, key="k")

        async with trio.open_nursery() as inner:
            inner.start_soon(publish_when_resumed)
            await waiting.wait()
            await http.post(f"/v1/admin/streams/{prefix}/resume", auth=AUTH)
        assert producer.published == 1
        nursery.cancel_scope.cancel()


async def test_open_producer_registers_and_leaves_when_the_block_ends(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    async with Coordinator(str(http.base_url)) as coordinator, open_redis(standalone_url) as r:
        async with open_producer(coordinator, r, prefix, "api/0") as producer:
            await producer.publish({"n": "1"}, key="k")
            view = (await http.get(f"/v1/streams/{prefix}")).json()
            assert [p["producerId"] for p in view["producers"]] == ["api/0"]
        assert (await http.get(f"/v1/streams/{prefix}")).json()["producers"] == []  # left, not expired
        with pytest.raises(RscError, match="closed"):
            await producer.publish({"n": "2"})
        with pytest.raises(KeyError):  # the block's own error, not an exception group
            async with open_producer(coordinator, r, prefix, "api/1"):
                raise KeyError("mine")
        # with no producer and no group left, the stream can be deleted at once
        assert (await http.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 204


async def test_open_producer_fails_clearly_without_a_coordinator(standalone_url: str, prefix: str) -> None:
    async with (
        Coordinator("http://127.0.0.1:9", retries=0, timeout_s=0.2) as coordinator,
        open_redis(standalone_url) as r,
    ):
        with pytest.raises(CoordinatorUnavailable, match="no layout within"):
            async with open_producer(coordinator, r, prefix, start_timeout_s=0.5):
                raise AssertionError("not reached")


async def test_a_publish_redis_refuses_raises_publish_failed(
    http: httpx.AsyncClient, standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    async with (
        Coordinator(str(http.base_url)) as coordinator,
        open_redis(standalone_url) as r,
        open_producer(coordinator, r, prefix, "api/0") as producer,
    ):
        broken = producer.shard_key("k")
        sync_redis.delete(broken)
        sync_redis.set(broken, "not a stream")  # XADD to it fails with WRONGTYPE
        with pytest.raises(PublishFailed, match="may have been written") as failed:
            await producer.publish_many([({"n": "1"}, "k"), ({"n": "2"}, None)])
        assert "wrong kind of value" in str(failed.value)
        assert producer.published == 0
        sync_redis.delete(broken)
        await producer.publish({"n": "3"}, key="k")  # the producer goes on once Redis takes it
        await producer.flush()
        assert producer.published == 1


async def test_publishing_goes_on_with_the_last_layout_while_the_coordinator_is_down(
    standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url)
    async with open_redis(standalone_url) as r, trio.open_nursery() as nursery:
        async with serve_on(settings) as http:
            coordinator = Coordinator(str(http.base_url), retries=0, timeout_s=0.5)
            producer = Producer(coordinator, r, prefix, "api/0")
            await nursery.start(producer.run)
            layout = producer.layout
        # the coordinator is gone now; heartbeats fail, publishing does not
        await trio.sleep(0.3)
        ids = await producer.publish_many([({"n": str(n)}, f"k{n}") for n in range(20)])
        assert len(ids) == 20
        assert producer.layout == layout
        assert sum(sync_redis.xlen(s.key) for s in layout.active) == 20
        nursery.cancel_scope.cancel()
        await coordinator.aclose()


async def test_a_publish_before_the_producer_has_a_layout_fails_at_once(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    """As the synchronous producer before `start`: `RscError` saying how to start it, not a
    wait without end; once `run` has started (a layout known), the same producer publishes."""
    async with (
        Coordinator(str(http.base_url)) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
    ):
        producer = Producer(coordinator, r, prefix, "api/0")
        with trio.fail_after(5), pytest.raises(RscError, match=r"not started: await nursery\.start"):
            await producer.publish({"n": "1"}, key="k")
        with trio.fail_after(5), pytest.raises(RscError, match="not started"):
            await producer.publish_many([({"n": "2"}, None)])
        assert producer.published == 0
        await nursery.start(producer.run)
        assert await producer.publish({"n": "3"}, key="k")
        nursery.cancel_scope.cancel()
