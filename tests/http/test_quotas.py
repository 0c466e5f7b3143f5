"""Quotas (issue 27): what one caller may create, and how big anything may grow.

Over a real server (its own key prefix, so only this test's streams count): anonymous callers
creating ever new streams are refused at their quota with 429 `QUOTA_EXCEEDED` and nothing
beyond it exists in Redis; the count survives a coordinator restart and is released when a
stream is deleted; a credential's `quota` table lowers its limits; the deployment's limits hold
for the admin (refusals audited as rejected); refusals are counted in `/metrics`. The pure
core refuses a join and a producer past their quotas."""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import httpx
import pytest
import redis
import trio

from rsc.config import Settings
from rsc.events import quotas
from rsc.events.auth import credential
from rsc.events.commands import CreateStream, Heartbeat, ProducerHeartbeat
from rsc.events.errors import QuotaExceeded
from rsc.events.stream import execute as execute_stream
from tests.groupkit import Group
from tests.httpkit import FAST, hb, serve_on

ADMIN = ("admin", "s3cret")
TOKEN = "quota-token-0123456789"


def producer(stream: str, name: str) -> dict[str, Any]:
    return {"protocolVersion": 1, "streamPrefix": stream, "producerId": name, "metadataVersion": 0}


def settings_for(redis_url: str, namespace: str, **extra: Any) -> Settings:
    return attrs.evolve(FAST, redis_url=redis_url, admin_password=ADMIN[1], key_prefix=namespace, **extra)


def refused(response: httpx.Response, quota: str, limit: int) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["error"] == "QUOTA_EXCEEDED"
    assert body["details"] == {"quota": quota, "limit": limit}
    assert "Retry-After" not in response.headers  # not a rate: waiting alone does not help


async def test_anonymous_stream_creation_stops_at_its_quota_and_nothing_beyond_exists(
    standalone_url: str, sync_redis: redis.Redis
) -> None:
    namespace = f"q{uuid.uuid4().hex[:8]}:"
    config = settings_for(standalone_url, namespace, anonymous_quota_streams=3)
    async with serve_on(config) as http:
        for n in range(3):
            ok = await http.post("/v1/heartbeat", json=hb(f"s{n}", "m", 0))
            assert ok.status_code == 200, ok.text
        beyond = await http.post("/v1/heartbeat", json=hb("s3", "m", 0))
        refused(beyond, quotas.STREAMS, 3)
        by_producer = await http.post("/v1/producers/heartbeat", json=producer("s4", "p"))
        refused(by_producer, quotas.STREAMS, 3)
        # A layout version a client reports is no proof of a loss: a "rebuild" counts too.
        rebuild = await http.post(
            "/v1/producers/heartbeat", json={**producer("r1", "p"), "metadataVersion": 1}
        )
        refused(rebuild, quotas.STREAMS, 3)
        rejoin = await http.post("/v1/heartbeat", json=hb("r2", "m", 1, metadataVersion=1))
        refused(rejoin, quotas.STREAMS, 3)
        running = (await http.get("/readyz")).json()["actors"]["running"]
        for n in range(20):  # refused names keep no actor in memory
            refused(await http.post("/v1/heartbeat", json=hb(f"x{n}", "m", 0)), quotas.STREAMS, 3)
        await trio.sleep(0.1)
        assert (await http.get("/readyz")).json()["actors"]["running"] == running
        listed = await http.get("/v1/streams")
        assert {s["streamPrefix"] for s in listed.json()["streams"]} == {"s0", "s1", "s2"}
        metrics = (await http.get("/metrics")).text
        assert 'rsc_quota_refusals_total{quota="streams"}' in metrics
    # Nothing of the refused streams is in Redis: no journal, no shard key, no registration.
    assert not [k for k in sync_redis.scan_iter(f"{namespace}*") if "s3" in k or "s4" in k]
    # A restart does not reset the count; deleting a stream releases its place.
    async with serve_on(config) as http:
        again = await http.post("/v1/heartbeat", json=hb("s5", "m", 0))
        refused(again, quotas.STREAMS, 3)
        left = await http.post("/v1/heartbeat", json=hb("s0", "m", -1, memberEpoch=-1))
        assert left.status_code == 200, left.text
        gone = await http.delete("/v1/admin/streams/s0/groups/billing", auth=ADMIN)
        assert gone.status_code in (200, 202, 204), gone.text
        deleted = await http.delete("/v1/admin/streams/s0", auth=ADMIN)
        assert deleted.status_code in (200, 202, 204), deleted.text

        async def created() -> bool:
            return (await http.post("/v1/heartbeat", json=hb("s5", "m", 0))).status_code == 200

        from tests.processes.test_worker import until

        await until(created, 20)


async def test_a_credential_s_quota_table_lowers_its_limits(standalone_url: str) -> None:
    namespace = f"q{uuid.uuid4().hex[:8]}:"
    limited = credential(
        "limited",
        ["member", "producer"],
        token=TOKEN,
        create=True,
        quota={"streams": 1, "members_per_group": 2, "producers_per_stream": 1, "groups_per_stream": 1},
    )
    config = settings_for(standalone_url, namespace, credentials=(limited,))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with serve_on(config) as http:
        for member in ("a", "b"):
            ok = await http.post("/v1/heartbeat", json=hb("one", member, 0), headers=auth)
            assert ok.status_code == 200, ok.text
        refused(
            await http.post("/v1/heartbeat", json=hb("one", "c", 0), headers=auth), "members_per_group", 2
        )
        # In a batch, each item gets its own answer: the join past the quota alone is refused.
        batch = {"heartbeats": [hb("one", "a", 1), hb("one", "d", 0)]}
        items = (await http.post("/v1/heartbeats", json=batch, headers=auth)).json()["responses"]
        assert items[1]["error"] == "QUOTA_EXCEEDED"
        assert items[1]["status"] == 429  # what it is answered alone: a client waits and retries
        assert items[1]["details"] == {"quota": "members_per_group", "limit": 2}
        assert "error" not in items[0], items[0]  # a live member is no join
        other_group = hb("one", "e", 0, consumerGroup="audit")
        refused(await http.post("/v1/heartbeat", json=other_group, headers=auth), "groups_per_stream", 1)
        refused(await http.post("/v1/heartbeat", json=hb("two", "a", 0), headers=auth), "streams", 1)
        first = await http.post("/v1/producers/heartbeat", json=producer("one", "p1"), headers=auth)
        assert first.status_code == 200, first.text
        second = await http.post("/v1/producers/heartbeat", json=producer("one", "p2"), headers=auth)
        refused(second, "producers_per_stream", 1)
        # The admin has the deployment's limits: it may add what the credential may not.
        put = await http.put("/v1/admin/streams/one/groups/audit", json={}, auth=ADMIN)
        assert put.status_code == 200, put.text


async def test_the_deployment_s_quotas_hold_for_the_admin_and_refusals_are_audited(
    standalone_url: str,
) -> None:
    namespace = f"q{uuid.uuid4().hex[:8]}:"
    config = settings_for(standalone_url, namespace, quota_streams=1, quota_shards_per_stream=8)
    async with serve_on(config) as http:
        refused(
            await http.put("/v1/admin/streams/a", json={"shardCount": 9}, auth=ADMIN), "shards_per_stream", 8
        )
        assert (await http.put("/v1/admin/streams/a", json={"shardCount": 8}, auth=ADMIN)).status_code == 200
        refused(
            await http.put("/v1/admin/streams/a", json={"shardCount": 16}, auth=ADMIN), "shards_per_stream", 8
        )
        refused(await http.put("/v1/admin/streams/b", json={"shardCount": 1}, auth=ADMIN), "streams", 1)
        refused(await http.post("/v1/heartbeat", json=hb("c", "m", 0)), "streams", 1)
        audit = (await http.get("/v1/admin/audit", params={"outcome": "rejected"}, auth=ADMIN)).json()
        records = audit["records"] if isinstance(audit, dict) else audit
        assert sum(1 for r in records if r["status"] == 429) >= 3, records


async def test_creations_side_by_side_never_pass_a_quota_together(
    standalone_url: str, sync_redis: redis.Redis
) -> None:
    """Stream creations run side by side (a batch naming new streams, admin PUTs and single
    heartbeats at once); each counts the others still under way, so exactly the quota's worth
    is created and every other is refused, for a caller's quota and the deployment's."""
    namespace = f"q{uuid.uuid4().hex[:8]}:"
    config = settings_for(standalone_url, namespace, anonymous_quota_streams=7, quota_streams=12)
    answers: dict[str, str] = {}  # stream: "created" or the error code
    async with serve_on(config) as http:

        async def batch(tag: str) -> None:
            body = {"heartbeats": [hb(f"{tag}{n}", "m", 0) for n in range(6)]}
            items = (await http.post("/v1/heartbeats", json=body)).json()["responses"]
            for n, item in enumerate(items):
                answers[f"{tag}{n}"] = item.get("error", "created")

        def outcome(answer: httpx.Response) -> str:
            return "created" if answer.status_code == 200 else str(answer.json()["error"])

        async def single(name: str) -> None:
            answers[name] = outcome(await http.post("/v1/heartbeat", json=hb(name, "m", 0)))

        async def put(name: str) -> None:
            put = await http.put(f"/v1/admin/streams/{name}", json={"shardCount": 2}, auth=ADMIN)
            answers[name] = outcome(put)

        async with trio.open_nursery() as nursery:
            for tag in ("b", "c"):
                nursery.start_soon(batch, tag)
            for n in range(4):
                nursery.start_soon(single, f"s{n}")
            for n in range(8):
                nursery.start_soon(put, f"a{n}")
        listed = {s["streamPrefix"] for s in (await http.get("/v1/streams")).json()["streams"]}
    assert len(answers) == 24
    created = {name for name, said in answers.items() if said == "created"}
    assert set(answers.values()) == {"created", "QUOTA_EXCEEDED"}, str(sorted(answers.items()))
    # 12 in all (the deployment's quota), at most 7 of them anonymous; nothing else exists
    assert created == listed
    assert len(created) == 12, answers
    assert len([name for name in created if not name.startswith("a")]) <= 7
    registered = sync_redis.smembers(f"{namespace}rsc:v1:streams")
    assert {r.decode() if isinstance(r, bytes) else r for r in registered} == listed


def test_a_join_past_the_group_s_quota_is_refused_and_nothing_changes() -> None:
    kit = Group.create()
    joined = kit.hb("a", 0)
    before = kit.state
    with pytest.raises(QuotaExceeded) as caught:
        kit.run(Heartbeat("b", "inc-1", 0, kit.now, 1, max_members=1))
    assert caught.value.details == {"quota": "members_per_group", "limit": 1}
    assert kit.state == before
    # A live member's heartbeat is no join: the limit does not apply to it.
    kit.run(Heartbeat("a", "inc-1", joined.member_epoch, kit.now, 1, max_members=1))


def test_a_new_producer_past_the_stream_s_quota_is_refused() -> None:
    state, _ = execute_stream(None, CreateStream("orders", 2))
    state, _ = execute_stream(state, ProducerHeartbeat("p1", 0, False, 1_000, 10_000, max_producers=1))
    with pytest.raises(QuotaExceeded):
        execute_stream(state, ProducerHeartbeat("p2", 0, False, 1_000, 10_000, max_producers=1))
    assert execute_stream(state, ProducerHeartbeat("p1", 0, False, 2_000, 10_000, max_producers=1))[1]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"streams": 1.5}, "quota streams must be a whole number, not 1.5"),
        ({"streams": 0}, "quota streams must be at least 1"),
        ({"members": 3}, "unknown quotas members"),
        ({"streams": True}, "must be a whole number"),
    ],
)
def test_a_credential_s_quota_table_is_checked_at_load(table: dict[str, Any], says: str) -> None:
    import json

    from rsc.config import ConfigError, load

    listed = [{"name": "c", "token": TOKEN, "roles": ["member"], "quota": table}]
    with pytest.raises(ConfigError, match=says) as refused:
        load(environ={"RSC_CREDENTIALS": json.dumps(listed)})
    assert "credentials: credentials" not in str(refused.value)
