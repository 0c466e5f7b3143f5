"""Rate limits (issue 27): token buckets per member id / producer id and per caller.

The buckets are pure (time is an input); over a real server, one member id sending faster
than its limit gets 429 `RATE_LIMITED` with `Retry-After` while another member id is not
touched, a leave always goes through, and the wait it is told is enough; views and Admin API
writes have their per-caller limits; a batch answers a limited item in its place."""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import httpx
import pytest
import trio

from rsc.events.rates import TokenBuckets, retry_after_header
from tests.httpkit import FAST, hb, serve_on

ADMIN = ("admin", "s3cret")


def test_a_bucket_allows_its_burst_then_refuses_until_it_refills() -> None:
    buckets = TokenBuckets(rate=2.0, burst=3)
    assert [buckets.take("m", 0.0) for _ in range(3)] == [None, None, None]
    wait = buckets.take("m", 0.0)
    assert wait == pytest.approx(0.5)  # one token at 2 a second
    assert buckets.take("other", 0.0) is None  # each key its own bucket
    assert buckets.take("m", 0.49) is not None
    assert buckets.take("m", 0.5) is None
    assert retry_after_header(0.01) == "1"
    assert retry_after_header(2.2) == "3"


def test_a_cost_above_the_burst_goes_through_from_a_full_bucket() -> None:
    buckets = TokenBuckets(rate=1.0, burst=5)
    assert buckets.take("batch", 0.0, cost=50) is None  # never refused for ever
    assert buckets.take("batch", 1.0) is not None  # it is in debt now


def test_the_table_is_bounded_and_forgetting_never_refuses() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1, max_keys=3)
    for key in ("a", "b", "c", "d"):
        assert buckets.take(key, 0.0) is None
    assert len(buckets._buckets) == 3
    assert buckets.take("a", 0.0) is None  # forgotten, so full again


def limited(response: httpx.Response, kind: str) -> float:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["error"] == "RATE_LIMITED"
    assert body["details"]["limit"] == kind
    assert int(response.headers["Retry-After"]) >= 1
    wait: float = body["details"]["retryAfterS"]
    return wait


def settings_for(redis_url: str, **extra: Any) -> Any:
    return attrs.evolve(
        FAST,
        redis_url=redis_url,
        admin_password=ADMIN[1],
        key_prefix=f"r{uuid.uuid4().hex[:8]}:",
        **{"heartbeat_interval_ms": 1_000, **extra},
    )


async def test_one_member_id_past_its_limit_waits_and_nobody_else_does(standalone_url: str) -> None:
    # One token a second (10 per 10 s interval): the 8 heartbeats below would have to take
    # seconds for a refill to let the last one through, however loaded the machine is.
    config = settings_for(
        standalone_url,
        heartbeat_interval_ms=10_000,
        rate_limit_party_per_interval=10,
        rate_limit_party_burst=5,
    )
    async with serve_on(config) as http:
        joined = (await http.post("/v1/heartbeat", json=hb("s", "a", 0))).json()
        epoch = joined["memberEpoch"]
        answers = [await http.post("/v1/heartbeat", json=hb("s", "a", epoch)) for _ in range(8)]
        assert [r.status_code for r in answers[:4]] == [200] * 4  # the burst (the join took one)
        wait = limited(answers[-1], "party")
        assert 0 < wait <= 1.0  # a tenth of the interval at most: well within the lease
        other = await http.post("/v1/heartbeat", json=hb("s", "b", 0))
        assert other.status_code == 200, other.text
        batch = {"heartbeats": [hb("s", "a", epoch), hb("s", "b", other.json()["memberEpoch"])]}
        items = (await http.post("/v1/heartbeats", json=batch)).json()["responses"]
        assert items[0]["error"] == "RATE_LIMITED"
        assert items[0]["status"] == 429
        assert "error" not in items[1], items[1]
        await trio.sleep(wait + 0.01)
        again = await http.post("/v1/heartbeat", json=hb("s", "a", epoch))
        assert again.status_code == 200, again.text
        for _ in range(8):  # drained again; a leave still goes through
            await http.post("/v1/heartbeat", json=hb("s", "a", epoch))
        # Another caller sending under a's member id (not its incarnation) spends its own tokens.
        for _ in range(8):
            await http.post("/v1/heartbeat", json=hb("s", "b", 1, incarnation="not-b"))
        fine = await http.post("/v1/heartbeat", json=hb("s", "b", other.json()["memberEpoch"]))
        assert fine.status_code == 200, fine.text
        leave = await http.post("/v1/heartbeat", json=hb("s", "a", -1))
        assert leave.status_code == 200, leave.text
        assert 'rsc_rate_limited_total{kind="party"}' in (await http.get("/metrics")).text


async def test_protocol_work_is_never_limited_and_echoes_and_join_loops_are(standalone_url: str) -> None:
    """Issue 51: acknowledging revokes and joining are not charged to a member's own limit.
    A member acknowledging more revokes than its burst goes through; echoing the same
    `revokedShards` is limited; a member id crash-looping through joins under new
    incarnations meets its member id's join limit, and another member id does not."""
    config = settings_for(
        standalone_url,
        heartbeat_interval_ms=10_000,
        rate_limit_party_per_interval=10,
        rate_limit_party_burst=20,  # and so 2 joins per member id, one each 10 intervals
        default_shard_count=32,
    )
    async with serve_on(config) as http:
        joined = (await http.post("/v1/heartbeat", json=hb("p", "a", 0))).json()
        epoch, owned = joined["memberEpoch"], joined["assignment"]["assigned"]
        assert len(owned) == 32
        pause = await http.post("/v1/admin/streams/p/groups/billing/pause", json={}, auth=ADMIN)
        assert pause.status_code == 200, pause.text
        told = (await http.post("/v1/heartbeat", json=hb("p", "a", epoch, ownedShards=owned))).json()
        assert sorted(told["assignment"]["revoke"]) == sorted(owned)
        # One acknowledgement per shard, more than the burst: each is news, none is limited.
        left = list(owned)
        for shard in owned:
            left.remove(shard)
            body = hb("p", "a", told["memberEpoch"], ownedShards=left, revokedShards=[shard])
            answer = await http.post("/v1/heartbeat", json=body)
            assert answer.status_code == 200, answer.text
        echo = hb("p", "a", told["memberEpoch"], ownedShards=[], revokedShards=[owned[-1]])
        echoes = [await http.post("/v1/heartbeat", json=echo) for _ in range(22)]
        limited(echoes[-1], "party")
        # Crash-looping through joins under new incarnations: the member id's join limit.
        joins = [
            await http.post("/v1/heartbeat", json=hb("p", "c", 0, incarnation=f"boot-{n}")) for n in range(3)
        ]
        assert joins[0].status_code == 200, joins[0].text
        limited(joins[-1], "joins")
        # A rejoin of a known incarnation (told to, after a fence) is charged to its own limit.
        rejoin = await http.post("/v1/heartbeat", json=hb("p", "c", 0, incarnation="boot-0"))
        assert rejoin.status_code == 200, rejoin.text
        other = await http.post("/v1/heartbeat", json=hb("p", "d", 0))
        assert other.status_code == 200, other.text
        assert 'rsc_rate_limited_total{kind="joins"} 1.0' in (await http.get("/metrics")).text


async def test_views_and_admin_writes_have_per_caller_limits(standalone_url: str) -> None:
    # A token a second each: a refill in the middle of a few requests needs seconds of them.
    config = settings_for(standalone_url, rate_limit_views_per_s=1, rate_limit_admin_writes_per_s=1)
    async with serve_on(config) as http:
        views = [await http.get("/v1/streams") for _ in range(4)]
        assert [r.status_code for r in views[:2]] == [200] * 2  # a burst of twice the rate
        limited(views[-1], "views")
        writes = [
            await http.put(f"/v1/admin/streams/w{n}", json={"shardCount": 1}, auth=ADMIN) for n in range(3)
        ]
        assert [r.status_code for r in writes[:2]] == [200, 200]
        limited(writes[2], "admin-writes")
        assert (await http.get("/v1/admin/streams/w0", auth=ADMIN)).status_code == 200  # reads are not writes
        assert (await http.get("/healthz")).status_code == 200  # nor is the process's health


def test_a_rate_or_a_party_burst_of_0_switches_a_limit_off() -> None:
    from rsc.http.ratelimit import PARTY, VIEWS, RateLimits

    rates = RateLimits(
        1_000, party_per_interval=10, party_burst=0, heartbeats_per_s=1, views_per_s=0, admin_writes_per_s=1
    )
    assert rates.buckets[PARTY] is None
    assert rates.buckets[VIEWS] is None
    assert all(rates.wait(PARTY, "m") is None for _ in range(1_000))
