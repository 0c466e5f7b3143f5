"""A stream's dead-letter streams: counted, read and replayed over the stream's layout.

Each shard key has one (`<shard key>:dlq`, written by the pollers with the entry's original
id and delivery count beside its fields). Every shard of the layout is listed, a draining or
retired one too (it may still hold dead letters); replayed entries go back only to ACTIVE
shards: no new entries go to a shard that drains or retired.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from rsc.actors.effects.port import Effects
from rsc.events.errors import UnknownShard
from rsc.events.model import Shard, ShardState
from rsc.events.stream import StreamState
from rsc.events.wire import dead_letter_key

#: The fields a poller adds to a dead letter: the entry's id on its shard, and its deliveries.
SOURCE_ID = "rscSourceId"
DELIVERIES = "rscDeliveries"


@attrs.frozen
class DeadLetterCount:
    """One shard's dead-letter stream (`key`) and how many entries it holds."""

    shard: int
    key: str
    length: int


@attrs.frozen
class DeadLetterEntry:
    """One dead letter: its id in the dead-letter stream, its id on its shard, how often it was
    delivered, and the entry's own fields."""

    shard: int
    id: str
    original_id: str
    deliveries: int
    fields: dict[str, str]


@attrs.frozen
class ReplayOutcome:
    """What a replay put back: (shard, dead-letter id, new id on the shard) of each entry, and
    the shards left out (not ACTIVE) that hold dead letters."""

    entries: tuple[tuple[int, str, str], ...]
    skipped_shards: tuple[int, ...]


def shards_of(state: StreamState, stream_prefix: str, only: int | None = None) -> list[Shard]:
    """The layout's shards (`only` that one, if given).

    Raises `UnknownShard` if the layout has no shard `only`."""
    shards = [s for s in state.layout.shards if only is None or s.index == only]
    if only is not None and not shards:
        raise UnknownShard(f"stream {stream_prefix!r} has no shard {only}")
    return shards


async def counts(effects: Effects, shards: Sequence[Shard]) -> list[DeadLetterCount]:
    """How many dead letters each of `shards` holds.

    Raises `StoreError` if Redis cannot be read."""
    found = await effects.dead_letter_counts(s.key for s in shards)
    return [DeadLetterCount(s.index, dead_letter_key(s.key), found.get(s.key, 0)) for s in shards]


async def entries(
    effects: Effects, shards: Sequence[Shard], limit: int, after: tuple[int, str] | None = None
) -> list[DeadLetterEntry]:
    """The oldest dead letters of `shards`, shard by shard (ascending index), at most `limit` in
    all; after `(shard, entry id)` when given (a page's cursor: the rest of that shard, then the
    shards above it).

    Raises `StoreError` if Redis cannot be read."""
    out: list[DeadLetterEntry] = []
    for shard in sorted(shards, key=lambda s: s.index):
        if after is not None and shard.index < after[0]:
            continue
        since = after[1] if after is not None and shard.index == after[0] else None
        for entry_id, fields in await effects.dead_letters(shard.key, limit - len(out), since):
            original = fields.pop(SOURCE_ID, "")
            deliveries = int(fields.pop(DELIVERIES, "0") or 0)
            out.append(DeadLetterEntry(shard.index, entry_id, original, deliveries, fields))
        if len(out) >= limit:
            break
    return out


async def replay(effects: Effects, shards: Sequence[Shard], ids: Sequence[str], limit: int) -> ReplayOutcome:
    """Put dead letters of `shards` (`ids`, or the oldest) back on their ACTIVE shards, at most
    `limit` in all; the shards that drain or retired are left out and named if they hold any.

    Raises `StoreError` if Redis cannot be read or written."""
    replayed: list[tuple[int, str, str]] = []
    for shard in shards:
        left = limit - len(replayed)
        if shard.state is not ShardState.ACTIVE or left <= 0:
            continue  # no new entries go to a shard that drains or retired
        done = await effects.replay_dead_letters(shard.key, ids, left)
        replayed.extend((shard.index, old, new) for old, new in done)
    others = [s for s in shards if s.state is not ShardState.ACTIVE]
    found = await effects.dead_letter_counts(s.key for s in others)
    return ReplayOutcome(tuple(replayed), tuple(s.index for s in others if found.get(s.key)))
