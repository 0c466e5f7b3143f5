"""Dead letters: each shard's dead-letter stream (`<shard key>:dlq`, in the shard's slot).

Members move an entry there after too many deliveries (`member/dead_letter`); the coordinator
counts them, lists them, and replays them onto their shard (`coordinator/replay_dead_letters`:
appended again and deleted in one step, none lost, none replayed twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase, chunks
from rsc.actors.store_connection import redis_errors
from rsc.events.wire import dead_letter_key


class DeadLetters(Protocol):
    """The dead-letter streams of shards. Every call raises `StoreUnavailable` when Redis does
    not answer (and coredis' `ResponseError` when Redis refuses a command)."""

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        """How many entries each shard's dead-letter stream (`<shard key>:dlq`) holds."""
        ...

    async def dead_letters(
        self, shard_key: str, count: int, after: str | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """The oldest `count` entries of a shard's dead-letter stream (after the entry id `after`)."""
        ...

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        """Append dead letters (`ids`, or the oldest `count`) to the shard again and delete them
        from the dead-letter stream, atomically; (dead-letter id, new id) of each."""
        ...


class RedisDeadLetters(RedisEffectsBase):
    """`DeadLetters` on Redis."""

    _replay = CoordinatorScript("replay_dead_letters")

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        """See `DeadLetters.dead_letter_counts`."""
        out: dict[str, int] = {}
        for chunk in chunks(shard_keys):
            with redis_errors("reading dead-letter streams"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.xlen(dead_letter_key(key))
            out.update(zip(chunk, (int(n) for n in pipe.results or ()), strict=True))
        return out

    async def dead_letters(
        self, shard_key: str, count: int, after: str | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """See `DeadLetters.dead_letters`."""
        start = "-" if after is None else "(" + after
        with redis_errors("reading a dead-letter stream"):
            entries = await self.redis.xrange(dead_letter_key(shard_key), start, "+", count=count)
        return [(str(e.identifier), {str(k): str(v) for k, v in e.field_values.items()}) for e in entries]

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        """See `DeadLetters.replay_dead_letters`."""
        with redis_errors("replaying dead letters"):
            done = await self._replay(keys=[shard_key, dead_letter_key(shard_key)], args=[count, *ids])
        return [(str(old), str(new)) for old, new in done]
