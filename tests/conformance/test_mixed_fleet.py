"""Python and Node.js members in one group, and producers of both languages on one stream.

Three `rsc worker` processes (the Python worker under the conformance contract) and three
Node.js workers (clients/node) share a group while 20,000 messages are published; one Node
worker is kill -9'd and started again, and the stream is scaled out from 4 to 8 shards and back
in to 4 on the way; every worker heartbeats batched (`POST /v1/heartbeats`). The history
checker (`rsc.conformance.history`) judges every handler call both recorded
against the group's journal: nothing acknowledged is lost, no two calls on one shard overlap,
no call starts on a shard after it moved away. And a Node.js producer routes every key to the
shard the Python router names."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.cluster import RedisCluster

from rsc.cli.conformance_command import PYTHON_CLIENT
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.conformance.harness import PRODUCER_TOKEN, Client, Harness, free_port, harness, wait_for
from rsc.conformance.history import check
from rsc.events import codec
from rsc.events.model import Layout
from rsc.events.routing import route
from rsc.sync_connect import sync_redis
from tests.redis_servers import SentinelSet, cluster

ROOT = Path(__file__).parents[2]
NODE_DIR = ROOT / "clients" / "node"
NODE_CLIENT = f"node {NODE_DIR / 'bin' / 'conformance-client.js'}"
MESSAGES = 20_000


@pytest.fixture(autouse=True)
def _node_is_there() -> None:
    """Node.js is required (`make test` installs clients/node): no Node.js fails, never skips."""
    assert shutil.which("node"), "Node.js is required (make test installs clients/node with npm)"


def publish_steadily(h: Harness, total: int, done: threading.Event, mids: list[str]) -> None:
    try:
        while len(mids) < total:
            mids += h.publish(min(250, total - len(mids)))
            time.sleep(0.05)
    finally:
        done.set()


def batched_heartbeats(h: Harness) -> float:
    """How many `POST /v1/heartbeats` requests the coordinator answered (its own histogram)."""
    text = h.admin("GET", "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "rsc_heartbeat_seconds"
        for sample in family.samples
        if sample.name.endswith("_count") and sample.labels.get("endpoint") == "batch"
    )


def test_three_python_and_three_node_workers_ride_a_reshard_out_and_in(tmp_path: Path) -> None:
    with harness(PYTHON_CLIENT, tmp_path) as h:
        for _ in range(3):
            h.start_client(RSC_HANDLER_MS="1")
        nodes = [h.start_client(NODE_CLIENT, RSC_HANDLER_MS="1") for _ in range(3)]
        assert wait_for(lambda: len((h.group_view() or {}).get("members", ())) == 6, 30, 0.1), h.group_view()
        mids: list[str] = []
        done = threading.Event()
        publisher = threading.Thread(target=publish_steadily, args=(h, MESSAGES, done, mids), daemon=True)
        publisher.start()
        assert wait_for(lambda: len(mids) >= MESSAGES // 5, 60)
        assert any(r.pid in {n.pid for n in nodes} for r in h.records()), "no Node worker handled anything"
        h.kill(nodes[0])
        restarted = h.start_client(NODE_CLIENT, RSC_HANDLER_MS="1")
        assert wait_for(lambda: len(mids) >= 2 * MESSAGES // 5, 60)
        answer = h.admin("PUT", f"/v1/admin/streams/{h.stream}", json={"shardCount": 8})
        assert answer.status_code == 200, answer.text
        assert wait_for(lambda: len(mids) >= 3 * MESSAGES // 5, 60)
        assert wait_for(lambda: h.settled(6, 8), 60, 0.2), h.group_view()
        answer = h.admin("PUT", f"/v1/admin/streams/{h.stream}", json={"shardCount": 4})
        assert answer.status_code == 200, answer.text
        assert done.wait(120), "the publisher did not finish"
        publisher.join()
        handled = wait_for(lambda: set(mids) <= h.ended(), 120, 0.5)
        assert handled, f"{len(set(mids) - h.ended())} of {len(mids)} never handled"
        assert wait_for(lambda: h.pending() == 0, 30, 0.5), f"{h.pending()} left pending"
        assert wait_for(lambda: h.settled(6, 4), 60, 0.2), h.group_view()
        report = check(h.records(), h.publishes, h.faults, h.ownership())
        assert report.ok, "\n".join(report.problems())
        assert report.published == MESSAGES
        by_pid = {c.pid: sum(r.ev == "end" and r.pid == c.pid for r in h.records()) for c in h.clients}
        assert by_pid[restarted.pid] > 0, f"the restarted Node worker handled nothing: {by_pid}"
        assert batched_heartbeats(h) > 0


def test_node_and_python_producers_route_every_key_to_the_same_shard(tmp_path: Path) -> None:
    keys = [f"key-{i}" for i in range(300)] + ["", "Grüße", "注文-7", "customer:1001"]
    with harness(PYTHON_CLIENT, tmp_path) as h:
        h.publish(1)  # the stream, as Python producers create it
        answer = h.admin("PUT", f"/v1/admin/streams/{h.stream}", json={"shardCount": 7})
        assert answer.status_code == 200, answer.text
        env = h.client_env(RSC_TOKEN=PRODUCER_TOKEN)
        script = NODE_DIR / "bin" / "publish-keys.js"
        done = subprocess.run(
            ["node", str(script)],
            input=json.dumps(keys),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        auth = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}
        view = h.http.get(f"/v1/streams/{h.stream}/routing", headers=auth).json()
        layout = codec.converter.structure(
            {
                "metadataVersion": view["metadataVersion"],
                "routing": view["routing"],
                "shards": view["shards"],
            },
            Layout,
        )
        with h.redis.client() as r:
            landed = {
                fields["bkey"]: shard["index"]
                for shard in view["shards"]
                for _, fields in r.xrange(shard["key"])
                if "bkey" in fields and fields.get("mid") == fields["bkey"]  # the Node producer's
            }
        assert set(landed) == set(keys)
        assert {k: landed[k] for k in keys} == {k: route(layout, k.encode()).index for k in keys}


@contextlib.contextmanager
def data_plane(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "cluster":
        with cluster() as url:
            yield url
    else:
        with SentinelSet(tmp_path / "sentinel") as sentinels:
            yield sentinels.url


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
def test_the_node_worker_reads_a_redis_cluster_and_through_sentinel(tmp_path: Path, kind: str) -> None:
    """The Node.js worker given a cluster node's URL or a `redis+sentinel://` URL (as the
    Python clients take them): ioredis follows the slots, or asks the sentinels for the
    primary; the fenced scripts run where each shard lives."""
    with data_plane(kind, tmp_path) as url:
        port = free_port()
        env = {
            **os.environ,
            "RSC_HEARTBEAT_INTERVAL_MS": "200",
            "RSC_MEMBER_LEASE_TTL_MS": "2000",
            "RSC_COORDINATOR_LEASE_TTL_MS": "1000",
            "RSC_DEFAULT_SHARD_COUNT": "6",
        }
        log = (tmp_path / "coordinator.log").open("wb")
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}", "--redis-url", url]
        coordinator = subprocess.Popen(serve, env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        client_env = {**os.environ, "RSC_COORDINATOR_URL": base, "RSC_REDIS_URL": url, "RSC_STREAM": "nc"}
        client_env |= {"RSC_GROUP": "g", "RSC_MEMBER_ID": "n1", "RSC_HANDLER_MS": "1"}
        worker = None
        try:
            with httpx.Client(base_url=base) as http:
                assert wait_for(lambda: http.get("/readyz").status_code == 200, 30)
                worker = Client(shlex.split(NODE_CLIENT), client_env, tmp_path / "node.stderr")
                joined = wait_for(lambda: len(http.get("/v1/streams/nc/groups/g").json()["members"]) == 1, 30)
                assert joined, worker.stderr_tail()
            data = RedisCluster.from_url(url) if kind == "cluster" else sync_redis(url)
            coordinator_client = SyncCoordinator(base)
            producer = SyncProducer(coordinator_client, data, "nc").start()
            try:
                producer.publish_many([({"mid": f"m{i}", "bkey": f"k{i}"}, f"k{i}") for i in range(600)])
            finally:
                producer.close()
                coordinator_client.close()
                data.close()
            handled = lambda: {r.mid for r in worker.records if r.ev == "end"}  # noqa: E731
            assert wait_for(lambda: len(handled()) == 600, 60), (len(handled()), worker.stderr_tail())
            assert len({r.shard for r in worker.records}) == 6
        finally:
            if worker is not None:
                worker.kill()
            coordinator.kill()
            coordinator.wait()
            log.close()


def test_a_node_worker_rides_a_sentinel_failover(tmp_path: Path) -> None:
    """A Node.js worker (blocked in its wake-up read on the primary) and the coordinator, both
    through a `redis+sentinel://` URL, while the primary fails over to its replica: the worker
    is not restarted and handles everything published before and after (the replica was in
    sync: nothing acknowledged is lost)."""
    with SentinelSet(tmp_path / "sentinel") as sentinels:
        url = sentinels.url
        port = free_port()
        env = {
            **os.environ,
            "RSC_HEARTBEAT_INTERVAL_MS": "200",
            "RSC_MEMBER_LEASE_TTL_MS": "3000",
            "RSC_COORDINATOR_LEASE_TTL_MS": "1000",
            "RSC_DEFAULT_SHARD_COUNT": "4",
        }
        log = (tmp_path / "coordinator.log").open("wb")
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}", "--redis-url", url]
        coordinator = subprocess.Popen(serve, env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        client_env = {**os.environ, "RSC_COORDINATOR_URL": base, "RSC_REDIS_URL": url, "RSC_STREAM": "sf"}
        client_env |= {"RSC_GROUP": "g", "RSC_MEMBER_ID": "n1", "RSC_HANDLER_MS": "1"}
        worker = None

        def publish(first: int, count: int) -> None:
            data = sync_redis(url)
            coordinator_client = SyncCoordinator(base)
            producer = SyncProducer(coordinator_client, data, "sf", start_timeout_s=30.0).start()
            try:
                messages = [({"mid": f"m{i}", "bkey": f"k{i}"}, f"k{i}") for i in range(first, first + count)]
                producer.publish_many(messages)
            finally:
                producer.close()
                coordinator_client.close()
                data.close()

        try:
            with httpx.Client(base_url=base) as http:
                assert wait_for(lambda: http.get("/readyz").status_code == 200, 30)
                worker = Client(shlex.split(NODE_CLIENT), client_env, tmp_path / "node.stderr")
                joined = wait_for(lambda: len(http.get("/v1/streams/sf/groups/g").json()["members"]) == 1, 30)
                assert joined, worker.stderr_tail()
            handled = lambda: {r.mid for r in worker.records if r.ev == "end"}  # noqa: E731
            publish(0, 300)
            assert wait_for(lambda: len(handled()) == 300, 60), (len(handled()), worker.stderr_tail())
            time.sleep(0.5)  # idle: blocked in its wake-up read on the primary
            sentinels.failover()
            publish(300, 300)
            assert wait_for(lambda: len(handled()) == 600, 90), (len(handled()), worker.stderr_tail(20))
            assert worker.alive(), worker.stderr_tail()
        finally:
            if worker is not None:
                worker.kill()
            coordinator.kill()
            coordinator.wait()
            log.close()
