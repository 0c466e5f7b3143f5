"""Shard keys on a real 3-primary Redis Cluster: spread evenly, also after scale-outs, and routable."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator

import attrs
import httpx
import pytest
from redis.cluster import RedisCluster

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import open_producer
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def http(cluster_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=cluster_url, admin_password="pw")) as client:
        yield client


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    """An independent redis-py cluster client: which primary really holds a key."""
    with RedisCluster.from_url(cluster_url, decode_responses=True) as client:
        yield client


def primaries_of(cluster: RedisCluster, keys: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter({f"{n.host}:{n.port}": 0 for n in cluster.get_primaries()})
    for key in keys:
        node = cluster.get_node_from_key(key)
        counts[f"{node.host}:{node.port}"] += 1
    return counts


async def test_shards_spread_over_the_primaries_through_scale_outs(
    http: httpx.AsyncClient, cluster: RedisCluster, prefix: str
) -> None:
    response = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)
    assert response.status_code == 200, response.text
    for count in (4, 8, 16, 17):
        if count != 4:
            put = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": count}, auth=AUTH)
            assert put.status_code == 200, put.text
        view = (await http.get(f"/v1/streams/{prefix}")).json()
        keys = [s["key"] for s in view["shards"]]
        assert len(keys) == count
        really = primaries_of(cluster, keys)
        assert max(really.values()) - min(really.values()) <= 1, (count, really)
        assert view["shardsPerPrimary"] == {n: c for n, c in really.items() if c}
        for shard in view["shards"]:
            node = cluster.get_node_from_key(shard["key"])
            assert shard["primaryNode"] == f"{node.host}:{node.port}"
            assert cluster.exists(shard["key"]) == 1  # created with the layout


async def test_a_producer_publishes_to_every_primary(
    http: httpx.AsyncClient, cluster_url: str, cluster: RedisCluster, prefix: str
) -> None:
    assert (
        await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 6}, auth=AUTH)
    ).status_code == 200
    async with (
        Coordinator(str(http.base_url)) as coordinator,
        open_redis(cluster_url) as r,
        open_producer(coordinator, r, prefix, "api/0") as producer,
    ):
        await producer.publish_many([({"n": str(n)}, f"key-{n}") for n in range(600)])
        keys = [s.key for s in producer.layout.active]
    lengths = {key: cluster.xlen(key) for key in keys}
    assert sum(lengths.values()) == 600
    assert all(length > 0 for length in lengths.values())
    assert all(count == 2 for count in primaries_of(cluster, keys).values())
