"""A Redis out of memory (`OOM`: used memory above `maxmemory` with `noeviction`), as the
coordinator and the producers say it: a typed error with its own code, never a 500, and a
series in `/metrics`; the producer waits for memory, then raises `RedisOutOfMemory`, and
publishes again once memory is freed. On a private standalone Redis of its own (its memory
limit must not touch other tests)."""

from __future__ import annotations

import attrs
import pytest
import redis as redis_py
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import RedisOutOfMemory, open_producer
from rsc.client.sync import RedisOutOfMemory as SyncOutOfMemory
from rsc.client.sync import SyncCoordinator, SyncProducer
from tests import redis_servers
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


def fill(checker: redis_py.Redis) -> None:
    """Redis past its memory limit: `maxmemory` below what it uses, nothing it may evict."""
    checker.set("ballast", "x" * 2_000_000)
    checker.config_set("maxmemory-policy", "noeviction")
    checker.config_set("maxmemory", str(int(checker.info("memory")["used_memory"]) // 2))


async def test_an_out_of_memory_redis_is_a_typed_error_everywhere_and_passes() -> None:
    with redis_servers.standalone() as url:
        checker = redis_py.Redis.from_url(url, decode_responses=True)
        settings = attrs.evolve(FAST, redis_url=url, admin_password="pw")
        async with serve_on(settings) as http, Coordinator(str(http.base_url)) as coordinator:
            assert (
                await http.put("/v1/admin/streams/orders", json={"shardCount": 2}, auth=AUTH)
            ).status_code == 200
            async with (
                open_redis(url) as r,
                open_producer(coordinator, r, "orders", "api", delivery_timeout_s=0.5) as producer,
            ):
                publisher, sync_coordinator = (
                    redis_py.Redis.from_url(url),
                    SyncCoordinator(str(http.base_url)),
                )
                sync = SyncProducer(
                    sync_coordinator,
                    publisher,
                    "orders",
                    "sync",
                    delivery_timeout_s=0.5,
                )
                await trio.to_thread.run_sync(sync.start)  # (a thread: the coordinator runs here)
                try:
                    await producer.publish({"n": "1"})
                    fill(checker)
                    with pytest.raises(RedisOutOfMemory, match="out of memory"):
                        await producer.publish({"n": "2"})
                    with pytest.raises(SyncOutOfMemory, match="out of memory"):
                        await trio.to_thread.run_sync(lambda: sync.publish({"n": "3"}))
                    refused = await http.put("/v1/admin/streams/more", json={"shardCount": 2}, auth=AUTH)
                    assert refused.status_code == 503, refused.text
                    assert refused.json()["error"] == "REDIS_OUT_OF_MEMORY"
                    metrics = (await http.get("/metrics")).text
                    [line] = [m for m in metrics.splitlines() if m.startswith("rsc_redis_oom_refusals_total")]
                    assert float(line.split()[-1]) >= 1
                    # memory freed: both publish again, and the coordinator writes again
                    checker.config_set("maxmemory", "0")
                    await producer.publish({"n": "4"})
                    await trio.to_thread.run_sync(lambda: sync.publish({"n": "5"}))
                    created = await http.put("/v1/admin/streams/more", json={"shardCount": 2}, auth=AUTH)
                    assert created.status_code == 200, created.text
                finally:
                    await trio.to_thread.run_sync(sync.close)
                    publisher.close()
                    sync_coordinator.close()
        checker.close()
