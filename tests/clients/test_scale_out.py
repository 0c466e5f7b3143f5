"""Online scale-out under load: producers publish and workers consume during 4 -> 8 -> 16 shards.

Everything is real: `rsc serve`'s app on a socket, Redis (standalone, and a
3-primary cluster), two trio producers
and two worker Apps (four members). Nothing published may be lost, and every
entry must end acknowledged (no pending entries left in any shard).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.producer import Producer, open_producer
from rsc.client.worker import App
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=redis_url, admin_password="pw")) as client:
        yield client


def worker(base_url: str, redis_url: str, prefix: str, name: str, consumed: list[str]) -> App:
    app = App(base_url, redis_url, member_settings=MemberSettings(heartbeat_interval_ms=100))

    @app.listener(stream=prefix, group="billing", concurrency=2, name=name, poller=PollerSettings(batch=50))
    async def handle(message: Message) -> None:
        consumed.append(message.fields["id"])

    return app


async def publish_until(producer: Producer, stop: trio.Event, published: list[str], seed: int) -> None:
    rng = random.Random(seed)
    n = 0
    while not stop.is_set():
        batch = []
        for _ in range(20):
            n += 1
            batch.append(({"id": f"{producer.producer_id}/{n}"}, f"customer-{rng.randrange(500)}"))
        await producer.publish_many(batch)
        published.extend(fields["id"] for fields, _ in batch)
        await trio.sleep(0.005)


async def test_scale_out_4_8_16_while_publishing_and_consuming_loses_nothing(
    http: httpx.AsyncClient, redis_url: str, prefix: str, checker: Any
) -> None:
    base = str(http.base_url)
    put = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)
    assert put.status_code == 200, put.text
    consumed: list[str] = []
    published: list[str] = []
    apps = [worker(base, redis_url, prefix, name, consumed) for name in ("worker-a", "worker-b")]

    async def group_view() -> dict[str, object]:
        data: dict[str, object] = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
        return data

    async def settled(shards: int) -> bool:
        view = await group_view()
        members = view.get("members", [])
        assert isinstance(members, list)
        owned = sorted(s for m in members if m["state"] == "STABLE" for s in m["assigned"])
        return len(members) == 4 and owned == list(range(shards))

    async with (
        Coordinator(base) as coordinator,
        open_redis(redis_url) as r,
        trio.open_nursery() as nursery,
    ):
        for app in apps:
            await nursery.start(app.run)
        with trio.fail_after(20):
            while not await settled(4):
                await trio.sleep(0.05)

        stop = trio.Event()
        async with (
            open_producer(coordinator, r, prefix, "api/0") as p0,
            open_producer(coordinator, r, prefix, "api/1") as p1,
            trio.open_nursery() as producing,
        ):
            for seed, producer in enumerate((p0, p1)):
                producing.start_soon(publish_until, producer, stop, published, seed)
            for shards in (8, 16):
                await trio.sleep(0.5)
                put = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": shards}, auth=AUTH)
                assert put.status_code == 200, put.text
                with trio.fail_after(20):
                    while not (
                        len(p0.layout.active) == len(p1.layout.active) == shards and await settled(shards)
                    ):
                        await trio.sleep(0.05)
            await trio.sleep(0.5)
            stop.set()

        with trio.fail_after(30):
            while not set(published) <= set(consumed):
                await trio.sleep(0.05)
        view = (await http.get(f"/v1/streams/{prefix}")).json()
        keys = [s["key"] for s in view["shards"]]
        assert len(keys) == 16
        with trio.fail_after(10):  # acknowledgements go out in batches: wait for the last ones
            while any(checker.xpending(key, "billing")["pending"] for key in keys):
                await trio.sleep(0.05)
        for app in apps:
            app.stop()

    assert len(published) == len(set(published)) > 1_000
    assert set(consumed) == set(published)  # nothing lost, nothing invented
    duplicates = sum(c - 1 for c in Counter(consumed).values())
    assert duplicates == 0  # no member failed: the revoke-before-assign handoff redelivers nothing
    assert all(checker.xlen(key) > 0 for key in keys)  # producers used every new shard
    assert sum(checker.xlen(key) for key in keys) == len(published)
