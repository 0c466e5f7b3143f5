"""Lists in pages over a real socket: `limit` and `cursor`, `nextCursor` and `Link`, the whole
list without `limit`, stable cursors while streams come and go, and bad cursors refused."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from rsc.events.wire import dead_letter_key
from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "s3cret")


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")) as http:
        yield http


async def create(client: httpx.AsyncClient, name: str) -> None:
    answer = await client.put(f"/v1/admin/streams/{name}", json={"shardCount": 1}, auth=AUTH)
    assert answer.status_code in (200, 201), answer.text


async def delete(client: httpx.AsyncClient, name: str) -> None:
    answer = await client.delete(f"/v1/admin/streams/{name}", auth=AUTH)
    assert answer.status_code in (200, 204), answer.text


async def walk(
    client: httpx.AsyncClient, limit: int, between: Any = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Every stream, page by page through the `Link` header; each page's body too."""
    names: list[str] = []
    pages: list[dict[str, Any]] = []
    url: str | None = f"/v1/streams?limit={limit}"
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append(body)
        assert len(body["streams"]) <= limit
        names += [s["streamPrefix"] for s in body["streams"]]
        link = answer.headers.get("Link")
        if body["nextCursor"] is None:
            assert link is None
            url = None
        else:
            assert link is not None
            found = re.fullmatch(r'<([^>]+)>; rel="next"', link)
            assert found is not None, link
            url = found.group(1)
            assert f"cursor={body['nextCursor']}" in url
        if between is not None:
            await between(len(pages))
    return names, pages


async def test_pages_walk_the_whole_list_once(client: httpx.AsyncClient, prefix: str) -> None:
    mine = [f"{prefix}-{i:02}" for i in range(23)]
    for name in mine:
        await create(client, name)
    whole = (await client.get("/v1/streams")).json()
    assert "nextCursor" not in whole  # without limit: the whole list, as before pages existed
    everything = [s["streamPrefix"] for s in whole["streams"]]
    names, pages = await walk(client, 7)
    assert names == everything  # the same items, in the same (sorted) order, each once
    assert [n for n in names if n.startswith(prefix)] == mine
    assert all(len(p["streams"]) == 7 for p in pages[:-1])
    one = (await client.get("/v1/streams", params={"limit": len(everything)})).json()
    assert one["nextCursor"] is None  # the last page says so


async def test_a_walk_sees_every_stream_that_lived_through_it_once_while_others_come_and_go(
    client: httpx.AsyncClient, prefix: str
) -> None:
    stay = [f"{prefix}-s{i:02}" for i in range(12)]
    doomed = [f"{prefix}-s{i:02}x" for i in range(0, 12, 3)]  # sort between the ones that stay
    for name in stay + doomed:
        await create(client, name)
    added: list[str] = []

    async def churn(page: int) -> None:
        # after each page: one created before the cursor, one after it, one deleted ahead
        for name in (f"{prefix}-a{page:02}", f"{prefix}-s99-{page:02}"):
            await create(client, name)
            added.append(name)
        if doomed:
            await delete(client, doomed.pop())

    names, _ = await walk(client, 4, churn)
    seen = [n for n in names if n.startswith(prefix)]
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(stay) <= set(seen)  # nothing that lived through the walk missed
    assert seen == sorted(seen)


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"cursor": "not-a-cursor!"}, "INVALID_CURSOR"),
        ({"cursor": base64.urlsafe_b64encode(b'{"list":"audit","after":"x"}').decode()}, "INVALID_CURSOR"),
        ({"cursor": base64.urlsafe_b64encode(b"[1, 2]").decode()}, "INVALID_CURSOR"),
        ({"limit": "0"}, "INVALID_REQUEST"),
        ({"limit": "1001"}, "INVALID_REQUEST"),
        ({"limit": "ten"}, "INVALID_REQUEST"),
    ],
)
async def test_a_bad_cursor_or_limit_is_a_400(
    client: httpx.AsyncClient, query: dict[str, str], code: str
) -> None:
    answer = await client.get("/v1/streams", params=query)
    assert answer.status_code == 400
    assert answer.json()["error"] == code


async def test_a_repeated_limit_or_cursor_is_a_400(client: httpx.AsyncClient) -> None:
    answer = await client.get("/v1/streams?limit=1&limit=2")
    assert answer.status_code == 400
    assert answer.json()["error"] == "INVALID_REQUEST"


async def test_the_audit_log_in_pages_newest_first(client: httpx.AsyncClient, prefix: str) -> None:
    """The audit log is always in pages (100 newest by default): `nextCursor` and `Link` lead
    to older records, each once, and the last page says there is nothing older."""
    for i in range(7):
        await client.get(f"/v1/admin/streams/{prefix}-{i}", auth=AUTH)  # 404s, audited
    query = {"pathPrefix": f"/v1/admin/streams/{prefix}"}
    whole = (await client.get("/v1/admin/audit", params=query, auth=AUTH)).json()
    assert len(whole["records"]) == 7
    assert whole["nextCursor"] is None
    seen: list[str] = []
    url: str | None = "/v1/admin/audit?" + str(httpx.QueryParams({**query, "limit": 3}))
    while url is not None:
        answer = await client.get(url, auth=AUTH)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        seen += [r["recordId"] for r in body["records"]]
        link = answer.headers.get("Link")
        assert (link is None) == (body["nextCursor"] is None)
        url = re.fullmatch(r'<([^>]+)>; rel="next"', link).group(1) if link else None  # type: ignore[union-attr]
    assert seen == [r["recordId"] for r in whole["records"]]


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        base64.urlsafe_b64encode(b'{"list":"streams","after":"1-1"}').decode(),  # another list's
        base64.urlsafe_b64encode(b'{"list":"audit","after":"not-an-id"}').decode(),
    ],
)
async def test_a_bad_audit_cursor_is_a_400(client: httpx.AsyncClient, cursor: str) -> None:
    answer = await client.get("/v1/admin/audit", params={"cursor": cursor}, auth=AUTH)
    assert answer.status_code == 400
    assert answer.json()["error"] == "INVALID_CURSOR"


async def test_a_group_s_members_in_pages(client: httpx.AsyncClient, prefix: str) -> None:
    """A page of members carries what concerns them (targets, the shards they hold); the pages
    together are the whole view's members and assignments."""
    epochs = {}
    for member in ("m1", "m2", "m3", "m4", "m5"):
        epochs[member] = (await beat(client, hb(prefix, member, 0)))["memberEpoch"]
    path = f"/v1/streams/{prefix}/groups/billing"
    whole = (await client.get(path)).json()
    assert "nextCursor" not in whole
    members: list[dict[str, Any]] = []
    targets: dict[str, Any] = {}
    current: dict[str, Any] = {}
    url: str | None = f"{path}?limit=2"
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["members"]) <= 2
        ids = {m["memberId"] for m in body["members"]}
        assert set(body["targetAssignment"]) <= ids
        assert set(body["currentAssignment"].values()) <= ids
        members += body["members"]
        targets.update(body["targetAssignment"])
        current.update(body["currentAssignment"])
        assert body["groupEpoch"] == whole["groupEpoch"]
        link = answer.headers.get("Link")
        assert "nextCursor" in body
        assert (link is None) == (body["nextCursor"] is None)
        url = re.fullmatch(r'<([^>]+)>; rel="next"', link).group(1) if link else None  # type: ignore[union-attr]
    assert [m["memberId"] for m in members] == [m["memberId"] for m in whole["members"]]
    assert targets == whole["targetAssignment"]
    assert current == whole["currentAssignment"]
    bad = await client.get(path, params={"cursor": "x"})
    assert (bad.status_code, bad.json()["error"]) == (400, "INVALID_CURSOR")


async def test_dead_letters_in_pages_shard_by_shard(
    client: httpx.AsyncClient, prefix: str, sync_redis: Any
) -> None:
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 3}, auth=AUTH)
    view = (await client.get(f"/v1/streams/{prefix}")).json()
    for shard in view["shards"]:
        for n in range(3 if shard["index"] != 1 else 0):  # shard 1 has none
            fields = {"rscSourceId": f"{n + 1}-0", "rscDeliveries": "5", "n": str(n)}
            sync_redis.xadd(dead_letter_key(shard["key"]), fields)
    path = f"/v1/admin/streams/{prefix}/dlq/entries"
    whole = (await client.get(path, params={"limit": 1000}, auth=AUTH)).json()
    assert whole["nextCursor"] is None
    assert [e["shard"] for e in whole["entries"]] == [0, 0, 0, 2, 2, 2]
    seen: list[tuple[int, str]] = []
    url: str | None = f"{path}?limit=2"
    while url is not None:
        answer = await client.get(url, auth=AUTH)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["entries"]) <= 2
        seen += [(e["shard"], e["id"]) for e in body["entries"]]
        link = answer.headers.get("Link")
        assert (link is None) == (body["nextCursor"] is None)
        url = re.fullmatch(r'<([^>]+)>; rel="next"', link).group(1) if link else None  # type: ignore[union-attr]
    assert seen == [(e["shard"], e["id"]) for e in whole["entries"]]
    for cursor in ("x", base64.urlsafe_b64encode(b'{"list":"dlq","after":"zero/1-0"}').decode()):
        bad = await client.get(path, params={"cursor": cursor}, auth=AUTH)
        assert (bad.status_code, bad.json()["error"]) == (400, "INVALID_CURSOR")
