"""The synchronous producer (redis-py, heartbeats in a thread) against a real coordinator and Redis.

The coordinator runs in this test's trio loop; the producer's blocking code
runs in a worker thread (`trio.to_thread.run_sync`), as in an application.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable

import attrs
import httpx
import pytest
import redis
import trio

from rsc.client import sync
from rsc.client.append_calls import (
    SEALED_APPEND,
    appends,
    refusal,
)
from rsc.client.errors import CoordinatorUnavailable, RscError
from rsc.client.sync import ProducerPaused, PublishFailed, SyncCoordinator, SyncProducer
from rsc.events.routing import route
from rsc.events.wire import seal_key
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=redis_url, admin_password="pw")) as client:
        yield client


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


async def test_routes_by_key_follows_a_scale_out_and_leaves_on_close(
    http: httpx.AsyncClient, prefix: str, checker: redis.Redis
) -> None:
    base = str(http.base_url)

    def scenario() -> None:
        with (
            SyncCoordinator(base) as coordinator,
            httpx.Client(base_url=base) as admin,
            SyncProducer(coordinator, checker, prefix, "api/sync") as producer,
        ):
            assert producer.layout.metadata_version == 1
            for n in range(40):
                producer.publish({"n": str(n)}, key=f"customer-{n % 10}")
            stored = {s.key: [int(f["n"]) for _, f in checker.xrange(s.key)] for s in producer.layout.active}
            assert sorted(n for ns in stored.values() for n in ns) == list(range(40))  # each once
            for n in range(10):
                shard = route(producer.layout, f"customer-{n}".encode()).key
                assert {n + 10 * i for i in range(4)} <= set(stored[shard])  # a key stays on its shard
            assert len(producer.publish_many([({"k": "none"}, None) for _ in range(8)])) == 8
            assert all(checker.xlen(s.key) > 0 for s in producer.layout.active)  # keyless: round robin

            assert admin.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 8}, auth=AUTH).is_success
            wait_for(lambda: producer.layout.metadata_version == 2)
            assert len(producer.layout.active) == 8
            wait_for(lambda: admin.get(f"/v1/streams/{prefix}").json()["producers"][0]["upToDate"])
            assert producer.published == 48
        # closed: it left at once, so the stream has no live producer any more
        with httpx.Client(base_url=base) as admin:
            assert admin.get(f"/v1/streams/{prefix}").json()["producers"] == []
            with pytest.raises(RscError, match="closed"):
                producer.publish({"n": "late"})

    await trio.to_thread.run_sync(scenario)


async def test_blocks_while_paused_then_raises_or_goes_on(
    http: httpx.AsyncClient, prefix: str, checker: redis.Redis
) -> None:
    base = str(http.base_url)

    def scenario() -> None:
        with (
            SyncCoordinator(base) as coordinator,
            httpx.Client(base_url=base) as admin,
            SyncProducer(coordinator, checker, prefix, "api/sync", pause_timeout_s=0.3) as producer,
        ):
            admin.post(f"/v1/admin/streams/{prefix}/pause", auth=AUTH)
            wait_for(lambda: producer.paused)
            with pytest.raises(ProducerPaused):
                producer.publish({"n": "1"}, key="k")
            wait_for(lambda: admin.get(f"/v1/streams/{prefix}").json()["producersSummary"]["quiesced"] == 1)

            producer.pause_timeout_s = 10
            publisher = threading.Thread(target=producer.publish, args=({"n": "2"}, "k"))
            publisher.start()
            admin.post(f"/v1/admin/streams/{prefix}/resume", auth=AUTH)
            publisher.join(10)
            assert producer.published == 1

    await trio.to_thread.run_sync(scenario)


async def test_start_fails_clearly_without_a_coordinator(prefix: str, sync_redis: redis.Redis) -> None:
    def scenario() -> None:
        with SyncCoordinator("http://127.0.0.1:9", retries=0, timeout_s=0.2) as coordinator:
            producer = SyncProducer(coordinator, sync_redis, prefix, start_timeout_s=0.5)
            with pytest.raises(CoordinatorUnavailable, match="no layout"):
                producer.start()
            with pytest.raises(RscError, match="closed"):
                producer.publish({"n": "1"})

    await trio.to_thread.run_sync(scenario)


async def test_a_publish_redis_refuses_raises_publish_failed(
    http: httpx.AsyncClient, prefix: str, checker: redis.Redis
) -> None:
    base = str(http.base_url)

    def scenario() -> None:
        with (
            SyncCoordinator(base) as coordinator,
            SyncProducer(coordinator, checker, prefix, "api/sync") as producer,
        ):
            broken = producer.shard_key("k")
            checker.delete(broken)
            checker.set(broken, "not a stream")
            with pytest.raises(PublishFailed, match=r"WRONGTYPE|wrong kind of value"):
                producer.publish({"n": "1"}, key="k")
            assert producer.flush(timeout_s=1)  # nothing stays in flight after a failure
            checker.delete(broken)
            producer.publish({"n": "2"}, key="k")
            assert producer.published == 1

    await trio.to_thread.run_sync(scenario)


@pytest.mark.parametrize("packed", [True, False], ids=["hiredis-packed", "redis-py-pipeline"])
def test_appends_reply_the_same_packed_by_hiredis_or_through_a_pipeline(
    packed: bool, prefix: str, sync_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One reply per call in order: the ids written, a sealed shard's refusal and NOSCRIPT in
    place as exceptions (what the producer classifies by code), the connection reusable after."""
    if not packed:
        monkeypatch.setattr(sync, "_pack_command", None)
    keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(3)]
    messages = [({"n": str(n)}, None) for n in range(6)]
    calls = appends([(n, keys[n % 3]) for n in range(6)], messages)
    sync_redis.script_load(SEALED_APPEND)
    sync_redis.set(seal_key(keys[2]), "7")
    replies = sync.send_appends(sync_redis, calls)
    assert [len(r) for r in replies[:2]] == [2, 2]  # two ids each
    assert isinstance(replies[2], redis.exceptions.ResponseError)
    assert refusal(replies[2]) == "SEALED"
    assert [sync_redis.xlen(k) for k in keys] == [2, 2, 0]
    sync_redis.script_flush()
    again = sync.send_appends(sync_redis, calls[:1])
    assert refusal(again[0]) == "NOSCRIPT"
    assert sync_redis.ping()  # the pooled connection was left whole
