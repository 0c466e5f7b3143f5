"""What every Redis effect shares: the client (and the lean connection beside it), the term
check, fenced pipelines, key chunks.

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
from typing import Any, TypeVar

import coredis

from rsc.actors.errors import TermFenced
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.store_connection import RedisClient, ScriptCall, Scripts, raise_first, redis_errors
from rsc.lua import script
from rsc.redis_errors import error_code
from rsc.resp import Command, Multiplexed

_T = TypeVar("_T")

#: Keys per pipeline when reading or writing many shard keys (creating them, their consumer
#: groups, statistics, trims). The coordinator has one thread: parsing a pipeline's replies is
#: one step of its event loop, which no heartbeat interrupts. 512 keys (1,024 replies for the
#: metrics sampler's XLEN and XINFO GROUPS) took 15-20 ms, a stall every batch answered
#: meanwhile waited for; 128 keep each step to a few milliseconds, for a round trip more per
#: 128 keys.
CHUNK = 128


class CoordinatorScript:
    """A coordinator script an effects class calls (`rsc/lua/coordinator/<name>.lua`), declared
    once as a class attribute and registered with the instance's client on first use: the
    effects' mixins need no `__init__` of their own (they compose in `RedisEffects`)."""

    def __init__(self, name: str) -> None:
        self.name = f"coordinator/{name}"
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = f"_registered{attr}"

    def __get__(self, instance: RedisEffectsBase | None, owner: type) -> Any:
        if instance is None:
            return self
        found = instance.__dict__.get(self.attr)
        if found is None:
            found = instance.__dict__[self.attr] = instance.redis.register_script(script(self.name))
        return found


class RedisEffectsBase:
    """The client and the fencing every Redis effect uses; one call per shard key (each in its
    own slot), pipelined per node."""

    def __init__(
        self,
        redis: RedisClient,
        fence_token: Callable[[], int] | None = None,
        keys: KeySpace = DEFAULT_KEYS,
        lean: Multiplexed | None = None,
    ) -> None:
        self.redis = redis
        #: The lean connection the hot commands take where there is one (`open_lean`), else None.
        self.lean = lean
        #: How the effects' scripts are sent (`Scripts`: on `lean` where there is one).
        self.scripts = Scripts(redis, lean)
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
        """`calls` in one round trip (per node, `Scripts.run`), their answers in order; in a
        term only, or, `unfenced` (what they do, for errors), in or out of one. Raises what
        `_refusals` raises (unfenced: `StoreUnavailable` when Redis does not answer, coredis'
        `ResponseError`)."""
        async with self._guarded(unfenced):
            return await self.scripts.run(calls)

    async def _lean_call(self, context: str, commands: Sequence[Command]) -> list[Any]:
        """`commands` on the lean connection (there must be one), their replies in order.
        Raises the first error reply, `StoreUnavailable` when Redis does not answer."""
        assert self.lean is not None
        with redis_errors(context):
            return raise_first(await self.lean.call(commands))

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


def chunks(keys: Iterable[_T]) -> Iterator[list[_T]]:
    """`keys` in lists of at most `CHUNK` (one pipeline each)."""
    batch: list[_T] = []
    for key in keys:
        batch.append(key)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch
