"""Retention's Redis half: shard keys trimmed by a stream's policy, and what each group lost.

Each call runs `coordinator/trim.lua` on one shard key (fenced by the owner-token fence of the
shard, in its slot): the cap producers check is written as the policy says, the dead-letter
stream is capped, and the entries the policy removes go in the same atomic step as the count
of what each consumer group lost to them (`<shard key>:rsc:v1:trimmed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from rsc.actors.effects.owners import OWNER_FENCE_FIELD
from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase, chunks
from rsc.actors.store_connection import ScriptCall, redis_errors
from rsc.events.retention import Keep, Retention
from rsc.events.wire import (
    TRIMMED_TOTAL_FIELD,
    cap_key,
    dead_letter_key,
    owner_key,
    trimmed_key,
)

#: The most entries one call removes one by one (counting each group's loss); more: called again.
TRIM_LIMIT = 10_000


@attrs.frozen
class Trimmed:
    """What one trim of one shard key did."""

    removed: int
    #: Whether the policy removes more there now (the call stopped at its limit).
    more: bool
    #: Group -> entries it lost (removed before it acknowledged them), groups with a loss only.
    lost: dict[str, int]
    dead_letters_removed: int = 0
    #: Group -> the time (ms) of its oldest entry not acknowledged before the trim (none: absent).
    oldest_ms: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class TrimCall:
    """One shard key to trim by `policy` at `now_ms`; `released` groups do not hold entries back."""

    shard_key: str
    policy: Retention
    now_ms: int
    released: tuple[str, ...] = ()


class Trimming(Protocol):
    """Trimming shard keys. Raises `TermFenced` out of a term (or when a newer term wrote
    there), `StoreUnavailable` when Redis does not answer."""

    async def trim(self, calls: Sequence[TrimCall], limit: int = TRIM_LIMIT) -> list[Trimmed]:
        """Apply each call's policy to its shard key (one script each, pipelined per node)."""
        ...

    async def trimmed_counts(self, shard_keys: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per shard key: group -> entries it lost to retention, and `:trimmed` -> all removed."""
        ...


def _pairs(flat: Sequence[object]) -> dict[str, int]:
    """{name: number} of a script's flat reply [name, number, ...]."""
    items = [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    return {items[i]: int(items[i + 1]) for i in range(0, len(items), 2)}


def _opt(n: int | None) -> str:
    return "" if n is None else str(n)


class RedisTrimming(RedisEffectsBase):
    """`Trimming` on Redis."""

    _trim = CoordinatorScript("trim")

    async def trim(self, calls: Sequence[TrimCall], limit: int = TRIM_LIMIT) -> list[Trimmed]:
        """See `Trimming.trim`."""
        out: list[Trimmed] = []
        for chunk in chunks(calls):
            scripts: list[ScriptCall] = []
            for call in chunk:
                key, p = call.shard_key, call.policy
                keys = [owner_key(key), key, trimmed_key(key), cap_key(key), dead_letter_key(key)]
                args = [
                    OWNER_FENCE_FIELD,
                    self._token_arg(),
                    str(call.now_ms),
                    "acknowledged" if p.keep is Keep.ACKNOWLEDGED else "all",
                    _opt(p.max_age_ms),
                    _opt(p.max_entries_per_shard),
                    p.when_full.value,
                    str(limit),
                    _opt(p.dead_letter_max_entries),
                    *call.released,
                ]
                scripts.append((self._trim, keys, args))
            for removed, more, lost, dead, oldest in await self._scripts(scripts):
                ages = {name: ms for name, ms in _pairs(oldest).items() if ms >= 0}
                out.append(Trimmed(int(removed), bool(int(more)), _pairs(lost), int(dead), ages))
        return out

    async def trimmed_counts(self, shard_keys: Iterable[str]) -> dict[str, dict[str, int]]:
        """See `Trimming.trimmed_counts`."""
        out: dict[str, dict[str, int]] = {}
        for chunk in chunks(shard_keys):
            with redis_errors("reading retention counts"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.hgetall(trimmed_key(key))
            for key, found in zip(chunk, pipe.results or (), strict=True):
                out[key] = {str(k): int(v) for k, v in dict(found).items()}
        return out


__all__ = ["TRIMMED_TOTAL_FIELD", "TRIM_LIMIT", "RedisTrimming", "TrimCall", "Trimmed", "Trimming"]
