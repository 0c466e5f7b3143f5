"""Idempotent producers (feature level 6): a retried append is appended once.

* The append script itself: a repeat answered with the first ids (even once the shard is
  sealed), an older epoch refused, a late copy below the floor refused, records pruned and
  expiring.
* Both producers through a TCP proxy that cuts the connection after Redis ran a request and
  before its reply reached the producer (a network blip, an idle cut, a failover): every
  `publish` and `publish_many` returns, and every message is in Redis exactly once, also
  through a scale-out.
* A producer restarted with the same id: a new epoch; the old process is fenced by the
  coordinator and on every shard the new one wrote.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import httpx
import pytest
import redis
import trio
from prometheus_client import REGISTRY

from rsc.actors.store_connection import open_redis
from rsc.client.append_calls import (
    SEALED_APPEND,
)
from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorRejected
from rsc.client.producer import Producer, ProducerFenced, open_producer
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.conformance.cutting_proxy import CuttingProxy
from rsc.events.wire import cap_key, producer_key, seal_key
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


def append(r: redis.Redis, shard: str, epoch: int, seq: int, low: int, *values: str) -> Any:
    keys = [shard, seal_key(shard), cap_key(shard), producer_key(shard, "p")]
    args: list[Any] = [epoch, seq, low, 60_000, len(values)]
    for value in values:
        args += [2, "v", value]
    return r.eval(SEALED_APPEND, len(keys), *keys, *args)


def test_the_script_answers_a_repeat_refuses_old_epochs_and_late_copies(sync_redis: redis.Redis) -> None:
    shard = "idem:{idem:0}"
    sync_redis.delete(shard, seal_key(shard), producer_key(shard, "p"))
    ids = append(sync_redis, shard, 1, 1, 1, "a", "b")
    assert len(ids) == 2
    assert append(sync_redis, shard, 1, 1, 1, "a", "b") == ["REPEAT", *ids]  # nothing appended again
    assert sync_redis.xlen(shard) == 2
    later = append(sync_redis, shard, 1, 9, 1, "c")  # out of order: 3-8 are still in flight
    assert append(sync_redis, shard, 1, 3, 1, "d") != later
    assert sync_redis.xlen(shard) == 4
    sync_redis.set(seal_key(shard), "2")
    assert append(sync_redis, shard, 1, 9, 1, "c") == ["REPEAT", *later]  # dedupe before the seal
    with pytest.raises(redis.ResponseError, match=r"^SEALED"):
        append(sync_redis, shard, 1, 10, 1, "e")
    sync_redis.delete(seal_key(shard))
    # the stored floor follows the producer's once the record holds 128 calls: until then every
    # record stays (a late copy is answered as the repeat it is); then what is below the
    # producer's floor goes, and a late copy of it is refused
    third = sync_redis.xrevrange(shard, count=1)[0][0]
    assert append(sync_redis, shard, 1, 3, 9, "d") == ["REPEAT", third]
    for n in range(100, 224):  # 124 more calls: 127 recorded
        append(sync_redis, shard, 1, n, 9, "x")
    assert sync_redis.hget(producer_key(shard, "p"), "n") == "127"
    newest = append(sync_redis, shard, 1, 1100, 224, "e")  # the 128th: pruned below 224
    record = sync_redis.hgetall(producer_key(shard, "p"))
    assert (record["f"], record["n"], record["1100"]) == ("224", "1", newest[0])
    assert sorted(record) == ["1100", "e", "f", "n"]
    with pytest.raises(redis.ResponseError, match=r"^STALE"):
        append(sync_redis, shard, 1, 3, 1100, "d")
    assert sync_redis.xlen(shard) == 129
    # a newer epoch (a restarted process) starts afresh; the older one is refused from then on
    assert append(sync_redis, shard, 2, 1, 1, "f")[0] != "REPEAT"
    with pytest.raises(redis.ResponseError, match=r"^FENCED producer epoch 1"):
        append(sync_redis, shard, 1, 1101, 1100, "g")
    assert sync_redis.xlen(shard) == 130
    assert 0 < sync_redis.pttl(producer_key(shard, "p")) <= 60_000
    # a bad window (or epoch, sequence, floor) is refused before anything is written
    keys = [shard, seal_key(shard), cap_key(shard), producer_key(shard, "p")]
    for head in ([2, 5, 1, 0], [2, 5, 1, "soon"], ["x", 5, 1, 60_000], [2, "y", 1, 60_000]):
        with pytest.raises(redis.ResponseError, match=r"^INVALID"):
            sync_redis.eval(SEALED_APPEND, 4, *keys, *head, 1, 2, "v", "i")
    assert sync_redis.xlen(shard) == 130
    # not idempotent (no epoch): appended every time, nothing recorded
    keys = [shard, seal_key(shard), cap_key(shard), producer_key(shard, "q")]
    for _ in range(2):
        sync_redis.eval(SEALED_APPEND, 4, *keys, "", 0, 0, 0, 1, 2, "v", "h")
    assert sync_redis.xlen(shard) == 132
    assert not sync_redis.exists(producer_key(shard, "q"))


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    # A namespace of its own: these tests need the newest feature level, and the session's
    # Redis is shared with tests that hold theirs lower.
    namespace = f"t{uuid.uuid4().hex[:8]}:"
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw", key_prefix=namespace)
    async with serve_on(settings) as client:
        yield client


def entries(checker: redis.Redis, prefix: str) -> list[str]:
    """Every message id field in the stream's shard keys (duplicates kept)."""
    found: list[str] = []
    for key in checker.scan_iter(f"*{prefix}*", _type="stream"):
        if "rsc:v1" in key:  # the coordinator's journals
            continue
        found += [fields["id"] for _, fields in checker.xrange(key)]
    return found


@pytest.mark.parametrize("client", ["trio", "sync"])
@pytest.mark.parametrize("batch", [1, 50])
async def test_replies_cut_after_redis_ran_the_append_leave_no_duplicate(
    http: httpx.AsyncClient,
    standalone_url: str,
    sync_redis: redis.Redis,
    prefix: str,
    client: str,
    batch: int,
) -> None:
    """Every publish returns, and each message is in Redis once: through cut replies, and
    through a scale-out 4 -> 8 in the middle."""
    base = str(http.base_url)
    port = int(standalone_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
    share = 0.1 if batch == 1 else 0.4
    ids = [f"m{n}" for n in range(600)]
    published: list[str] = []

    async def scale_out() -> None:
        answer = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 8}, auth=AUTH)
        assert answer.status_code == 200, answer.text

    # replies to appends lost after Redis ran them; armed once the producer is open
    with CuttingProxy(port, 0.0, seed=batch) as proxy:
        url = proxy.url
        if client == "trio":
            async with (
                Coordinator(base) as coordinator,
                open_redis(url) as r,
                open_producer(coordinator, r, prefix, "api", delivery_timeout_s=20) as producer,
            ):
                proxy.share = share
                await _publish_all(producer, ids, batch, published, scale_out)
        else:
            token = trio.lowlevel.current_trio_token()
            await trio.to_thread.run_sync(
                _publish_sync, base, url, prefix, ids, batch, published, scale_out, token, (proxy, share)
            )
    assert proxy.cuts >= 3  # the run did meet cut replies
    repeats = REGISTRY.get_sample_value("rsc_producer_repeats_total", {"stream": prefix})
    assert repeats is not None
    assert repeats >= 1  # sent again, answered as repeats
    assert published == ids
    found = entries(sync_redis, prefix)
    twice = sorted(i for i in set(found) if found.count(i) > 1)
    assert not twice, f"{len(found) - len(set(found))} duplicates, e.g. {twice[:5]}"
    assert sorted(found) == sorted(ids)


async def _publish_all(
    producer: Producer, ids: list[str], batch: int, published: list[str], halfway: Callable[[], Any]
) -> None:
    for start in range(0, len(ids), batch):
        if start == len(ids) // 2:
            await halfway()
            await producer.heartbeat()  # the new layout: later messages are routed over 8 shards
        chunk = ids[start : start + batch]
        written = await producer.publish_many([({"id": i}, i) for i in chunk])
        assert len(written) == len(chunk)
        published += chunk


def _publish_sync(
    base: str,
    url: str,
    prefix: str,
    ids: list[str],
    batch: int,
    published: list[str],
    halfway: Callable[[], Any],
    token: trio.lowlevel.TrioToken,
    arm: tuple[CuttingProxy, float],
) -> None:
    with (
        redis.Redis.from_url(url) as r,
        SyncCoordinator(base) as coordinator,
        SyncProducer(coordinator, r, prefix, "api-sync", delivery_timeout_s=20) as producer,
    ):
        arm[0].share = arm[1]
        for start in range(0, len(ids), batch):
            if start == len(ids) // 2:
                trio.from_thread.run(halfway, trio_token=token)
                producer.heartbeat()
            chunk = ids[start : start + batch]
            written = producer.publish_many([({"id": i}, i) for i in chunk])
            assert len(written) == len(chunk)
            published.extend(chunk)


async def test_a_restarted_producer_fences_the_old_process(
    http: httpx.AsyncClient, standalone_url: str, sync_redis: redis.Redis, prefix: str
) -> None:
    """Same explicit id, a new process: it gets a newer epoch and publishes at once; the old
    one's heartbeat is refused (`PRODUCER_FENCED`) and its late append to a shard the new one
    wrote is refused, never written."""
    base = str(http.base_url)
    async with Coordinator(base) as coordinator, open_redis(standalone_url) as r, trio.open_nursery() as n:
        old = Producer(coordinator, r, prefix, "orders-api/0", delivery_timeout_s=2)
        await n.start(old.run)
        await old.publish({"id": "old-1"}, "k")
        new = Producer(coordinator, r, prefix, "orders-api/0", delivery_timeout_s=2)
        await n.start(new.run)
        assert old.state.epoch is not None
        assert new.state.epoch is not None
        assert new.state.epoch > old.state.epoch
        await new.publish({"id": "new-1"}, "k")  # not refused: the same shard as old-1
        with pytest.raises(ProducerFenced):
            await old.publish({"id": "old-2"}, "k")  # the shard has seen the newer epoch
        with pytest.raises(CoordinatorRejected, match="PRODUCER_FENCED"):
            await old.heartbeat()
        with pytest.raises(ProducerFenced):
            await old.publish({"id": "old-3"}, "other-key")
        assert sorted(entries(sync_redis, prefix)) == ["new-1", "old-1"]
        n.cancel_scope.cancel()
