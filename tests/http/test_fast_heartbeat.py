"""`POST /v1/heartbeat` and `/v1/heartbeats` below Quart (`rsc.http.heartbeats.fast_path`) answer
exactly as the Quart routes do: every request is sent twice over a real socket, once on the
fast path and once with the fast path stepped aside (its paths pointed elsewhere, so Quart's
routes answer), and the two answers must agree: status, headers, error codes and words, the
answer's body.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import trio

from rsc.coordinator_process import serve
from rsc.events.auth import credential
from rsc.http.heartbeats import fast_path as fast_heartbeat
from tests import redis_servers
from tests.httpkit import FAST, hb, serve_on, workers_and_others

TOKEN = "fast-member-token-0123456789"
OTHER = "fast-other-token-0123456789"
#: Headers whose values say nothing of the answer (hypercorn's own, or per request).
_VARYING = {"date", "server", "x-request-id", "connection"}


@contextlib.contextmanager
def through_quart() -> Iterator[None]:
    """Requests in this block go to Quart's routes (the fast path matches other paths)."""
    saved = fast_heartbeat.PATH, fast_heartbeat.BATCH_PATH
    fast_heartbeat.PATH = fast_heartbeat.BATCH_PATH = "/not-a-heartbeat-path"
    try:
        yield
    finally:
        fast_heartbeat.PATH, fast_heartbeat.BATCH_PATH = saved


def shape(response: httpx.Response, *names: str) -> dict[str, Any]:
    """What an answer says: status, header names and values (but the varying ones), and its body
    with the request id checked against `X-Request-Id` and then left out; `names`: the stream
    prefixes written in place of each other."""
    text = response.text
    for index, name in enumerate(names):
        text = text.replace(name, f"<stream {index}>")
    body = json.loads(text)
    if isinstance(body, dict) and "requestId" in body:
        assert body.pop("requestId") == response.headers["x-request-id"]
    headers = {k: v for k, v in response.headers.items() if k not in _VARYING}
    return {"status": response.status_code, "headers": headers, "body": body}


async def both(
    http: httpx.AsyncClient,
    fast_body: Any,
    quart_body: Any = None,
    *,
    names: tuple[str, ...] = (),
    path: str = "/v1/heartbeat",
    **kw: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same request on each path (`quart_body` if it must differ, as a new member would)."""
    fast = await http.post(path, **_body(fast_body), **kw)
    with through_quart():
        quart = await http.post(path, **_body(fast_body if quart_body is None else quart_body), **kw)
    return shape(fast, *names), shape(quart, *reversed(names)) if names else shape(quart)


def _body(value: Any) -> dict[str, Any]:
    streamed = isinstance(value, bytes | str) or hasattr(value, "__aiter__")
    return {"content": value} if streamed else {"json": value}


async def test_answers_agree_on_every_kind_of_request(standalone_url: str, prefix: str) -> None:
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        credentials=workers_and_others(prefix, TOKEN, OTHER),
        max_body_bytes=4096,
        quota_members_per_group=2,
        max_batch_items=4,
        rate_limit_party_per_interval=0,
    )
    member = {"Authorization": f"Bearer {TOKEN}"}
    a, b = f"{prefix}a", f"{prefix}b"
    async with serve_on(settings) as http:
        # joins of a new stream (each path its own): the same answer but for the stream's name
        fast, quart = await both(http, hb(a, "m1", 0), hb(b, "m1", 0), names=(a, b), headers=member)
        assert fast["status"] == 200
        assert fast["body"]["memberEpoch"] == 1
        assert fast == quart
        # a steady member, protocol 2 (the answer names its version and the feature level)
        steady = hb(a, "m1", 1, protocolVersion=2)
        fast, quart = await both(
            http, steady, hb(b, "m1", 1, protocolVersion=2), names=(a, b), headers=member
        )
        assert fast["body"]["protocolVersion"] == 2
        assert fast == quart
        cases: list[tuple[str, Any, dict[str, str], int]] = [
            ("malformed JSON", b'{"protocolVersion": 1,', member, 400),
            ("not an object", b"[1, 2]", member, 400),
            ("too deep", b"[" * 40 + b"]" * 40, member, 400),
            ("lone surrogate", b'{"streamPrefix": "\\ud800"}', member, 400),
            ("schema", {"protocolVersion": 1, "streamPrefix": 7}, member, 400),
            ("unsupported version", hb(a, "m9", 0, protocolVersion=0), member, 400),
            ("bad id", hb(a, "", 0), member, 400),
            ("fenced epoch", hb(a, "m1", 7), member, 200),
            ("no credential", hb(a, "m1", 1), {}, 401),
            ("bad credential", hb(a, "m1", 1), {"Authorization": "Bearer nope"}, 401),
            ("basic without admin", hb(a, "m1", 1), {"Authorization": "Basic YWRtaW46eA=="}, 403),
            ("other stream", hb(a, "m1", 1), {"Authorization": f"Bearer {OTHER}"}, 403),
            ("too large", b"{" + b" " * 5000 + b"}", member, 413),
            ("request id kept", hb(a, "m1", 1), {**member, "X-Request-Id": "req-77"}, 200),
        ]
        for name, body, headers, status in cases:
            fast, quart = await both(http, body, headers=headers)
            assert fast == quart, name
            assert fast["status"] == status, (name, fast)
        kept = await http.post(
            "/v1/heartbeat", json=hb(a, "m1", 1), headers={**member, "X-Request-Id": "req-77"}
        )
        assert kept.headers["x-request-id"] == "req-77"
        made = await http.post(
            "/v1/heartbeat", json=hb(a, "m1", 1), headers={**member, "X-Request-Id": "bad id!"}
        )
        assert made.headers["x-request-id"] != "bad id!"
        assert made.json()["memberEpoch"] == 1
        # the group's member quota (2): a third member is refused 429 QUOTA_EXCEEDED on either path
        await http.post("/v1/heartbeat", json=hb(a, "m2", 0), headers=member)
        fast, quart = await both(http, hb(a, "m3", 0), headers=member)
        assert (fast["status"], fast["body"]["error"]) == (429, "QUOTA_EXCEEDED")
        assert fast == quart
        # a body sent in chunks, without Content-Length, over the limit: 413 as it arrives
        big = b"{" + b" " * 5000 + b"}"
        fast, quart = await both(http, _chunks(big), _chunks(big), headers=member)
        assert (fast["status"], fast["body"]["error"]) == (413, "BODY_TOO_LARGE")
        assert fast == quart
        # batches: each item answered or refused in its place, alike on both paths
        items = [hb(a, "m1", 7), hb(a, "", 0), hb("elsewhere-x", "m1", 0), {"protocolVersion": "1"}]
        fast, quart = await both(http, {"heartbeats": items}, path="/v1/heartbeats", headers=member)
        assert fast["status"] == 200
        assert [r.get("error") for r in fast["body"]["responses"]] == [
            None,  # answered (FENCED: a stale epoch, which changes nothing)
            "INVALID_REQUEST",
            "FORBIDDEN",
            "INVALID_REQUEST",
        ]
        for answer in (fast, quart):  # each item names its request's id
            for item in answer["body"]["responses"]:
                item.pop("requestId", None)
        assert fast == quart
        for name, body, status in [
            ("too many items", {"heartbeats": [hb(a, "m1", 1)] * 5}, 413),
            ("not a batch", {"heartbeat": []}, 400),
            ("malformed", b"{", 400),
        ]:
            fast, quart = await both(http, body, path="/v1/heartbeats", headers=member)
            assert fast == quart, name
            assert fast["status"] == status, (name, fast)
        fast, quart = await both(http, {"heartbeats": []}, path="/v1/heartbeats", headers={})
        assert fast == quart
        assert fast["status"] == 401
        # other methods still reach Quart's routing: 405 with Allow
        refused = await http.get("/v1/heartbeat", headers=member)
        assert (refused.status_code, refused.headers["allow"]) == (405, "OPTIONS, POST")


async def _chunks(data: bytes) -> Any:
    for start in range(0, len(data), 1000):
        yield data[start : start + 1000]


async def test_rate_limits_answer_alike(standalone_url: str, prefix: str) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, rate_limit_heartbeats_per_s=1)
    async with serve_on(settings) as http:
        seen: dict[str, dict[str, Any]] = {}
        for path in ("fast", "quart"):
            with through_quart() if path == "quart" else contextlib.nullcontext():
                for _ in range(10):
                    answer = await http.post("/v1/heartbeat", json=hb(prefix, f"m-{path}", 0))
                    if answer.status_code == 429:
                        break
                await trio.sleep(0)
            assert answer.status_code == 429, answer.text
            body = answer.json()
            assert float(answer.headers["retry-after"]) >= 1
            seen[path] = {
                "error": body["error"],
                "details": sorted(body["details"]),
                "limit": body["details"]["limit"],
            }
        assert (
            seen["fast"]
            == seen["quart"]
            == {
                "error": "RATE_LIMITED",
                "details": ["limit", "retryAfterS"],
                "limit": "heartbeats",
            }
        )


async def test_a_standby_answers_503_on_the_fast_path(prefix: str) -> None:
    member = credential("workers", ["member"], token=TOKEN, streams=[f"{prefix}*"], create=True)
    with redis_servers.standalone() as url:
        settings = attrs.evolve(FAST, redis_url=url, credentials=(member,))
        async with serve_on(settings) as active:
            shutdown = trio.Event()
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(
                    lambda task_status: serve(
                        settings, "127.0.0.1:0", shutdown=shutdown, task_status=task_status
                    )
                )
                async with httpx.AsyncClient(base_url=urls[0], timeout=10) as standby:
                    good = {"Authorization": f"Bearer {TOKEN}"}
                    fast, quart = await both(standby, hb(prefix, "m1", 0), headers=good)
                    # a bad credential on a standby: 503 STANDBY all the same, and counted as
                    # a refused credential on either path (authorization runs first, as ever)
                    before = await _refused(standby)
                    bad = await both(standby, hb(prefix, "m1", 0), headers={"Authorization": "Bearer bad"})
                    counted = await _refused(standby) - before
                shutdown.set()
            assert (fast["status"], fast["body"]["error"]) == (503, "STANDBY")
            assert fast["headers"]["retry-after"] == "1"
            assert fast == quart
            assert bad[0] == bad[1] == fast
            assert counted == 2
            answer = await active.post("/v1/heartbeat", json=hb(prefix, "m1", 0), headers=good)
            assert answer.status_code == 200


async def _refused(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    found = re.search(
        r'^rsc_auth_refusals_total\{action="[^"]*",reason="bad-credential"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0
