"""What the Admin API asks of the whole deployment rather than of one aggregate.

The deployment's feature level (its state, and finalizing it; the level alone, which the
heartbeat routes ask too, is `Registry.feature_level`), the live parties (every live member
and producer, with its client's feature level), and a stream's dead letters (counted, read
and replayed over its layout: `rsc.actors.stream_dead_letters`).

Imports `rsc.actors.registry` (the actors it reads) and `rsc.events`; nothing imports it
below `rsc.http`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from rsc.actors import stream_dead_letters
from rsc.actors.features import FeatureState
from rsc.actors.registry import Registry
from rsc.actors.stream_dead_letters import DeadLetterCount, DeadLetterEntry, ReplayOutcome
from rsc.events import admin_rules
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.events.stream import StreamState
from rsc.events.versions import Party


async def feature_state(registry: Registry) -> FeatureState:
    """The finalized feature level and the highest level written, read from Redis now.

    Raises `StoreError` (`UnsupportedFeatureLevel`: finalized at a level this release does
    not know)."""
    return await registry.store.features.load()


async def finalize_feature_level(
    registry: Registry, level: int, by: str, parties: Callable[[], Awaitable[Sequence[Party]]]
) -> tuple[FeatureState, FeatureState]:
    """Finalize the deployment's feature `level` (`by`: who asked); the state before and after.

    Raising the level first asks `parties` (every coordinator, member and producer) and
    waits for none of them (`rsc.events.admin_rules`). Raises `InvalidCommand` or
    `UnknownFeatureLevel` for a level this release does not know,
    `FeatureLevelNotSupported` if a party does not support it, `FeatureLevelMoved` if the
    level changed meanwhile or data above `level` was written, `StoreError`."""
    admin_rules.check_known_level(level)
    before = await registry.store.features.load()
    if admin_rules.raises_level(level, before.level):
        admin_rules.check_supported(level, await parties())
    after = await registry.store.features.finalize(level, by, expected=before.level)
    return before, after


async def live_parties(registry: Registry) -> list[Party]:
    """Every live member and live producer of every stream, with its client's feature level
    (a stream or group deleted meanwhile is left out).

    Raises `StoreError` or `ActorStopped` if an aggregate cannot be read."""
    parties: list[Party] = []
    for prefix in await registry.stream_prefixes():
        try:
            actor = await registry.stream(prefix, create=False)
        except UnknownStream:
            continue
        state = actor.state
        if state is None:
            continue
        for producer in state.producers.values():
            who = producer.client
            name = f"{prefix}/{producer.producer_id}"
            parties.append(Party("producer", name, who.version, who.feature_level))
        for group_name in sorted(state.groups):
            try:
                group = await registry.group(prefix, group_name, create=False)
            except (UnknownGroup, UnknownStream):
                continue
            if group.state is None:
                continue
            for member in group.state.members.values():
                who = member.client
                name = f"{prefix}/{group_name}/{member.member_id}"
                parties.append(Party("member", name, who.version, who.feature_level))
    return parties


async def dead_letter_counts(registry: Registry, stream_prefix: str) -> list[DeadLetterCount]:
    """How many dead letters each shard of the stream's layout holds.

    Raises `UnknownStream`, `StoreError`."""
    shards = stream_dead_letters.shards_of(await _stream_state(registry, stream_prefix), stream_prefix)
    return await stream_dead_letters.counts(registry.effects, shards)


async def dead_letter_entries(
    registry: Registry, stream_prefix: str, shard: int | None, limit: int
) -> list[DeadLetterEntry]:
    """The oldest dead letters of the stream (of `shard` only, if given), at most `limit`.

    Raises `UnknownStream`, `UnknownShard` (no such shard), `StoreError`."""
    state = await _stream_state(registry, stream_prefix)
    shards = stream_dead_letters.shards_of(state, stream_prefix, shard)
    return await stream_dead_letters.entries(registry.effects, shards, limit)


async def replay_dead_letters(
    registry: Registry, stream_prefix: str, shard: int | None, ids: Sequence[str], limit: int
) -> ReplayOutcome:
    """Put dead letters (`ids`, or the oldest; of `shard` only, if given) back on their
    ACTIVE shards, at most `limit`.

    Raises `UnknownStream`, `UnknownShard` (no such shard), `StoreError`."""
    state = await _stream_state(registry, stream_prefix)
    shards = stream_dead_letters.shards_of(state, stream_prefix, shard)
    return await stream_dead_letters.replay(registry.effects, shards, ids, limit)


async def _stream_state(registry: Registry, stream_prefix: str) -> StreamState:
    """The state of an existing stream (never creates one; `UnknownStream`)."""
    actor = await registry.stream(stream_prefix, create=False)
    assert actor.state is not None  # `stream` refuses a stream that does not exist
    return actor.state
