"""One way to run a script (`rsc.scripts`): each call goes as `EVALSHA`, and only the calls
Redis answered `NOSCRIPT` have their script loaded and are sent again, so a script that is
not idempotent runs once per call, whichever client sends it (the coordinator's coredis
pipeline and lean connection, redis-py for the synchronous producer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import coredis
import pytest
import redis

from rsc.actors.errors import StoreUnavailable
from rsc.actors.store_connection import Scripts, open_lean, open_redis, redis_errors
from rsc.redis_errors import is_unavailable
from rsc.scripts import LOAD_ROUNDS, reloading_sync, unknown_script
from tests.redis_servers import standalone

#: Not idempotent: counts its runs in its key.
COUNT = "return redis.call('INCR', KEYS[1])"
#: The same, another script (another sha).
COUNT_TOO = "return redis.call('INCRBY', KEYS[1], 1)"


@pytest.mark.parametrize("lean", [False, True], ids=["coredis", "lean"])
async def test_only_the_calls_redis_did_not_know_are_sent_again(
    standalone_url: str, prefix: str, lean: bool
) -> None:
    async with open_redis(standalone_url) as client, open_lean(client) as connection:
        scripts = Scripts(client, connection if lean else None)
        known, unknown = client.register_script(COUNT), client.register_script(COUNT_TOO)
        await client.script_flush()
        await client.script_load(COUNT)  # Redis knows one of the two
        keys = [f"{prefix}:{i}" for i in range(4)]
        calls = [
            (known, [keys[0]], []),
            (unknown, [keys[1]], []),
            (known, [keys[2]], []),
            (unknown, [keys[3]], []),
        ]
        assert await scripts.run(calls) == [1, 1, 1, 1]
        await client.script_flush()  # Redis knows neither
        assert await scripts.one(known, [keys[0]], []) == 2
        assert await scripts.run(calls[1:]) == [2, 2, 2]
        assert [int(v) for v in await client.mget(keys)] == [2, 2, 2, 2]  # each call ran once


def test_the_blocking_twin_sends_again_only_what_redis_did_not_know(standalone_url: str, prefix: str) -> None:
    with redis.Redis.from_url(standalone_url, decode_responses=True) as r:
        r.script_flush()
        known = r.script_load(COUNT)
        unknown = redis.client.Script(r, COUNT_TOO).sha
        keys = [f"{prefix}:{i}" for i in range(3)]
        calls = [(known, keys[0]), (unknown, keys[1]), (known, keys[2])]
        sent: list[int] = []

        def send(each: Sequence[tuple[str, str]]) -> list[Any]:
            sent.append(len(each))
            pipe = r.pipeline(transaction=False)
            for sha, key in each:
                pipe.evalsha(sha, 1, key)
            return pipe.execute(raise_on_error=False)

        loaded: list[str] = []
        replies = reloading_sync(
            calls, send, lambda each: loaded.extend(r.script_load(COUNT_TOO) for _ in each)
        )
        assert replies == [1, 1, 1]
        assert sent == [3, 1]
        assert len(loaded) == 1
        assert [int(v) for v in r.mget(keys)] == [1, 1, 1]


def test_noscript_is_told_by_its_class_or_its_code() -> None:
    assert unknown_script(coredis.exceptions.NoScriptError("No matching script"))
    assert unknown_script(redis.exceptions.NoScriptError("No matching script"))
    assert unknown_script(coredis.exceptions.ResponseError("NOSCRIPT No matching script"))
    assert not unknown_script(coredis.exceptions.ResponseError("SEALED shard k"))
    assert not unknown_script("NOSCRIPT")  # a reply, not an error


@pytest.mark.parametrize("stale_loads", [1, LOAD_ROUNDS])
async def test_a_script_loaded_on_the_old_primary_is_loaded_again_or_fails_as_transient(
    standalone_url: str, prefix: str, stale_loads: int
) -> None:
    """A failover between loading a script and running it (seen behind Sentinel: the pool's
    connection to the old primary took the `SCRIPT LOAD`): the call is `NOSCRIPT` again. It is
    loaded and sent again up to `LOAD_ROUNDS` times; a `NOSCRIPT` left after that is a Redis
    that may answer later (`StoreUnavailable` to the coordinator's rounds, which try again),
    never a refusal that ends the coordinator. Two real servers, the old primary a second one."""
    with standalone() as old_url, redis.Redis.from_url(old_url) as old:
        async with open_redis(standalone_url) as client:
            loads: list[str] = []

            class FailingOver(Scripts):
                async def _load(self, calls: Sequence[Any]) -> None:
                    if len(loads) < stale_loads:
                        loads.append("old")
                        old.script_load(COUNT)
                    else:
                        loads.append("new")
                        await super()._load(calls)

            scripts = FailingOver(client)
            counter = client.register_script(COUNT)
            await client.script_flush()
            key = f"{prefix}:count"
            if stale_loads < LOAD_ROUNDS:
                assert await scripts.one(counter, [key], []) == 1
                assert loads == ["old", "new"]
                return
            with pytest.raises(coredis.exceptions.NoScriptError) as refused:
                await scripts.one(counter, [key], [])
            assert loads == ["old"] * LOAD_ROUNDS
            assert is_unavailable(refused.value)
            loads.clear()  # the pool still reaches the old primary
            with pytest.raises(StoreUnavailable), redis_errors("a retention round"):
                await scripts.one(counter, [key], [])
            assert await client.get(key) is None  # never ran
