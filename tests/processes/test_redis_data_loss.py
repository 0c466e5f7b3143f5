"""Redis losing data under a running coordinator, `rsc worker` and a sync producer (issue 26):
FLUSHALL, a restart without persistence, an older copy restored. Every publish acknowledged
after Redis answers again is handled; the coordinator says what was lost (log, /readyz,
/metrics); `rsc journal verify` passes afterwards."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import redis
import trio

from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.sync_connect import sync_redis
from tests.httpkit import FAST, serve_on
from tests.processes.test_worker import ROOT, group_view, result_lines, start_worker, until
from tests.redis_servers import DurableServer, free_port

SHARDS = 4


def handled_seqs(results: Path) -> set[int]:
    """The `seq` field of every handled entry (the workers record it with RECORD_ORDER)."""
    return {int(p[4]) for line in result_lines(results) if len(p := line.split()) >= 5}


class Publisher:
    """A sync producer publishing `seq`-numbered messages from a thread; remembers which were
    acknowledged (`publish` returned) and when."""

    def __init__(self, base_url: str, redis_url: str, prefix: str) -> None:
        self.client = sync_redis(redis_url, decode_responses=True)  # a sentinel URL too
        self.coordinator = SyncCoordinator(base_url)
        self.producer = SyncProducer(
            self.coordinator, self.client, prefix, "loss/sync", delivery_timeout_s=20
        )
        self.seq = 0
        self.acknowledged: dict[int, float] = {}

    def publish(self, count: int) -> set[int]:
        done: set[int] = set()
        for _ in range(count):
            self.seq += 1
            seq = self.seq
            self.producer.publish({"bkey": f"k{seq % 16}", "seq": str(seq)}, key=f"k{seq % 16}")
            self.acknowledged[seq] = time.monotonic()
            done.add(seq)
        return done

    def close(self) -> None:
        self.producer.close()
        self.coordinator.close()
        self.client.close()


def restart_from(server: DurableServer, rdb: Path) -> None:
    """Crash Redis and start it again from an older RDB."""
    server.stop(signal.SIGKILL)
    (server.workdir / "dump.rdb").write_bytes(rdb.read_bytes())
    server.start()


async def stop_all(publisher: Publisher | None, workers: list[subprocess.Popen[bytes]]) -> None:
    if publisher is not None:
        await trio.to_thread.run_sync(publisher.close)
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=20)


def verify_journals(url: str) -> None:
    """`rsc journal verify` over every aggregate passes."""
    verify = subprocess.run(
        [sys.executable, "-m", "rsc", "journal", "verify", "--redis-url", url],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def _any_handled(results: Path, seqs: set[int]) -> bool:
    return bool(seqs & handled_seqs(results))


async def _flowing(results: Path, seqs: set[int]) -> bool:
    return seqs <= handled_seqs(results)


async def test_flushall_and_a_restart_without_persistence_lose_nothing_published_after(
    tmp_path: Path, prefix: str
) -> None:
    results = tmp_path / "handled.txt"
    with DurableServer(tmp_path / "redis", persistent=False) as server:
        settings = attrs.evolve(
            FAST, redis_url=server.url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
        )
        async with serve_on(settings) as http:
            log = tmp_path / "worker.log"
            worker = start_worker(
                str(http.base_url),
                server.url,
                prefix,
                "10.0.0.7",
                2,
                log,
                results_file=results,
                record_order=True,
            )
            publisher: Publisher | None = None
            gaps: dict[str, float] = {}
            try:

                async def reading_everything() -> bool:
                    view = await group_view(http, prefix)
                    return sum(len(m["assigned"]) for m in view["members"]) == SHARDS

                await until(reading_everything)
                publisher = await trio.to_thread.run_sync(Publisher, str(http.base_url), server.url, prefix)
                await trio.to_thread.run_sync(publisher.producer.start)
                before = await trio.to_thread.run_sync(publisher.publish, 100)
                await until(lambda: _flowing(results, before), 20)

                for fault in ("FLUSHALL", "restart without persistence"):
                    started = time.monotonic()
                    if fault == "FLUSHALL":
                        with redis.Redis.from_url(server.url) as client:
                            client.flushall()
                    else:
                        server.stop(signal.SIGKILL)
                        server.start()
                    after = await trio.to_thread.run_sync(publisher.publish, 200)
                    await until(functools.partial(_any_handled, results, after), 30)
                    gaps[fault] = round(time.monotonic() - started, 2)  # to the first handled
                    await until(functools.partial(_flowing, results, after), 30)
                    # The coordinator says what was lost, in /readyz (still 200: the fleet's
                    # heartbeats carry the correction).
                    ready = await http.get("/readyz")
                    assert ready.status_code == 200, ready.text
                    loss = ready.json()["dataLoss"]
                    assert loss["counts"], ready.json()
                metrics = (await http.get("/metrics")).text
                assert 'rsc_redis_data_loss_total{kind="everything"}' in metrics
                # The stream kept its layout and the members their shards.
                view = await group_view(http, prefix)
                assert sum(len(m["assigned"]) for m in view["members"]) == SHARDS
                with redis.Redis.from_url(server.url, decode_responses=True) as client:
                    routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
                    keys = [s["key"] for s in routing["shards"]]
                    assert all(client.exists(k) for k in keys)
                    await until(
                        lambda: _true(all(client.xpending(k, "billing")["pending"] == 0 for k in keys)), 20
                    )
                verify_journals(server.url)
                print("from the fault to the first handled publish after it (s):", gaps)
            finally:
                if publisher is not None:
                    await trio.to_thread.run_sync(publisher.close)
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
                    worker.wait(timeout=20)


async def _true(value: bool) -> bool:
    return value


async def test_an_older_copy_and_evicted_keys_lose_nothing_after(tmp_path: Path, prefix: str) -> None:
    """An older RDB restored (what a lagging replica's promotion does: older journals, lease,
    token counter and owner tokens than the coordinator and members have seen), then a shard key
    with its consumer group and another shard's owner tokens evicted."""
    results = tmp_path / "handled.txt"
    workdir = tmp_path / "redis"
    with DurableServer(workdir, persistent=False) as server:
        settings = attrs.evolve(
            FAST, redis_url=server.url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
        )
        async with serve_on(settings) as http:
            logs = [tmp_path / "a.log", tmp_path / "b.log"]
            workers = [
                start_worker(
                    str(http.base_url),
                    server.url,
                    prefix,
                    "10.0.0.8",
                    1,
                    logs[0],
                    results_file=results,
                    record_order=True,
                )
            ]
            publisher: Publisher | None = None
            try:

                async def reading(members: int) -> bool:
                    view = await group_view(http, prefix)
                    live = [m for m in view["members"] if m["assigned"]]
                    return len(live) == members and sum(len(m["assigned"]) for m in live) == SHARDS

                await until(functools.partial(reading, 1))
                publisher = await trio.to_thread.run_sync(Publisher, str(http.base_url), server.url, prefix)
                await trio.to_thread.run_sync(publisher.producer.start)
                first = await trio.to_thread.run_sync(publisher.publish, 100)
                await until(functools.partial(_flowing, results, first), 20)
                with redis.Redis.from_url(server.url) as client:
                    client.save()  # the copy a lagging replica (or last night's RDB) holds
                (workdir / "old.rdb").write_bytes((workdir / "dump.rdb").read_bytes())
                # Later history: a second worker, a handoff, more entries.
                workers.append(
                    start_worker(
                        str(http.base_url),
                        server.url,
                        prefix,
                        "10.0.0.9",
                        1,
                        logs[1],
                        results_file=results,
                        record_order=True,
                    )
                )
                await until(functools.partial(reading, 2), 20)
                second = await trio.to_thread.run_sync(publisher.publish, 100)
                await until(functools.partial(_flowing, results, second), 20)

                restart_from(server, workdir / "old.rdb")
                started = time.monotonic()
                after = await trio.to_thread.run_sync(publisher.publish, 200)
                await until(functools.partial(_flowing, results, after), 30)
                rolled_back = round(time.monotonic() - started, 2)

                async def rollback_noticed() -> bool:  # within a member lease (the watch's round)
                    loss = (await http.get("/readyz")).json()["dataLoss"]
                    return bool(set(loss["counts"]) & {"rollback", "aggregate", "lease"})

                await until(rollback_noticed, settings.member_lease_ttl_ms / 1000)

                routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
                keys = [s["key"] for s in routing["shards"]]
                with redis.Redis.from_url(server.url, decode_responses=True) as client:
                    client.delete(keys[0])  # evicted with its consumer group
                    client.delete(f"{keys[1]}:rsc:v1:owners")  # owner tokens evicted
                started = time.monotonic()
                evicted = await trio.to_thread.run_sync(publisher.publish, 200)
                await until(functools.partial(_flowing, results, evicted), 30)
                healed = round(time.monotonic() - started, 2)
                loss = (await http.get("/readyz")).json()["dataLoss"]
                assert loss["counts"].get("shard"), loss
                await until(functools.partial(reading, 2), 20)  # still two members, no rebalance storm
                verify_journals(server.url)
                print("all handled after a rollback in", rolled_back, "s, after an eviction in", healed, "s")
            finally:
                await stop_all(publisher, workers)


async def test_everything_lost_with_the_coordinator_is_rebuilt_from_the_fleet(
    tmp_path: Path, prefix: str
) -> None:
    """FLUSHALL while no coordinator runs (it restarted): the new one knows nothing, the worker
    and the producer know the layout. The stream is rebuilt above their version with the shard
    keys the producer recreated, the group at `0`; everything published after is handled."""
    results = tmp_path / "handled.txt"
    port = free_port()
    bind = f"127.0.0.1:{port}"
    with DurableServer(tmp_path / "redis", persistent=False) as server:
        settings = attrs.evolve(
            FAST, redis_url=server.url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
        )
        base_url = f"http://{bind}"
        workers: list[subprocess.Popen[bytes]] = []
        publisher: Publisher | None = None
        try:
            async with serve_on(settings, bind) as http:
                workers.append(
                    start_worker(
                        base_url,
                        server.url,
                        prefix,
                        "10.0.0.10",
                        2,
                        tmp_path / "w.log",
                        results_file=results,
                        record_order=True,
                    )
                )

                async def reading_everything() -> bool:
                    view = await group_view(http, prefix)
                    return sum(len(m["assigned"]) for m in view["members"]) == SHARDS

                await until(reading_everything)
                publisher = await trio.to_thread.run_sync(Publisher, base_url, server.url, prefix)
                await trio.to_thread.run_sync(publisher.producer.start)
                before = await trio.to_thread.run_sync(publisher.publish, 50)
                await until(functools.partial(_flowing, results, before), 20)
                old_keys = {
                    s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]
                }
                old_version = (await http.get(f"/v1/streams/{prefix}/routing")).json()["metadataVersion"]
            with redis.Redis.from_url(server.url) as client:
                client.flushall()
            started = time.monotonic()
            after = await trio.to_thread.run_sync(publisher.publish, 100)  # by the layout it knows
            async with serve_on(settings, bind) as http:
                await until(functools.partial(_flowing, results, after), 30)
                more = await trio.to_thread.run_sync(publisher.publish, 100)
                await until(functools.partial(_flowing, results, more), 30)
                flowing = round(time.monotonic() - started, 2)
                routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
                assert routing["metadataVersion"] > old_version
                assert {s["key"] for s in routing["shards"]} == old_keys
                loss = (await http.get("/readyz")).json()["dataLoss"]
                assert loss["counts"].get("rebuilt"), loss
                verify_journals(server.url)
                print("rebuilt from the fleet; everything handled", flowing, "s after the flush")
        finally:
            await stop_all(publisher, workers)
