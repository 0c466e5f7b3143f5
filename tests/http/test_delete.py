"""Deleting groups and streams: refused while in use, terminal, then created afresh on use.

Core rules as plain unit tests; the whole path (Admin API, Redis consumer
groups and shard keys, audit) over a real socket with real Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import redis

from rsc.events import group, stream
from rsc.events.commands import (
    CreateGroup,
    CreateStream,
    DeleteGroup,
    DeleteStream,
    Heartbeat,
    ProducerHeartbeat,
    RegisterGroup,
    Tick,
    UnregisterGroup,
)
from rsc.events.errors import Deleted, NotEmpty
from rsc.events.model import Layout, Shard
from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "s3cret")
LAYOUT = Layout(1, tuple(Shard(i, f"k{i}") for i in range(4)))


def test_a_group_with_live_members_is_not_deleted() -> None:
    state, _ = group.execute(None, CreateGroup("s", "g", LAYOUT))
    state, _ = group.execute(state, Heartbeat("m1", "i", 0, now_ms=0))
    with pytest.raises(NotEmpty, match="m1"):
        group.decide(state, DeleteGroup(1))
    state, _ = group.execute(state, Heartbeat("m1", "i", -1, now_ms=1))
    state, _ = group.execute(state, DeleteGroup(2))
    assert state.deleted
    assert group.decide(state, DeleteGroup(3)) == []  # idempotent
    assert group.decide(state, Tick(4, {})) == []
    with pytest.raises(Deleted):
        group.decide(state, Heartbeat("m1", "i", 0, now_ms=5))


def test_a_deleted_group_is_created_afresh_and_replays() -> None:
    history = []
    state = None
    for command in [
        CreateGroup("s", "g", LAYOUT),
        Heartbeat("m1", "i", 0, now_ms=0),
        Heartbeat("m1", "i", -1, now_ms=1),
        DeleteGroup(2),
        CreateGroup("s", "g", LAYOUT, now_ms=3),
        Heartbeat("m2", "j", 0, now_ms=4),
    ]:
        state, events = group.execute(state, command)
        history.extend(events)
    assert state is not None
    assert not state.deleted
    assert set(state.members) == {"m2"}
    assert state.group_epoch == 1  # a new group, not the old one continued
    assert group.fold(history) == state


def test_a_stream_in_use_is_not_deleted() -> None:
    state, _ = stream.execute(None, CreateStream("s", 4))
    with_group, _ = stream.execute(state, RegisterGroup("g"))
    with pytest.raises(NotEmpty, match="1 group"):
        stream.decide(with_group, DeleteStream(1))
    with_producer, _ = stream.execute(state, ProducerHeartbeat("p", 1, False, 0, 1_000))
    with pytest.raises(NotEmpty, match="1 live producer"):
        stream.decide(with_producer, DeleteStream(1))
    emptied, _ = stream.execute(with_group, UnregisterGroup("g"))
    deleted, _ = stream.execute(emptied, DeleteStream(2))
    assert deleted.deleted
    with pytest.raises(Deleted):
        stream.decide(deleted, RegisterGroup("g"))
    fresh, _ = stream.execute(deleted, CreateStream("s", 2, now_ms=3))
    assert (fresh.deleted, fresh.shard_count, fresh.groups) == (False, 2, {})


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")) as http:
        yield http


async def shard_keys(client: httpx.AsyncClient, prefix: str) -> list[str]:
    view = (await client.get(f"/v1/streams/{prefix}")).json()
    return [s["key"] for s in view["shards"]]


async def test_delete_a_group_then_its_stream(
    client: httpx.AsyncClient, prefix: str, sync_redis: redis.Redis
) -> None:
    group_path = f"/v1/admin/streams/{prefix}/groups/billing"
    r = await beat(client, hb(prefix, "a", 0))
    keys = await shard_keys(client, prefix)
    assert all(sync_redis.xinfo_groups(k)[0]["name"] == "billing" for k in keys)
    busy = await client.delete(group_path, auth=AUTH)
    assert (busy.status_code, busy.json()["error"]) == (409, "NOT_EMPTY")
    stream_busy = await client.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)
    assert (stream_busy.status_code, stream_busy.json()["error"]) == (409, "NOT_EMPTY")

    await beat(client, hb(prefix, "a", -1, ownedShards=r["assignment"]["assigned"]))
    etag = (await client.get(group_path, auth=AUTH)).headers["ETag"]
    assert (await client.delete(group_path, auth=AUTH, headers={"If-Match": '"999"'})).status_code == 412
    gone = await client.delete(group_path, auth=AUTH, headers={"If-Match": etag})
    assert gone.status_code == 204
    assert all(sync_redis.xinfo_groups(k) == [] for k in keys)  # consumer groups and PELs destroyed
    assert (await client.get(group_path, auth=AUTH)).status_code == 404
    assert (await client.get(f"/v1/streams/{prefix}")).json()["groups"] == []
    assert (await client.delete(group_path, auth=AUTH)).status_code == 404

    deleted = await client.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)
    assert deleted.status_code == 204
    assert sync_redis.exists(*keys) == 0
    assert (await client.get(f"/v1/streams/{prefix}")).status_code == 404
    assert prefix not in [s["streamPrefix"] for s in (await client.get("/v1/streams")).json()["streams"]]
    assert (await client.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 404

    records = (await client.get("/v1/admin/audit", params={"method": "DELETE"}, auth=AUTH)).json()
    mine = [(r["path"], r["status"]) for r in records["records"] if prefix in r["path"]]
    assert mine[:2] == [(f"/v1/admin/streams/{prefix}", 404), (f"/v1/admin/streams/{prefix}", 204)]


async def test_a_deleted_group_and_stream_come_back_afresh_on_use(
    client: httpx.AsyncClient, prefix: str, sync_redis: redis.Redis
) -> None:
    r = await beat(client, hb(prefix, "a", 0))
    await beat(client, hb(prefix, "a", -1, ownedShards=r["assignment"]["assigned"]))
    assert (await client.delete(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).status_code == 204
    assert (await client.delete(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 204
    again = await beat(client, hb(prefix, "b", 0))  # auto-creation: a new stream and group
    assert (again["status"], again["groupEpoch"], again["metadataVersion"]) == ("OK", 1, 1)
    assert again["assignment"]["assigned"] == [0, 1, 2, 3]
    keys = await shard_keys(client, prefix)
    assert all(sync_redis.xinfo_groups(k)[0]["name"] == "billing" for k in keys)
    assert (await client.get(f"/v1/streams/{prefix}")).json()["groups"] == ["billing"]
