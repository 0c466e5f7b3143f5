"""What every Redis effect shares: the client, the term check, fenced pipelines, key chunks.

Given the coordinator's fence-token provider, an effect writes only while this process holds
an active term (`TermFenced` otherwise), so an actor of a deposed coordinator resumed after a
pause does not rewrite owner tokens after its deadline. Each concern's Redis half
(`RedisStreamCatalog`, `RedisShardKeys`, ...) extends `RedisEffectsBase`, registering its own
scripts in `__init__` (cooperatively: `RedisEffects` is all of them at once).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import coredis

from rsc.actors.errors import StoreUnavailable, TermFenced
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.store_connection import RedisClient, redis_errors
from rsc.connect import error_code, redis_leaf

#: Commands per pipeline when creating many shard keys or consumer groups.
CHUNK = 512
#: One script call of a pipeline (`RedisEffectsBase._scripts`): a script registered with the
#: client (`register_script`), its keys, its arguments.
ScriptCall = tuple[Any, Sequence[str], Sequence[Any]]


class RedisEffectsBase:
    """The client and the fencing every Redis effect uses; one call per shard key (each in its
    own slot), pipelined per node."""

    def __init__(
        self, redis: RedisClient, fence_token: Callable[[], int] | None = None, keys: KeySpace = DEFAULT_KEYS
    ) -> None:
        self.redis = redis
        #: Where the keys are (the namespace new shard keys get, through `topology`).
        self.keys = keys
        #: Raises `TermFenced` when this coordinator holds no active term (None: always write).
        self.fence_token = fence_token
        #: Told of an owner-token fence above our token (`rsc.actors.redis_store.FenceFloor`).
        self.on_fenced: Callable[[int], Awaitable[bool]] | None = None

    def _in_term(self) -> None:
        """Raises `TermFenced` when this coordinator holds no active term."""
        if self.fence_token is not None:
            self.fence_token()

    def _token_arg(self) -> str:
        """This term's coordinator token for the owner-token scripts ('' without fencing).
        Raises `TermFenced` when this coordinator holds no active term."""
        return "" if self.fence_token is None else str(self.fence_token())

    @contextlib.asynccontextmanager
    async def _pipeline(self) -> AsyncIterator[Any]:
        """One round trip per node for many single-key commands (they run when the block exits).

        Raises what `_refusals` raises."""
        async with self._refusals(), self.redis.pipeline(transaction=False) as pipe:
            yield pipe

    async def _scripts(self, calls: Sequence[ScriptCall], unfenced: str | None = None) -> list[Any]:
        """`calls` in one pipeline (one round trip per node), their answers in order; in a
        term only, or, `unfenced` (what they do, for errors), in or out of one.

        Each is sent as `EVALSHA` without asking first whether Redis holds the script (coredis
        asks, with `SCRIPT EXISTS`, before every pipeline that holds a script: a round trip
        more each time). Only when Redis answers `NOSCRIPT` (it restarted, failed over, or its
        scripts were flushed) are the scripts loaded and the calls sent again, which every
        script sent this way allows: each is idempotent. Raises what `_refusals` raises
        (unfenced: `StoreUnavailable` when Redis does not answer, coredis' `ResponseError`)."""
        for attempt in range(2):
            try:
                async with self._guarded(unfenced), self.redis.pipeline(transaction=False) as pipe:
                    for script, keys, args in calls:
                        pipe.evalsha(script.sha, keys=keys, args=args)
                return list(pipe.results or ())
            except Exception as exc:
                if attempt or not isinstance(redis_leaf(exc), coredis.exceptions.NoScriptError):
                    raise
            async with self._guarded(unfenced):
                for loaded in {id(call[0]): call[0] for call in calls}.values():
                    try:
                        await self.redis.script_load(loaded.script)
                    except coredis.exceptions.ClusterResponseError as exc:
                        # Sent to every node of a cluster: one that did not answer fails it.
                        raise StoreUnavailable(f"loading a script: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def _guarded(self, unfenced: str | None) -> AsyncIterator[None]:
        """`_refusals`; or, `unfenced` (what the block does), `StoreUnavailable` when Redis
        does not answer."""
        if unfenced is None:
            async with self._refusals():
                yield
        else:
            with redis_errors(unfenced):
                yield

    @contextlib.asynccontextmanager
    async def _refusals(self) -> AsyncIterator[None]:
        """The block's Redis commands (a pipeline, or a command sent alone) as effects see them.

        Raises `TermFenced` when this coordinator holds no active term, or a script refused a
        write with `FENCED` (a newer term wrote there), `StoreUnavailable` when Redis does not
        answer, and coredis' `ResponseError` for any other refusal."""
        self._in_term()
        try:
            with redis_errors("side effect"):
                yield
        except coredis.exceptions.ResponseError as exc:
            if error_code(exc) == "FENCED":
                # Classified by its code above; the stored fence is then read from the text of
                # the refusal ('FENCED owner token of <key> fence <n>'): the one figure it carries.
                found = re.search(r" fence (\d+)", str(exc))
                fence = int(found.group(1)) if found else None
                if fence is not None and self.on_fenced is not None:
                    await self.on_fenced(fence)  # Redis lost the token counter: the next try passes
                raise TermFenced(f"a newer coordinator term wrote there: {exc}", fence) from exc
            raise


async def guard(awaitable: Awaitable[object]) -> None:
    """Await one effect's command; raises `StoreUnavailable` when Redis does not answer."""
    with redis_errors("side effect"):
        await awaitable


def chunks(keys: Iterable[str]) -> Iterator[list[str]]:
    """`keys` in lists of at most `CHUNK` (one pipeline each)."""
    batch: list[str] = []
    for key in keys:
        batch.append(key)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch
