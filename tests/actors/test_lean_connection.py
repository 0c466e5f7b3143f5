"""The coordinator's lean multiplexed connection (`rsc.resp.Multiplexed`, `open_lean`): many
tasks on one connection each get their own replies in order, a cancelled caller leaves the
connection in step, a Redis that stops answering or closes the connection fails every waiting
caller as an outage and the next call connects afresh, and error replies come as the coredis
classes the coordinator classifies (by code)."""

from __future__ import annotations

import functools
import subprocess

import coredis
import pytest
import redis
import trio

from rsc.actors.errors import StoreUnavailable
from rsc.actors.store_connection import Scripts, open_lean, open_redis, redis_errors
from rsc.lua import script
from rsc.redis_errors import error_code
from rsc.resp import Endpoint, Multiplexed
from tests import redis_servers


def connections(url: str) -> int:
    """How many clients are connected to `url`, but the one asking."""
    with redis.Redis.from_url(url) as r:
        return len(r.client_list()) - 1


async def test_many_callers_share_one_connection_and_each_gets_its_replies(
    standalone_url: str, prefix: str
) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        before = connections(standalone_url)
        got: dict[int, list[object]] = {}

        async def one(i: int) -> None:
            key = f"{prefix}:{i}"
            got[i] = await lean.call([("SET", key, f"v{i}"), ("GET", key), ("STRLEN", key)])

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
        assert got == {i: ["OK", f"v{i}", len(f"v{i}")] for i in range(300)}
        assert connections(standalone_url) == before + 1


async def test_a_cancelled_caller_leaves_the_connection_in_step(standalone_url: str, prefix: str) -> None:
    """Its reply still comes and is dropped: the caller after it gets its own, not that one."""
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        await lean.call([("SET", f"{prefix}:k", "mine")])
        with trio.move_on_after(0.05) as waited:  # (a blocking pop, only to delay a reply)
            await lean.call([("BLPOP", f"{prefix}:empty", "0.3")])
        assert waited.cancelled_caught
        assert await lean.call([("GET", f"{prefix}:k")]) == ["mine"]


async def test_error_replies_come_as_the_coredis_classes_the_coordinator_classifies(
    standalone_url: str, prefix: str
) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        await lean.call([("SET", f"{prefix}:s", "x")])
        missing, wrong, custom, fine = await lean.call(
            [
                ("EVALSHA", "0" * 40, 0),
                ("LPUSH", f"{prefix}:s", "y"),
                ("EVAL", "return redis.error_reply('FENCED owner token of k fence 7')", 0),
                ("GET", f"{prefix}:s"),
            ]
        )
        assert isinstance(missing, coredis.exceptions.NoScriptError)
        assert isinstance(wrong, coredis.exceptions.WrongTypeError)
        assert isinstance(custom, coredis.exceptions.ResponseError)
        assert error_code(custom) == "FENCED"
        assert "fence 7" in str(custom)
        assert fine == "x"


async def test_scripts_are_loaded_when_redis_lost_them_and_refusals_are_raised(
    standalone_url: str, prefix: str
) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        scripts = Scripts(client, lean)
        ensure = client.register_script(script("coordinator/ensure_stream"))
        keys = [f"{prefix}:{{{prefix}:{i}}}" for i in range(3)]
        await client.script_flush()
        assert await scripts.run([(ensure, [key], []) for key in keys]) == [1, 1, 1]
        await client.script_flush()
        assert await scripts.one(ensure, [keys[0]], []) == 1
        assert await client.exists(keys) == 3
        await client.set(f"{prefix}:plain", "x")
        group = client.register_script(script("coordinator/ensure_group"))
        with pytest.raises(coredis.exceptions.WrongTypeError):
            await scripts.run([(group, [keys[1]], ["g", "0"]), (group, [f"{prefix}:plain"], ["g", "0"])])


async def test_a_redis_that_stops_answering_fails_every_caller_then_a_new_connection_serves() -> None:
    with redis_servers.standalone() as url:
        async with open_redis(url, command_timeout_s=0.3) as client, open_lean(client) as lean:
            assert lean is not None
            assert await lean.call([("PING",)]) == ["PONG"]
            pid = redis_servers.server_pid(url)
            failures: list[str] = []

            async def one() -> None:
                try:
                    with redis_errors("a test call"):
                        await lean.call([("PING",)])
                except StoreUnavailable as exc:
                    failures.append(str(exc))

            subprocess.run(["kill", "-STOP", str(pid)], check=True)
            try:
                with trio.fail_after(5):
                    async with trio.open_nursery() as nursery:
                        for _ in range(5):
                            nursery.start_soon(one)
            finally:
                subprocess.run(["kill", "-CONT", str(pid)], check=True)
            assert len(failures) == 5
            assert all("no reply from Redis within" in f for f in failures)
            assert await lean.call([("PING",)]) == ["PONG"]
            assert connections(url) == 2  # the coredis client's, and the new lean one


async def test_a_connection_killed_under_it_is_an_outage_then_replaced(standalone_url: str) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        await lean.call([("CLIENT", "SETNAME", "lean-under-test")])
        with redis.Redis.from_url(standalone_url) as r:
            victims = [c["addr"] for c in r.client_list() if c.get("name") == "lean-under-test"]
            assert len(victims) == 1
            r.client_kill(victims[0])
        with pytest.raises(StoreUnavailable), redis_errors("a test call"):
            await lean.call([("PING",)])
        assert await lean.call([("PING",)]) == ["PONG"]


async def test_it_connects_with_the_clients_credentials_and_database(prefix: str) -> None:
    with redis_servers.standalone(password="s3cret") as url:
        async with open_redis(url + "/3") as client, open_lean(client) as lean:
            assert lean is not None
            await lean.call([("SET", f"{prefix}:k", "in-3")])
            assert await client.get(f"{prefix}:k") == "in-3"
        endpoint = Endpoint.of(client)
        assert endpoint is not None
        assert endpoint.db == 3
        assert endpoint.password == "s3cret"


async def test_there_is_no_lean_connection_on_a_cluster(cluster_url: str) -> None:
    async with open_redis(cluster_url) as client, open_lean(client) as lean:
        assert lean is None


async def test_a_call_after_the_connection_closed_is_refused(standalone_url: str) -> None:
    async with open_redis(standalone_url) as client:
        endpoint = Endpoint.of(client)
        assert endpoint is not None
        async with Multiplexed.open(endpoint) as lean:
            await lean.call([("PING",)])
        with pytest.raises(coredis.exceptions.ConnectionError):
            await lean.call([("PING",)])


async def test_sustained_load_longer_than_the_command_timeout_is_no_outage() -> None:
    """Callers that keep the writer busy for several command timeouts in a row: each write is
    bounded, not the stream of them, so a healthy connection is never broken by its load."""
    with redis_servers.standalone() as url:
        async with open_redis(url, command_timeout_s=0.3) as client, open_lean(client) as lean:
            assert lean is not None
            failures: list[BaseException] = []
            calls = [0] * 2000  # each caller's answered calls

            async def loop(n: int, until: float) -> None:
                while trio.current_time() < until:
                    try:
                        await lean.call([("PING",)])
                        calls[n] += 1
                    except Exception as exc:
                        failures.append(exc)

            started = trio.current_time()
            until = started + 1.0  # (three command timeouts)
            async with trio.open_nursery() as nursery:
                for n in range(len(calls)):
                    nursery.start_soon(loop, n, until)
            assert trio.current_time() - started >= 1.0  # the load lasted three timeouts
            assert failures == []
            assert min(calls) >= 1  # every caller was answered throughout: nobody starved
            assert connections(url) == 2  # the coredis client's, and the one lean connection


class FakeRedis:
    """A listener that speaks just enough RESP to be one Redis in a test: it answers each
    command read, on whichever connection, with the next of `answers` (bytes sent as they
    are; None, or none left: say nothing), and counts the connections it accepted."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = iter(answers)
        self.accepted = 0
        self.port = 0

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self._one, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def _one(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        async with stream:
            async for _ in stream:  # (each test command arrives in one read)
                answer = next(self.answers, None)
                if answer is not None:
                    await stream.send_all(answer)

    def endpoint(self, timeout: float = 0.3) -> Endpoint:
        return Endpoint("127.0.0.1", self.port, connect_timeout=timeout, command_timeout=timeout)


async def test_callers_queued_behind_a_failed_attempt_to_connect_fail_with_it() -> None:
    """A Redis that accepts the connection and never answers its handshake: the callers that
    waited for that one attempt fail with it, rather than each try again in turn (which made
    the last of ten wait ten connect timeouts)."""
    fake = FakeRedis([None])
    async with trio.open_nursery() as nursery:
        await fake.serve(nursery)
        async with Multiplexed.open(fake.endpoint()) as lean:
            failures: list[BaseException] = []

            async def one() -> None:
                try:
                    await lean.call([("PING",)])
                except coredis.exceptions.ConnectionError as exc:
                    failures.append(exc)

            async with trio.open_nursery() as callers:
                for _ in range(10):
                    callers.start_soon(one)
            assert len(failures) == 10
            assert all("timed out" in str(f) for f in failures)
            assert fake.accepted == 1
            with pytest.raises(coredis.exceptions.ConnectionError):  # a later call tries again
                await lean.call([("PING",)])
            assert fake.accepted == 2
        nursery.cancel_scope.cancel()


async def test_a_refused_handshake_too_many_clients_is_an_outage() -> None:
    fake = FakeRedis([b"-ERR max number of clients reached\r\n"])
    async with trio.open_nursery() as nursery:
        await fake.serve(nursery)
        async with Multiplexed.open(fake.endpoint()) as lean:
            with pytest.raises(StoreUnavailable, match="max number of clients"), redis_errors("a test call"):
                await lean.call([("PING",)])
        nursery.cancel_scope.cancel()


async def test_a_reply_that_is_not_resp_breaks_the_connection_not_the_coordinator() -> None:
    """hiredis cannot read it: the caller fails as an outage (nothing after it can be trusted),
    the reader task ends cleanly (the nursery it runs in, the coordinator's, goes on), and the
    next call connects afresh."""
    fake = FakeRedis([b"+OK\r\n", b"!not resp\r\n", b"+OK\r\n", b"+PONG\r\n"])
    async with trio.open_nursery() as nursery:
        await fake.serve(nursery)
        async with Multiplexed.open(fake.endpoint()) as lean:
            with pytest.raises(StoreUnavailable, match="unreadable reply"), redis_errors("a test call"):
                await lean.call([("PING",)])
            assert await lean.call([("PING",)]) == ["PONG"]
            assert fake.accepted == 2
        nursery.cancel_scope.cancel()


async def test_a_readonly_reply_reaches_its_caller_then_the_next_call_reconnects() -> None:
    """Behind an address that moved to the new primary after a failover, the old connection
    leads to a replica: it is closed once it said so, and the next call finds the primary."""
    readonly = b"-READONLY You can't write against a read only replica.\r\n"
    fake = FakeRedis([b"+OK\r\n", readonly, b"+OK\r\n", b":1\r\n"])
    async with trio.open_nursery() as nursery:
        await fake.serve(nursery)
        async with Multiplexed.open(fake.endpoint()) as lean:
            (reply,) = await lean.call([("INCR", "k")])
            assert isinstance(reply, coredis.exceptions.ReadOnlyError)
            assert await lean.call([("INCR", "k")]) == [1]
            assert fake.accepted == 2
        nursery.cancel_scope.cancel()


async def test_a_value_that_is_not_utf8_is_an_error_reply_and_the_connection_stays(
    standalone_url: str, prefix: str
) -> None:
    with redis.Redis.from_url(standalone_url) as r:
        r.set(f"{prefix}:bytes", b"\xff\xfe")
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        await lean.call([("CLIENT", "SETNAME", "lean-utf8")])
        before = connections(standalone_url)
        odd, fine, listed = await lean.call(
            [("GET", f"{prefix}:bytes"), ("PING",), ("MGET", f"{prefix}:bytes", f"{prefix}:none")]
        )
        assert isinstance(odd, coredis.exceptions.ResponseError)
        assert "not UTF-8" in str(odd)
        assert fine == "PONG"
        assert isinstance(listed, coredis.exceptions.ResponseError)
        assert await lean.call([("CLIENT", "GETNAME")]) == ["lean-utf8"]  # the same connection
        assert connections(standalone_url) == before


async def test_an_empty_call_answers_nothing_and_keeps_the_connection_in_step(standalone_url: str) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as lean:
        assert lean is not None
        assert await lean.call([]) == []
        assert await Scripts(client, lean).run([]) == []
        assert await lean.call([("ECHO", "after")]) == ["after"]


async def test_an_owner_cancelled_while_the_connection_is_open_closes_it(standalone_url: str) -> None:
    """A coordinator stopped by cancellation (its scope cancelled, as a test or a supervisor
    does) leaves no socket open behind it."""
    async with open_redis(standalone_url) as client:
        with trio.CancelScope() as scope:
            async with open_lean(client) as lean:
                assert lean is not None
                assert await lean.call([("PING",)]) == ["PONG"]
                line = lean._line
                assert line is not None
                scope.cancel()
                await trio.sleep_forever()
        assert line.connection.stream.socket.fileno() == -1
