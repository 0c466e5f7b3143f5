"""The coordinator over a real socket: `serve` on a free port, real Redis, httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import redis as redis_py
import trio

import rsc
from tests.httpkit import FAST, beat, hb, serve_on


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, max_body_bytes=4_096)) as http:
        yield http


async def test_join_heartbeat_leave(client: httpx.AsyncClient, prefix: str) -> None:
    r = await beat(client, hb(prefix, "a", 0))
    assert r["status"] == "OK"
    assert r["assignment"] == {"assigned": [0, 1, 2, 3], "pending": [], "revoke": []}
    assert r["heartbeatIntervalMs"] == 100
    assert r["maxConcurrency"] == 1
    again = await beat(client, hb(prefix, "a", r["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    assert again["status"] == "OK"
    assert again["layout"] is None
    left = await beat(client, hb(prefix, "a", -1))
    assert left["memberEpoch"] == -1
    view = (await client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert view["members"] == []
    assert view["groupEpoch"] == 2


def keep_of(moving: list[int]) -> list[int]:
    return [s for s in [0, 1, 2, 3] if s not in moving]


async def test_revoke_before_assign_seen_from_outside(client: httpx.AsyncClient, prefix: str) -> None:
    a = await beat(client, hb(prefix, "a", 0))
    b = await beat(client, hb(prefix, "b", 0))
    assert b["status"] == "REVOKE_PENDING"
    assert b["assignment"]["assigned"] == []
    moving = b["assignment"]["pending"]
    a2 = await beat(client, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    assert a2["assignment"]["revoke"] == moving
    b2 = await beat(client, hb(prefix, "b", b["memberEpoch"]))
    assert b2["assignment"]["assigned"] == []  # not before a acknowledged
    view = (await client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert [p["memberId"] for p in view["revokeProgress"]] == ["a"]
    # what each reported reading, beside what it was given
    owned = {m["memberId"]: (m["owned"], m["assigned"], m["revoking"]) for m in view["members"]}
    assert owned == {"a": ([0, 1, 2, 3], keep_of(moving), moving), "b": ([], [], [])}
    keep = [s for s in [0, 1, 2, 3] if s not in moving]
    a3 = await beat(client, hb(prefix, "a", a2["memberEpoch"], ownedShards=keep, revokedShards=moving))
    assert a3["status"] == "OK"
    b3 = await beat(client, hb(prefix, "b", b["memberEpoch"]))
    assert b3["assignment"]["assigned"] == moving
    assert b3["status"] == "OK"


async def test_stale_epoch_is_fenced(client: httpx.AsyncClient, prefix: str) -> None:
    await beat(client, hb(prefix, "a", 0))
    r = await beat(client, hb(prefix, "a", 9))
    assert (r["status"], r["memberEpoch"], r["fenceReason"]) == ("FENCED", 0, "STALE_EPOCH")


async def test_lease_expiry(standalone_url: str, prefix: str) -> None:
    short = attrs.evolve(FAST, redis_url=standalone_url, member_lease_ttl_ms=400)
    async with serve_on(short) as client:
        r = await beat(client, hb(prefix, "a", 0))
        await trio.sleep(0.8)  # lease 400 ms, ticks every 50 ms
        late = await beat(client, hb(prefix, "a", r["memberEpoch"]))
    assert (late["status"], late["fenceReason"]) == ("FENCED", "LEASE_EXPIRED")


async def test_sync_metadata(client: httpx.AsyncClient, prefix: str) -> None:
    r = await beat(client, hb(prefix, "a", 0, metadataVersion=7))
    assert r["status"] == "SYNC_METADATA"
    assert r["layout"]["metadataVersion"] == 1


def answers_counted(metrics: str, prefix: str, status: str) -> float:
    """`rsc_heartbeat_answers_total` of the `billing` group of `prefix` with `status`."""
    labels = f'group="billing",status="{status}",stream="{prefix}"'
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("rsc_heartbeat_answers_total{") and sorted(name[28:-1].split(",")) == sorted(
            labels.split(",")
        ):
            return float(value)
    return 0.0


async def test_answers_are_counted_by_status_single_and_batched(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """What a conformance scenario asks the coordinator (not the client) about: the
    SYNC_METADATA exchanges it had, on either route."""
    await beat(client, hb(prefix, "a", 0, metadataVersion=7))
    batch = [hb(prefix, "b", 0, metadataVersion=9), hb(prefix, "c", 0)]
    assert (await client.post("/v1/heartbeats", json={"heartbeats": batch})).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert answers_counted(metrics, prefix, "SYNC_METADATA") == 2
    assert answers_counted(metrics, prefix, "OK") + answers_counted(metrics, prefix, "REVOKE_PENDING") == 1


async def test_another_incarnation_is_a_409(client: httpx.AsyncClient, prefix: str) -> None:
    await beat(client, hb(prefix, "a", 0))
    response = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0, incarnation="other"))
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "INCARNATION_MISMATCH"
    assert body["requestId"] == response.headers["X-Request-Id"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "MALFORMED_JSON"),
        (b"[1, 2]", 400, "INVALID_REQUEST"),
        (b'{"protocolVersion": 1}', 400, "INVALID_REQUEST"),
        (b"x" * 5_000, 413, "BODY_TOO_LARGE"),
    ],
)
async def test_bad_bodies_are_4xx(client: httpx.AsyncClient, body: bytes, status: int, code: str) -> None:
    response = await client.post("/v1/heartbeat", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert response.json()["error"] == code


async def test_wrong_types_name_the_field(client: httpx.AsyncClient, prefix: str) -> None:
    response = await client.post("/v1/heartbeat", json=hb(prefix, "a", "0"))  # type: ignore[arg-type]
    assert response.status_code == 400
    assert any("memberEpoch" in d for d in response.json()["details"])


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"protocolVersion": 0}, "UNSUPPORTED_PROTOCOL_VERSION"),
        ({"memberEpoch": -5}, "INVALID_REQUEST"),
        ({"streamPrefix": "bad{name}"}, "INVALID_REQUEST"),
        ({"memberId": ""}, "INVALID_REQUEST"),
    ],
)
async def test_out_of_range_fields_are_400(
    client: httpx.AsyncClient, prefix: str, change: dict[str, Any], code: str
) -> None:
    response = await client.post("/v1/heartbeat", json={**hb(prefix, "a", 0), **change})
    assert response.status_code == 400
    assert response.json()["error"] == code


async def test_request_id_is_echoed_or_made(client: httpx.AsyncClient) -> None:
    given = await client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert given.headers["X-Request-Id"] == "abc-123"
    made = await client.get("/healthz")
    assert len(made.headers["X-Request-Id"]) == 32


async def test_batch_heartbeats_keep_order_and_report_errors_per_item(
    client: httpx.AsyncClient, prefix: str
) -> None:
    await beat(client, hb(prefix, "m0", 0))
    batch = [
        hb(prefix, "m1", 0),
        hb(prefix, "m2", 0, metadataVersion=99),  # only this one is told SYNC_METADATA
        hb(prefix, "m3", 0),
        {**hb(prefix, "m4", 0), "protocolVersion": 0},  # refused by the core
        {"memberId": 1},  # refused by the schema
    ]
    response = await client.post("/v1/heartbeats", json={"heartbeats": batch})
    assert response.status_code == 200
    results = response.json()["responses"]
    assert len(results) == 5
    assert results[0]["status"] in ("OK", "REVOKE_PENDING")
    assert results[1]["status"] == "SYNC_METADATA"
    assert results[2]["status"] in ("OK", "REVOKE_PENDING")
    assert results[3]["error"] == "UNSUPPORTED_PROTOCOL_VERSION"
    assert results[4]["error"] == "INVALID_REQUEST"
    assert results[4]["requestId"] == response.headers["X-Request-Id"]


async def test_operator_views_and_routing(client: httpx.AsyncClient, prefix: str) -> None:
    await beat(client, hb(prefix, "a", 0))
    routing = (await client.get(f"/v1/streams/{prefix}/routing")).json()
    assert routing["shardCount"] == 4
    assert [s["index"] for s in routing["shards"]] == [0, 1, 2, 3]
    stream = (await client.get(f"/v1/streams/{prefix}")).json()
    assert stream["groups"] == ["billing"]
    listed = (await client.get("/v1/streams")).json()["streams"]
    assert prefix in [s["streamPrefix"] for s in listed]
    group = (await client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert group["currentAssignment"] == {"0": "a", "1": "a", "2": "a", "3": "a"}
    assert group["members"][0]["state"] == "STABLE"
    assert 0 < group["members"][0]["leaseLeftMs"] <= 10_000


async def test_unknown_things_are_404(client: httpx.AsyncClient, prefix: str) -> None:
    for path, code in [
        (f"/v1/streams/{prefix}/routing", "UNKNOWN_STREAM"),
        (f"/v1/streams/{prefix}", "UNKNOWN_STREAM"),
        ("/v1/nowhere", "NOT_FOUND"),
    ]:
        response = await client.get(path)
        assert response.status_code == 404
        assert response.json()["error"] == code
    assert (await client.get("/v1/heartbeat")).status_code == 405


async def test_version_and_probes(client: httpx.AsyncClient) -> None:
    version = (await client.get("/v1/version")).json()
    assert version["serverVersion"] == rsc.__version__
    assert version["protocol"] == {"min": 1, "max": 2}
    assert version["schemaVersion"] == 2
    assert version["lifecycle"]["status"] == "supported"
    assert [(p["version"], p["status"]) for p in version["protocols"]] == [(1, "supported"), (2, "supported")]
    features = version["features"]
    assert features["supported"] == {"min": 1, "max": 8}
    assert [level["level"] for level in features["levels"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    # the shared Redis: whichever coordinator came first (none yet when this test runs first)
    assert features["finalized"] in (None, 1, 2, 3, 4, 5, 6, 7, 8)
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).status_code == 200


async def test_metrics(client: httpx.AsyncClient, prefix: str) -> None:
    a = await beat(client, hb(prefix, "a", 0))
    await beat(client, hb(prefix, "b", 0))
    await beat(client, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'rsc_heartbeat_seconds_count{endpoint="single"}' in text
    assert f'rsc_members{{group="billing",state="UNREVOKED",stream="{prefix}"}} 1.0' in text
    assert f'rsc_revoking_shards{{group="billing",stream="{prefix}"}} 2.0' in text
    assert f'rsc_group_epoch{{group="billing",stream="{prefix}"}} 2.0' in text
    assert "rsc_journal_writes_total" in text
    assert "rsc_actor_inbox_depth" in text
    labels = f'group="billing",stream="{prefix}"'
    assert f"rsc_handoffs_total{{{labels}}}" not in text  # nothing handed off yet
    assert f"rsc_rebalances_total{{{labels}}} 2.0" in text
    a2 = await beat(client, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    moving = a2["assignment"]["revoke"]
    await beat(client, hb(prefix, "a", a2["memberEpoch"], ownedShards=[0, 1], revokedShards=moving))
    b = await beat(client, hb(prefix, "b", a2["groupEpoch"]))
    assert b["assignment"]["assigned"] == moving
    text = (await client.get("/metrics")).text
    assert f"rsc_handoffs_total{{{labels}}} 2.0" in text
    assert f"rsc_handoff_seconds_count{{{labels}}} 2.0" in text


async def test_stream_view_shows_redis_figures(client: httpx.AsyncClient, prefix: str) -> None:
    await beat(client, hb(prefix, "a", 0))
    view = (await client.get(f"/v1/streams/{prefix}")).json()
    shard = view["shards"][0]
    assert shard["length"] == 0
    assert shard["primaryNode"] is None  # standalone Redis
    assert shard["groups"] == [
        {"group": "billing", "pending": 0, "lag": 0, "lastDeliveredId": "0-0", "consumers": 0}
    ]


async def test_demo_members_show_a_handoff(client: httpx.AsyncClient) -> None:
    """The `rsc serve --demo` script: members join, one leaves and returns; shards hand over cleanly."""
    from rsc.demo import run_demo

    lines: list[str] = []
    await run_demo(str(client.base_url), lines.append, rounds=18, pace_s=0.3)
    assert any("revoking" in line for line in lines)
    assert any("leaves gracefully" in line for line in lines)
    view = (await client.get("/v1/streams/demo-orders/groups/demo-billing")).json()
    assert len(view["members"]) == 3
    assert sorted(view["currentAssignment"]) == ["0", "1", "2", "3"]


async def test_metrics_sample_shard_lag_pending_and_dead_letters(standalone_url: str, prefix: str) -> None:
    """Lag, pending, lengths and dead letters come from Redis on a timer (a scrape never waits
    for Redis): one series per readable shard, and per group."""
    settings = attrs.evolve(FAST, redis_url=standalone_url, metrics_sample_interval_ms=100)
    async with serve_on(settings) as client:
        await beat(client, hb(prefix, "a", 0))
        keys = [s["key"] for s in (await client.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
        checker = redis_py.Redis.from_url(standalone_url, decode_responses=True)
        for n in range(3):
            checker.xadd(keys[0], {"n": str(n)})
        checker.xreadgroup("billing", "a", {keys[0]: ">"}, count=1)  # one read, not acknowledged
        checker.xadd(f"{keys[1]}:dlq", {"rscSourceId": "1-1", "rscDeliveries": "5", "n": "x"})
        checker.close()
        shard0 = f'shard="0",stream="{prefix}"'
        with trio.fail_after(10):
            while f"rsc_shard_length{{{shard0}}} 3.0" not in (text := (await client.get("/metrics")).text):
                await trio.sleep(0.05)
        assert f'rsc_group_pending{{group="billing",{shard0}}} 1.0' in text
        assert f'rsc_group_lag{{group="billing",{shard0}}} 2.0' in text
        assert f'rsc_dead_letters{{shard="1",stream="{prefix}"}} 1.0' in text
        assert "process_cpu_seconds_total" in text  # the standard process metrics
