"""Static members over real HTTP on a real coordinator (issue 28): the feature level gate, the
takeover as a client sees it, and who may take an id over when credentials are configured."""

from __future__ import annotations

import attrs
import httpx
import trio

from rsc.events.auth import credential
from tests import redis_servers
from tests.httpkit import FAST, hb, serve_on

ADMIN = ("admin", "s3cret")
#: A lease a test can wait out, heartbeats fast enough to keep members alive meanwhile.
TIMING = attrs.evolve(FAST, member_lease_ttl_ms=2_000, heartbeat_interval_ms=200, tick_interval_ms=50)


async def join(
    http: httpx.AsyncClient, prefix: str, member: str, incarnation: str, **extra: object
) -> httpx.Response:
    return await http.post(
        "/v1/heartbeat", json=hb(prefix, member, 0, incarnation=incarnation, static=True, **extra)
    )


async def test_static_needs_level_4_then_a_new_incarnation_takes_over(prefix: str) -> None:
    with redis_servers.standalone() as url:
        settings = attrs.evolve(TIMING, redis_url=url, admin_password=ADMIN[1], initial_feature_level=3)
        async with serve_on(settings) as http:
            await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=ADMIN)
            refused = await http.put(
                f"/v1/admin/streams/{prefix}/groups/billing", json={"staticHoldMs": 5_000}, auth=ADMIN
            )
            assert (refused.status_code, refused.json()["error"]) == (409, "FEATURE_LEVEL_REQUIRED")
            assert refused.json()["details"] == {"required": 4, "finalized": 3}
            # Level 3: `static` is ignored (not said back); a second incarnation is refused as ever.
            first = await join(http, prefix, "w1", "a")
            assert first.status_code == 200, first.text
            assert "static" not in first.json()
            second = await join(http, prefix, "w1", "b")
            assert (second.status_code, second.json()["error"]) == (409, "INCARNATION_MISMATCH")
            left = await http.post("/v1/heartbeat", json=hb(prefix, "w1", -1, incarnation="a"))
            assert left.status_code == 200, left.text
            raised = await http.put("/v1/admin/features", json={"level": 4}, auth=ADMIN)
            assert raised.status_code == 200, raised.text
            # Level 4: the member is static and a new process takes its id over at once.
            old = (await join(http, prefix, "w2", "a")).json()
            assert old["static"] is True
            assert old["assignment"]["assigned"] == [0, 1, 2, 3]
            taken = await join(http, prefix, "w2", "b")
            assert taken.status_code == 200, taken.text
            assert taken.json()["static"] is True
            assert taken.json()["status"] == "REVOKE_PENDING"
            assert taken.json()["assignment"]["pending"] == [0, 1, 2, 3]  # until the old lease ends
            stale = await http.post(
                "/v1/heartbeat",
                json=hb(prefix, "w2", old["memberEpoch"], incarnation="a", ownedShards=[0, 1, 2, 3]),
            )
            assert stale.json()["status"] == "FENCED"
            assert stale.json()["fenceReason"] == "REPLACED"
            view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
            assert view["quarantines"][0]["shards"] == [0, 1, 2, 3]
            assert [m["static"] for m in view["members"]] == [True]
            with trio.fail_after(10):
                while True:
                    answer = (
                        await http.post(
                            "/v1/heartbeat",
                            json=hb(prefix, "w2", taken.json()["memberEpoch"], incarnation="b", static=True),
                        )
                    ).json()
                    if answer["assignment"]["assigned"] == [0, 1, 2, 3]:
                        break
                    await trio.sleep(0.1)
            set_hold = await http.put(
                f"/v1/admin/streams/{prefix}/groups/billing", json={"staticHoldMs": 5_000}, auth=ADMIN
            )
            assert set_hold.status_code == 200, set_hold.text


async def test_only_a_member_credential_for_the_stream_takes_an_id_over(prefix: str) -> None:
    member = credential("worker", ["member"], token="worker-token-0123456789abcdef", streams=[prefix])
    other = credential("other", ["member"], token="other-token-0123456789abcdefgh", streams=["elsewhere"])
    monitor = credential("watch", ["monitor"], token="watch-token-0123456789abcdefgh")
    with redis_servers.standalone() as url:
        settings = attrs.evolve(
            TIMING, redis_url=url, admin_password=ADMIN[1], credentials=(member, other, monitor)
        )
        async with serve_on(settings) as http:
            await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=ADMIN)
            await http.put(f"/v1/admin/streams/{prefix}/groups/billing", json={}, auth=ADMIN)

            def bearer(token: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {token}"}

            body = hb(prefix, "w1", 0, incarnation="a", static=True)
            first = await http.post(
                "/v1/heartbeat", json=body, headers=bearer("worker-token-0123456789abcdef")
            )
            assert first.status_code == 200, first.text
            for token in ("other-token-0123456789abcdefgh", "watch-token-0123456789abcdefgh"):
                body = hb(prefix, "w1", 0, incarnation="b", static=True)
                refused = await http.post("/v1/heartbeat", json=body, headers=bearer(token))
                assert refused.status_code == 403, refused.text
            view = (await http.get(f"/v1/streams/{prefix}/groups/billing", auth=ADMIN)).json()
            assert [m["memberId"] for m in view["members"]] == ["w1"]
            body = hb(prefix, "w1", 0, incarnation="b", static=True)
            taken = await http.post(
                "/v1/heartbeat", json=body, headers=bearer("worker-token-0123456789abcdef")
            )
            assert taken.status_code == 200, taken.text
            assert taken.json()["static"] is True
