"""A consumer group's position on each shard key (feature level 7): read for a reset's plan,
counted between two ids, and set, fenced and only where no member holds the shard.

`coordinator/read_position.lua` and `coordinator/count_entries.lua` read only; each count call
reads at most `COUNT_CHUNK` entries, so Redis is never blocked long (the caller calls again
from the last id). `coordinator/set_position.lua` re-creates the group at the new id (dropping
its pending entries) under the owner-token fence of the shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import attrs

from rsc.actors.effects.owners import OWNER_FENCE_FIELD
from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase, chunks
from rsc.actors.store_connection import ScriptCall, redis_errors
from rsc.events.group_position import ShardPosition
from rsc.events.wire import owner_key

#: The most entries one count call reads.
COUNT_CHUNK = 10_000


@attrs.frozen
class PendingEntry:
    """One entry a group has delivered and not acknowledged: its id, the consumer (member) it
    was delivered to, how long since (ms) and how many times it was delivered."""

    id: str
    consumer: str
    idle_ms: int
    deliveries: int


class Positions(Protocol):
    """Group positions on shard keys. Raises `StoreUnavailable` when Redis does not answer;
    `set_position` also `TermFenced` out of a term, and coredis' `ResponseError` for `OWNED`
    (a member holds the shard) and `MISSING` (no such key)."""

    async def positions(self, shard_keys: Iterable[str], group: str) -> dict[str, ShardPosition]:
        """Where `group` stands on each key (a missing key: `key_exists` false)."""
        ...

    async def count_entries(
        self, shard_key: str, after: str, upto: str, limit: int
    ) -> tuple[int, str | None]:
        """How many entries lie after `after` and at or before `upto`, reading at most `limit`
        of them; and the last id counted (None: none)."""
        ...

    async def set_position(self, shard_key: str, group: str, last_id: str, entries_read: int | None) -> int:
        """Put `group` at `last_id` on the key, its pending entries dropped; how many were."""
        ...

    async def oldest_pending(
        self, shard_keys: Iterable[str], group: str, count: int
    ) -> dict[str, list[PendingEntry]]:
        """Each key's oldest `count` entries `group` has pending (a missing key or group: none)."""
        ...

    async def entry_fields(self, shard_key: str, ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """The fields of the entries `ids` of the key that still exist."""
        ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisPositions(RedisEffectsBase):
    """`Positions` on Redis."""

    _read_position = CoordinatorScript("read_position")
    _count_entries = CoordinatorScript("count_entries")
    _set_position = CoordinatorScript("set_position")

    async def positions(self, shard_keys: Iterable[str], group: str) -> dict[str, ShardPosition]:
        """See `Positions.positions`."""
        out: dict[str, ShardPosition] = {}
        for chunk in chunks(shard_keys):
            calls: list[ScriptCall] = [(self._read_position, [key], [group]) for key in chunk]
            for key, found in zip(chunk, await self._scripts(calls, "reading group positions"), strict=True):
                exists, first, last, added, length, has_group, delivered, read, pending = found
                out[key] = ShardPosition(
                    key_exists=bool(int(exists)),
                    first_id=_text(first) or None,
                    last_id=_text(last),
                    entries_added=int(added),
                    length=int(length),
                    group_exists=bool(int(has_group)),
                    last_delivered=_text(delivered),
                    entries_read=None if _text(read) == "" else int(read),
                    pending=int(pending),
                )
        return out

    async def count_entries(
        self, shard_key: str, after: str, upto: str, limit: int
    ) -> tuple[int, str | None]:
        """See `Positions.count_entries`."""
        call: ScriptCall = (self._count_entries, [shard_key], [after, upto, str(limit)])
        [(count, last)] = await self._scripts([call], "counting entries")
        return int(count), _text(last) or None

    async def set_position(self, shard_key: str, group: str, last_id: str, entries_read: int | None) -> int:
        """See `Positions.set_position`."""
        args = [
            OWNER_FENCE_FIELD,
            self._token_arg(),
            group,
            last_id,
            "" if entries_read is None else str(entries_read),
        ]
        [dropped] = await self._scripts([(self._set_position, [owner_key(shard_key), shard_key], args)])
        return int(dropped)

    async def oldest_pending(
        self, shard_keys: Iterable[str], group: str, count: int
    ) -> dict[str, list[PendingEntry]]:
        """See `Positions.oldest_pending`."""
        out: dict[str, list[PendingEntry]] = {}
        for chunk in chunks(shard_keys):
            with redis_errors("reading pending entries"):
                async with self.redis.pipeline(transaction=False, raise_on_error=False) as pipe:
                    for key in chunk:
                        pipe.xpending(key, group, start="-", end="+", count=count)
            for key, found in zip(chunk, pipe.results or (), strict=True):
                if isinstance(found, BaseException):  # no such key or group: nothing pending
                    out[key] = []
                    continue
                out[key] = [
                    PendingEntry(_text(p.identifier), _text(p.consumer), int(p.idle), int(p.delivered))
                    for p in found
                ]
        return out

    async def entry_fields(self, shard_key: str, ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """See `Positions.entry_fields`."""
        wanted = list(ids)
        with redis_errors("reading entries"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for entry in wanted:
                    pipe.xrange(shard_key, start=entry, end=entry)
        out: dict[str, dict[str, str]] = {}
        for entry, found in zip(wanted, pipe.results or (), strict=True):
            for e in found:
                out[entry] = {_text(k): _text(v) for k, v in dict(e.field_values).items()}
        return out


__all__ = ["COUNT_CHUNK", "PendingEntry", "Positions", "RedisPositions"]
