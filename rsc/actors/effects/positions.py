"""A consumer group's position on each shard key (feature level 7): read for a reset's plan,
counted between two ids, and set, fenced and only where no member holds the shard.

`coordinator/read_position.lua` and `coordinator/count_entries.lua` read only; each count call
reads at most `COUNT_CHUNK` entries, so Redis is never blocked long (the caller calls again
from the last id). `coordinator/set_position.lua` re-creates the group at the new id (dropping
its pending entries) under the owner-token fence of the shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rsc.actors.effects.owners import OWNER_FENCE_FIELD
from rsc.actors.effects.pipelines import RedisEffectsBase, chunks
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.store_connection import RedisClient, ScriptCall
from rsc.events.group_position import ShardPosition
from rsc.events.wire import owner_key
from rsc.lua import script
from rsc.resp import Multiplexed

#: The most entries one count call reads.
COUNT_CHUNK = 10_000


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisPositions(RedisEffectsBase):
    """`Positions` on Redis."""

    def __init__(
        self,
        redis: RedisClient,
        fence_token: Callable[[], int] | None = None,
        keys: KeySpace = DEFAULT_KEYS,
        lean: Multiplexed | None = None,
    ) -> None:
        super().__init__(redis, fence_token, keys, lean)
        self._read_position = redis.register_script(script("coordinator/read_position"))
        self._count_entries = redis.register_script(script("coordinator/count_entries"))
        self._set_position = redis.register_script(script("coordinator/set_position"))

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


__all__ = ["COUNT_CHUNK", "Positions", "RedisPositions"]
