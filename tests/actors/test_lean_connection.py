"""The coordinator's lean multiplexed connection (`rsc.resp.Multiplexed`, `open_lean`): many
tasks on one connection each get their own replies in order, a cancelled caller leaves the
connection in step, a Redis that stops answering or closes the connection fails every waiting
caller as an outage and the next call connects afresh, and error replies come as the coredis
classes the coordinator classifies (by code)."""

from __future__ import annotations

import subprocess

import coredis
import pytest
import redis
import trio

from rsc.actors.errors import StoreUnavailable
from rsc.actors.store_connection import Scripts, open_lean, open_redis, redis_errors
from rsc.connect import error_code
from rsc.lua import script
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
