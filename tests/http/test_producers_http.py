"""Producers over a real socket: registration, layout acknowledgement, pause/resume, expiry."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests import redis_servers
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "s3cret")


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")
    async with serve_on(settings) as http:
        yield http


def pb(prefix: str, producer: str, version: int, **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "streamPrefix": prefix,
        "producerId": producer,
        "metadataVersion": version,
        **extra,
    }


async def produce(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/v1/producers/heartbeat", json=body)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def stream_view(client: httpx.AsyncClient, prefix: str) -> dict[str, Any]:
    response = await client.get(f"/v1/streams/{prefix}")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


async def test_a_producer_registers_and_follows_a_scale_out(client: httpx.AsyncClient, prefix: str) -> None:
    first = await produce(client, pb(prefix, "api-1", 0, client={"name": "test", "version": "1"}))
    assert (first["status"], first["metadataVersion"], first["shardCount"], first["paused"]) == (
        "OK",
        1,
        4,
        False,
    )
    assert [s["index"] for s in first["layout"]["shards"]] == [0, 1, 2, 3]
    assert first["leaseTtlMs"] == FAST.member_lease_ttl_ms
    routed = await produce(client, pb(prefix, "api-1", 1))
    assert routed["layout"] is None
    view = await stream_view(client, prefix)
    assert [(p["producerId"], p["ackedVersion"], p["upToDate"]) for p in view["producers"]] == [
        ("api-1", 1, True)
    ]
    assert view["producers"][0]["client"] == {"name": "test", "version": "1", "featureLevel": 1}

    scaled = await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 8}, auth=AUTH)
    assert scaled.status_code == 200
    assert (await stream_view(client, prefix))["producersSummary"] == {
        "live": 1,
        "ackedCurrentVersion": 0,
        "quiesced": 0,
    }
    told = await produce(client, pb(prefix, "api-1", 1))
    assert told["metadataVersion"] == 2
    assert len(told["layout"]["shards"]) == 8
    await produce(client, pb(prefix, "api-1", 2))
    assert (await stream_view(client, prefix))["producers"][0]["upToDate"]


async def test_pause_quiesce_resume(client: httpx.AsyncClient, prefix: str) -> None:
    await produce(client, pb(prefix, "api-1", 0))
    path = f"/v1/admin/streams/{prefix}"
    paused = await client.post(f"{path}/pause", json={"reason": "maintenance"}, auth=AUTH)
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"]["paused"]["reason"] == "maintenance"
    told = await produce(client, pb(prefix, "api-1", 1))
    assert told["paused"] is True
    routing = (await client.get(f"/v1/streams/{prefix}/routing")).json()
    assert routing["paused"] is True
    await produce(client, pb(prefix, "api-1", 1, quiesced=True))
    assert (await stream_view(client, prefix))["producersSummary"]["quiesced"] == 1
    again = await client.post(f"{path}/pause", auth=AUTH)  # no body: idempotent, first reason kept
    assert again.json()["status"]["paused"]["reason"] == "maintenance"
    resumed = await client.post(f"{path}/resume", auth=AUTH)
    assert resumed.status_code == 200
    assert resumed.json()["status"]["paused"] is None
    assert (await produce(client, pb(prefix, "api-1", 1)))["paused"] is False
    records = (await client.get("/v1/admin/audit", params={"pathPrefix": path}, auth=AUTH)).json()["records"]
    assert [(r["method"], r["path"].rsplit("/", 1)[-1], r["status"]) for r in records] == [
        ("POST", "resume", 200),
        ("POST", "pause", 200),
        ("POST", "pause", 200),
    ]


async def test_pause_honours_if_match_and_needs_credentials(client: httpx.AsyncClient, prefix: str) -> None:
    await produce(client, pb(prefix, "api-1", 0))
    path = f"/v1/admin/streams/{prefix}"
    assert (await client.post(f"{path}/pause")).status_code == 401
    etag = (await client.get(path, auth=AUTH)).headers["ETag"]
    stale = await client.post(f"{path}/pause", headers={"If-Match": '"999"'}, auth=AUTH)
    assert stale.status_code == 412
    fresh = await client.post(f"{path}/pause", headers={"If-Match": etag}, auth=AUTH)
    assert fresh.status_code == 200
    bad = await client.post(f"{path}/pause", content=b'{"reason": 5}', auth=AUTH)
    assert (bad.status_code, bad.json()["error"]) == (400, "INVALID_REQUEST")
    missing = await client.post("/v1/admin/streams/never-made/pause", auth=AUTH)
    assert (missing.status_code, missing.json()["error"]) == (404, "UNKNOWN_STREAM")


async def test_a_producer_ahead_of_the_store_is_told_to_sync(client: httpx.AsyncClient, prefix: str) -> None:
    await produce(client, pb(prefix, "api-0", 0))  # the stream exists, at version 1
    r = await produce(client, pb(prefix, "api-1", 9))
    assert r["status"] == "SYNC_METADATA"
    assert r["layout"]["metadataVersion"] == 1
    view = await stream_view(client, prefix)
    assert {p["producerId"]: p["ackedVersion"] for p in view["producers"]}["api-1"] == 0
    metrics = (await client.get("/metrics")).text
    counted = {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "rsc_producer_answers"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["stream"] == prefix
    }
    assert counted == {"OK": 1.0, "SYNC_METADATA": 1.0}


async def test_a_producer_that_knows_a_stream_redis_lost_rebuilds_it(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """Redis holds nothing of the stream while a producer routes by its version 9: Redis lost
    it (no coordinator remembers it). It is rebuilt above what the producer knows, so the
    producer (of any client version) takes it as an ordinary layout change."""
    r = await produce(client, pb(prefix, "api-1", 9))
    assert r["status"] == "OK"
    assert r["layout"]["metadataVersion"] == 10
    r = await produce(client, pb(prefix, "api-1", 10))
    assert r["status"] == "OK"
    assert r.get("layout") is None  # up to date


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"producerId": ""}, "INVALID_REQUEST"),
        ({"metadataVersion": "1"}, "INVALID_REQUEST"),
        ({"quiesced": "yes"}, "INVALID_REQUEST"),
        ({"protocolVersion": 0}, "UNSUPPORTED_PROTOCOL_VERSION"),
        ({"streamPrefix": "has space"}, "INVALID_REQUEST"),
    ],
)
async def test_bad_producer_heartbeats_are_400(
    client: httpx.AsyncClient, prefix: str, change: dict[str, Any], code: str
) -> None:
    response = await client.post("/v1/producers/heartbeat", json={**pb(prefix, "api-1", 0), **change})
    assert (response.status_code, response.json()["error"]) == (400, code)


async def test_producers_expire_after_their_lease(standalone_url: str, prefix: str) -> None:
    short = attrs.evolve(FAST, redis_url=standalone_url, member_lease_ttl_ms=400)
    async with serve_on(short) as client:
        await produce(client, pb(prefix, "gone", 0))
        await produce(client, pb(prefix, "stays", 0))
        for _ in range(8):
            await trio.sleep(0.1)
            await produce(client, pb(prefix, "stays", 1))
        view = await stream_view(client, prefix)
    assert [p["producerId"] for p in view["producers"]] == ["stays"]


async def test_without_auto_creation_an_unknown_stream_is_404(standalone_url: str, prefix: str) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, auto_create_streams=False)
    async with serve_on(settings) as client:
        response = await client.post("/v1/producers/heartbeat", json=pb(prefix, "api-1", 0))
    assert (response.status_code, response.json()["error"]) == (404, "UNKNOWN_STREAM")


async def test_a_claim_at_the_counters_limit_is_not_rebuilt_above_it(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """A version at 2^53-1 cannot be rebuilt above: the stream is made as new (version 1) and
    the producer told to sync, instead of a stream no heartbeat could ever name again."""
    r = await produce(client, pb(prefix, "api-1", 2**53 - 1))
    assert r["status"] == "SYNC_METADATA"
    assert r["layout"]["metadataVersion"] == 1
    assert (await produce(client, pb(prefix, "api-1", 1)))["status"] == "OK"


async def test_full_shards_a_producer_reports_are_trimmed_before_the_next_round(
    standalone_url: str, prefix: str, sync_redis: Any
) -> None:
    """`fullShards` (feature level 5): the shards are trimmed by the stream's policy at once, not
    at the next round (10 minutes away here); an index the stream does not have is ignored, one
    outside the shard range refused."""
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, admin_password="s3cret", retention_interval_ms=600_000
    )
    async with serve_on(settings) as http:
        for bad in ([-1], [16_384], ["0"], 3):
            refused = await http.post("/v1/producers/heartbeat", json=pb(prefix, "api", 0, fullShards=bad))
            assert refused.status_code == 400, (bad, refused.text)
            assert refused.json()["error"] == "INVALID_REQUEST"
        policy = {"keep": "all", "maxEntriesPerShard": 3, "whenFull": "drop-oldest"}
        made = await http.put(
            f"/v1/admin/streams/{prefix}", json={"shardCount": 2, "retention": policy}, auth=AUTH
        )
        assert made.status_code == 200, made.text
        first = await produce(http, pb(prefix, "api", 0))
        keys = [s["key"] for s in first["layout"]["shards"]]
        for key in keys:
            for n in range(10):
                sync_redis.xadd(key, {"n": str(n)})
        await trio.sleep(0.5)
        assert [sync_redis.xlen(k) for k in keys] == [10, 10]  # no round in between
        await produce(http, pb(prefix, "api", 1, fullShards=[1, 9_999]))
        with trio.fail_after(5):
            while sync_redis.xlen(keys[1]) != 3:
                await trio.sleep(0.05)
        assert sync_redis.xlen(keys[0]) == 10  # only what was reported


async def test_a_new_deployment_s_first_stream_has_its_level_s_retention_and_producer_an_epoch() -> None:
    """The very first request of a new deployment is a producer's registration, or a member's
    join: the feature level is made then (not after), so a producer gets its epoch (level 6)
    in that first answer and the stream either creates has its level's default retention."""
    with redis_servers.standalone() as url:
        async with serve_on(attrs.evolve(FAST, redis_url=url, admin_password="s3cret")) as http:
            first = await produce(http, pb("fresh", "api", 0, producerEpoch=0, protocolVersion=2))
            assert first["producerEpoch"] > 0
            spec = (await http.get("/v1/admin/streams/fresh", auth=AUTH)).json()["spec"]
            assert spec["retention"]["keep"] == "acknowledged"
    with redis_servers.standalone() as url:  # and when the first request is a member's join
        async with serve_on(attrs.evolve(FAST, redis_url=url, admin_password="s3cret")) as http:
            join = {
                "protocolVersion": 2,
                "streamPrefix": "fresh",
                "consumerGroup": "g",
                "memberId": "m1",
                "incarnation": "i1",
                "memberEpoch": 0,
            }
            assert (await http.post("/v1/heartbeat", json=join)).status_code == 200
            spec = (await http.get("/v1/admin/streams/fresh", auth=AUTH)).json()["spec"]
            assert spec["retention"]["keep"] == "acknowledged"


async def test_a_group_s_oldest_pending_entries_without_fields_but_for_the_admin(
    client: httpx.AsyncClient, prefix: str, sync_redis: Any
) -> None:
    assert (await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)).is_success
    assert (await client.put(f"/v1/admin/streams/{prefix}/groups/g", json={}, auth=AUTH)).is_success
    keys = [s["key"] for s in (await client.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    # explicit ids: two appends in one millisecond on two shards would get the same id, and the
    # order of equal ids over the shards is not specified
    base = int(time.time() * 1000) + 1_000
    ids = [sync_redis.xadd(keys[n % 2], {"n": str(n)}, id=f"{base + n}-0") for n in range(6)]
    for key in keys:
        sync_redis.xreadgroup("g", "m1", {key: ">"}, count=2)
    shown = await client.get(f"/v1/streams/{prefix}/groups/g/pending", params={"limit": 3})
    assert shown.status_code == 200, shown.text
    entries = shown.json()["entries"]
    assert [e["id"] for e in entries] == [ids[0], ids[1], ids[2]]  # oldest first, over the shards
    assert all(e["member"] == "m1" and e["deliveries"] == 1 and "fields" not in e for e in entries)
    admin = await client.get(f"/v1/admin/streams/{prefix}/groups/g/pending", params={"limit": 3}, auth=AUTH)
    assert [e["fields"] for e in admin.json()["entries"]] == [{"n": "0"}, {"n": "1"}, {"n": "2"}]
    assert (
        await client.get(f"/v1/streams/{prefix}/groups/g/pending", params={"limit": 0})
    ).status_code == 400
    assert (await client.get(f"/v1/streams/{prefix}/groups/nope/pending")).status_code == 404
