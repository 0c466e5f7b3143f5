"""The stream catalog: the set of streams that exist, and who created each (stream quotas).

Keys (`{coordinator}` hash tag, one slot): `KeySpace.streams` (a set of stream prefixes),
`KeySpace.created(owner)` (the streams `owner` created) and `KeySpace.creators` (stream
prefix -> owner), the last two written together or not at all.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from rsc.actors.effects.pipelines import RedisEffectsBase, guard
from rsc.actors.store_connection import raise_first, redis_errors
from rsc.resp import Command, refusal


class StreamCatalog(Protocol):
    """Which streams exist and who created each: the registry's and the quotas' view."""

    async def register_stream(self, stream_prefix: str) -> None:
        """Record that the stream exists. Raises `TermFenced` outside an active term,
        `StoreUnavailable` when Redis does not answer."""
        ...

    async def unregister_stream(self, stream_prefix: str) -> None:
        """Forget the stream, and release the quota of whoever created it. Raises `TermFenced`
        outside an active term, `StoreUnavailable` when Redis does not answer."""
        ...

    async def stream_counts(self, owner: str, pending: Collection[tuple[str, str]]) -> tuple[int, int]:
        """How many streams exist (the registry's set), and how many of them `owner` created
        (its `streams` quota's use), each with the `pending` creations (stream, its creator)
        that it does not record yet (none is missed; one recorded during the read may count
        twice). Raises `StoreUnavailable` when Redis does not answer."""
        ...

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        """`owner` created `stream_prefix` (counted until the stream is deleted). Raises
        `TermFenced` outside an active term, `StoreUnavailable` when Redis does not answer."""
        ...

    async def streams(self) -> set[str]:
        """Every registered stream prefix. Raises `StoreUnavailable` when Redis does not answer."""
        ...


class RedisStreamCatalog(RedisEffectsBase):
    """`StreamCatalog` on Redis (the `{coordinator}` keys)."""

    async def register_stream(self, stream_prefix: str) -> None:
        """See `StreamCatalog.register_stream`."""
        self._in_term()
        if self.lean is not None:
            await self._lean_call("registering a stream", [("SADD", self.keys.streams, stream_prefix)])
            return
        await guard(self.redis.sadd(self.keys.streams, [stream_prefix]))

    async def unregister_stream(self, stream_prefix: str) -> None:
        """See `StreamCatalog.unregister_stream`."""
        self._in_term()
        await guard(self.redis.srem(self.keys.streams, [stream_prefix]))
        with redis_errors("releasing a stream quota"):
            owner = await self.redis.hget(self.keys.creators, stream_prefix)
            if owner is not None:
                await self.redis.srem(self.keys.created(owner), [stream_prefix])
                await self.redis.hdel(self.keys.creators, [stream_prefix])

    async def stream_counts(self, owner: str, pending: Collection[tuple[str, str]]) -> tuple[int, int]:
        """See `StreamCatalog.stream_counts`."""
        names = sorted({name for name, _ in pending})
        mine = sorted({name for name, creator in pending if creator == owner})
        # One round trip (no transaction: the registry's set and the creator's are in different
        # slots). Each admitted stream is looked up before its set is counted: one recorded in
        # between counts twice for a moment (never not at all).
        if self.lean is not None:
            commands: list[Command] = [("SMISMEMBER", self.keys.streams, *names)] if names else []
            commands += [("SMISMEMBER", self.keys.created(owner), *mine)] if mine else []
            commands += [("SCARD", self.keys.streams), ("SCARD", self.keys.created(owner))]
            *known, total, created = await self._lean_call("counting streams", commands)
        else:
            *known, total, created = await self._coredis_counts(owner, names, mine)
        registered = known.pop(0) if names else ()
        recorded = known.pop(0) if mine else ()
        unregistered = sum(1 for found in registered if not found)
        unrecorded = sum(1 for found in recorded if not found)
        return int(total) + unregistered, int(created) + unrecorded

    async def _coredis_counts(self, owner: str, names: list[str], mine: list[str]) -> list[Any]:
        with redis_errors("counting streams"):
            async with self.redis.pipeline(transaction=False) as pipe:
                if names:  # (SMISMEMBER: Redis 6.2, as XAUTOCLAIM)
                    pipe.smismember(self.keys.streams, names)
                if mine:
                    pipe.smismember(self.keys.created(owner), mine)
                pipe.scard(self.keys.streams)
                pipe.scard(self.keys.created(owner))
        return list(pipe.results or (0, 0))

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        """See `StreamCatalog.record_created`."""
        self._in_term()
        # One slot ({coordinator}): both or neither.
        if self.lean is not None:
            created = ("SADD", self.keys.created(owner), stream_prefix)
            creator = ("HSET", self.keys.creators, stream_prefix, owner)
            with redis_errors("recording a stream quota"):
                replies = raise_first(await self.lean.call([("MULTI",), created, creator, ("EXEC",)]))
                raise_first([refusal(reply) for reply in replies[-1] or ()])  # (refused inside EXEC)
            return
        with redis_errors("recording a stream quota"):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.sadd(self.keys.created(owner), [stream_prefix])
                pipe.hset(self.keys.creators, {stream_prefix: owner})

    async def streams(self) -> set[str]:
        """See `StreamCatalog.streams`."""
        with redis_errors("listing streams"):
            return set(await self.redis.smembers(self.keys.streams))
