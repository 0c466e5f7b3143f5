"""An operator's group operations end to end: `rsc serve`'s app on a socket, worker Apps and a
trio producer against real Redis.

* Pause under load: the members keep heartbeating and hand every shard back; nothing is
  delivered while paused (the view and `/metrics` say so); resume: everything published
  meanwhile is handled, nothing lost.
* Below feature level 7 a pause is refused (409 `FEATURE_LEVEL_REQUIRED`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.producer import open_producer
from rsc.client.worker import App
from tests import redis_servers
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    # A namespace of its own: these tests need the newest feature level, and the session's
    # Redis is shared with tests that hold theirs lower.
    namespace = f"t{uuid.uuid4().hex[:8]}:"
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw", key_prefix=namespace)
    async with serve_on(settings) as client:
        yield client


def worker(base_url: str, redis_url: str, prefix: str, handled: list[str]) -> App:
    app = App(base_url, redis_url, member_settings=MemberSettings(heartbeat_interval_ms=100))

    @app.listener(
        stream=prefix, group="billing", concurrency=2, name="billing", poller=PollerSettings(batch=50)
    )
    async def handle(message: Message) -> None:
        handled.append(message.fields["id"])

    return app


async def wait_until(check: Any, timeout_s: float = 20) -> None:
    with trio.fail_after(timeout_s):
        while not await check():
            await trio.sleep(0.05)


async def test_a_paused_group_receives_nothing_then_resumes_losing_nothing(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    base = str(http.base_url)
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)).is_success
    assert (await http.put(group, json={"startFrom": "earliest"}, auth=AUTH)).is_success
    handled: list[str] = []
    published: list[str] = []
    async with (
        Coordinator(base) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
        open_producer(coordinator, r, prefix, "api") as producer,
    ):
        apps = [worker(base, standalone_url, prefix, handled) for _ in range(2)]
        for app in apps:
            await nursery.start(app.run)

        async def publish(count: int) -> None:
            for _ in range(count):
                n = f"m{len(published)}"
                await producer.publish({"id": n}, n)
                published.append(n)

        await publish(200)
        await wait_until(lambda: _async(set(published) <= set(handled)))
        paused = await http.post(f"{group}/pause", json={"reason": "downstream down"}, auth=AUTH)
        assert paused.status_code == 200, paused.text
        status = paused.json()["status"]
        assert (status["paused"], status["pausedReason"]) == (True, "downstream down")

        async def nothing_held() -> bool:
            view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
            return not view["currentAssignment"] and len(view["members"]) == 2

        await wait_until(nothing_held, timeout_s=5)  # handed back within a few heartbeats
        before = len(handled)
        with trio.move_on_after(3):  # publishing under load: nothing is delivered
            while True:
                await publish(20)
                await trio.sleep(0.05)
        await trio.sleep(0.5)
        assert len(handled) == before
        view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
        assert view["paused"] is True
        assert len(view["members"]) == 2  # they keep their membership
        metrics = (await http.get("/metrics")).text
        assert f'rsc_group_paused{{group="billing",stream="{prefix}"}} 1.0' in metrics
        again = await http.post(f"{group}/pause", json={"reason": "other"}, auth=AUTH)
        assert again.json()["status"]["pausedReason"] == "downstream down"  # idempotent
        resumed = await http.post(f"{group}/resume", auth=AUTH)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["status"]["paused"] is False
        await wait_until(lambda: _async(set(published) <= set(handled)))
        for app in apps:
            app.stop()
    audit = (await http.get("/v1/admin/audit", params={"pathPrefix": group}, auth=AUTH)).json()
    actions = [(e["method"], e["path"]) for e in audit["records"]]
    assert ("POST", f"{group}/pause") in actions
    assert ("POST", f"{group}/resume") in actions


async def test_a_pause_below_feature_level_7_is_refused() -> None:
    with redis_servers.standalone() as url:
        async with serve_on(
            attrs.evolve(FAST, redis_url=url, admin_password="pw", initial_feature_level=6)
        ) as http:
            assert (await http.put("/v1/admin/streams/s", json={"shardCount": 1}, auth=AUTH)).is_success
            assert (await http.put("/v1/admin/streams/s/groups/g", json={}, auth=AUTH)).is_success
            refused = await http.post("/v1/admin/streams/s/groups/g/pause", auth=AUTH)
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"] == "FEATURE_LEVEL_REQUIRED"
            missing = await http.post("/v1/admin/streams/s/groups/nope/pause", auth=AUTH)
            assert missing.status_code == 404


async def _async(value: bool) -> bool:
    return value


async def publish_many(producer: Any, ids: list[str]) -> None:
    for start in range(0, len(ids), 100):
        await producer.publish_many([({"id": i}, i) for i in ids[start : start + 100]])


async def test_a_reset_to_a_time_plans_exactly_refuses_members_then_redelivers_exactly(
    http: httpx.AsyncClient, standalone_url: str, prefix: str, sync_redis: Any
) -> None:
    """A dry run counts per shard exactly what a test computes and changes nothing; executed
    under a running worker without `force`: 409 naming the members; with `force`: exactly the
    entries at or after the time are handled again, never two handlers on one shard at once."""
    base = str(http.base_url)
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)).is_success
    assert (await http.put(group, json={"startFrom": "earliest"}, auth=AUTH)).is_success
    keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}")).json()["shards"]]
    handled: list[tuple[str, int]] = []
    overlaps: list[int] = []
    app = exclusive_worker(base, standalone_url, prefix, handled, overlaps)
    first = [f"a{n}" for n in range(1_000)]
    second = [f"b{n}" for n in range(1_000)]
    async with (
        Coordinator(base) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
        open_producer(coordinator, r, prefix, "api") as producer,
    ):
        await nursery.start(app.run)
        await publish_many(producer, first)
        await trio.sleep(0.05)
        t = int(time.time() * 1000)
        await trio.sleep(0.01)
        await publish_many(producer, second)
        await wait_until(lambda: _async({i for i, _ in handled} >= set(first + second)))
        at_or_after = {k: sum(1 for e, _ in sync_redis.xrange(k) if int(e.split("-")[0]) >= t) for k in keys}
        assert sum(at_or_after.values()) == len(second), (
            t,
            [sync_redis.xrange(k, count=1) for k in keys],
            [sync_redis.xrevrange(k, count=1) for k in keys],
        )
        before = {k: sync_redis.xinfo_groups(k)[0]["last-delivered-id"] for k in keys}
        plan = await http.post(f"{group}/reset", json={"to": {"timeMs": t}}, auth=AUTH)
        assert plan.status_code == 200, plan.text
        shards = plan.json()["shards"]
        assert {s["key"]: s["redelivered"] for s in shards} == at_or_after
        assert all(s["exact"] and s["reachable"] and s["skipped"] == 0 for s in shards)
        assert plan.json()["dryRun"] is True
        assert plan.json()["executed"] is False
        assert {
            k: sync_redis.xinfo_groups(k)[0]["last-delivered-id"] for k in keys
        } == before  # nothing changed
        refused = await http.post(f"{group}/reset", json={"to": {"timeMs": t}, "dryRun": False}, auth=AUTH)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "NOT_EMPTY"
        assert "live member" in refused.json()["message"]
        count = len(handled)
        forced = await http.post(
            f"{group}/reset", json={"to": {"timeMs": t}, "dryRun": False, "force": True}, auth=AUTH
        )
        assert forced.status_code == 200, forced.text
        assert forced.json()["executed"] is True
        assert (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()["paused"] is False
        await wait_until(lambda: _async(len(handled) >= count + len(second)))
        await trio.sleep(1)  # nothing more comes
        again = [i for i, _ in handled[count:]]
        assert sorted(again) == sorted(second)  # exactly those at or after the time, once each
        assert not overlaps
        app.stop()
    audit = (await http.get("/v1/admin/audit", params={"pathPrefix": f"{group}/reset"}, auth=AUTH)).json()
    assert [r["status"] for r in audit["records"]] == [200, 409, 200]  # newest first


async def test_a_reset_to_latest_skips_the_backlog(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    """With no member running: a reset to latest needs no force, and nothing published before it
    is handled after it."""
    base = str(http.base_url)
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)).is_success
    assert (await http.put(group, json={"startFrom": "earliest"}, auth=AUTH)).is_success
    handled: list[str] = []
    backlog = [f"old{n}" for n in range(500)]
    fresh = [f"new{n}" for n in range(100)]
    async with (
        Coordinator(base) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
        open_producer(coordinator, r, prefix, "api") as producer,
    ):
        await publish_many(producer, backlog)
        unknown = await http.post(f"{group}/reset", json={"to": {"ids": {"99": "1-0"}}}, auth=AUTH)
        assert unknown.status_code == 400, unknown.text  # a shard the stream does not have
        done = await http.post(f"{group}/reset", json={"to": "latest", "dryRun": False}, auth=AUTH)
        assert done.status_code == 200, done.text
        assert sum(s["skipped"] for s in done.json()["shards"]) == len(backlog)
        app = worker(base, standalone_url, prefix, handled)
        await nursery.start(app.run)
        await publish_many(producer, fresh)
        await wait_until(lambda: _async(set(fresh) <= set(handled)))
        await trio.sleep(0.5)
        assert not set(handled) & set(backlog)
        app.stop()


def exclusive_worker(
    base_url: str, redis_url: str, prefix: str, handled: list[tuple[str, int]], overlaps: list[int]
) -> App:
    """A worker that notes each message with its shard, and any two handlers at once on one shard."""
    app = App(base_url, redis_url, member_settings=MemberSettings(heartbeat_interval_ms=100))
    running: dict[int, int] = {}
    poller = PollerSettings(batch=50)

    @app.listener(stream=prefix, group="billing", concurrency=4, name="billing", poller=poller)
    async def handle(message: Message) -> None:
        running[message.shard] = running.get(message.shard, 0) + 1
        if running[message.shard] > 1:
            overlaps.append(message.shard)
        await trio.sleep(0)
        handled.append((message.fields["id"], message.shard))
        running[message.shard] -= 1

    return app


async def test_a_replay_group_starts_at_a_time_without_touching_the_production_group(
    http: httpx.AsyncClient, standalone_url: str, prefix: str
) -> None:
    """`startAt: {"timeMs": T}`: a new group handles exactly what was published at or after T;
    startAt cannot change once the group exists, and bad ids are refused."""
    base = str(http.base_url)
    stream = f"/v1/admin/streams/{prefix}"
    assert (await http.put(stream, json={"shardCount": 4}, auth=AUTH)).is_success
    assert (await http.put(f"{stream}/groups/billing", json={}, auth=AUTH)).is_success
    older = [f"a{n}" for n in range(300)]
    newer = [f"b{n}" for n in range(300)]
    async with (
        Coordinator(base) as coordinator,
        open_redis(standalone_url) as r,
        trio.open_nursery() as nursery,
        open_producer(coordinator, r, prefix, "api") as producer,
    ):
        await publish_many(producer, older)
        await trio.sleep(0.05)
        t = int(time.time() * 1000)
        await trio.sleep(0.01)
        await publish_many(producer, newer)
        bad = await http.put(f"{stream}/groups/replay", json={"startAt": {"ids": {"x": "1-0"}}}, auth=AUTH)
        assert bad.status_code == 400, bad.text
        made = await http.put(f"{stream}/groups/replay", json={"startAt": {"timeMs": t}}, auth=AUTH)
        assert made.status_code == 200, made.text
        assert made.json()["spec"]["startAt"] == {"timeMs": t}
        moved = await http.patch(f"{stream}/groups/replay", json={"startAt": {"timeMs": 0}}, auth=AUTH)
        assert moved.status_code == 409
        assert moved.json()["error"] == "IMMUTABLE_FIELD"
        handled: list[tuple[str, int]] = []
        app = App(base, standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100))

        @app.listener(
            stream=prefix, group="replay", concurrency=2, name="replay", poller=PollerSettings(batch=50)
        )
        async def handle(message: Message) -> None:
            handled.append((message.fields["id"], message.shard))

        await nursery.start(app.run)
        await wait_until(lambda: _async(len(handled) >= len(newer)))
        await trio.sleep(0.5)
        assert sorted(i for i, _ in handled) == sorted(newer)
        app.stop()
    billing = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert billing["members"] == []  # the production group was never touched
