"""Quiesce-mode resharding end to end, and what a migration shows and allows.

Per-key order across a reshard: real `rsc worker` processes record each entry's key and
per-key sequence number as they finish handling it, while a trio and a synchronous producer
publish keyed messages throughout a quiesce scale-out and a quiesce scale-in. In quiesce mode
every entry of a key appended before the change is handled before any entry of that key
appended after it, so each key's sequence numbers come out of the workers in order.

Stalls: a producer that never reports `quiesced` stops the migration at PAUSING's bound, in a
visible state (stream view, Prometheus); an operator resumes it, or aborts it (producers
resume, the layout stays).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import ProducerPaused, open_producer
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.events import codec
from rsc.events.wire import ProducerHeartbeatRequest
from tests import redis_servers
from tests.httpkit import FAST, serve_on
from tests.processes.test_reshard import checker_for
from tests.processes.test_worker import group_view, result_lines, start_worker, stop_workers, until

AUTH = ("admin", "s3cret")
KEYS = 12


async def put_stream(http: httpx.AsyncClient, prefix: str, count: int, mode: str = "quiesce") -> Any:
    response = await http.put(
        f"/v1/admin/streams/{prefix}", json={"shardCount": count, "reshardMode": mode}, auth=AUTH
    )
    assert response.status_code == 200, response.text
    return response.json()


async def migration_of(http: httpx.AsyncClient, prefix: str) -> dict[str, Any]:
    view = (await http.get(f"/v1/streams/{prefix}")).json()
    migration: dict[str, Any] = view["migration"]
    return migration


async def until_phase(http: httpx.AsyncClient, prefix: str, phase: str, seconds: float) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await migration_of(http, prefix))
        return bool(seen["phase"] == phase)

    await until(reached, seconds)
    return seen


@attrs.define
class Keyed:
    """What one producer published: per key, the sequence numbers acknowledged, in order."""

    name: str
    acked: dict[str, list[int]] = attrs.field(factory=dict)
    paused: int = 0

    async def run(self, publish: Callable[[dict[str, str], str], Any]) -> None:
        n = 0
        while True:
            n += 1
            key = f"{self.name}:k{n % KEYS}"
            try:
                await publish({"bkey": key, "seq": str(n)}, key)
            except ProducerPaused:
                self.paused += 1
                continue
            self.acked.setdefault(key, []).append(n)
            await trio.sleep(0.004)


def handled_in_order(results: Path) -> tuple[dict[str, list[int]], int]:
    """Each key's sequence numbers in the order handlers finished, first handling of each only;
    and how many handlings were repeats (at-least-once)."""
    order: dict[str, list[int]] = {}
    seen: set[tuple[str, str]] = set()  # (shard key, entry id): ids are unique per key only
    repeats = 0
    for line in result_lines(results):
        shard, entry_id, _, bkey, seq = line.split()
        if (shard, entry_id) in seen:
            repeats += 1
            continue
        seen.add((shard, entry_id))
        order.setdefault(bkey, []).append(int(seq))
    return order, repeats


@pytest.mark.timeout(240)
async def test_quiesce_mode_keeps_per_key_order_across_a_scale_out_and_a_scale_in(  # noqa: PLR0915 (one story)
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        admin_password="s3cret",
        quiesce_pause_timeout_ms=20_000,
        quiesce_consume_timeout_ms=60_000,
    )
    results = tmp_path / "handled.txt"
    sync_redis = checker_for(standalone_url)
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        await put_stream(http, prefix, 4)
        workers = [
            start_worker(
                base_url,
                standalone_url,
                prefix,
                f"10.0.1.{i}",
                2,
                delay=0.01,  # a backlog forms: entries of a moved key wait in its old shard
                results_file=results,
                record_order=True,
                log=tmp_path / f"w{i}.log",
            )
            for i in (1, 2)
        ]
        trio_out, sync_out = Keyed("t"), Keyed("s")
        sync_coordinator = SyncCoordinator(base_url)
        try:
            async with (
                open_redis(standalone_url) as redis,
                Coordinator(base_url) as coordinator,
                open_producer(coordinator, redis, prefix, "trio-producer", pause_timeout_s=0.5) as producer,
                trio.open_nursery() as nursery,
            ):
                sync_producer = SyncProducer(
                    sync_coordinator, sync_redis, prefix, "sync-producer", pause_timeout_s=0.5
                )
                await trio.to_thread.run_sync(sync_producer.start)

                async def trio_publish(fields: dict[str, str], key: str) -> str:
                    return await producer.publish(fields, key)

                async def sync_publish(fields: dict[str, str], key: str) -> str:
                    return await trio.to_thread.run_sync(lambda: sync_producer.publish(fields, key))

                async def four_members() -> bool:
                    view = await group_view(http, prefix)
                    return len(view["members"]) == 4 and all(m["state"] == "STABLE" for m in view["members"])

                await until(four_members, 30)
                nursery.start_soon(trio_out.run, trio_publish)
                nursery.start_soon(sync_out.run, sync_publish)
                await trio.sleep(1.5)
                for migration_id, count in ((1, 6), (2, 3)):
                    started = await put_stream(http, prefix, count)
                    assert (started["spec"]["shardCount"], started["spec"]["reshardMode"]) == (
                        count,
                        "quiesce",
                    )
                    done = await until_phase(http, prefix, "DONE", 90)
                    assert done["migrationId"] == migration_id
                    phases = [p["phase"] for p in done["phases"]]
                    expected = ["PAUSING", "QUIESCED", "SWITCHING"]
                    expected += ["DRAINING", "DONE"] if count == 3 else ["DONE"]
                    assert phases == expected
                    assert done["stalled"] is None
                    await trio.sleep(1.5)  # publishing on the new layout
                nursery.cancel_scope.cancel()
            await trio.to_thread.run_sync(sync_producer.close)
            sync_coordinator.close()
            sync_redis.close()
            assert trio_out.paused
            assert sync_out.paused  # both were held while the layout changed

            acked = {**trio_out.acked, **sync_out.acked}
            total = sum(len(v) for v in acked.values())
            assert total > 300

            def missing() -> list[tuple[str, int]]:
                order, _ = handled_in_order(results)
                return sorted((k, n) for k, seqs in acked.items() for n in set(seqs) - set(order.get(k, ())))

            async def everything_handled() -> bool:
                return not missing()

            with trio.move_on_after(60):
                await until(everything_handled, 120)
            assert not missing(), f"{len(missing())} acknowledged but never handled: {missing()[:20]}"
            order, repeats = handled_in_order(results)
            for key, sequence in acked.items():
                # A publish the test cancelled at the end may have been written without its
                # acknowledgement reaching the producer (at-least-once): handled, after the rest.
                handled = order[key]
                assert handled[: len(sequence)] == sequence, f"{key}: handled out of order"
                assert all(n > sequence[-1] for n in handled[len(sequence) :]), (key, handled, sequence)
            assert repeats == 0
            shards = (await http.get(f"/v1/streams/{prefix}")).json()["shards"]
            assert [s["index"] for s in shards if s["state"] == "ACTIVE"] == [0, 1, 2]
        finally:
            stop_workers(workers)


@pytest.fixture
async def short_bounds(standalone_url: str) -> Any:
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        admin_password="s3cret",
        quiesce_pause_timeout_ms=1_000,
        quiesce_consume_timeout_ms=1_500,
    )
    async with serve_on(settings) as http:
        yield http


async def producer_beat(http: httpx.AsyncClient, prefix: str, producer: str, quiesced: bool) -> Any:
    request = ProducerHeartbeatRequest(2, prefix, producer, 0, quiesced)
    version = (await http.get(f"/v1/streams/{prefix}/routing")).json()["metadataVersion"]
    body = codec.wire.unstructure(request) | {"metadataVersion": version}
    response = await http.post("/v1/producers/heartbeat", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_producer_that_never_quiesces_stalls_the_migration_visibly_until_resumed(
    short_bounds: httpx.AsyncClient, prefix: str
) -> None:
    http = short_bounds
    await put_stream(http, prefix, 2, "online")
    await producer_beat(http, prefix, "stubborn", quiesced=False)
    await put_stream(http, prefix, 4)
    with trio.move_on_after(2.5):  # past PAUSING's bound, the producer never quiet
        while True:
            assert (await producer_beat(http, prefix, "stubborn", quiesced=False))["paused"]
            await trio.sleep(0.2)
    m = await migration_of(http, prefix)
    assert m["phase"] == "PAUSING"
    assert m["stalled"]["phase"] == "PAUSING"
    assert "stubborn" in m["stalled"]["reason"]
    assert m["waitingForProducers"] == ["stubborn"]
    assert m["producerVersions"] == {"stubborn": m["fromVersion"]}
    assert (m["mode"], m["fromShardCount"], m["toShardCount"], m["drainingShards"]) == ("quiesce", 2, 4, [])
    assert [p["phase"] for p in m["phases"]] == ["PAUSING"]
    assert m["inPhaseMs"] >= 2_000  # past the bound, still counting
    metrics = (await http.get("/metrics")).text
    assert f'rsc_migration_stalled{{stream="{prefix}"}} 1.0' in metrics
    assert f'rsc_migration_phase{{phase="PAUSING",stream="{prefix}"}} 1.0' in metrics
    seconds = re.search(rf'rsc_migration_phase_seconds{{stream="{prefix}"}} ([0-9.e+]+)', metrics)
    assert seconds is not None
    assert float(seconds.group(1)) >= 2.0, seconds
    # Stopped: the producer turning quiet does not move it on by itself.
    await producer_beat(http, prefix, "stubborn", quiesced=True)
    await trio.sleep(1.5)
    assert (await migration_of(http, prefix))["phase"] == "PAUSING"
    view = (await http.get(f"/v1/streams/{prefix}")).json()
    assert view["shardCount"] == 2
    assert view["paused"] is not None  # still held
    resumed = await http.post(f"/v1/admin/streams/{prefix}/migration/resume", auth=AUTH)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"]["migration"]["stalled"] is None

    async def switched() -> bool:
        await producer_beat(http, prefix, "stubborn", quiesced=True)  # acknowledges the new layout
        return bool((await migration_of(http, prefix))["phase"] == "DONE")

    await until(switched, 10)
    view = (await http.get(f"/v1/streams/{prefix}")).json()
    assert (view["shardCount"], view["paused"]) == (4, None)
    again = await http.post(f"/v1/admin/streams/{prefix}/migration/resume", auth=AUTH)
    assert (again.status_code, again.json()["error"]) == (409, "NO_MIGRATION")
    records = (
        await http.get("/v1/admin/audit", params={"pathPrefix": f"/v1/admin/streams/{prefix}"}, auth=AUTH)
    ).json()["records"]
    assert [r["status"] for r in records if r["path"].endswith("/migration/resume")] == [409, 200]


async def test_groups_that_do_not_consume_stall_quiesced_and_an_abort_leaves_the_layout(
    short_bounds: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    """QUIESCED waits until every group has consumed everything: with entries nobody reads it
    stops at its bound; an abort resumes the producers and keeps the old layout."""
    http = short_bounds
    await put_stream(http, prefix, 2, "online")
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await http.put(group, json={"startFrom": "earliest"}, auth=AUTH)).status_code == 200
    checker = checker_for(standalone_url)
    keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    checker.xadd(keys[0], {"n": "1"})
    await put_stream(http, prefix, 1)
    stalled = await until_phase(http, prefix, "QUIESCED", 5)

    async def stopped() -> bool:
        stalled.update(await migration_of(http, prefix))
        return stalled["stalled"] is not None

    await until(stopped, 10)
    assert stalled["stalled"]["phase"] == "QUIESCED"
    view = (await http.get(f"/v1/streams/{prefix}")).json()
    assert view["migration"]["waitingForGroups"] == {"billing": [0]}  # what it waits for, by name
    assert view["paused"] is not None
    assert [s["state"] for s in view["shards"]] == ["ACTIVE", "ACTIVE"]
    conflict = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 3}, auth=AUTH)
    assert (conflict.status_code, conflict.json()["error"]) == (409, "MIGRATION_IN_PROGRESS")
    assert "resume or abort it first" in conflict.json()["message"]  # stalled: resume is possible
    resume = await http.post(f"/v1/admin/streams/{prefix}/resume", auth=AUTH)
    assert (resume.status_code, resume.json()["error"]) == (409, "MIGRATION_IN_PROGRESS")
    aborted = await http.post(
        f"/v1/admin/streams/{prefix}/migration/abort", json={"reason": "no consumer today"}, auth=AUTH
    )
    assert aborted.status_code == 200, aborted.text
    status = aborted.json()["status"]
    assert (status["migration"]["phase"], status["migration"]["outcome"]) == ("ABORTED", "no consumer today")
    assert (status["paused"], status["shardCount"]) == (None, 2)
    assert aborted.json()["spec"]["shardCount"] == 2
    again = await http.post(f"/v1/admin/streams/{prefix}/migration/abort", auth=AUTH)
    assert (again.status_code, again.json()["error"]) == (409, "NO_MIGRATION")
    checker.close()


async def test_migrations_need_their_feature_level_and_then_cannot_be_lowered_below_it(prefix: str) -> None:
    with redis_servers.standalone() as url:  # the feature level is one per deployment
        settings = attrs.evolve(FAST, redis_url=url, admin_password="s3cret", initial_feature_level=2)
        async with serve_on(settings) as http:
            await put_stream(http, prefix, 2, "online")
            refused = await http.put(
                f"/v1/admin/streams/{prefix}", json={"shardCount": 3, "reshardMode": "quiesce"}, auth=AUTH
            )
            assert (refused.status_code, refused.json()["error"]) == (409, "FEATURE_LEVEL_REQUIRED")
            assert refused.json()["details"] == {"required": 3, "finalized": 2}
            online = await put_stream(http, prefix, 1, "online")  # below level 3: no migration record
            assert online["status"]["migration"] is None
            assert online["spec"] == {"shardCount": 1, "reshardMode": "online"}
            raised = await http.put("/v1/admin/features", json={"level": 3}, auth=AUTH)
            assert raised.status_code == 200, raised.text
            started = await put_stream(http, prefix, 2, "quiesce")
            assert started["status"]["migration"]["migrationId"] == 1
            # Level-3 events are in the journal now: a level-2 coordinator could not replay them.
            lowered = await http.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
            assert (lowered.status_code, lowered.json()["error"]) == (409, "FEATURE_LEVEL_IN_USE")
