"""`rsc.client` against `serve` over a real socket and real Redis: the HTTP client and two members."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import certifi
import httpx
import pytest
import trio

from rsc.actors.store_connection import open_redis
from rsc.client import admin_api
from rsc.client.admin_api import AdminClient, AdminError
from rsc.client.coordinator import Backoff, Coordinator, Failover, coordinator_urls
from rsc.client.errors import CoordinatorRejected, CoordinatorUnavailable
from rsc.client.member import Member, MemberSettings
from rsc.client.poller import Message
from rsc.client.sync import SyncCoordinator
from rsc.client.worker import App, instance_id
from rsc.events.model import HeartbeatStatus
from rsc.events.wire import HeartbeatRequest
from tests.clientkit import Recorder
from tests.clients.test_member import Log, never_overlapping
from tests.httpkit import FAST, serve_on
from tests.redis_servers import free_port


@pytest.fixture
async def base_url(standalone_url: str) -> AsyncIterator[str]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield str(http.base_url)


async def test_errors_map_to_the_clients_own_exceptions(base_url: str, prefix: str) -> None:
    async with Coordinator(base_url) as coordinator:
        bad = HeartbeatRequest(0, prefix, "billing", "a", "i", 0)
        with pytest.raises(CoordinatorRejected) as rejected:
            await coordinator.heartbeat(bad)
        assert (rejected.value.status, rejected.value.code) == (400, "UNSUPPORTED_PROTOCOL_VERSION")
        assert rejected.value.request_id
        ok = await coordinator.heartbeat(HeartbeatRequest(1, prefix, "billing", "a", "i", 0))
        assert ok.status is HeartbeatStatus.OK
        both = await coordinator.heartbeats([HeartbeatRequest(1, prefix, "billing", "b", "i", 0), bad])
        assert isinstance(both[1], CoordinatorRejected)
        assert both[1].code == "UNSUPPORTED_PROTOCOL_VERSION"
    nobody = f"http://127.0.0.1:{free_port()}"
    async with Coordinator(nobody, retries=2, backoff=Backoff(0.01, 0.02)) as coordinator:
        with pytest.raises(CoordinatorUnavailable):
            await coordinator.heartbeat(HeartbeatRequest(1, prefix, "billing", "a", "i", 0))


async def test_two_members_share_a_stream_and_one_leaves(base_url: str, prefix: str) -> None:
    log: Log = []
    ra, rb = Recorder("a", log), Recorder("b", log)
    async with Coordinator(base_url) as coordinator, trio.open_nursery() as nursery:
        a = Member(coordinator, prefix, "billing", "10.0.0.1/w/0", ra)
        b = Member(coordinator, prefix, "billing", "10.0.0.2/w/0", rb)
        await nursery.start(a.run)
        with trio.fail_after(10):
            while ra.reading != {0, 1, 2, 3}:
                await trio.sleep(0.05)
        await nursery.start(b.run)
        with trio.fail_after(10):
            while not (len(ra.reading) == len(rb.reading) == 2):
                await trio.sleep(0.05)
        b.stop()
        await b.wait_left()
        with trio.fail_after(10):
            while ra.reading != {0, 1, 2, 3}:
                await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=base_url) as http:
            view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
        assert [m["memberId"] for m in view["members"]] == ["10.0.0.1/w/0"]
        a.stop()
    never_overlapping(log)


async def test_an_app_with_concurrency_4_joins_four_members_batched(
    base_url: str, standalone_url: str, prefix: str
) -> None:
    app = App(base_url, standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100))

    @app.listener(stream=prefix, group="billing", concurrency=4, name="orders-worker")
    async def handle(message: Message) -> None:
        return None

    async with httpx.AsyncClient(base_url=base_url) as http, trio.open_nursery() as nursery:
        await nursery.start(app.run)

        async def members() -> list[str]:
            view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
            return sorted(m["memberId"] for m in view.get("members", []) if m["state"] == "STABLE")

        with trio.fail_after(10):
            while len(await members()) != 4:
                await trio.sleep(0.05)
        ip = instance_id()  # no POD_IP here: host name and pid
        assert await members() == [f"{ip}/orders-worker/{i}" for i in range(4)]
        assert sorted(len(m.owned) for m in app.members) == [1, 1, 1, 1]

        async def counts() -> dict[str, float]:
            metrics = (await http.get("/metrics")).text
            found = re.findall(r'rsc_heartbeat_seconds_count\{endpoint="(\w+)"\} (\S+)', metrics)
            return {endpoint: float(count) for endpoint, count in found}

        # Stable: heartbeats travel batched (only long polls, while shards are pending, alone).
        before = await counts()
        await trio.sleep(1)  # ten intervals
        after = await counts()
        assert after["batch"] - before["batch"] >= 5
        assert after.get("single", 0) == before.get("single", 0)
        app.stop()


async def test_max_concurrency_from_the_admin_api_resizes_the_poller(
    standalone_url: str, prefix: str
) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")
    async with serve_on(settings) as http:
        app = App(
            str(http.base_url), standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100)
        )

        @app.listener(stream=prefix, group="billing")
        async def handle(message: Message) -> None:
            return None

        # The stream first: the member's join may not have created it yet, and a group's PUT
        # never creates a stream.
        created = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=("admin", "pw"))
        assert created.status_code == 200
        async with trio.open_nursery() as nursery:
            await nursery.start(app.run)
            poller = app.pollers[0]
            assert poller.workers == 1
            put = await http.put(
                f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 3}, auth=("admin", "pw")
            )
            assert put.status_code == 200
            with trio.fail_after(10):
                while poller.workers != 3:
                    await trio.sleep(0.05)
            assert len(poller.dispatcher.workers) == 3
            await http.put(
                f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 1}, auth=("admin", "pw")
            )
            with trio.fail_after(10):
                while len(poller.dispatcher.workers) != 1:
                    await trio.sleep(0.05)
            app.stop()


async def test_members_not_involved_keep_consuming_while_another_joins(
    base_url: str, standalone_url: str, prefix: str
) -> None:
    handled: list[tuple[float, int]] = []

    def app_for() -> App:
        app = App(base_url, standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100))

        first = not apps  # the second app gets its own listener name: same host, same ip

        @app.listener(stream=prefix, group="billing", concurrency=2 if first else 1, name=f"app-{len(apps)}")
        async def handle(message: Message) -> None:
            handled.append((trio.current_time(), message.shard))

        return app

    apps: list[App] = []
    async with (
        open_redis(standalone_url) as r,
        httpx.AsyncClient(base_url=base_url) as http,
        trio.open_nursery() as nursery,
    ):
        apps.append(app_for())
        await nursery.start(apps[0].run)
        with trio.fail_after(10):
            while sorted(len(m.owned) for m in apps[0].members) != [2, 2]:
                await trio.sleep(0.05)
        keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]

        async def publish() -> None:
            while True:
                for key in keys:
                    await r.xadd(key, {"n": "x"})
                await trio.sleep(0.01)

        nursery.start_soon(publish)
        await trio.sleep(1)
        joined_at = trio.current_time()
        before = {shard: n for n, m in enumerate(apps[0].members) for shard in m.owned}
        samples: list[dict[int, int]] = []  # shard -> which of the first app's members reads it

        async def watch() -> None:
            while True:
                samples.append({shard: n for n, m in enumerate(apps[0].members) for shard in m.owned})
                await trio.sleep(0.01)

        nursery.start_soon(watch)
        apps.append(app_for())
        await nursery.start(apps[1].run)
        with trio.fail_after(10):
            while not apps[1].members[0].owned:
                await trio.sleep(0.05)
        await trio.sleep(1)
        moved = set(apps[1].members[0].owned)
        for app in apps:
            app.stop()
        nursery.cancel_scope.cancel()
    assert len(moved) == 1
    assert len(samples) > 10
    for shard in set(range(4)) - moved:
        # never stopped, never handed to the other member of the app: read by its member throughout
        assert all(sample.get(shard) == before[shard] for sample in samples), shard
        assert any(t > joined_at and s == shard for t, s in handled)  # and handled meanwhile


# --- several coordinators: an active one and standbys ------------------------------


class Counting(httpx.AsyncBaseTransport):
    """A real transport that remembers the address of every request it sends."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(f"{request.url.scheme}://{request.url.netloc.decode()}")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_coordinator_urls_are_a_list_or_comma_separated() -> None:
    assert coordinator_urls("http://a:1, http://b:2/ ,") == ("http://a:1", "http://b:2")
    assert coordinator_urls(["http://a:1/"]) == ("http://a:1",)
    with pytest.raises(ValueError, match="no coordinator URL"):
        coordinator_urls(" , ")


def test_failover_moves_to_the_named_active_or_the_next_and_waits_only_before_a_retry() -> None:
    failover = Failover("http://a:1,http://b:2,http://c:3")
    rejection = CoordinatorRejected(503, "STANDBY", "standby", details={"active": "http://c:3/"})
    failover.failed(0, rejection)
    assert failover.url == "http://c:3"  # named and listed: straight there
    failover.failed(2, CoordinatorRejected(503, "STANDBY", "standby", details={"active": "http://x:9"}))
    assert failover.url == "http://a:1"  # named but not listed: the next one
    failover.failed(2)
    assert failover.url == "http://a:1"  # another call already moved on
    plan = failover.attempts(retries=0, backoff=Backoff(1.0, 1.0), rng=__import__("random").Random(0))
    wait, index = next(plan)
    assert (wait, index) == (0.0, 0)
    failover.failed(index)
    assert next(plan) == (0.0, 1)  # a URL not tried yet in this call: no wait
    failover.failed(1)
    failover.failed(2)
    assert len(list(plan)) == 1  # at least one attempt per URL, then done (retries=0)


async def test_a_client_skips_a_dead_coordinator_and_a_standby(
    base_url: str, standalone_url: str, prefix: str
) -> None:
    active = base_url.rstrip("/")
    dead = f"http://127.0.0.1:{free_port()}"
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as standby_http:
        standby = str(standby_http.base_url).rstrip("/")
        refused = await standby_http.post("/v1/heartbeat", json={})
        assert refused.status_code == 503
        assert refused.json()["details"] == {"active": active}
        transport = Counting()
        async with Coordinator([standby, dead, active], transport=transport, retries=0) as coordinator:
            ok = await coordinator.heartbeat(HeartbeatRequest(1, prefix, "billing", "a", "i", 0))
            assert ok.status is HeartbeatStatus.OK
            assert transport.sent == [standby, active]  # the standby named the active one
            assert coordinator.base_url == active
            await coordinator.heartbeat(HeartbeatRequest(1, prefix, "billing", "a", "i", ok.member_epoch))
            assert transport.sent[-1] == active  # and it stays there
        async with Coordinator(f"{dead},{active}", backoff=Backoff(0.01, 0.02)) as coordinator:
            await coordinator.heartbeat(HeartbeatRequest(1, prefix, "billing", "b", "i", 0))
            assert coordinator.base_url == active

        def sync_routing() -> dict[str, object]:
            with SyncCoordinator(f"{standby}, {dead}, {active}", retries=0) as sync:
                return sync.routing(prefix)

        routing = await trio.to_thread.run_sync(sync_routing)
        assert routing["streamPrefix"] == prefix
    async with Coordinator([dead, standby], retries=1, backoff=Backoff(0.01, 0.02)) as nobody:
        with pytest.raises(CoordinatorUnavailable):
            await nobody.heartbeat(HeartbeatRequest(1, prefix, "billing", "c", "i", 0))


async def test_a_coordinator_outage_is_two_lines_for_all_the_members_of_a_process(
    standalone_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Three members start while nothing listens at the coordinator's address, then it starts:
    one line when heartbeats began to fail and one when they succeed again (with the count of
    failures not logged), for the three together, not a line per member or per retry."""
    caplog.set_level(logging.INFO, "rsc.client.member")
    port = free_port()
    app = App(
        f"http://127.0.0.1:{port}", standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100)
    )

    @app.listener(stream=prefix, group="billing", concurrency=3)
    async def handle(message: Message) -> None:
        return None

    def outage_lines() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "rsc.client.member" and r.levelno >= logging.WARNING
        ]

    done = trio.Event()

    async def run() -> None:
        await app.run()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(2)  # a retry every 0.25 s for each of three members
        assert len(outage_lines()) == 1, outage_lines()
        assert outage_lines()[0].startswith("heartbeats fail, retrying: ")
        settings = attrs.evolve(FAST, redis_url=standalone_url)
        async with serve_on(settings, f"127.0.0.1:{port}"):
            with trio.fail_after(10):
                while len(outage_lines()) < 2:
                    await trio.sleep(0.05)
            assert sorted(len(m.owned) for m in app.members) != [0, 0, 0]
            app.stop()
            with trio.fail_after(10):
                await done.wait()  # they leave while the coordinator answers
    ended = outage_lines()[1]
    repeats = re.search(r"succeed again after [\d.]+ s \((\d+) repeated failures not logged\)", ended)
    assert repeats is not None, ended
    assert int(repeats.group(1)) >= 15, ended


async def test_each_shard_event_is_one_log_line_naming_the_member_and_the_shards(
    standalone_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Assigned, revoked and lost shards are one INFO line each, with the member id and the shard
    indexes (and the epoch for an assignment): what an operator greps for."""
    caplog.set_level(logging.INFO, "rsc.client.member")
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
    )
    port = free_port()
    log: Log = []
    ra, rb = Recorder("a", log), Recorder("b", log)
    async with Coordinator(f"http://127.0.0.1:{port}") as coordinator, trio.open_nursery() as nursery:
        a = Member(coordinator, prefix, "billing", "10.0.0.1/w/0", ra)
        b = Member(coordinator, prefix, "billing", "10.0.0.2/w/0", rb)
        async with serve_on(settings, f"127.0.0.1:{port}"):
            await nursery.start(a.run)
            with trio.fail_after(10):
                while ra.reading != {0, 1, 2, 3}:
                    await trio.sleep(0.05)
            await nursery.start(b.run)
            with trio.fail_after(10):
                while not (len(ra.reading) == len(rb.reading) == 2):
                    await trio.sleep(0.05)
        # The coordinator is gone: past the lease both drop what they hold (self-fencing).
        with trio.fail_after(10):
            while ra.reading or rb.reading:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.name == "rsc.client.member"]
    moved = sorted(next(shards for _, who, what, shards in log if who == "b" and what == "assigned"))
    kept = sorted({0, 1, 2, 3} - set(moved))
    assert "10.0.0.1/w/0: reads shards [0, 1, 2, 3] (epoch 1)" in lines
    assert f"10.0.0.1/w/0: revoking shards {moved}" in lines
    assert any(line.startswith(f"10.0.0.2/w/0: reads shards {moved} (epoch ") for line in lines), lines
    assert (
        f"10.0.0.2/w/0: waits for shards {moved} (their last holder hands them over, or its lease ends)"
        in lines
    )
    assert f"10.0.0.1/w/0: lost shards {kept}" in lines
    assert f"10.0.0.2/w/0: lost shards {moved}" in lines
    assert sum("no heartbeat succeeded within the lease" in line for line in lines) == 2, lines


# --- what the clients refuse before any request, and answers they cannot read ------------------


async def test_a_coordinator_url_no_request_could_use_is_refused_when_constructing() -> None:
    """Not retried with backoff at each call (no scheme) nor `httpx.InvalidURL` (malformed):
    `ValueError` at once, naming the URL (its password hidden) and what is wrong; a later URL
    of the list is checked as well as the first."""
    refused = {
        "localhost:8080": "'localhost:8080' has no scheme: it must start with http:// or https://",
        "127.0.0.1:8080": "'127.0.0.1:8080' has no scheme",
        "http://[::1": r"'http://\[::1' is malformed: Invalid port",
        "http://h:port": "'http://h:port' is malformed",
        "redis://127.0.0.1:6379": "has the scheme 'redis'",
        "http:///v1": "names no host",
        "http://admin:secret@h:99999": r"'http://admin:\*\*\*@h:99999' has a port out of range",
        "http://127.0.0.1:1,127.0.0.1:2": "'127.0.0.1:2' has no scheme",
    }
    for url, why in refused.items():
        for client in (Coordinator, SyncCoordinator):
            with pytest.raises(ValueError, match=why) as error:
                client(url)
            assert "secret" not in str(error.value)
    await Coordinator(["http://127.0.0.1:1", "https://[::1]:8443/base/"]).aclose()  # fine, as before
    SyncCoordinator("http://127.0.0.1:1, https://coordinator.example").close()


def test_a_ca_bundle_that_cannot_be_read_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a bare `OSError`: the client's own error, naming the file and why it cannot be used,
    whether it was given or came from `RSC_CA_BUNDLE` (the coordinator clients:
    `CoordinatorUnavailable`; the admin client: `AdminError` `BAD_CA_BUNDLE`)."""
    missing = tmp_path / "missing.pem"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = {
        str(missing): "No such file or directory",
        str(garbage): r"it holds no certificate \(NO_CERTIFICATE_OR_CRL_FOUND\)",
        str(tmp_path): "Is a directory",
    }
    url = "https://127.0.0.1:1"
    for path, why in cases.items():
        expected = f"cannot use the CA bundle '{re.escape(path)}': {why}"
        for client in (Coordinator, SyncCoordinator):
            with pytest.raises(CoordinatorUnavailable, match=expected):
                client(url, ca_bundle=path)
        with pytest.raises(AdminError, match=expected) as refused:
            AdminClient(url, password="pw", ca_bundle=path)
        assert (refused.value.status, refused.value.code) == (0, "BAD_CA_BUNDLE")
    monkeypatch.setenv("RSC_CA_BUNDLE", str(missing))
    with pytest.raises(CoordinatorUnavailable, match=re.escape(str(missing))):
        SyncCoordinator(url)
    with pytest.raises(AdminError, match=re.escape(str(missing))):
        AdminClient(url, password="pw")
    monkeypatch.setenv("RSC_CA_BUNDLE", certifi.where())  # a readable bundle: fine, as before
    SyncCoordinator(url).close()
    AdminClient(url, password="pw").close()


async def test_an_admin_answer_that_is_not_json_is_an_admin_error(standalone_url: str) -> None:
    """A 2xx answer the admin client cannot read (here the coordinator's metrics, text) leaves as
    `AdminError` with its status and `NOT_JSON`, as every other failure, not a bare `ValueError`."""
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as http:
        url = str(http.base_url)

        def read_metrics() -> AdminError:
            with AdminClient(url, password="pw") as admin:
                assert admin.request("GET", "/v1/streams").status == 200  # JSON: read as before
                with pytest.raises(AdminError) as failed:
                    admin.request("GET", "/metrics")
                return failed.value

        error = await trio.to_thread.run_sync(read_metrics)
    assert (error.status, error.code) == (200, "NOT_JSON")
    assert "GET /metrics" in error.message
    assert "is not JSON (text/plain" in error.message


async def test_a_404_suggests_the_base_url_only_when_it_is_not_a_coordinators(standalone_url: str) -> None:
    """A 404 under a base URL that is not a coordinator's (here with `/v1` added) says so; a 404 of
    a resource that does not exist keeps the coordinator's own message. Told apart by asking
    `/v1/version`, not by the words of the 404."""
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as http:
        url = str(http.base_url).rstrip("/")

        def both() -> tuple[AdminError, AdminError]:
            errors = []
            for base, path in ((f"{url}/v1", "/v1/streams/nope"), (url, "/v1/admin/no-such-resource")):
                with AdminClient(base, password="pw") as admin, pytest.raises(AdminError) as failed:
                    admin.request("GET", path)
                errors.append(failed.value)
            return errors[0], errors[1]

        wrong_base, missing = await trio.to_thread.run_sync(both)
    assert (wrong_base.status, wrong_base.code) == (404, "NOT_FOUND")
    assert "is it the coordinator's base URL (without /v1)?" in wrong_base.message
    assert (missing.status, missing.code) == (404, "NOT_FOUND")  # an unknown path of a coordinator
    assert "base URL" not in missing.message


async def test_the_admin_client_reads_a_list_whole_page_by_page(
    standalone_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`streams()` follows `nextCursor` to the end: what `rsc apply --prune` compares against is
    every stream, never one page of them."""
    monkeypatch.setattr(admin_api, "PAGE_SIZE", 2)
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as http:
        url = str(http.base_url)
        for i in range(5):
            put = await http.put(
                f"/v1/admin/streams/{prefix}-{i}", json={"shardCount": 1}, auth=("admin", "pw")
            )
            assert put.status_code in (200, 201)
        whole = [s["streamPrefix"] for s in (await http.get("/v1/streams")).json()["streams"]]

        def listed() -> list[str]:
            with AdminClient(url, password="pw") as admin:
                return [s["streamPrefix"] for s in admin.streams()]

        names = await trio.to_thread.run_sync(listed)
    assert names == whole
    assert [n for n in names if n.startswith(prefix)] == [f"{prefix}-{i}" for i in range(5)]


async def test_the_admin_client_reads_more_audit_records_than_a_page_holds(
    standalone_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_api, "PAGE_SIZE", 2)
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as http:
        url = str(http.base_url)
        for i in range(5):
            await http.get(f"/v1/admin/streams/{prefix}-{i}", auth=("admin", "pw"))
        path = f"/v1/admin/streams/{prefix}"

        def read(limit: int) -> list[str]:
            with AdminClient(url, password="pw") as admin:
                return [r["path"] for r in admin.audit(pathPrefix=path, limit=limit)]

        assert await trio.to_thread.run_sync(read, 4) == [f"{path}-{i}" for i in (4, 3, 2, 1)]
        assert await trio.to_thread.run_sync(read, 50) == [f"{path}-{i}" for i in (4, 3, 2, 1, 0)]
