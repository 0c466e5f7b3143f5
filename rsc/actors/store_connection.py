"""The coordinator's Redis connection: `rsc.connect.open_redis`, failures as `StoreUnavailable`;
and the lean connection its hot paths use beside it (`open_lean`, `Scripts`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import coredis

from rsc import connect
from rsc.actors.errors import OOM_REFUSALS, RedisOutOfMemory, StoreUnavailable
from rsc.connect import DEFAULT_REDIS_URL, RedisClient
from rsc.redis_errors import error_code, is_unavailable, redis_leaf
from rsc.resp import Multiplexed, ScriptCall, eval_scripts, open_lean
from rsc.scripts import reloading

__all__ = [
    "DEFAULT_REDIS_URL",
    "RedisClient",
    "ScriptCall",
    "Scripts",
    "open_lean",
    "raise_first",
    "open_redis",
    "redis_errors",
]


@contextlib.contextmanager
def redis_errors(context: str) -> Iterator[None]:
    """Translate failures of an unavailable Redis (`rsc.redis_errors.is_unavailable`: bare, or in
    coredis' exception groups) into `StoreUnavailable`."""
    try:
        yield
    except BaseException as exc:
        leaf = redis_leaf(exc)
        if leaf is not None and error_code(leaf) == "OOM":
            OOM_REFUSALS[0] += 1
            raise RedisOutOfMemory(f"{context}: Redis is out of memory (OOM): {leaf}") from exc
        if leaf is None or not is_unavailable(leaf):
            raise
        raise StoreUnavailable(f"{context}: {leaf}") from exc


@contextlib.asynccontextmanager
async def open_redis(
    url: str = DEFAULT_REDIS_URL,
    *,
    connect_timeout_s: float | None = None,
    command_timeout_s: float | None = None,
) -> AsyncIterator[RedisClient]:
    """Connect to `url` (standalone or cluster, detected); raises `StoreUnavailable` when nothing answers.

    The coordinator gives both timeouts, so that a hung Redis fails its commands
    (503 to callers) instead of hanging them; `connect.RedisRefused` (wrong password)
    is raised as it is: retrying will not help.
    """
    async with contextlib.AsyncExitStack() as stack:
        try:
            client = await stack.enter_async_context(
                connect.open_redis(
                    url, connect_timeout_s=connect_timeout_s, command_timeout_s=command_timeout_s
                )
            )
        except connect.RedisUnreachable as exc:
            raise StoreUnavailable(str(exc)) from exc
        yield client


class Scripts:
    """Runs registered scripts in one round trip (per node): on the lean connection when there
    is one, else in a coredis pipeline. The coordinator's store and effects call their scripts
    through it."""

    def __init__(self, redis: RedisClient, lean: Multiplexed | None = None) -> None:
        self.redis = redis
        self.lean = lean

    async def run(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """The replies of `calls`, in order. Raises the first error reply (the coredis class
        of its code; `ResponseError` with the code in its text for the others), what Redis
        being unavailable raises (coredis' `ConnectionError`, `TimeoutError`...), and
        `StoreUnavailable` when a cluster node did not take a script.

        Each is sent as `EVALSHA`; only the calls Redis answers `NOSCRIPT` are loaded and sent
        again (`rsc.scripts.reloading`)."""
        if self.lean is not None:
            return raise_first(await eval_scripts(self.lean, calls))
        return raise_first(await reloading(calls, self._send, self._load))

    async def _send(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """One reply per call (an error reply as its exception); raises what coredis raises
        when Redis does not answer."""
        if len(calls) == 1:  # alone: no pipeline
            script, keys, args = calls[0]
            try:
                return [await self.redis.evalsha(script.sha, keys=keys, args=args)]
            except Exception as exc:
                if isinstance(leaf := redis_leaf(exc), coredis.exceptions.ResponseError):
                    return [leaf]  # an error reply, as a pipeline returns it
                raise
        async with self.redis.pipeline(transaction=False, raise_on_error=False) as pipe:
            for script, keys, args in calls:
                pipe.evalsha(script.sha, keys=keys, args=args)
        return list(pipe.results or ())

    async def _load(self, calls: Sequence[ScriptCall]) -> None:
        for loaded in _distinct(calls):
            try:
                await self.redis.script_load(loaded.script)
            except coredis.exceptions.ClusterResponseError as exc:
                # Sent to every node of a cluster: one that did not answer fails it.
                raise StoreUnavailable(f"loading a script: {exc}") from exc

    async def one(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The reply of one script call; raises as `run`."""
        return (await self.run([(script, keys, args)]))[0]


def raise_first(replies: list[Any]) -> list[Any]:
    """`replies`; raises the first of them that is an error reply."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _distinct(calls: Sequence[ScriptCall]) -> list[Any]:
    """The scripts `calls` run, each once."""
    return list({id(call[0]): call[0] for call in calls}.values())
