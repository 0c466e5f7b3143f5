"""One scope rule on every read path (issue 27): with views and metrics protected, a monitor
credential sees exactly the streams its patterns cover, and nothing else, in lists, views,
routing, `/metrics` and `/readyz` details; a stream it may not see answers the same whether it
exists or not. Every credential, path and stream is tried (none sampled away); the coordinator is a
real server over real sockets (its own key prefix, so only this test's streams exist)."""

from __future__ import annotations

import re
import uuid

import attrs
import httpx
import trio

from rsc.actors.dataset import DATA_LOSS
from rsc.events.auth import Credential, credential
from tests.httpkit import FAST, serve_on

ADMIN = ("admin", "s3cret")
STREAMS = ["a", "a:x", "a:x:y", "b", "b:x", "ab", "b:q:x"]
ABSENT = ["a:nope", "c", "b:x:none"]
PATTERNS = [
    ["a"],
    ["a:*"],
    ["a:**"],
    ["*"],
    ["**"],
    ["a*"],
    ["?:*"],
    ["[ab]:x"],
    ["b:*", "a"],
    ["*:x:*"],
    ["*:x"],
]
PATHS = ["list", "stream", "group", "routing", "metrics", "readyz"]
LABEL = re.compile(r'stream="([^"]*)"')


def credentials() -> list[Credential]:
    return [
        credential(f"m{i}", ["monitor", "producer"], token=f"scope-token-{i:04d}-0123456789", streams=p)
        for i, p in enumerate(PATTERNS)
    ]


def bearer(c: Credential) -> dict[str, str]:
    index = int(c.name[1:])
    return {"Authorization": f"Bearer scope-token-{index:04d}-0123456789"}


def check_read_paths(base_url: str, creds: list[Credential]) -> None:
    with httpx.Client(base_url=base_url, timeout=10) as http:

        def one_read(c: Credential, path: str, name: str) -> None:
            headers = bearer(c)
            covered = {s for s in STREAMS if c.covers(s)}
            if path == "list":
                answer = http.get("/v1/streams", headers=headers)
                assert answer.status_code == 200
                assert {s["streamPrefix"] for s in answer.json()["streams"]} == covered
            elif path in ("stream", "group", "routing"):
                url = {
                    "stream": f"/v1/streams/{name}",
                    "group": f"/v1/streams/{name}/groups/g",
                    "routing": f"/v1/streams/{name}/routing",
                }[path]
                answer = http.get(url, headers=headers)
                if not c.covers(name):  # the same whether it exists or not: no existence oracle
                    assert answer.status_code == 403, answer.text
                    assert answer.json()["error"] == "FORBIDDEN"
                elif name in STREAMS:
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["streamPrefix"] == name
                else:
                    assert answer.status_code == 404, answer.text
                    assert answer.json()["error"] == "UNKNOWN_STREAM"
            elif path == "metrics":
                answer = http.get("/metrics", headers=headers)
                assert answer.status_code == 200
                series = [line for line in answer.text.splitlines() if line and not line.startswith("#")]
                named = {m[1] for line in series if (m := LABEL.search(line))}
                assert named == covered  # every stream it covers has series, no other stream does
                if not c.everything:  # aggregates over every stream, and the process: not its business
                    assert all(LABEL.search(line) for line in series), [
                        line for line in series if not LABEL.search(line)
                    ][:3]
            else:
                answer = http.get("/readyz", headers=headers)
                assert answer.status_code == 200
                recent = answer.json()["dataLoss"]["recent"]
                assert recent  # the test reported one loss below
                assert all(("what" in r) == c.everything for r in recent), recent

        # Every combination (a path that names no stream once per credential): none sampled away.
        for c in creds:
            for path in PATHS:
                for name in STREAMS + ABSENT if path in ("stream", "group", "routing") else [""]:
                    one_read(c, path, name)


async def test_a_scoped_credential_sees_only_its_streams_on_every_read_path(standalone_url: str) -> None:
    creds = credentials()
    config = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        admin_password=ADMIN[1],
        credentials=tuple(creds),
        protect_views=True,
        protect_metrics=True,
        key_prefix=f"scope{uuid.uuid4().hex[:8]}",
    )
    async with serve_on(config) as http:
        for name in STREAMS:
            put = await http.put(f"/v1/admin/streams/{name}", json={"shardCount": 2}, auth=ADMIN)
            assert put.status_code == 200, put.text
            put = await http.put(f"/v1/admin/streams/{name}/groups/g", json={}, auth=ADMIN)
            assert put.status_code == 200, put.text
        # The admin sees every stream's series and the aggregates; nobody sees anything unnamed.
        everything = await http.get("/metrics", auth=ADMIN)
        assert {m[1] for m in LABEL.finditer(everything.text)} == set(STREAMS)
        assert "rsc_heartbeat_seconds" in everything.text
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/v1/streams")).status_code == 401
        DATA_LOSS.shard("the shard key a:x:0 was gone")  # as a member's report makes it
        # /readyz is public: nobody, or a member credential, sees the reports but not their names.
        for headers in ({}, {"Authorization": "Bearer not-a-valid-token-at-all"}):
            recent = (await http.get("/readyz", headers=headers)).json()["dataLoss"]["recent"]
            assert recent
            assert all("what" not in r for r in recent), recent
        admin_view = (await http.get("/readyz", auth=ADMIN)).json()["dataLoss"]["recent"]
        assert all("what" in r for r in admin_view)
        await trio.to_thread.run_sync(check_read_paths, str(http.base_url), creds)
