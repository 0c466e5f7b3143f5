"""Authentication, authorization and bounded input over a real socket (`serve`, real Redis)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import redis as redis_py
import trio

from rsc.config import Settings
from rsc.coordinator_process import Exposed, serve
from rsc.events.auth import credential
from rsc.events.placement import shard_key
from rsc.http.audit import AUDIT_KEY
from tests.httpkit import FAST, hb, serve_on

MEMBER_TOKEN = "member-token-0123456789"
CREATOR_TOKEN = "creator-token-0123456789"
PRODUCER_TOKEN = "producer-token-0123456789"
MONITOR_TOKEN = "monitor-token-0123456789"
ADMIN = ("admin", "s3cret")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def secured(redis_url: str, **extra: Any) -> Settings:
    credentials = (
        credential("workers", ["member"], token=MEMBER_TOKEN, streams=["sec-*"]),
        credential("bootstrap", ["member", "producer"], token=CREATOR_TOKEN, streams=["sec-*"], create=True),
        credential("shop", ["producer"], token=PRODUCER_TOKEN, streams=["sec-*"]),
        credential("grafana", ["monitor"], token=MONITOR_TOKEN, streams=["sec-a*"]),
    )
    return attrs.evolve(FAST, redis_url=redis_url, admin_password="s3cret", credentials=credentials, **extra)


@pytest.fixture
def stream(prefix: str) -> str:
    return f"sec-{prefix}"


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(secured(standalone_url)) as http:
        yield http


async def refusals(client: httpx.AsyncClient, action: str, reason: str) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(
        rf'^rsc_auth_refusals_total{{action="{action}",reason="{reason}"}} (\S+)$', text, re.MULTILINE
    )
    return float(found.group(1)) if found else 0.0


async def test_members_and_producers_need_a_credential(client: httpx.AsyncClient, stream: str) -> None:
    before = await refusals(client, "member-heartbeat", "unauthenticated")
    response = await client.post("/v1/heartbeat", json=hb(stream, "a", 0))
    assert response.status_code == 401
    assert response.json()["error"] == "UNAUTHENTICATED"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert await refusals(client, "member-heartbeat", "unauthenticated") == before + 1
    body = {"protocolVersion": 1, "streamPrefix": stream, "producerId": "p1"}
    assert (await client.post("/v1/producers/heartbeat", json=body)).status_code == 401
    batch = {"heartbeats": [hb(stream, "a", 0)]}
    assert (await client.post("/v1/heartbeats", json=batch)).status_code == 401
    bad_before = await refusals(client, "member-heartbeat", "bad-credential")
    wrong = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer("not-a-token-at-all"))
    assert wrong.status_code == 401
    assert await refusals(client, "member-heartbeat", "bad-credential") == bad_before + 1
    # A bad credential is refused even where none is needed: a typo never falls back to anonymous.
    assert (await client.get("/v1/streams", headers=bearer("not-a-token-at-all"))).status_code == 401
    assert (await client.get("/healthz", headers=bearer("not-a-token-at-all"))).status_code == 200


async def test_creation_needs_a_credential_that_may_create(client: httpx.AsyncClient, stream: str) -> None:
    refused = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer(MEMBER_TOKEN))
    assert refused.status_code == 404
    assert refused.json()["error"] == "UNKNOWN_STREAM"
    assert (await client.get(f"/v1/streams/{stream}")).status_code == 404  # nothing was created
    put = await client.put(f"/v1/admin/streams/{stream}", json={"shardCount": 2}, auth=ADMIN)
    assert put.status_code == 200
    no_group = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer(MEMBER_TOKEN))
    assert no_group.status_code == 404
    assert no_group.json()["error"] == "UNKNOWN_GROUP"
    created = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer(CREATOR_TOKEN))
    assert created.status_code == 200, created.text
    joined = await client.post("/v1/heartbeat", json=hb(stream, "b", 0), headers=bearer(MEMBER_TOKEN))
    assert joined.status_code == 200, joined.text
    assert joined.json()["status"] in ("OK", "REVOKE_PENDING")
    producer = {"protocolVersion": 1, "streamPrefix": stream, "producerId": "p1"}
    ok = await client.post("/v1/producers/heartbeat", json=producer, headers=bearer(PRODUCER_TOKEN))
    assert ok.status_code == 200, ok.text
    other = {**producer, "streamPrefix": f"{stream}-new"}
    missing = await client.post("/v1/producers/heartbeat", json=other, headers=bearer(PRODUCER_TOKEN))
    assert missing.status_code == 404


async def test_roles_and_stream_patterns(client: httpx.AsyncClient, stream: str) -> None:
    outside = await client.post("/v1/heartbeat", json=hb("other", "a", 0), headers=bearer(CREATOR_TOKEN))
    assert outside.status_code == 403
    assert outside.json()["error"] == "FORBIDDEN"
    producer = {"protocolVersion": 1, "streamPrefix": stream, "producerId": "p1"}
    as_member = await client.post("/v1/producers/heartbeat", json=producer, headers=bearer(MEMBER_TOKEN))
    assert as_member.status_code == 403
    as_producer = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer(PRODUCER_TOKEN))
    assert as_producer.status_code == 403
    as_monitor = await client.post("/v1/heartbeat", json=hb(stream, "a", 0), headers=bearer(MONITOR_TOKEN))
    assert as_monitor.status_code == 403
    assert await refusals(client, "member-heartbeat", "forbidden") >= 2


async def test_a_batch_is_authorized_item_by_item(client: httpx.AsyncClient, stream: str) -> None:
    batch = {"heartbeats": [hb(stream, "a", 0), hb("elsewhere", "b", 0)]}
    response = await client.post("/v1/heartbeats", json=batch, headers=bearer(CREATOR_TOKEN))
    assert response.status_code == 200
    first, second = response.json()["responses"]
    assert first["status"] == "OK"
    assert second["error"] == "FORBIDDEN"


async def test_views_never_show_the_incarnation(client: httpx.AsyncClient, stream: str) -> None:
    joined = await client.post(
        "/v1/heartbeat", json=hb(stream, "a", 0, incarnation="secret-inc"), headers=bearer(CREATOR_TOKEN)
    )
    assert joined.status_code == 200
    view = await client.get(f"/v1/streams/{stream}/groups/billing")
    assert view.status_code == 200
    assert view.json()["members"][0]["memberId"] == "a"
    assert "secret-inc" not in view.text
    assert "incarnation" not in view.json()["members"][0]


async def test_protected_views_and_metrics(standalone_url: str, prefix: str) -> None:
    settings = secured(standalone_url, protect_views=True, protect_metrics=True)
    async with serve_on(settings) as client:
        for name in (f"sec-a{prefix}", f"sec-b{prefix}"):
            put = await client.put(f"/v1/admin/streams/{name}", json={"shardCount": 1}, auth=ADMIN)
            assert put.status_code == 200
        assert (await client.get("/v1/streams")).status_code == 401
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get(f"/v1/streams/sec-a{prefix}")).status_code == 401
        monitor = bearer(MONITOR_TOKEN)
        seen = {
            s["streamPrefix"] for s in (await client.get("/v1/streams", headers=monitor)).json()["streams"]
        }
        assert f"sec-a{prefix}" in seen
        assert f"sec-b{prefix}" not in seen  # outside the monitor's patterns
        assert (await client.get(f"/v1/streams/sec-a{prefix}", headers=monitor)).status_code == 200
        assert (await client.get(f"/v1/streams/sec-b{prefix}", headers=monitor)).status_code == 403
        assert (await client.get("/metrics", headers=monitor)).status_code == 200
        assert (await client.get("/metrics", auth=ADMIN)).status_code == 200
        assert (await client.get(f"/v1/streams/sec-b{prefix}", auth=ADMIN)).status_code == 200
        assert (
            await client.get(f"/v1/streams/sec-b{prefix}", headers=bearer(MEMBER_TOKEN))
        ).status_code == 403
        for public in ("/healthz", "/readyz", "/v1/version", "/openapi.json"):
            assert (await client.get(public)).status_code == 200, public


async def test_a_non_loopback_bind_without_credentials_is_refused(standalone_url: str) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url)
    with pytest.raises(Exposed, match="--insecure"):
        await serve(settings, "0.0.0.0:0")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:  # --insecure: the operator said a network guards it
        insecure = attrs.evolve(settings, insecure=True)
        urls = await nursery.start(
            lambda task_status: serve(insecure, "0.0.0.0:0", shutdown=shutdown, task_status=task_status)
        )
        assert urls
        shutdown.set()


# --- bounded input ---------------------------------------------------------------


@pytest.fixture
async def open_client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret", max_batch_items=20)
    async with serve_on(settings) as http:
        yield http


async def test_batches_are_capped(open_client: httpx.AsyncClient, prefix: str) -> None:
    batch = {"heartbeats": [hb(prefix, f"m{i}", 0) for i in range(21)]}
    response = await open_client.post("/v1/heartbeats", json=batch)
    assert response.status_code == 413
    assert response.json()["error"] == "BATCH_TOO_LARGE"
    assert response.json()["details"]["limit"] == 20
    assert (await open_client.get(f"/v1/streams/{prefix}")).status_code == 404  # nothing done
    batch["heartbeats"].pop()
    assert (await open_client.post("/v1/heartbeats", json=batch)).status_code == 200


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/heartbeat", "POST"),
        ("/v1/heartbeats", "POST"),
        ("/v1/producers/heartbeat", "POST"),
        ("/v1/admin/streams/deep", "PUT"),
        ("/v1/admin/streams/deep/groups/g", "PUT"),
        ("/v1/admin/streams/deep/pause", "POST"),
    ],
)
async def test_deep_json_is_a_400_on_every_body(
    open_client: httpx.AsyncClient, path: str, method: str
) -> None:
    for depth in (40, 950, 5_000):
        body = "[" * depth + "]" * depth
        response = await open_client.request(
            method, path, content=body, auth=ADMIN, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (depth, response.text)
        assert response.json()["error"] == "JSON_TOO_DEEP"
        wrapped = '{"heartbeats": [' + "[" * depth + "]" * depth + "]}"
        response = await open_client.request(
            method, path, content=wrapped, auth=ADMIN, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (depth, response.text)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"client": {"name": "x" * 129, "version": "1"}}, "client.name"),
        ({"client": {"name": "ok", "version": "v" * 65}}, "client.version"),
        ({"client": {"name": "evil\x1b[2J", "version": "1"}}, "client.name"),
        ({"client": {"name": "line\nbreak", "version": "1"}}, "client.name"),
        ({"client": {"name": "gnp.\u202eexe", "version": "1"}}, "client.name"),  # bidi override
        ({"client": {"name": "ok", "version": "1\u20282"}}, "client.version"),  # line separator
        ({"client": {"name": "zero\u200bwidth", "version": "1"}}, "client.name"),
        ({"memberEpoch": 10**30}, "memberEpoch"),
        ({"metadataVersion": 2**53}, "metadataVersion"),
        ({"ownedShards": [16_384]}, "shard"),
    ],
)
async def test_stored_fields_are_bounded(
    open_client: httpx.AsyncClient, prefix: str, extra: dict[str, Any], field: str
) -> None:
    body = {**hb(prefix, "a", 0), **extra}
    response = await open_client.post("/v1/heartbeat", json=body)
    assert response.status_code == 400, response.text
    assert field in response.text
    producer = {"protocolVersion": 1, "streamPrefix": prefix, "producerId": "p", **extra}
    if "client" in extra or "metadataVersion" in extra:
        response = await open_client.post("/v1/producers/heartbeat", json=producer)
        assert response.status_code == 400, response.text


async def test_unicode_client_names_within_limits_are_kept(
    open_client: httpx.AsyncClient, prefix: str
) -> None:
    body = {**hb(prefix, "a", 0), "client": {"name": "клиент-日本", "version": "1.0"}}
    assert (await open_client.post("/v1/heartbeat", json=body)).status_code == 200
    view = (await open_client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert view["members"][0]["client"] == {"name": "клиент-日本", "version": "1.0", "featureLevel": 1}


async def test_admin_numbers_and_reasons_are_bounded(open_client: httpx.AsyncClient, prefix: str) -> None:
    path = f"/v1/admin/streams/{prefix}"
    assert (await open_client.put(path, json={"shardCount": 1}, auth=ADMIN)).status_code == 200
    for value in (10**30, 1_025, 0):
        response = await open_client.put(f"{path}/groups/g", json={"maxConcurrency": value}, auth=ADMIN)
        assert response.status_code == 400, value
    assert (
        await open_client.put(f"{path}/groups/g", json={"maxConcurrency": 1_024}, auth=ADMIN)
    ).status_code == 200
    for reason in ("deploy\r\nFAKE LOG LINE", "deploy\u2028FAKE", "\u202eyolped"):
        bad = await open_client.post(f"{path}/pause", json={"reason": reason}, auth=ADMIN)
        assert bad.status_code == 400, reason
    assert (await open_client.post(f"{path}/pause", json={"reason": "deploy"}, auth=ADMIN)).status_code == 200


# --- admin logins, audit, bugs ----------------------------------------------------


async def audit_records(client: httpx.AsyncClient, **filters: str) -> list[dict[str, Any]]:
    response = await client.get("/v1/admin/audit", params=filters, auth=ADMIN)
    assert response.status_code == 200, response.text
    records: list[dict[str, Any]] = response.json()["records"]
    return records


async def test_failed_admin_logins_are_throttled_and_audited_once(standalone_url: str) -> None:
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        admin_password="s3cret",
        admin_auth_max_failures=3,
        admin_auth_window_s=1,
    )
    async with serve_on(settings) as client:
        path = "/v1/admin/audit"
        before = len(await audit_records(client, outcome="throttled", limit="1000"))
        for _ in range(3):
            assert (await client.get(path, auth=("admin", "guess"))).status_code == 401
        for _ in range(20):
            blocked = await client.get(path, auth=("admin", "guess"))
            assert blocked.status_code == 429
            assert blocked.json()["error"] == "TOO_MANY_FAILURES"
            assert 1 <= int(blocked.headers["Retry-After"]) <= 1
        # While blocked, even the right password waits: guessing on would otherwise go on.
        assert (await client.get(path, auth=ADMIN)).status_code == 429
        with trio.fail_after(15):  # the window ends; one aggregated record is written
            while (await client.get(path, auth=ADMIN)).status_code == 429:
                await trio.sleep(0.2)
            while len(throttled := await audit_records(client, outcome="throttled", limit="1000")) == before:
                await trio.sleep(0.2)
        assert len(throttled) == before + 1
        assert throttled[0]["count"] >= 21  # and the polls above that were still refused
        assert throttled[0]["status"] == 429
        denied = await audit_records(client, outcome="denied", limit="1000")
        assert sum(1 for r in denied if r["caller"] == "admin") >= 3


async def test_an_unexpected_error_is_a_500_whose_request_id_is_logged(
    standalone_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from rsc.actors.clock import WallClock
    from rsc.actors.deployment import Deployment
    from rsc.actors.effects.redis_effects import RedisEffects
    from rsc.actors.redis_store import RedisStore
    from rsc.actors.registry import RegistrySettings, open_registry
    from rsc.actors.store_connection import open_redis
    from rsc.http.app import create_app

    async with (
        open_redis(standalone_url) as redis,
        open_registry(RedisStore(redis), RedisEffects(redis), WallClock(), RegistrySettings()) as registry,
    ):
        app = create_app(Deployment(registry))

        @app.get("/boom")
        async def boom() -> str:
            raise RuntimeError("a bug")

        response = await app.test_client().get("/boom", headers={"X-Request-Id": "req-4242"})
        assert response.status_code == 500
        body = await response.get_json()
        assert body["error"] == "INTERNAL"
        assert body["requestId"] == "req-4242"
        assert "req-4242" in body["message"]
        logged = [r for r in caplog.records if "req-4242" in r.getMessage()]
        assert len(logged) == 1
        assert logged[0].exc_info is not None  # one traceback, with the id
        assert sum(1 for r in caplog.records if r.exc_info) == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"streamPrefix": "orders\n"},
        {"consumerGroup": "billing\n"},
        {"memberId": "m\n"},
        {"incarnation": "i\n"},
        {"client": {"name": "name\n", "version": "1"}},
        {"client": {"name": "lone \ud800 surrogate", "version": "1"}},
    ],
)
async def test_a_trailing_newline_is_not_a_name(
    open_client: httpx.AsyncClient, extra: dict[str, Any]
) -> None:
    """Python's `$` matches before a final newline: every pattern check must match the whole value."""
    body = json.dumps({**hb("nl", "a", 0), **extra})  # ASCII escapes: a lone surrogate gets through
    response = await open_client.post(
        "/v1/heartbeat", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    producer = {"protocolVersion": 1, "streamPrefix": "nl", "producerId": "p\n"}
    assert (await open_client.post("/v1/producers/heartbeat", json=producer)).status_code == 400


def test_settings_never_show_secrets() -> None:
    """A Settings object that ends up in a log line or a traceback shows no password."""
    settings = Settings(redis_url="redis://user:redis-secret@db:6379/0", admin_password="admin-secret")
    text = repr(settings) + str(settings)
    assert "redis-secret" not in text
    assert "admin-secret" not in text
    assert "redis://user:***@db:6379/0" in text


@pytest.mark.parametrize(
    "name", ["encoded-surrogate.json", "utf16-lone-surrogate.json", "lone-surrogate.json", "nan.json"]
)
async def test_what_is_not_text_is_not_json(open_client: httpx.AsyncClient, name: str) -> None:
    """A surrogate, encoded in UTF-8, escaped, or in UTF-16, can never reach Redis or a log."""
    body = (Path(__file__).parents[1] / "corpus" / name).read_bytes()
    for path in ("/v1/heartbeat", "/v1/producers/heartbeat"):
        response = await open_client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (name, path, response.text)
        assert response.json()["error"] == "MALFORMED_JSON"


async def test_admin_passwords_cannot_be_guessed_through_other_paths(standalone_url: str) -> None:
    """Basic credentials are accepted on views and /metrics too: wrong ones count there as well."""
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, admin_password="s3cret", admin_auth_max_failures=3
    )
    async with serve_on(settings) as client:
        for path in ("/v1/streams", "/metrics", "/nope"):
            assert (await client.get(path, auth=("admin", f"guess-{path}"))).status_code == 401
        blocked = await client.get("/v1/streams", auth=ADMIN)  # even the right one, from here
        assert blocked.status_code == 429
        assert blocked.json()["error"] == "TOO_MANY_FAILURES"
        assert int(blocked.headers["Retry-After"]) >= 1
        assert (await client.get("/v1/admin/audit", auth=ADMIN)).status_code == 429  # one budget
        assert (await client.get("/v1/streams")).status_code == 200  # without Basic: public as ever


async def test_unauthenticated_admin_requests_cannot_flood_the_audit(standalone_url: str) -> None:
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, admin_password="s3cret", admin_auth_max_failures=5
    )
    async with serve_on(settings) as client:
        with redis_py.Redis.from_url(standalone_url) as checker:  # the admin is locked out too
            before = checker.xlen(AUDIT_KEY)
            statuses = [(await client.get("/v1/admin/streams/x")).status_code for _ in range(200)]
            assert statuses[:5] == [401] * 5
            assert set(statuses[5:]) == {429}
            # five records for the five refusals; the 429s wait for one aggregated record
            assert checker.xlen(AUDIT_KEY) == before + 5


async def test_group_creation_by_heartbeat_can_be_off(standalone_url: str, prefix: str) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret", auto_create_groups=False)
    async with serve_on(settings) as client:
        refused = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))  # nor its stream
        assert refused.status_code == 404
        assert (await client.get(f"/v1/streams/{prefix}")).status_code == 404
        assert (
            await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=ADMIN)
        ).is_success
        refused = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))
        assert refused.status_code == 404
        assert refused.json()["error"] == "UNKNOWN_GROUP"
        assert (
            await client.get(f"/v1/streams/{prefix}/groups/billing")
        ).status_code == 404  # reads create nothing
        put = await client.put(f"/v1/admin/streams/{prefix}/groups/billing", json={}, auth=ADMIN)
        assert put.is_success
        assert (await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))).status_code == 200


async def test_where_heartbeats_may_not_create_only_evidence_in_redis_rebuilds_a_lost_stream(
    standalone_url: str, prefix: str
) -> None:
    """With group creation by heartbeat off, a member that claims a layout version (epoch > 0)
    rebuilds nothing on its word alone; shard keys of that stream in Redis (what producers
    routing by a lost layout recreate) are the evidence that Redis lost it."""
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret", auto_create_groups=False)
    async with serve_on(settings) as client:
        claim = hb(prefix, "a", 3, metadataVersion=4)
        refused = await client.post("/v1/heartbeat", json=claim)
        assert (refused.status_code, refused.json()["error"]) == (404, "UNKNOWN_STREAM")
        assert (await client.get(f"/v1/streams/{prefix}")).status_code == 404
        other = f"{prefix}x"
        with redis_py.Redis.from_url(standalone_url) as redis:
            for index in (0, 2):  # index 1 got no entry since the loss
                redis.xadd(shard_key(other, index), {"v": "1"})
        rebuilt = await client.post("/v1/heartbeat", json=hb(other, "a", 3, metadataVersion=4))
        assert rebuilt.status_code == 200, rebuilt.text
        assert rebuilt.json()["status"] == "UNKNOWN_MEMBER"  # it rejoins the recreated group
        routing = (await client.get(f"/v1/streams/{other}/routing")).json()
        assert routing["metadataVersion"] == 5
        assert [s["key"] for s in routing["shards"]] == [shard_key(other, i) for i in range(3)]
        group = (await client.get(f"/v1/admin/streams/{other}/groups/billing", auth=ADMIN)).json()
        assert group["spec"]["startFrom"] == "earliest"  # never `$`: all in it came after the loss


async def test_a_unix_socket_is_local(standalone_url: str, prefix: str, tmp_path: Path) -> None:
    """Protected mode treats a Unix socket peer like loopback: `--bind unix:...` works without credentials."""
    path = tmp_path / "rsc.sock"
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        settings = attrs.evolve(FAST, redis_url=standalone_url)
        await nursery.start(
            lambda task_status: serve(settings, f"unix:{path}", shutdown=shutdown, task_status=task_status)
        )
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        async with httpx.AsyncClient(transport=transport, base_url="http://rsc") as client:
            response = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))
            assert response.status_code == 200, response.text
        shutdown.set()


def test_a_wildcard_bind_advertises_this_hosts_address() -> None:
    import socket

    from rsc.http.standby import default_advertise_url

    assert default_advertise_url(["http://10.1.2.3:8080"]) == "http://10.1.2.3:8080"
    assert default_advertise_url(["http://unix:/tmp/s.sock"]) is None
    advertised = default_advertise_url(["https://0.0.0.0:8443"])
    address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        assert advertised is None  # nothing usable to name: a warning says to set advertise_url
    else:
        assert advertised == f"https://{address}:8443"
