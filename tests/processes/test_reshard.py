"""Resharding end to end: scale-in with drain-gated retirement, seals, scale to 0 and out again.

A real coordinator, `rsc worker` processes and both producers (trio and synchronous)
publishing keyed messages throughout, on standalone Redis and on the 3-primary cluster:
8 -> 4 -> 2 -> 0 -> 4 shards. Every acknowledged publish must be handled, nothing left
pending, and each retired shard retired only once Redis showed it drained.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import redis as redis_py
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import NoWritableShards, Producer, open_producer
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.events.routing import Router
from rsc.events.wire import seal_key
from tests.httpkit import FAST, beat, hb, serve_on
from tests.processes.test_worker import (
    group_view,
    handled_entries,
    result_lines,
    spread,
    start_worker,
    stop_workers,
    until,
)

AUTH = ("admin", "s3cret")
KEYS = 16


def checker_for(url: str) -> Any:
    """An independent redis-py client (a cluster client on the cluster)."""
    client = redis_py.Redis.from_url(url, decode_responses=True)
    try:
        client.cluster("info")
    except redis_py.ResponseError:
        return client
    client.close()
    return redis_py.RedisCluster.from_url(url, decode_responses=True)


@attrs.define
class Published:
    #: (key, sequence number) of each acknowledged publish: unique per message, wherever it
    #: landed (a publish refused by a seal lands on another shard than first routed to).
    acked: set[tuple[str, str]] = attrs.field(factory=set)
    refused_empty: int = 0  # publishes refused with no ACTIVE shard (scale to 0)


async def stream_shards(http: httpx.AsyncClient, prefix: str) -> dict[int, str]:
    view = (await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).json()
    return {s["index"]: s["state"] for s in view["status"]["shards"]}


async def reshard(http: httpx.AsyncClient, prefix: str, count: int) -> None:
    response = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": count}, auth=AUTH)
    assert response.status_code == 200, response.text


async def all_retired_but_active(http: httpx.AsyncClient, prefix: str) -> bool:
    return "DRAINING" not in (await stream_shards(http, prefix)).values()


async def publish_forever(publish: Callable[[dict[str, str], str], Any], out: Published, name: str) -> None:
    n = 0
    while True:
        n += 1
        key = f"{name}:k{n % KEYS}"
        try:
            await publish({"bkey": key, "seq": str(n)}, key)
            out.acked.add((key, str(n)))
        except NoWritableShards:
            out.refused_empty += 1
        await trio.sleep(0.01)


@pytest.mark.timeout(240)
async def test_scale_in_to_zero_and_out_again_loses_nothing(  # noqa: PLR0915 (one story, told in order)
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    settings = attrs.evolve(
        FAST,
        redis_url=redis_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        admin_password="s3cret",
        default_shard_count=8,
    )
    results = tmp_path / "handled.txt"
    checker, sync_redis = checker_for(redis_url), checker_for(redis_url)
    sync_coordinator: Any = None
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        await reshard(http, prefix, 8)
        workers = [
            start_worker(
                base_url,
                redis_url,
                prefix,
                f"10.0.0.{i}",
                2,
                results_file=results,
                record_order=True,
                log=tmp_path / f"w{i}.log",
            )
            for i in (1, 2)
        ]
        trio_out, sync_out = Published(), Published()
        sync_coordinator = SyncCoordinator(base_url)
        try:
            async with (
                open_redis(redis_url) as redis,
                Coordinator(base_url) as coordinator,
                open_producer(coordinator, redis, prefix, "trio-producer") as producer,
                trio.open_nursery() as nursery,
            ):
                sync_producer = SyncProducer(sync_coordinator, sync_redis, prefix, "sync-producer")
                await trio.to_thread.run_sync(sync_producer.start)  # (the coordinator runs here)

                async def trio_publish(fields: dict[str, str], key: str) -> str:
                    return await producer.publish(fields, key)

                async def sync_publish(fields: dict[str, str], key: str) -> str:
                    return await trio.to_thread.run_sync(lambda: sync_producer.publish(fields, key))

                nursery.start_soon(publish_forever, trio_publish, trio_out, "t")
                nursery.start_soon(publish_forever, sync_publish, sync_out, "s")

                async def four_members() -> bool:
                    view = await group_view(http, prefix)
                    return len(view["members"]) == 4 and all(m["state"] == "STABLE" for m in view["members"])

                await until(four_members, 30)
                await trio.sleep(1)
                for count in (4, 2, 0):
                    await reshard(http, prefix, count)
                    await trio.sleep(0.5)
                    await until(lambda: all_retired_but_active(http, prefix), 60)
                    shards = await stream_shards(http, prefix)
                    assert sum(state == "ACTIVE" for state in shards.values()) == count
                await trio.sleep(1)  # nothing is writable now
                assert trio_out.refused_empty
                assert sync_out.refused_empty
                await reshard(http, prefix, 4)
                shards = await stream_shards(http, prefix)
                assert sorted(i for i, s in shards.items() if s == "ACTIVE") == [8, 9, 10, 11]  # never reused
                await trio.sleep(2)
                nursery.cancel_scope.cancel()
            await trio.to_thread.run_sync(sync_producer.close)
            sync_coordinator.close()
            sync_redis.close()

            acked = trio_out.acked | sync_out.acked
            assert len(acked) > 200

            def handlings() -> list[tuple[str, str]]:
                """(key, sequence number) of each handling, repeats included."""
                return [(p[3], p[4]) for line in result_lines(results) if len(p := line.split()) == 5]

            async def everything_handled() -> bool:
                return acked <= set(handlings())

            with trio.move_on_after(60):
                await until(everything_handled, 120)
            lost = sorted(acked - set(handlings()))
            assert not lost, f"{len(lost)} acknowledged publishes never handled: {lost[:20]}"
            repeats = len(handlings()) - len(set(handlings()))
            print(f"{len(acked)} acknowledged publishes, all handled; {repeats} handled twice")
            routing = (await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).json()["status"]["shards"]
            for shard in routing:
                if shard["state"] == "RETIRED":
                    assert checker.xpending(shard["key"], "billing")["pending"] == 0
                    assert checker.exists(seal_key(shard["key"]))  # sealed before it retired

            async def nothing_pending() -> bool:
                return all(
                    checker.xpending(s["key"], "billing")["pending"] == 0
                    for s in routing
                    if checker.exists(s["key"])
                )

            await until(nothing_pending, 20)
            logs = "".join((tmp_path / f"w{i}.log").read_text() for i in (1, 2))
            assert "stops reading retired shards" in logs  # a retirement is not told as a handoff
        finally:
            stop_workers(workers)
            checker.close()


@pytest.fixture
async def admin(standalone_url: str) -> Any:
    async with admin_on(standalone_url) as http:
        yield http


@asynccontextmanager
async def admin_on(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(
        FAST,
        redis_url=redis_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        admin_password="s3cret",
    )
    async with serve_on(settings) as http:
        yield http


async def test_a_producer_on_a_stale_layout_is_refused_by_the_seal_and_re_routes(
    redis_url: str, prefix: str
) -> None:
    """Producers that have not heartbeated since the scale-in (held on the old layout on
    purpose: no heartbeat loop) publish to a DRAINING shard: the seal refuses, they learn the
    new layout and the message lands on an ACTIVE shard, written once. A `publish_many` that
    spans a sealed and an open shard writes the open shard's messages once and re-routes the
    others (standalone Redis and the cluster)."""
    async with admin_on(redis_url) as admin:
        await reshard(admin, prefix, 4)
        base_url = str(admin.base_url)
        checker = checker_for(redis_url)
        async with open_redis(redis_url) as redis, Coordinator(base_url) as coordinator:
            producer = Producer(coordinator, redis, prefix, "stale-trio")
            await producer.heartbeat()  # layout v1, and no more heartbeats
            sync_coordinator = SyncCoordinator(base_url)
            sync_producer = SyncProducer(sync_coordinator, checker_for(redis_url), prefix, "stale-sync")
            await trio.to_thread.run_sync(sync_producer.heartbeat)
            old = producer.state.layout

            def key_on(shard: int, skip: int = 0) -> str:
                on = (
                    f"k{n}"
                    for n in range(10_000)
                    if producer.state.shard_key(f"k{n}") == old.active[shard].key
                )
                return [next(on) for _ in range(skip + 1)][-1]

            key, open_key = key_on(3), key_on(0)
            await reshard(admin, prefix, 2)
            assert checker.exists(seal_key(old.active[3].key))
            entry = await producer.publish({"n": "1"}, key)
            sync_entry = await trio.to_thread.run_sync(lambda: sync_producer.publish({"n": "2"}, key))
            for stale in (producer.state, sync_producer.state):
                assert stale.layout.metadata_version > old.metadata_version  # it learnt the new layout
            # Both again on the old layout: one call with messages for a sealed and an open shard.
            for state in (producer.state, sync_producer.state):
                state.layout, state.router, state._routes = old, Router(old), {}
            batch = [({"n": f"m{i}"}, key_on(3, i) if i % 2 else open_key) for i in range(6)]
            many = await producer.publish_many(batch)
            sync_many = await trio.to_thread.run_sync(lambda: sync_producer.publish_many(batch))
            drained, kept = old.active[3].key, [s.key for s in old.active[:2]]
            assert checker.xlen(drained) == 0  # the seal kept everything out of the draining shard
            landed = [(e, f["n"]) for k in kept for e, f in checker.xrange(k)]
            assert {entry, sync_entry, *many, *sync_many} <= {e for e, _ in landed}
            written = sorted(n for _, n in landed)
            # Each message once per call: two calls of the batch, and the two single publishes.
            assert written == sorted(["1", "2", *[f"m{i}" for i in range(6)] * 2]), written
            sync_coordinator.close()
            sync_producer.redis.close()
        checker.close()


async def test_with_no_consumer_draining_shards_wait_then_retire_from_redis_evidence_alone(
    admin: httpx.AsyncClient, standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """The all-expired path: no member at all. Shards with entries left stay DRAINING (and
    visible); once a later member has consumed them, the coordinator retires them on the
    evidence alone, with no member's word."""
    await reshard(admin, prefix, 4)
    group = {"startFrom": "earliest"}
    assert (
        await admin.put(f"/v1/admin/streams/{prefix}/groups/billing", json=group, auth=AUTH)
    ).status_code == 200
    checker = checker_for(standalone_url)
    keys = [s["key"] for s in (await admin.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    for key in keys:
        checker.xadd(key, {"n": "1"})
    await reshard(admin, prefix, 2)
    await trio.sleep(3)  # several evidence rounds: entries remain, nobody reads them
    shards = await stream_shards(admin, prefix)
    assert [shards[i] for i in (2, 3)] == ["DRAINING", "DRAINING"]
    view = (await admin.get(f"/v1/streams/{prefix}")).json()
    drain = {s["index"]: s["drain"] for s in view["shards"]}
    assert drain[0] is None  # ACTIVE
    assert drain[2]["sealed"]  # what keeps it: one entry never delivered to billing
    assert not drain[2]["drained"]
    assert drain[2]["groups"] == [{"group": "billing", "pending": 0, "undelivered": True}]
    metrics = (await admin.get("/metrics")).text
    assert f'rsc_shards{{state="DRAINING",stream="{prefix}"}} 2.0' in metrics
    results = tmp_path / "handled.txt"
    worker = start_worker(str(admin.base_url), standalone_url, prefix, "10.0.0.9", 1, results_file=results)
    try:
        await until(lambda: all_retired_but_active(admin, prefix), 30)
        handled = handled_entries(result_lines(results))
        assert {(key, e) for key in keys for e, _ in checker.xrange(key)} <= handled
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        checker.close()


async def test_a_stream_scaled_to_zero_and_emptied_can_be_deleted(
    admin: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    await reshard(admin, prefix, 2)
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await admin.put(group, json={"startFrom": "earliest"}, auth=AUTH)).status_code == 200
    keys = [s["key"] for s in (await admin.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    await reshard(admin, prefix, 0)
    await until(lambda: all_retired_but_active(admin, prefix), 20)
    refused = await admin.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)
    assert (refused.status_code, refused.json()["error"]) == (409, "NOT_EMPTY")  # the group still reads it
    assert (await admin.delete(group, auth=AUTH)).status_code == 204
    assert (await admin.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 204
    checker = checker_for(standalone_url)
    assert not any(checker.exists(k, seal_key(k)) for k in keys)  # keys and seals are gone
    checker.close()


async def test_members_killed_during_a_scale_in_lose_nothing(
    admin: httpx.AsyncClient, standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """kill -9 of every worker right after a scale-in: the draining shards keep what was read
    but not acknowledged; they retire only once a later worker has claimed and handled it."""
    await reshard(admin, prefix, 4)
    base_url = str(admin.base_url)
    results = tmp_path / "handled.txt"
    first = start_worker(base_url, standalone_url, prefix, "10.0.0.1", 2, delay=0.05, results_file=results)
    checker = checker_for(standalone_url)
    try:

        async def two_members() -> bool:
            view = await group_view(admin, prefix)
            return len(view["members"]) == 2 and all(m["state"] == "STABLE" for m in view["members"])

        await until(two_members, 30)
        keys = [s["key"] for s in (await admin.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
        published = spread(checker, keys, 200)

        async def handling() -> bool:
            return results.exists()

        await until(handling, 10)
        await reshard(admin, prefix, 2)
        first.send_signal(signal.SIGKILL)  # mid-drain, handlers in flight
        first.wait()
        await trio.sleep(3)
        states = await stream_shards(admin, prefix)
        assert "DRAINING" in states.values()  # entries left behind: nothing retires on them
        for index, state in states.items():  # (one that did retire was drained)
            if state == "RETIRED":
                assert checker.xpending(keys[index], "billing")["pending"] == 0
        second = start_worker(base_url, standalone_url, prefix, "10.0.0.2", 2, results_file=results)
        try:
            await until(lambda: all_retired_but_active(admin, prefix), 60)

            async def all_handled() -> bool:
                return published <= handled_entries(result_lines(results))

            await until(all_handled, 30)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()
        checker.close()


async def test_retired_shard_keys_are_deleted_after_the_configured_retention(
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """With `retired_shard_retention_ms`, Redis deletes a retired shard key (drained: nothing
    pending) with its seal and owner tokens once the retention has passed; ACTIVE keys stay."""
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        admin_password="s3cret",
        retired_shard_retention_ms=1_500,
    )
    async with serve_on(settings) as http:
        await reshard(http, prefix, 3)
        checker = checker_for(standalone_url)
        keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
        results = tmp_path / "handled.txt"
        worker = start_worker(str(http.base_url), standalone_url, prefix, "10.0.0.7", 1, results_file=results)
        try:

            async def joined() -> bool:  # the group exists: the drain waits for it
                view = await group_view(http, prefix)
                return len(view["members"]) == 1 and view["members"][0]["state"] == "STABLE"

            await until(joined, 30)
            for n in range(30):
                checker.xadd(keys[n % 3], {"n": str(n)})
            await reshard(http, prefix, 1)
            await until(lambda: all_retired_but_active(http, prefix), 30)
            retired = keys[1:]
            assert all(checker.exists(k) for k in retired)  # kept for the retention first
            assert all(0 < checker.pttl(k) <= 1_500 for k in retired)
            assert all(checker.pttl(seal_key(k)) > 0 for k in retired)
            assert checker.pttl(keys[0]) == -1  # the ACTIVE key never expires

            async def gone() -> bool:
                return not any(checker.exists(k, seal_key(k)) for k in retired)

            await until(gone, 10)
            handled = handled_entries(result_lines(results))
            assert len(handled) == 30  # everything was handled before the keys went
            assert checker.exists(keys[0])
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=20)
            checker.close()


async def test_the_owner_reports_drain_progress_in_heartbeats_and_the_group_view_shows_it(
    admin: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    """`drainProgress` is kept for the DRAINING shards the member holds (the rest of what it sends
    is ignored) and shown in the group view; it is telemetry: the shards stay DRAINING while
    Redis shows entries left, whatever the member says."""
    a = await beat(admin, hb(prefix, "a", 0))
    a = await beat(admin, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    await reshard(admin, prefix, 2)
    a = await beat(admin, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    layout = a["layout"]
    assert [s["state"] for s in layout["shards"]] == ["ACTIVE", "ACTIVE", "DRAINING", "DRAINING"]
    checker = checker_for(standalone_url)
    checker.xadd(layout["shards"][3]["key"], {"n": "left"})  # unread: the shard cannot retire
    reports = [
        {"shard": 2, "pending": 0, "lag": 0},
        {"shard": 3, "pending": 0, "lag": 0},  # what the member says, not what Redis shows
        {"shard": 0, "pending": 9, "lag": 9},  # ACTIVE: not a drain report
        {"shard": 7, "pending": 1, "lag": None},  # not in the layout
    ]
    body = hb(
        prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3], metadataVersion=layout["metadataVersion"]
    )
    await beat(admin, {**body, "drainProgress": reports})
    view = (await admin.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert view["members"][0]["drainProgress"] == reports[:2]
    for _ in range(4):  # the drain watcher looks every second; the member stays alive
        await trio.sleep(0.5)
        await beat(admin, {**body, "drainProgress": reports})
    assert (await stream_shards(admin, prefix))[3] == "DRAINING"
    await beat(admin, {**body, "drainProgress": []})  # the next report replaces the last one
    view = (await admin.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert view["members"][0]["drainProgress"] == []
    checker.close()
