"""A strict, declarative Admin API: unknown fields refused, PUT replaces, PATCH merges,
If-Match atomic with the write, every stored field read back, no auto-creation by a member
that is not joining, and 401s that say what is wrong."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "s3cret")
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")
    async with serve_on(settings) as http:
        yield http


def error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json().get("error", "")


@pytest.mark.parametrize(
    ("path", "method", "body", "wrong", "meant"),
    [
        ("", "put", {"shardCount": 2, "reshardMod": "online"}, "reshardMod", "reshardMode"),
        ("", "patch", {"shardcount": 2}, "shardcount", "shardCount"),
        ("/groups/billing", "put", {"maxConcurency": 8}, "maxConcurency", "maxConcurrency"),
        ("/groups/billing", "patch", {"startfrom": "latest"}, "startfrom", "startFrom"),
        ("/pause", "post", {"reasn": "x"}, "reasn", "reason"),
        ("/migration/abort", "post", {"reson": "x"}, "reson", "reason"),
    ],
)
async def test_unknown_fields_are_refused_with_a_suggestion_and_change_nothing(
    client: httpx.AsyncClient,
    prefix: str,
    path: str,
    method: str,
    body: dict[str, Any],
    wrong: str,
    meant: str,
) -> None:
    created = await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    assert created.status_code == 200
    headers = MERGE if method == "patch" else {}
    response = await client.request(
        method.upper(), f"/v1/admin/streams/{prefix}{path}", json=body, auth=AUTH, headers=headers
    )
    assert error(response) == (400, "INVALID_REQUEST"), response.text
    message = response.json()["message"]
    assert wrong in message
    assert f"did you mean {meant!r}" in message
    assert response.json()["details"]["unknown"] == [wrong]
    after = await client.get(f"/v1/admin/streams/{prefix}", auth=AUTH)
    assert after.headers["ETag"] == created.headers["ETag"]  # nothing changed
    groups = await client.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)
    assert groups.status_code == 404  # and nothing was created


async def test_the_feature_change_body_is_strict_too(client: httpx.AsyncClient) -> None:
    response = await client.put("/v1/admin/features", json={"levl": 3}, auth=AUTH)
    assert error(response) == (400, "INVALID_REQUEST")
    assert "did you mean 'level'" in response.json()["message"]


async def test_every_field_round_trips_put_replaces_and_patch_merges(
    client: httpx.AsyncClient, prefix: str
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    spec = {"shardCount": 3, "reshardMode": "quiesce"}
    assert (await client.put(stream, json=spec, auth=AUTH)).json()["spec"] == spec
    assert (await client.get(stream, auth=AUTH)).json()["spec"] == spec
    # PATCH: only the fields given (RFC 7396); null means the default.
    patched = await client.patch(stream, json={"reshardMode": None}, auth=AUTH, headers=MERGE)
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"] == {"shardCount": 3, "reshardMode": "online"}
    # PUT: the whole spec; a field left out is its default.
    put = await client.put(stream, json={"shardCount": 3, "reshardMode": "quiesce"}, auth=AUTH)
    assert put.json()["spec"]["reshardMode"] == "quiesce"
    put = await client.put(stream, json={"shardCount": 3}, auth=AUTH)
    assert put.json()["spec"] == {"shardCount": 3, "reshardMode": "online"}

    group = f"{stream}/groups/billing"
    gspec = {"maxConcurrency": 6, "startFrom": "latest"}
    assert (await client.put(group, json=gspec, auth=AUTH)).json()["spec"] == gspec
    assert (await client.get(group, auth=AUTH)).json()["spec"] == gspec
    patched = await client.patch(group, json={"maxConcurrency": 2}, auth=AUTH, headers=MERGE)
    assert patched.json()["spec"] == {"maxConcurrency": 2, "startFrom": "latest"}
    # PATCH with plain JSON is accepted as a merge patch too.
    patched = await client.patch(group, json={"maxConcurrency": 3}, auth=AUTH)
    assert patched.json()["spec"]["maxConcurrency"] == 3
    # A group created by PATCH starts from the defaults.
    other = await client.patch(f"{stream}/groups/audit", json={"maxConcurrency": 4}, auth=AUTH, headers=MERGE)
    assert other.json()["spec"] == {"maxConcurrency": 4, "startFrom": "earliest"}
    for bad in ([1], "x", {"maxConcurrency": "many"}, {"maxConcurrency": 0}):
        response = await client.patch(group, json=bad, auth=AUTH, headers=MERGE)
        assert error(response) == (400, "INVALID_REQUEST"), bad


async def test_start_from_applies_at_creation_and_cannot_change_afterwards(
    client: httpx.AsyncClient, prefix: str
) -> None:
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    group = f"/v1/admin/streams/{prefix}/groups/billing"
    assert (await client.put(group, json={"startFrom": "latest"}, auth=AUTH)).status_code == 200
    changed = await client.put(group, json={"startFrom": "earliest"}, auth=AUTH)
    assert error(changed) == (409, "IMMUTABLE_FIELD")
    assert "startFrom" in changed.json()["message"]
    patched = await client.patch(group, json={"startFrom": "earliest"}, auth=AUTH, headers=MERGE)
    assert error(patched) == (409, "IMMUTABLE_FIELD")
    assert (await client.get(group, auth=AUTH)).json()["spec"]["startFrom"] == "latest"


async def test_if_match_on_a_missing_resource_creates_nothing(client: httpx.AsyncClient, prefix: str) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    refused = await client.put(stream, json={"shardCount": 2}, auth=AUTH, headers={"If-Match": '"1"'})
    assert error(refused) == (412, "PRECONDITION_FAILED")
    assert (await client.get(stream, auth=AUTH)).status_code == 404
    await client.put(stream, json={"shardCount": 2}, auth=AUTH)
    group = f"{stream}/groups/billing"
    refused = await client.put(group, json={}, auth=AUTH, headers={"If-Match": "*"})
    assert error(refused) == (412, "PRECONDITION_FAILED")
    assert (await client.get(group, auth=AUTH)).status_code == 404


async def test_a_group_of_a_missing_stream_is_404_and_creates_nothing(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """A misspelt stream name in a group's PUT or PATCH (a Terraform `rsc_group`, say) is a 404,
    not a new stream with the default shard count."""
    stream = f"/v1/admin/streams/{prefix}"
    put = await client.put(f"{stream}/groups/billing", json={"maxConcurrency": 2}, auth=AUTH)
    assert error(put) == (404, "UNKNOWN_STREAM"), put.text
    patch = await client.patch(f"{stream}/groups/billing", json={}, auth=AUTH, headers=MERGE)
    assert error(patch) == (404, "UNKNOWN_STREAM"), patch.text
    assert (await client.get(stream, auth=AUTH)).status_code == 404
    assert prefix not in [s["streamPrefix"] for s in (await client.get("/v1/streams")).json()["streams"]]


@pytest.mark.parametrize("kind", ["stream", "group"])
async def test_if_none_match_creates_only_and_of_two_concurrent_creates_exactly_one_wins(
    client: httpx.AsyncClient, prefix: str, kind: str
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    if kind == "group":
        await client.put(stream, json={"shardCount": 2}, auth=AUTH)
    path = stream if kind == "stream" else f"{stream}/groups/billing"
    field = "shardCount" if kind == "stream" else "maxConcurrency"
    answers: list[httpx.Response] = []

    async def create(value: int) -> None:
        body = {field: value}
        answers.append(await client.put(path, json=body, auth=AUTH, headers={"If-None-Match": "*"}))

    async with trio.open_nursery() as nursery:
        for value in (3, 5):
            nursery.start_soon(create, value)
    assert sorted(a.status_code for a in answers) == [200, 412], [a.text for a in answers]
    winner = next(a for a in answers if a.status_code == 200)
    stored = (await client.get(path, auth=AUTH)).json()["spec"]
    assert stored == winner.json()["spec"]
    again = await client.put(path, json={field: 7}, auth=AUTH, headers={"If-None-Match": "*"})
    assert error(again) == (412, "PRECONDITION_FAILED")
    assert "exists" in again.json()["message"]
    assert (await client.get(path, auth=AUTH)).json()["spec"] == stored  # nothing changed


@pytest.mark.parametrize("kind", ["stream", "group"])
async def test_two_concurrent_puts_with_the_same_if_match_exactly_one_wins(
    client: httpx.AsyncClient, prefix: str, kind: str
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    await client.put(stream, json={"shardCount": 2}, auth=AUTH)
    path = stream if kind == "stream" else f"{stream}/groups/billing"
    if kind == "group":
        await client.put(path, json={"maxConcurrency": 1}, auth=AUTH)
    field = "shardCount" if kind == "stream" else "maxConcurrency"
    answers: list[httpx.Response] = []

    async def put(body: dict[str, int], etag: str) -> None:
        answers.append(await client.put(path, json=body, auth=AUTH, headers={"If-Match": etag}))

    for _ in range(5):  # several rounds: the two requests race each time
        current = await client.get(path, auth=AUTH)
        now = current.json()["spec"][field]
        answers.clear()
        async with trio.open_nursery() as nursery:
            for value in (now + 1, now + 2):  # both change something (a no-op PUT changes nothing)
                nursery.start_soon(put, {field: value}, current.headers["ETag"])
        assert sorted(a.status_code for a in answers) == [200, 412], [a.text for a in answers]
        winner = next(a for a in answers if a.status_code == 200)
        assert (await client.get(path, auth=AUTH)).json()["spec"] == winner.json()["spec"]


async def test_a_put_racing_a_join_that_creates_the_group_still_applies_its_spec(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """A join creates a missing group with the default config; a PUT creating it at the same
    time must not be dropped as "already exists" (it answered 200 and changed nothing)."""
    stream = f"/v1/admin/streams/{prefix}"
    assert (await client.put(stream, json={"shardCount": 2}, auth=AUTH)).status_code == 200
    answers: list[httpx.Response] = []
    for round_ in range(8):  # the two orders (and the interleavings between) over the rounds
        group = f"g{round_}"
        answers.clear()

        async def put(group: str = group) -> None:
            body = {"maxConcurrency": 3}
            answers.append(await client.put(f"{stream}/groups/{group}", json=body, auth=AUTH))

        async def join(group: str = group) -> None:
            await beat(client, {**hb(prefix, "a", 0), "consumerGroup": group})

        async with trio.open_nursery() as nursery:
            first, second = (put, join) if round_ % 2 else (join, put)
            nursery.start_soon(first)
            nursery.start_soon(second)
        assert answers[0].status_code == 200, answers[0].text
        assert answers[0].json()["spec"]["maxConcurrency"] == 3
        stored = (await client.get(f"{stream}/groups/{group}", auth=AUTH)).json()["spec"]
        assert stored["maxConcurrency"] == 3, (round_, stored)
        answer = await beat(client, {**hb(prefix, "a", 1), "consumerGroup": group})
        assert answer["maxConcurrency"] == 3


async def test_a_heartbeat_that_is_not_a_join_never_creates_a_group_or_stream(
    client: httpx.AsyncClient, prefix: str
) -> None:
    for epoch in (5, -1):
        response = await client.post("/v1/heartbeat", json=hb(prefix, "stranger", epoch))
        assert error(response) == (404, "UNKNOWN_STREAM"), response.text
    batch = {"heartbeats": [hb(prefix, "stranger", 3)]}
    answer = (await client.post("/v1/heartbeats", json=batch)).json()["responses"][0]
    assert answer["error"] == "UNKNOWN_STREAM"
    assert (await client.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 404
    # The stream exists, the group does not: still nothing is created.
    assert (
        await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    ).status_code == 200
    response = await client.post("/v1/heartbeat", json=hb(prefix, "stranger", 5))
    assert error(response) == (404, "UNKNOWN_GROUP"), response.text
    assert (await client.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).status_code == 404
    joined = await beat(client, hb(prefix, "a", 0))  # a join still creates both (the default policy)
    assert joined["memberEpoch"] >= 1


async def test_401_says_whether_credentials_were_missing_or_wrong_not_which_part(
    client: httpx.AsyncClient, prefix: str
) -> None:
    path = f"/v1/admin/streams/{prefix}"
    missing = (await client.get(path)).json()["message"]
    wrong_password = (await client.get(path, auth=("admin", "nope"))).json()["message"]
    unknown_user = (await client.get(path, auth=("mallory", "s3cret"))).json()["message"]
    assert "no credentials" in missing
    assert wrong_password == unknown_user  # never which user names exist
    assert "wrong user name or password" in wrong_password
    assert missing != wrong_password
    # A Basic challenge for tools (curl, a browser's address bar); not for a page's script,
    # where the browser would open its own login dialog over the page (and hold the request).
    assert (await client.get(path)).headers["WWW-Authenticate"] == 'Basic realm="rsc admin"'
    scripted = await client.get(path, headers={"X-Requested-With": "XMLHttpRequest"})
    assert scripted.status_code == 401
    assert scripted.headers["WWW-Authenticate"] == 'RscBasic realm="rsc admin"'


async def test_no_error_names_a_python_type(client: httpx.AsyncClient, prefix: str) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    cases = [
        (stream, {"shardCount": 2, "reshardMode": "sideways"}),
        (stream, {"shardCount": "two"}),
        (stream, {"shardCount": 2.5}),
        (f"{stream}/groups/billing", {"startFrom": "yesterday"}),
        (f"{stream}/groups/billing", {"maxConcurrency": [1]}),
    ]
    for path, body in cases:
        response = await client.put(path, json=body, auth=AUTH)
        assert error(response) == (400, "INVALID_REQUEST"), body
        text = response.text
        for python in ("ReshardMode", "StartFrom", "<class", "int()", "NoneType", "Enum"):
            assert python not in text, (body, text)
    sideways = await client.put(stream, json={"shardCount": 2, "reshardMode": "sideways"}, auth=AUTH)
    assert "'online', 'quiesce'" in sideways.text
