"""An operator's group operations end to end: `rsc serve`'s app on a socket, worker Apps and a
trio producer against real Redis.

* Pause under load: the members keep heartbeating and hand every shard back; nothing is
  delivered while paused (the view and `/metrics` say so); resume: everything published
  meanwhile is handled, nothing lost.
* Below feature level 7 a pause is refused (409 `FEATURE_LEVEL_REQUIRED`).
"""

from __future__ import annotations

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
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as client:
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
