"""Long-poll heartbeats (`waitMs`) over a real socket: held while shards are pending, answered
on their release, never held otherwise; single and batched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.httpkit import FAST, beat, hb, serve_on

#: A long interval, so that an answer before it can only come from a release.
SLOW = attrs.evolve(FAST, heartbeat_interval_ms=5_000, member_lease_ttl_ms=20_000)


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(SLOW, redis_url=standalone_url)) as http:
        yield http


async def handoff_start(client: httpx.AsyncClient, prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """a holds every shard; b joins and waits for the ones a must revoke first."""
    a = await beat(client, hb(prefix, "a", 0))
    b = await beat(client, hb(prefix, "b", 0))
    assert b["status"] == "REVOKE_PENDING"
    assert b["assignment"]["pending"]
    a = await beat(client, hb(prefix, "a", a["memberEpoch"], ownedShards=[0, 1, 2, 3]))
    assert a["assignment"]["revoke"] == b["assignment"]["pending"]
    return a, b


async def ack(client: httpx.AsyncClient, prefix: str, a: dict[str, Any]) -> dict[str, Any]:
    moving = a["assignment"]["revoke"]
    keep = [s for s in [0, 1, 2, 3] if s not in moving]
    return await beat(client, hb(prefix, "a", a["memberEpoch"], ownedShards=keep, revokedShards=moving))


async def test_a_held_heartbeat_is_answered_when_its_shards_are_released(
    client: httpx.AsyncClient, prefix: str
) -> None:
    a, b = await handoff_start(client, prefix)
    answers: list[dict[str, Any]] = []

    async def wait_for_shards() -> None:
        answers.append(await beat(client, hb(prefix, "b", b["memberEpoch"], waitMs=5_000)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_shards)
        await trio.sleep(0.5)
        assert answers == []  # held: nothing was released yet
        with trio.fail_after(3):  # well before the 5 s interval
            await ack(client, prefix, a)
            while not answers:
                await trio.sleep(0.01)
    assert answers[0]["status"] == "OK"
    assert answers[0]["assignment"]["assigned"] == a["assignment"]["revoke"]
    view = (await client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert {m["memberId"]: m["state"] for m in view["members"]} == {"a": "STABLE", "b": "STABLE"}


async def test_a_heartbeat_with_nothing_pending_is_never_held(client: httpx.AsyncClient, prefix: str) -> None:
    with trio.fail_after(2):
        r = await beat(client, hb(prefix, "a", 0, waitMs=60_000))
        r = await beat(client, hb(prefix, "a", r["memberEpoch"], ownedShards=[0, 1, 2, 3], waitMs=60_000))
    assert r["status"] == "OK"


async def test_a_held_heartbeat_ends_at_its_wait(client: httpx.AsyncClient, prefix: str) -> None:
    _, b = await handoff_start(client, prefix)
    start = trio.current_time()
    with trio.fail_after(3):
        r = await beat(client, hb(prefix, "b", b["memberEpoch"], waitMs=300))
    assert trio.current_time() - start >= 0.3
    assert r["status"] == "REVOKE_PENDING"  # still pending: a has not acknowledged
    assert r["assignment"]["pending"] == b["assignment"]["pending"]


async def test_a_batch_with_a_held_item_is_answered_on_the_release(
    client: httpx.AsyncClient, prefix: str
) -> None:
    a, b = await handoff_start(client, prefix)
    answers: list[Any] = []

    async def batch() -> None:
        other = hb(f"{prefix}-other", "c", 0)  # another group: nothing b waits for
        body = {"heartbeats": [hb(prefix, "b", b["memberEpoch"], waitMs=5_000), other]}
        response = await client.post("/v1/heartbeats", json=body)
        assert response.status_code == 200, response.text
        answers.append(response.json()["responses"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch)
        await trio.sleep(0.5)
        assert answers == []
        with trio.fail_after(3):
            await ack(client, prefix, a)
            while not answers:
                await trio.sleep(0.01)
    held, other = answers[0]
    assert held["assignment"]["assigned"] == a["assignment"]["revoke"]
    assert other["memberEpoch"] > 0  # answered in the same response


@pytest.mark.parametrize("wait", [-1, 60_001, "soon", None])
async def test_a_bad_wait_is_a_400(client: httpx.AsyncClient, prefix: str, wait: object) -> None:
    response = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0, waitMs=wait))
    assert response.status_code == 400
    assert response.json()["error"] == "INVALID_REQUEST"


async def test_a_long_poll_is_given_up_when_its_client_goes_away(standalone_url: str, prefix: str) -> None:
    # at most two answers held at once (half of max_connections)
    settings = attrs.evolve(SLOW, redis_url=standalone_url, max_connections=4)
    async with serve_on(settings) as client:
        _, b = await handoff_start(client, prefix)
        body = hb(prefix, "b", b["memberEpoch"], waitMs=5_000)
        for _ in range(2):  # two long polls whose clients go away while they are held
            async with httpx.AsyncClient(base_url=str(client.base_url), timeout=10) as gone:
                with trio.move_on_after(0.3):
                    await gone.post("/v1/heartbeat", json=body)
        # Their holds were given up as their clients left: a third long poll is held again
        # (answered at its wait), where two holds still counted would answer it at once.
        start = trio.current_time()
        with trio.fail_after(4):
            answer = await beat(client, hb(prefix, "b", b["memberEpoch"], waitMs=1_000))
        assert trio.current_time() - start >= 1.0
        assert answer["status"] == "REVOKE_PENDING"
