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
    spec = {"shardCount": 3, "reshardMode": "quiesce", "retention": DEFAULT_RETENTION}
    assert (await client.put(stream, json=spec, auth=AUTH)).json()["spec"] == spec
    assert (await client.get(stream, auth=AUTH)).json()["spec"] == spec
    # PATCH: only the fields given (RFC 7396); null means the default.
    patched = await client.patch(stream, json={"reshardMode": None}, auth=AUTH, headers=MERGE)
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"] == spec | {"reshardMode": "online"}
    # PUT: the whole spec; a field left out is its default (retention: the stream keeps its own).
    put = await client.put(stream, json={"shardCount": 3, "reshardMode": "quiesce"}, auth=AUTH)
    assert put.json()["spec"]["reshardMode"] == "quiesce"
    put = await client.put(stream, json={"shardCount": 3}, auth=AUTH)
    assert put.json()["spec"] == spec | {"reshardMode": "online"}

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
        for value in range(1, 21):  # twenty at once: one wins, the others change nothing
            nursery.start_soon(create, value % 5 + 1)
    assert sorted(a.status_code for a in answers) == [200] + [412] * 19, [a.text for a in answers]
    winner = next(a for a in answers if a.status_code == 200)
    read = (await client.get(path, auth=AUTH)).json()
    stored = read["spec"]
    assert stored == winner.json()["spec"]
    assert read["revision"] == winner.json()["revision"]  # nothing was written after the create
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
    # (A member that knows no layout: one that knows a layout makes a stream Redis lost
    # rebuilt, test_a_member_that_knows_a_layout_rebuilds_what_redis_lost.)
    for epoch in (5, -1):
        response = await client.post("/v1/heartbeat", json=hb(prefix, "stranger", epoch, metadataVersion=0))
        assert error(response) == (404, "UNKNOWN_STREAM"), response.text
    left = await client.post("/v1/heartbeat", json=hb(prefix, "stranger", -1, metadataVersion=4))
    assert error(left) == (404, "UNKNOWN_STREAM"), left.text  # a leave rebuilds nothing
    batch = {"heartbeats": [hb(prefix, "stranger", 3, metadataVersion=0)]}
    answer = (await client.post("/v1/heartbeats", json=batch)).json()["responses"][0]
    assert answer["error"] == "UNKNOWN_STREAM"
    assert (await client.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 404
    # The stream exists, the group does not: still nothing is created.
    assert (
        await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    ).status_code == 200
    response = await client.post("/v1/heartbeat", json=hb(prefix, "stranger", 5, metadataVersion=0))
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


async def test_reads_and_deletes_racing_never_bring_a_deleted_group_back(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """A GET (or the answer to a write) of a group being deleted found it missing and
    created it again with the default config; a DELETE of a missing group created it first."""
    stream = f"/v1/admin/streams/{prefix}"
    await client.put(stream, json={"shardCount": 1}, auth=AUTH)
    for round_ in range(8):
        group = f"{stream}/groups/g{round_}"
        put = await client.put(group, json={"maxConcurrency": 7, "startFrom": "latest"}, auth=AUTH)
        assert put.status_code == 200, put.text
        statuses: list[int] = []

        async def get() -> None:
            statuses.append((await client.get(group, auth=AUTH)).status_code)  # noqa: B023

        async def delete() -> None:
            statuses.append((await client.delete(group, auth=AUTH)).status_code)  # noqa: B023

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(delete if n % 4 == 0 else get)
        assert set(statuses) <= {200, 204, 404, 409}, statuses
        assert 204 in statuses
        gone = await client.get(group, auth=AUTH)
        assert error(gone) == (404, "UNKNOWN_GROUP"), gone.text
    missing = await client.delete(f"{stream}/groups/never", auth=AUTH)
    assert error(missing) == (404, "UNKNOWN_GROUP")
    assert error(await client.get(f"{stream}/groups/never", auth=AUTH)) == (404, "UNKNOWN_GROUP")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([("If-None-Match", '"zzz"'), ("If-None-Match", "*")], 400),  # * must stand alone
        ([("If-None-Match", '"zzz"'), ("If-None-Match", '"2"')], 412),  # two lines: one list
        ([("If-Match", '"999"'), ("If-Match", '"2"')], 200),
        ([("If-Match", 'W/"2"')], 412),  # If-Match compares strongly: a weak tag never matches
        ([("If-Match", "2")], 400),  # not an entity tag
        ([("If-None-Match", "W/*")], 400),
        ([("If-None-Match", "garbage")], 400),
        ([("If-None-Match", "\u200b*".encode())], 400),  # a zero-width space before *
        ([("If-None-Match", 'W/"2"')], 412),  # If-None-Match compares weakly
    ],
)
async def test_preconditions_are_read_as_rfc_9110_says_or_refused(
    client: httpx.AsyncClient, prefix: str, headers: list[tuple[str, Any]], status: int
) -> None:
    """Every line of a precondition header counts; anything that is not `*` or entity tags is
    400, never a write without a condition."""
    stream = f"/v1/admin/streams/{prefix}"
    created = await client.put(stream, json={"shardCount": 2}, auth=AUTH)
    assert created.json()["revision"] == 2  # StreamCreated, then its RetentionSet
    answer = await client.put(stream, json={"shardCount": 3}, auth=AUTH, headers=headers)
    assert answer.status_code == status, answer.text
    expected = 3 if status == 200 else 2
    assert (await client.get(stream, auth=AUTH)).json()["spec"]["shardCount"] == expected


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", ""),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/migration/resume"),
        ("POST", "/migration/abort"),
        ("DELETE", "/groups/billing"),
    ],
)
async def test_any_if_match_on_a_missing_resource_is_412(
    client: httpx.AsyncClient, prefix: str, method: str, path: str
) -> None:
    if path.startswith("/groups"):
        await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    url = f"/v1/admin/streams/{prefix}{path}"
    for tag in ("*", '"1"'):
        answer = await client.request(method, url, auth=AUTH, headers={"If-Match": tag})
        assert error(answer) == (412, "PRECONDITION_FAILED"), answer.text
    plain = await client.request(method, url, auth=AUTH)
    assert plain.status_code == 404, plain.text


@pytest.mark.parametrize("path", ["/resume", "/migration/resume"])
@pytest.mark.parametrize(("body", "code"), [("{", "MALFORMED_JSON"), ('{"bogus": 1}', "INVALID_REQUEST")])
async def test_resume_bodies_are_read_like_every_other(
    client: httpx.AsyncClient, prefix: str, path: str, body: str, code: str
) -> None:
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    answer = await client.post(
        f"/v1/admin/streams/{prefix}{path}",
        content=body,
        auth=AUTH,
        headers={"Content-Type": "application/json"},
    )
    assert error(answer) == (400, code), answer.text


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/admin/audit", "limit=0"),
        ("/v1/admin/audit", "limit=1001"),
        ("/v1/admin/audit", "limit=99999999999999999999"),
        ("/v1/admin/audit", "limit=abc"),
        ("/v1/admin/audit", "status=0"),
        ("/v1/admin/audit", "limit=5&limit=6"),
        ("/v1/admin/streams/{prefix}/dlq/entries", "limit=-1"),
        ("/v1/admin/streams/{prefix}/dlq/entries", "limit=100000"),
        ("/v1/admin/streams/{prefix}/dlq/entries", "shard=0&shard=1"),
    ],
)
async def test_query_parameters_out_of_range_or_repeated_are_400(
    client: httpx.AsyncClient, prefix: str, path: str, query: str
) -> None:
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    answer = await client.get(f"{path.format(prefix=prefix)}?{query}", auth=AUTH)
    assert error(answer) == (400, "INVALID_REQUEST"), answer.text
    assert "int()" not in answer.text


@pytest.mark.parametrize(
    "body",
    [
        {"shard": 0, "ids": ["18446744073709551616-0"]},
        {"ids": ["1-18446744073709551616"]},
        {"ids": [f"{n}-0" for n in range(1_001)]},
    ],
)
async def test_dead_letter_replay_refuses_ids_redis_cannot_take(
    client: httpx.AsyncClient, prefix: str, body: dict[str, Any]
) -> None:
    """Ids above 2^64-1 were a 500 from Redis; more than the documented 1,000 were taken."""
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    answer = await client.post(f"/v1/admin/streams/{prefix}/dlq/replay", json=body, auth=AUTH)
    assert error(answer) == (400, "INVALID_REQUEST"), answer.text
    fine = await client.post(
        f"/v1/admin/streams/{prefix}/dlq/replay", json={"ids": ["18446744073709551615-0"]}, auth=AUTH
    )
    assert fine.status_code == 200, fine.text


async def test_a_number_too_long_for_python_is_said_in_json_words(
    client: httpx.AsyncClient, prefix: str
) -> None:
    answer = await client.put(
        f"/v1/admin/streams/{prefix}",
        content='{"shardCount": ' + "9" * 5_000 + "}",
        auth=AUTH,
        headers={"Content-Type": "application/json"},
    )
    assert error(answer) == (400, "MALFORMED_JSON")
    assert "more than 4300 digits" in answer.json()["message"]
    assert "sys." not in answer.text


async def test_of_concurrent_deletes_of_a_stream_exactly_one_is_204(
    client: httpx.AsyncClient, prefix: str
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    await client.put(stream, json={"shardCount": 1}, auth=AUTH)
    statuses: list[int] = []

    async def delete() -> None:
        statuses.append((await client.delete(stream, auth=AUTH)).status_code)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(delete)
    assert sorted(statuses) == [204] + [404] * 5, statuses


@pytest.mark.parametrize(
    ("path", "body", "problem"),
    [
        ("/pause", {"reason": "a\nb"}, "reason does not match its pattern (see /openapi.json) @ $.reason"),
        ("/dlq/replay", {"ids": ["x"]}, "ids does not match its pattern (see /openapi.json) @ $.ids"),
        ("/dlq/replay", {"limit": 0}, "limit must be >= 1: 0 @ $.limit"),
    ],
)
async def test_a_value_out_of_its_constraint_is_named_at_its_field(
    client: httpx.AsyncClient, prefix: str, path: str, body: dict[str, Any], problem: str
) -> None:
    """Not `invalid value @ $`, and not the server's regular expression."""
    await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    answer = await client.post(f"/v1/admin/streams/{prefix}{path}", json=body, auth=AUTH)
    assert error(answer) == (400, "INVALID_REQUEST"), answer.text
    assert answer.json()["details"] == [problem]


async def test_a_member_that_knows_a_layout_rebuilds_what_redis_lost(
    client: httpx.AsyncClient, prefix: str
) -> None:
    """A member already in its group (epoch > 0) that was told layout version 4 speaks of a
    stream and group that existed: Redis holds nothing of them, so Redis lost them. They are
    rebuilt, the stream above the version it knew (an ordinary layout change for everyone);
    the member is not a member of the rebuilt group and rejoins."""
    answer = await beat(client, hb(prefix, "a", 7, metadataVersion=4))
    assert answer["status"] == "UNKNOWN_MEMBER"
    routing = (await client.get(f"/v1/streams/{prefix}/routing")).json()
    assert routing["metadataVersion"] == 5
    assert (await client.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).status_code == 200
    rejoined = await beat(client, hb(prefix, "a", 0, metadataVersion=4))
    assert rejoined["memberEpoch"] >= 1
    assert rejoined["layout"]["metadataVersion"] == 5
    ready = (await client.get("/readyz")).json()
    assert ready["dataLoss"]["counts"]["rebuilt"] >= 2, ready  # the stream, then the group


DEFAULT_RETENTION = {
    "keep": "acknowledged",
    "maxAgeMs": None,
    "maxEntriesPerShard": None,
    "whenFull": "drop-oldest",
    "inactiveGroupMs": None,
    "deadLetterMaxEntries": 10_000,
}


async def test_retention_round_trips_merges_and_refuses_bad_numbers_naming_the_field(
    client: httpx.AsyncClient, prefix: str
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    policy = DEFAULT_RETENTION | {"keep": "all", "maxAgeMs": 60_000, "maxEntriesPerShard": 500}
    put = await client.put(stream, json={"shardCount": 2, "retention": policy}, auth=AUTH)
    assert put.status_code == 200, put.text
    assert put.json()["spec"]["retention"] == policy
    assert put.json()["status"]["retention"] == policy  # the stream view shows it too
    # a merge patch of the policy changes only the fields it names; null is the field's default
    patch = {"retention": {"whenFull": "refuse", "maxAgeMs": None}}
    patched = await client.patch(stream, json=patch, auth=AUTH, headers=MERGE)
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"]["retention"] == policy | {"whenFull": "refuse", "maxAgeMs": None}
    # null for the whole policy: the default policy
    reset = await client.patch(stream, json={"retention": None}, auth=AUTH, headers=MERGE)
    assert reset.json()["spec"]["retention"] == DEFAULT_RETENTION
    for field, bad in [
        ("maxAgeMs", 0),
        ("maxAgeMs", -5),
        ("maxEntriesPerShard", 1.5),
        ("maxEntriesPerShard", "10"),
        ("inactiveGroupMs", True),
        ("keep", "some"),
        ("whenFull", None),
    ]:
        refused = await client.put(stream, json={"shardCount": 2, "retention": {field: bad}}, auth=AUTH)
        assert refused.status_code == 400, (field, bad, refused.text)
        assert refused.json()["error"] == "INVALID_REQUEST"
        assert field in refused.text, (field, refused.text)
    unknown = await client.put(stream, json={"shardCount": 2, "retention": {"maxAge": 5}}, auth=AUTH)
    assert unknown.status_code == 400
    assert "retention.maxAge" in unknown.text
    assert "maxAgeMs" in unknown.text  # the closest known name
    assert (await client.get(stream, auth=AUTH)).json()["spec"]["retention"] == DEFAULT_RETENTION
