"""One active coordinator per Redis, hot standbys, no split brain (issue 11, item 6).

Three tiers:

* the lease alone: `Leadership` over `MemoryLease` under trio's MockClock
  (acquire, renew, expiry, token growth, a partitioned or paused holder),
  and the Lua scripts of `RedisLease` on real Redis;
* two coordinators in this process on one Redis, one of them reaching Redis
  through a TCP proxy that the test partitions;
* two `rsc serve` child processes with members heartbeating over HTTP to
  both URLs: kill -9 of the active, and SIGSTOP / SIGCONT of the active. A
  history checker proves that no shard was ever valid for two members at
  once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from rsc import journal
from rsc.actors.effects.redis_effects import RedisEffects
from rsc.actors.errors import StoreUnavailable, TermFenced
from rsc.actors.keys import COORDINATOR_LEASE_KEY, owner_key
from rsc.actors.leadership import (
    Acquired,
    Held,
    Leadership,
    LeaseBackend,
    LeaseHolder,
    MemoryLease,
    RedisLease,
)
from rsc.actors.redis_store import RedisStore
from rsc.actors.store_connection import RedisClient, open_redis
from rsc.client.coordinator import Backoff, Coordinator
from rsc.client.member import Member
from rsc.config import Settings
from rsc.coordinator_process import serve
from rsc.events import codec
from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import ClientInfo
from rsc.events.wire import HeartbeatResponse, OwnerToken
from tests import redis_servers
from tests.clientkit import Recorder
from tests.clients.test_member import Log, never_overlapping
from tests.httpkit import FAST

TTL_MS = 3_000
TTL_S = TTL_MS / 1000


# --- the lease alone, under the MockClock ----------------------------------------------


@attrs.define
class Partitionable:
    """A `LeaseBackend` in front of another whose calls can be held up (a partition: they reach the
    lease only once it heals) or fail at once (Redis down)."""

    inner: LeaseBackend
    fail: bool = False
    healed: trio.Event | None = None

    def partition(self) -> None:
        self.healed = trio.Event()

    def heal(self) -> None:
        if self.healed is not None:
            self.healed.set()
        self.healed = None

    async def _gate(self) -> None:
        if self.healed is not None:
            await self.healed.wait()
        if self.fail:
            raise StoreUnavailable("Redis is down (test)")

    async def acquire(self, holder: str, url: str | None, ttl_ms: int, floor: int = 0) -> Acquired | Held:
        await self._gate()
        return await self.inner.acquire(holder, url, ttl_ms, floor)

    async def retake(self, holder: str, url: str | None, ttl_ms: int, floor: int) -> int | None:
        await self._gate()
        return await self.inner.retake(holder, url, ttl_ms, floor)

    async def renew(self, holder: str, token: int, url: str | None, ttl_ms: int) -> bool:
        await self._gate()
        return await self.inner.renew(holder, token, url, ttl_ms)

    async def release(self, holder: str, token: int) -> None:
        await self._gate()
        await self.inner.release(holder, token)

    async def current(self) -> LeaseHolder | None:
        return await self.inner.current()


@attrs.define
class Watch:
    """When each term of one `Leadership` ended (trio's clock)."""

    ended: list[float] = attrs.field(factory=list)

    def __call__(self) -> None:
        self.ended.append(trio.current_time())


def leader(backend: LeaseBackend, name: str) -> Leadership:
    return Leadership(backend, TTL_MS, holder_id=name, advertise_url=f"http://{name}:8080")


async def wait_active(leadership: Leadership, timeout_s: float = 30.0) -> float:
    """Wait until `leadership` is active; the time it became so."""
    with trio.fail_after(timeout_s):
        while not leadership.active:
            await trio.sleep(0.01)
    term = leadership.term
    assert term is not None
    return term.started_at


async def test_one_holder_renews_and_a_standby_waits(autojump_clock: trio.testing.MockClock) -> None:
    lease = MemoryLease()
    a, b = leader(lease, "a"), leader(lease, "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        assert a.active
        assert a.token() == 1
        await nursery.start(b.run)
        assert not b.active
        with pytest.raises(TermFenced):
            b.token()
        await trio.sleep(10 * TTL_S)
        assert a.active
        assert a.token() == 1
        assert a.terms == 1
        assert not b.active
        assert b.active_elsewhere() == "http://a:8080"
        assert a.active_elsewhere() is None
        nursery.cancel_scope.cancel()


async def start_crashable(nursery: trio.Nursery, leadership: Leadership) -> trio.CancelScope:
    """Run `leadership` in `nursery`; cancelling the scope returned ends it without a release (a crash)."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await leadership.run(task_status=task_status)

    await nursery.start(run)
    return scope


async def test_a_crashed_holder_is_replaced_within_a_ttl_with_a_higher_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = MemoryLease()
    a, b = leader(lease, "a"), leader(lease, "b")
    async with trio.open_nursery() as nursery:
        a_scope = await start_crashable(nursery, a)
        await nursery.start(b.run)
        await trio.sleep(1.0)
        crashed = trio.current_time()
        a_scope.cancel()  # no release: the lease runs out by itself
        took_over = await wait_active(b)
        assert b.token() == 2
        assert crashed < took_over <= crashed + TTL_S + TTL_S / 4
        nursery.cancel_scope.cancel()


async def test_a_partitioned_holder_stops_before_its_lease_can_pass(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = MemoryLease()
    to_a = Partitionable(lease)
    a, b = leader(to_a, "a"), leader(lease, "b")
    watch = Watch()
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run, watch)
        await nursery.start(b.run)
        await trio.sleep(2.0)
        to_a.partition()  # renewals are sent and not answered
        took_over = await wait_active(b)
        assert watch.ended, "a's term must have ended"
        assert watch.ended[0] < took_over  # no moment with two active coordinators
        assert took_over - watch.ended[0] >= a.margin_s * 0.99
        assert not a.active
        to_a.heal()
        await trio.sleep(TTL_S)
        assert not a.active
        assert a.active_elsewhere() == "http://b:8080"
        nursery.cancel_scope.cancel()


async def test_a_holder_resumed_after_a_pause_sees_its_term_over_before_anything_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = MemoryLease()
    a = leader(lease, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await trio.sleep(1.0)
        assert a.active
        autojump_clock.jump(TTL_S)  # SIGSTOP ... SIGCONT: no task has run in between
        assert not a.active
        with pytest.raises(TermFenced):
            a.token()
        nursery.cancel_scope.cancel()


async def test_redis_down_briefly_keeps_the_term_and_longer_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lease = MemoryLease()
    to_a = Partitionable(lease)
    a = leader(to_a, "a")
    watch = Watch()
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run, watch)
        await trio.sleep(1.0)
        to_a.fail = True
        await trio.sleep(TTL_S / 3)  # one failed renewal; retried soon
        to_a.fail = False
        await trio.sleep(TTL_S)
        assert a.active
        assert a.token() == 1
        assert not watch.ended
        to_a.fail = True
        await trio.sleep(TTL_S)
        assert not a.active
        assert len(watch.ended) == 1
        to_a.fail = False
        await wait_active(a)
        assert a.token() == 2  # a new term has a new token, even for the same holder
        nursery.cancel_scope.cancel()


async def test_release_hands_over_at_once(autojump_clock: trio.testing.MockClock) -> None:
    lease = MemoryLease()
    a, b = leader(lease, "a"), leader(lease, "b")
    async with trio.open_nursery() as nursery:
        a_scope = await start_crashable(nursery, a)
        await nursery.start(b.run)
        await trio.sleep(1.0)
        a_scope.cancel()
        await a.release()
        released = trio.current_time()
        took_over = await wait_active(b)
        assert took_over - released <= TTL_S / 4 + 0.01
        nursery.cancel_scope.cancel()


# --- the Lua scripts on real Redis ---------------------------------------------------


@pytest.fixture
async def lease_redis(redis_url: str) -> AsyncIterator[RedisClient]:
    async with open_redis(redis_url) as client:
        yield client
        await client.delete([COORDINATOR_LEASE_KEY])  # leave no lease for the next test's coordinator


async def test_redis_lease_acquire_renew_expire_release(lease_redis: RedisClient) -> None:
    await lease_redis.delete([COORDINATOR_LEASE_KEY])
    lease = RedisLease(lease_redis)
    first = await lease.acquire("a", "http://a:1", 300)
    assert isinstance(first, Acquired)
    held = await lease.acquire("b", None, 300)
    assert isinstance(held, Held)
    assert held.by == LeaseHolder("a", first.token, "http://a:1")
    assert 0 < held.remaining_s <= 0.3
    assert await lease.renew("a", first.token, "http://a:2", 300)
    assert (await lease.current()) == LeaseHolder("a", first.token, "http://a:2")
    assert not await lease.renew("a", first.token + 1, None, 300)  # another term's token
    assert not await lease.renew("b", first.token, None, 300)  # another holder
    await lease.release("b", first.token)  # not b's: nothing happens
    assert (await lease.current()) is not None
    await trio.sleep(0.35)  # expired
    assert not await lease.renew("a", first.token, None, 300)
    second = await lease.acquire("b", None, 300)
    assert isinstance(second, Acquired)
    assert second.token > first.token
    assert (await lease.current()) == LeaseHolder("b", second.token, None)
    again = await lease.acquire("b", None, 300)  # the holder itself: a new term, a new token
    assert isinstance(again, Acquired)
    assert again.token > second.token
    await lease.release("b", again.token)
    assert (await lease.current()) is None


async def test_data_plane_effects_are_written_only_in_an_active_term(
    lease_redis: RedisClient, prefix: str
) -> None:
    lease = MemoryLease()
    leadership = leader(lease, "a")
    effects = RedisEffects(lease_redis, fence_token=leadership.token)
    shard = f"{prefix}:{{{prefix}:0}}"
    token = OwnerToken("10.0.0.1/w/0", "inc", 1)
    with pytest.raises(TermFenced):  # a standby (no term yet)
        await effects.set_owners("billing", {shard: token})
    assert await lease_redis.hget(owner_key(shard), "billing") is None
    async with trio.open_nursery() as nursery:
        await nursery.start(leadership.run)
        await effects.set_owners("billing", {shard: token})
        assert await effects.owners("billing", [shard]) == {shard: token}
        nursery.cancel_scope.cancel()


# --- two coordinators in one process ---------------------------------------------------


class RedisProxy:
    """A TCP proxy to Redis that the test can partition: bytes stop flowing both ways until it heals."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.healed = trio.Event()
        self.healed.set()

    def partition(self) -> None:
        self.healed = trio.Event()

    def heal(self) -> None:
        self.healed.set()

    async def run(self, *, task_status: trio.TaskStatus[str]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"redis://127.0.0.1:{port}")
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, client: trio.SocketStream) -> None:
        async with (
            client,
            await trio.open_tcp_stream("127.0.0.1", self.upstream_port) as upstream,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65_536):
                await self.healed.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


async def start_coordinator(nursery: trio.Nursery, settings: Settings) -> tuple[str, trio.Event]:
    """`serve` in `nursery`; its URL and the event that stops it gracefully."""
    shutdown = trio.Event()
    urls = await nursery.start(
        lambda task_status: serve(settings, "127.0.0.1:0", shutdown=shutdown, task_status=task_status)
    )
    return str(urls[0]), shutdown


async def wait_ready(http: httpx.AsyncClient, url: str, timeout_s: float = 10.0) -> float:
    """Poll `url`/readyz until it answers 200; the time it did."""
    with trio.fail_after(timeout_s):
        while True:
            try:
                if (await http.get(f"{url}/readyz", timeout=0.3)).status_code == 200:
                    return trio.current_time()
            except httpx.HTTPError:
                pass
            await trio.sleep(0.02)


async def standby_answer(
    http: httpx.AsyncClient, url: str, names: str | None, timeout_s: float = 10.0
) -> None:
    """Wait until `url` answers /readyz as a standby naming `names` as the active coordinator."""
    with trio.fail_after(timeout_s):
        while True:
            response = await http.get(f"{url}/readyz", timeout=3)
            if response.status_code == 503 and response.json()["details"] == {"active": names}:
                assert response.json()["error"] == "STANDBY"
                assert response.headers["Retry-After"] == "1"
                return
            await trio.sleep(0.05)


async def verify_journals(url: str) -> None:
    async with open_redis(url) as client:
        store = RedisStore(client)
        verdicts = [await journal.verify(store, a) for a in await journal.every_aggregate(client, store)]
    assert verdicts
    assert all(v.ok for v in verdicts), verdicts


async def assert_standby_probes(http: httpx.AsyncClient, url: str) -> None:
    """A standby refuses the protocol with 503 STANDBY; probes of the process itself still answer."""
    beat = await http.post(f"{url}/v1/heartbeat", json={"protocolVersion": 1})
    assert (beat.status_code, beat.json()["error"]) == (503, "STANDBY")
    for path in ("/healthz", "/v1/version", "/metrics", "/openapi.json"):
        assert (await http.get(url + path)).status_code == 200, path


async def wait_using(coordinator: Coordinator, url: str) -> None:
    """Wait until the client has moved to `url`, then a few heartbeats more."""
    with trio.fail_after(5):
        while coordinator.base_url != url:
            await trio.sleep(0.05)
    await trio.sleep(0.5)


@attrs.define
class TwoMembers:
    """Two `rsc.client` members on one failover-capable `Coordinator`, with their lifecycle log."""

    coordinator: Coordinator
    log: Log = attrs.field(factory=list)
    members: list[Member] = attrs.field(factory=list)
    readers: list[Recorder] = attrs.field(factory=list)

    async def start(self, nursery: trio.Nursery, prefix: str) -> None:
        for n in (1, 2):
            reader = Recorder(f"m{n}", self.log)
            member = Member(self.coordinator, prefix, "billing", f"10.0.0.{n}/w/0", reader)
            await nursery.start(member.run)
            self.members.append(member)
            self.readers.append(reader)
        with trio.fail_after(10):
            while not all(len(r.reading) == 2 for r in self.readers):
                await trio.sleep(0.05)

    def now(self) -> tuple[Any, ...]:
        """What must not change across a takeover: epochs and the shards each member reads."""
        return tuple((m.epoch, frozenset(r.reading)) for m, r in zip(self.members, self.readers, strict=True))

    async def stop(self) -> None:
        for member in self.members:
            member.stop()
        for member in self.members:
            await member.wait_left()
        await self.coordinator.aclose()


async def test_two_coordinators_in_one_process_standby_partition_and_handover(prefix: str) -> None:
    with redis_servers.standalone() as redis_url:  # a private Redis: this test owns its lease
        settings = attrs.evolve(FAST, redis_url=redis_url, coordinator_lease_ttl_ms=1_000)
        ttl_s = settings.coordinator_lease_ttl_ms / 1000
        proxy = RedisProxy(int(redis_url.rsplit(":", 1)[1]))
        async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
            proxied = await nursery.start(proxy.run)
            a_url, _ = await start_coordinator(nursery, attrs.evolve(settings, redis_url=proxied))
            b_url, stop_b = await start_coordinator(nursery, settings)

            # 1. b is a standby naming a; members listing b first move to a at once
            await standby_answer(http, b_url, a_url)
            await assert_standby_probes(http, b_url)
            pair = TwoMembers(Coordinator([b_url, a_url], timeout_s=0.5, backoff=Backoff(0.02, 0.2)))
            await pair.start(nursery, prefix)
            assert pair.coordinator.base_url == a_url  # the standby named the active one
            before = pair.now()

            # 2. a loses Redis: its term ends, the lease expires, b takes over
            partitioned = trio.current_time()
            proxy.partition()
            took_over = await wait_ready(http, b_url) - partitioned
            print(f"takeover after a partition of the active: {took_over:.2f} s (lease ttl {ttl_s} s)")
            assert took_over <= 3 * ttl_s
            await standby_answer(http, a_url, None)  # a cannot see who is active
            await wait_using(pair.coordinator, b_url)

            # 3. healed: a stays a standby and names b
            proxy.heal()
            await standby_answer(http, a_url, b_url)

            # 4. b stops gracefully: it releases the lease and a takes over at once
            stopped = trio.current_time()
            stop_b.set()
            handed_over = await wait_ready(http, a_url) - stopped
            print(f"takeover after a graceful stop of the active: {handed_over:.2f} s")
            assert handed_over <= ttl_s
            await wait_using(pair.coordinator, a_url)

            # nobody was fenced, nobody lost a shard, no shard was read by two members
            assert pair.now() == before
            assert [entry for entry in pair.log if entry[2] == "lost"] == []
            assert [m.self_fenced for m in pair.members] == [0, 0]
            never_overlapping(pair.log)
            await pair.stop()
            nursery.cancel_scope.cancel()
        await verify_journals(redis_url)


# --- two `rsc serve` processes, members over HTTP, a history checker ------------------

MEMBER_LEASE_S = 3.0
PROCESS_ENV = {
    "RSC_HEARTBEAT_INTERVAL_MS": "200",
    "RSC_MEMBER_LEASE_TTL_MS": str(int(MEMBER_LEASE_S * 1000)),
    "RSC_TICK_INTERVAL_MS": "100",
    "RSC_COORDINATOR_LEASE_TTL_MS": "1000",
    "RSC_DEFAULT_SHARD_COUNT": "8",
}


@attrs.frozen
class Answer:
    """One heartbeat answered with 200: who asked, when (sent, received), which coordinator, what it got."""

    member: str
    sent: float
    received: float
    url: str
    status: str
    #: The shards the member may read from this answer on (`assigned`; nothing when FENCED).
    assigned: frozenset[int]


class RawMember:
    """The shipped member machine over hand-made HTTP (httpx, camelCase JSON), with every
    coordinator URL.

    It finishes revokes at once (stopping a shard takes no time here), and on a failed
    request or a 503 moves to the active coordinator a standby named, else to the other URL.
    """

    def __init__(self, http: httpx.AsyncClient, urls: list[str], prefix: str, name: str) -> None:
        self.http = http
        self.urls = urls
        self.current = 0
        settings = MemberSettings(
            heartbeat_interval_ms=int(PROCESS_ENV["RSC_HEARTBEAT_INTERVAL_MS"]),
            lease_ttl_ms=int(MEMBER_LEASE_S * 1000),
            retry_interval_s=0.05,
        )
        self.machine = MemberMachine(
            prefix, "billing", f"10.0.0.9/{name}/0", uuid.uuid4().hex, ClientInfo("raw", "1"), settings
        )
        self.member_id = self.machine.member_id
        self.answers: list[Answer] = []

    @property
    def owned(self) -> frozenset[int]:
        return self.machine.owned

    def request(self) -> dict[str, Any]:
        body: dict[str, Any] = codec.wire.unstructure(self.machine.preview())
        return body

    async def run(self) -> None:
        machine = self.machine
        while True:
            now = trio.current_time()
            machine.silent(now)
            if machine.next_heartbeat_at(now) > now:
                await trio.sleep(machine.next_heartbeat_at(now) - now)
                continue
            request = machine.request(now)
            url = self.urls[self.current]
            try:
                response = await self.http.post(
                    f"{url}/v1/heartbeat", json=codec.wire.unstructure(request), timeout=0.5
                )
            except httpx.HTTPError as exc:
                machine.failed(request, trio.current_time(), str(exc))
                self.move(None)
                continue
            if response.status_code == 503:
                machine.failed(request, trio.current_time(), "503")
                self.move(response.json().get("details"))
                continue
            assert response.status_code == 200, response.text
            answer = codec.wire.structure(response.json(), HeartbeatResponse)
            assigned = (
                answer.assignment.assigned
                if answer.status.value not in ("FENCED", "UNKNOWN_MEMBER")
                else frozenset()
            )
            self.record(now, url, answer.status.value, assigned)
            machine.receive(request, answer, trio.current_time())
            machine.revoked(machine.revoking)  # in-flight work finishes at once here

    def move(self, details: Any) -> None:
        active = details.get("active") if isinstance(details, dict) else None
        if active in self.urls:
            self.current = self.urls.index(active)
        else:
            self.current = (self.current + 1) % len(self.urls)

    def record(self, sent: float, url: str, status: str, assigned: frozenset[int]) -> None:
        self.answers.append(Answer(self.member_id, sent, trio.current_time(), url, status, assigned))


@attrs.frozen
class Holding:
    member: str
    shard: int
    start: float
    end: float
    url: str


def holdings(answers: list[Answer], lease_s: float, until: float) -> Iterator[Holding]:
    """What each answer let its member read: its `assigned` shards, from the answer's receipt until
    the member's next answer arrives, or its lease (counted from the request's send time) ends."""
    for i, answer in enumerate(answers):
        following = answers[i + 1].received if i + 1 < len(answers) else until
        end = min(following, answer.sent + lease_s)
        for shard in answer.assigned:
            yield Holding(answer.member, shard, answer.received, end, answer.url)


def double_ownerships(
    histories: list[list[Answer]], lease_s: float, until: float
) -> list[tuple[Holding, Holding]]:
    """Every pair of holdings of one shard by two members at overlapping times (should be none).

    `histories` holds each member's answers in order.
    """
    by_shard: dict[int, list[Holding]] = {}
    for answers in histories:
        for holding in holdings(answers, lease_s, until):
            by_shard.setdefault(holding.shard, []).append(holding)
    overlaps = []
    for shard_holdings in by_shard.values():
        shard_holdings.sort(key=lambda h: h.start)
        for i, first in enumerate(shard_holdings):
            for second in shard_holdings[i + 1 :]:
                if second.start >= first.end:
                    break
                if second.member != first.member:
                    overlaps.append((first, second))
    return overlaps


def test_the_history_checker_finds_overlaps_and_only_them() -> None:
    def ok(member: str, sent: float, received: float, *shards: int) -> Answer:
        return Answer(member, sent, received, "x", "OK", frozenset(shards))

    a = [ok("a", 0.0, 0.1, 1, 2), ok("a", 1.0, 1.1, 2)]
    assert double_ownerships([a, [ok("b", 1.05, 1.2, 1)]], MEMBER_LEASE_S, 5.0) == []  # a let 1 go at 1.1
    overlaps = double_ownerships([a, [ok("b", 0.9, 1.0, 1)]], MEMBER_LEASE_S, 5.0)
    assert [(x.member, y.member, x.shard) for x, y in overlaps] == [("a", "b", 1)]  # from 1.0 to 1.1
    late = [ok("b", 3.5, 3.6, 1)]
    assert double_ownerships([[ok("a", 0.0, 0.1, 1)], late], MEMBER_LEASE_S, 5.0) == []  # a's lease: 3.0


@attrs.frozen
class ServeProcess:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def rsc_serve(redis_url: str, tmp_path: Path, name: str) -> Iterator[ServeProcess]:
    """`rsc serve` as a child process with the short leases of `PROCESS_ENV`; killed at the end."""
    port = redis_servers.free_port()
    env = {**os.environ, **PROCESS_ENV, "RSC_REDIS_URL": redis_url}
    log_path = tmp_path / f"{name}.log"
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield ServeProcess(name, f"http://127.0.0.1:{port}", process, log_path)
    finally:
        process.kill()  # also ends a stopped process
        process.wait()


async def wait_up(http: httpx.AsyncClient, server: ServeProcess, timeout_s: float = 30.0) -> None:
    with trio.fail_after(timeout_s):
        while True:
            assert server.process.poll() is None, server.log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{server.url}/healthz", timeout=1)).status_code == 200:
                    return
            await trio.sleep(0.05)


async def settle(members: list[RawMember], shards: int = 8, timeout_s: float = 15.0) -> None:
    """Wait until every member holds its fair share and the last answer of each is OK."""
    with trio.fail_after(timeout_s):
        while not (
            all(m.answers and m.answers[-1].status == "OK" for m in members)
            and sorted(len(m.owned) for m in members) == [shards // len(members)] * len(members)
        ):
            await trio.sleep(0.05)


def takeover_report(members: list[RawMember], faulted: float, url: str) -> tuple[float, float]:
    """Seconds from the fault to the first answer from `url`, and the longest gap any member saw."""
    first = min(a.received for m in members for a in m.answers if a.url == url and a.received > faulted)
    gaps = []
    for member in members:
        times = [a.received for a in member.answers]
        gaps += [later - earlier for earlier, later in itertools.pairwise(times) if later > faulted]
    return first - faulted, max(gaps)


@attrs.define
class Stale:
    done: trio.Event = attrs.field(factory=trio.Event)
    status: int = 0
    error: str | None = None


async def stale_heartbeat(
    http: httpx.AsyncClient, url: str, member: RawMember, *, task_status: trio.TaskStatus[Stale]
) -> None:
    """Send `member`'s next heartbeat to `url` and wait long for its answer (the server is paused)."""
    stale = Stale()
    task_status.started(stale)
    response = await http.post(f"{url}/v1/heartbeat", json=member.request(), timeout=30)
    stale.status, stale.error = response.status_code, response.json().get("error")
    stale.done.set()


@pytest.mark.parametrize("fault", ["kill -9", "SIGSTOP"])
async def test_two_serve_processes_hand_over_without_double_ownership(
    fault: str, prefix: str, tmp_path: Path
) -> None:
    ttl_s = int(PROCESS_ENV["RSC_COORDINATOR_LEASE_TTL_MS"]) / 1000
    with redis_servers.standalone() as redis_url, rsc_serve(redis_url, tmp_path, "a") as a:
        try:
            async with httpx.AsyncClient() as http:
                await wait_up(http, a)
                await wait_ready(http, a.url)
                with rsc_serve(redis_url, tmp_path, "b") as b:
                    await wait_up(http, b)
                    await standby_answer(http, b.url, a.url)
                    members = [
                        RawMember(http, [a.url, b.url] if i % 2 else [b.url, a.url], prefix, f"w{i}")
                        for i in range(4)
                    ]
                    async with trio.open_nursery() as nursery:
                        for member in members:
                            nursery.start_soon(member.run)
                        await settle(members)
                        faulted = trio.current_time()
                        if fault == "kill -9":
                            a.process.kill()
                        else:
                            a.process.send_signal(signal.SIGSTOP)
                            # a steady heartbeat that waits in a's socket until it resumes
                            stale = await nursery.start(stale_heartbeat, http, a.url, members[1])
                        ready = await wait_ready(http, b.url) - faulted
                        resumed = float("inf")
                        if fault == "SIGSTOP":
                            await trio.sleep(1.5)
                            resumed = trio.current_time()
                            a.process.send_signal(signal.SIGCONT)
                            await standby_answer(http, a.url, b.url)  # it knows it is deposed
                            with trio.fail_after(5):
                                await stale.done.wait()
                            assert (stale.status, stale.error) == (503, "STANDBY")
                        await trio.sleep(1.0)
                        await settle(members)
                        until = trio.current_time()
                        nursery.cancel_scope.cancel()
        except BaseException:
            for server in ("a", "b"):
                path = tmp_path / f"{server}.log"
                print(f"--- {server}.log\n{path.read_text() if path.exists() else ''}")
            raise
        await verify_journals(redis_url)
    first_answer, longest_gap = takeover_report(members, faulted, b.url)
    print(
        f"{fault} of the active coordinator: standby ready after {ready:.2f} s, first member answer "
        f"after {first_answer:.2f} s, longest gap between a member's answers {longest_gap:.2f} s "
        f"(coordinator lease {ttl_s} s)"
    )
    histories = [m.answers for m in members]
    assert double_ownerships(histories, MEMBER_LEASE_S, until) == []
    assert not [x for h in histories for x in h if x.status in ("FENCED", "UNKNOWN_MEMBER")]
    assert not [x for h in histories for x in h if x.url == a.url and x.received > resumed]
    assert ready <= 3 * ttl_s


async def test_owner_tokens_are_fenced_in_the_shard_slot(redis: RedisClient, prefix: str) -> None:
    """A deposed coordinator that passed its term check just before a pause cannot overwrite the
    owner tokens its successor wrote: the write itself checks the coordinator token, next to the
    shard key (so on a cluster too)."""
    from rsc.actors.effects.redis_effects import RedisEffects
    from rsc.events.wire import OwnerToken

    key = f"{prefix}:0"
    new = RedisEffects(redis, fence_token=lambda: 7)
    old = RedisEffects(redis, fence_token=lambda: 6)
    mine, theirs = OwnerToken("b", "inc-b", 3), OwnerToken("a", "inc-a", 2)
    await new.set_owners("billing", {key: mine})
    with pytest.raises(TermFenced) as fenced:
        await old.set_owners("billing", {key: theirs})
    assert fenced.value.fence == 7  # the stored fence, the figure the refusal carries
    with pytest.raises(TermFenced):
        await old.clear_owners("billing", {key: mine})
    with pytest.raises(TermFenced):
        await old.sync_owners("billing", [key], {})
    assert await new.owners("billing", [key]) == {key: mine}  # untouched by the deposed one
    await RedisEffects(redis, fence_token=lambda: 8).clear_owners("billing", {key: mine})  # a newer term
    assert await new.owners("billing", [key]) == {}
    with pytest.raises(TermFenced):  # and now the one before it is deposed too
        await new.set_owners("billing", {key: mine})
    await RedisEffects(redis).set_owners("billing", {key: mine})  # tools without a term: unfenced
    assert await new.owners("billing", [key]) == {key: mine}
