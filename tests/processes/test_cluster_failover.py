"""A Redis Cluster failing over under a running coordinator, `rsc worker` and a sync producer
(issue 26): `CLUSTER FAILOVER` on the replica of the primary that holds the coordinator's keys
(lease, token counter, dataset marker, journals) and of one holding shard keys. The clients
follow the new slot owners (MOVED), nothing is lost, every publish after is handled, the
members keep their shards, the journals verify."""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import redis
import trio
from redis.cluster import RedisCluster

from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.events.slots import key_slot
from tests.httpkit import FAST, serve_on
from tests.processes.test_redis_data_loss import _flowing, verify_journals
from tests.processes.test_worker import group_view, start_worker, until
from tests.redis_servers import cluster

SHARDS = 4


@pytest.fixture(scope="module")
def replicated_cluster_url() -> Iterator[str]:
    with cluster(primaries=3, replicas=1) as url:
        yield url


class ClusterPublisher:
    """A sync producer on a redis-py cluster client, `seq`-numbered messages, from a thread."""

    def __init__(self, base_url: str, redis_url: str, prefix: str) -> None:
        self.client = RedisCluster.from_url(redis_url, decode_responses=True)
        self.coordinator = SyncCoordinator(base_url)
        self.producer = SyncProducer(
            self.coordinator, self.client, prefix, "cluster/sync", delivery_timeout_s=20
        )
        self.seq = 0

    def publish(self, count: int) -> set[int]:
        done: set[int] = set()
        for _ in range(count):
            self.seq += 1
            self.producer.publish(
                {"bkey": f"k{self.seq % 16}", "seq": str(self.seq)}, key=f"k{self.seq % 16}"
            )
            done.add(self.seq)
        return done

    def close(self) -> None:
        self.producer.close()
        self.coordinator.close()
        self.client.close()


def fail_over(url: str, key: str, timeout: float = 90.0) -> tuple[str, str]:
    """`CLUSTER FAILOVER` on the replica of the primary holding `key`'s slot (coordinated: the
    replica catches up first, nothing is lost); (old, new) primary once every node agrees."""
    slot = key_slot(key)
    with RedisCluster.from_url(url) as client:
        old = client.get_node_from_key(key)
        old_at = f"{old.host}:{old.port}"
    with redis.Redis(host=old.host, port=old.port, decode_responses=True) as primary:
        deadline = time.monotonic() + timeout
        while True:  # its replica connected and in sync
            info = primary.info("replication")
            replica = info.get("slave0")
            if replica and replica.get("state") == "online":
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.1)
    with redis.Redis(host=replica["ip"], port=int(replica["port"]), decode_responses=True) as node:
        new_at = f"{replica['ip']}:{replica['port']}"
        deadline = time.monotonic() + timeout
        asked = -1e9
        while True:
            if time.monotonic() - asked > 8:  # a manual failover not done in 5 s is aborted: ask again
                node.execute_command("CLUSTER", "FAILOVER")
                asked = time.monotonic()
            slots = node.execute_command("CLUSTER", "SLOTS")
            owner = next((r for r in slots if r[0] <= slot <= r[1]), None)
            if owner is not None and f"{owner[2][0]}:{owner[2][1]}" == new_at:
                role = node.execute_command("ROLE")[0]
                if role == "master":
                    break
            assert time.monotonic() < deadline, slots
            time.sleep(0.1)
    return old_at, new_at


async def test_a_cluster_failover_loses_nothing_and_moves_no_shard(
    replicated_cluster_url: str, tmp_path: Path, prefix: str
) -> None:
    url = replicated_cluster_url
    results = tmp_path / "handled.txt"
    settings = attrs.evolve(FAST, redis_url=url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000)
    workers: list[subprocess.Popen[bytes]] = []
    publisher: ClusterPublisher | None = None
    async with serve_on(settings) as http:
        try:
            workers.append(
                start_worker(
                    str(http.base_url),
                    url,
                    prefix,
                    "10.0.0.13",
                    2,
                    tmp_path / "worker.log",
                    results_file=results,
                    record_order=True,
                )
            )

            async def reading_everything() -> bool:  # balanced: each of its two members reads two
                view = await group_view(http, prefix)
                return sorted(len(m["assigned"]) for m in view["members"]) == [2, 2]

            await until(reading_everything)
            members = {
                m["memberId"]: sorted(m["assigned"]) for m in (await group_view(http, prefix))["members"]
            }
            publisher = await trio.to_thread.run_sync(ClusterPublisher, str(http.base_url), url, prefix)
            await trio.to_thread.run_sync(publisher.producer.start)
            before = await trio.to_thread.run_sync(publisher.publish, 50)
            await until(functools.partial(_flowing, results, before), 20)
            routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
            gaps = []
            # The coordinator's own keys (one hash tag), then a shard key's primary.
            for key in ("rsc:v1:{coordinator}:lease", routing["shards"][0]["key"]):
                moved = await trio.to_thread.run_sync(fail_over, url, key)
                started = time.monotonic()
                after = await trio.to_thread.run_sync(publisher.publish, 100)
                await until(functools.partial(_flowing, results, after), 30)
                gaps.append(round(time.monotonic() - started, 2))
                print("failed over", moved, "publishes after handled in", gaps[-1], "s")
            assert (await http.get("/readyz")).status_code == 200
            loss = (await http.get("/readyz")).json()["dataLoss"]
            assert not set(loss["counts"]) & {"everything", "rollback", "aggregate"}, loss  # nothing lost
            now = {m["memberId"]: sorted(m["assigned"]) for m in (await group_view(http, prefix))["members"]}
            assert now == members  # no rebalance
            await trio.to_thread.run_sync(verify_journals, url)
        finally:
            if publisher is not None:
                await trio.to_thread.run_sync(publisher.close)
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=20)
