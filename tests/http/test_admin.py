"""The Admin API over a real socket: Basic Auth, declarative specs, ETag, audit."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "s3cret")


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")
    async with serve_on(settings) as http:
        yield http


@pytest.fixture
async def no_admin(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield http


async def audit(client: httpx.AsyncClient, **filters: str) -> list[dict[str, object]]:
    response = await client.get("/v1/admin/audit", params=filters, auth=AUTH)
    assert response.status_code == 200
    records: list[dict[str, object]] = response.json()["records"]
    return records


async def test_credentials_are_required_and_failures_audited(client: httpx.AsyncClient, prefix: str) -> None:
    path = f"/v1/admin/streams/{prefix}"
    missing = await client.get(path)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Basic")
    wrong = await client.put(path, json={"shardCount": 3}, auth=("admin", "nope"))
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "UNAUTHENTICATED"
    records = await audit(client, pathPrefix=path)
    assert [(r["method"], r["status"], r["outcome"], r["caller"]) for r in records] == [
        ("PUT", 401, "denied", "admin"),
        ("GET", 401, "denied", None),
    ]
    assert records[0]["bodySha256"] == hashlib.sha256(b'{"shardCount":3}').hexdigest()
    assert records[0]["requestId"] == wrong.headers["X-Request-Id"]
    assert records[0]["remoteAddress"] == "127.0.0.1"


async def test_admin_is_forbidden_without_a_configured_password(
    no_admin: httpx.AsyncClient, prefix: str
) -> None:
    response = await no_admin.get(f"/v1/admin/streams/{prefix}", auth=AUTH)
    assert response.status_code == 403
    assert response.json()["error"] == "ADMIN_DISABLED"


async def test_declarative_stream_put_get_etag(client: httpx.AsyncClient, prefix: str) -> None:
    path = f"/v1/admin/streams/{prefix}"
    assert (await client.get(path, auth=AUTH)).status_code == 404
    created = await client.put(path, json={"shardCount": 3}, auth=AUTH)
    assert created.status_code == 200
    # a new stream at feature level 5 keeps what some group has not acknowledged, no limit
    default = {"keep": "acknowledged", "maxAgeMs": None, "maxEntriesPerShard": None}
    default |= {"whenFull": "drop-oldest", "inactiveGroupMs": None, "deadLetterMaxEntries": 10_000}
    assert created.json()["spec"] == {"shardCount": 3, "reshardMode": "online", "retention": default}
    again = await client.put(path, json={"shardCount": 3}, auth=AUTH)  # idempotent
    assert again.headers["ETag"] == created.headers["ETag"]
    got = await client.get(path, auth=AUTH)
    assert got.headers["ETag"] == created.headers["ETag"]
    stale = await client.put(path, json={"shardCount": 5}, auth=AUTH, headers={"If-Match": '"999"'})
    assert stale.status_code == 412
    grown = await client.put(
        path, json={"shardCount": 5}, auth=AUTH, headers={"If-Match": got.headers["ETag"]}
    )
    assert grown.status_code == 200
    assert grown.json()["status"]["metadataVersion"] == 2
    assert grown.headers["ETag"] != got.headers["ETag"]
    quiesce = await client.put(path, json={"shardCount": 2, "reshardMode": "quiesce"}, auth=AUTH)
    assert quiesce.status_code == 200, quiesce.text
    # Read back as stored: the target count and the mode, while the layout has not switched.
    assert quiesce.json()["spec"] == {"shardCount": 2, "reshardMode": "quiesce", "retention": default}
    migration = quiesce.json()["status"]["migration"]
    assert (migration["mode"], migration["fromShardCount"], migration["toShardCount"]) == ("quiesce", 5, 2)
    assert migration["phase"] in ("PAUSING", "QUIESCED")
    assert quiesce.json()["status"]["shardCount"] == 5
    conflict = await client.put(path, json={"shardCount": 3}, auth=AUTH)
    assert (conflict.status_code, conflict.json()["error"]) == (409, "MIGRATION_IN_PROGRESS")
    aborted = await client.post(f"{path}/migration/abort", json={"reason": "test"}, auth=AUTH)
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["status"]["migration"]["phase"] == "ABORTED"
    assert aborted.json()["spec"] == {"shardCount": 5, "reshardMode": "quiesce", "retention": default}
    shrink = await client.put(path, json={"shardCount": 2}, auth=AUTH)  # scale-in: 2 ACTIVE, 3 DRAINING
    assert shrink.status_code == 200, shrink.text
    states = [s["state"] for s in shrink.json()["status"]["shards"]]
    assert states.count("ACTIVE") == 2
    bad = await client.put(path, json={"shardCount": "many"}, auth=AUTH)
    assert bad.status_code == 400
    records = await audit(client, pathPrefix=path, method="PUT")
    assert [r["status"] for r in records] == [400, 200, 409, 200, 200, 412, 200, 200]
    assert records[1]["revision"] is not None
    assert records[3]["revision"] is not None


async def test_scale_out_and_max_concurrency_reach_members(client: httpx.AsyncClient, prefix: str) -> None:
    r = await beat(client, hb(prefix, "a", 0))
    assert r["assignment"]["assigned"] == [0, 1, 2, 3]
    group_path = f"/v1/admin/streams/{prefix}/groups/billing"
    put = await client.put(group_path, json={"maxConcurrency": 8}, auth=AUTH)
    assert put.status_code == 200
    assert put.json()["spec"] == {"maxConcurrency": 8, "startFrom": "earliest"}
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 6}, auth=AUTH)
    with trio.fail_after(10):  # the layout reaches the group in the background
        while (r2 := await beat(client, hb(prefix, "a", r["memberEpoch"], ownedShards=[0, 1, 2, 3])))[
            "metadataVersion"
        ] != 2:
            await trio.sleep(0.05)
    assert r2["maxConcurrency"] == 8
    assert r2["assignment"]["assigned"] == [0, 1, 2, 3, 4, 5]
    assert r2["metadataVersion"] == 2


async def test_audit_filters(client: httpx.AsyncClient, prefix: str) -> None:
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    await client.get(f"/v1/admin/streams/{prefix}", auth=("intruder", "x"))
    # An unknown user name is recorded only hashed (it may be a password typed in the wrong field).
    assert not await audit(client, caller="intruder")
    assert not await audit(client, caller="unknown-user:" + hashlib.sha256(b"intruder").hexdigest()[:12])
    key = b"rsc-audit:" + hashlib.sha256(b"s3cret").hexdigest().encode()  # keyed: no offline dictionary
    denied = await audit(
        client, caller="unknown-user:" + hmac.new(key, b"intruder", "sha256").hexdigest()[:12]
    )
    assert denied
    assert all(r["outcome"] == "denied" for r in denied)
    assert len(await audit(client, limit="1")) == 1
    assert (await client.get("/v1/admin/audit", params={"status": "x"}, auth=AUTH)).status_code == 400
    misspelt = await client.get("/v1/admin/audit", params={"outcom": "denied"}, auth=AUTH)
    assert misspelt.status_code == 400  # not every record, unfiltered
    assert "'outcom'" in misspelt.json()["message"]
