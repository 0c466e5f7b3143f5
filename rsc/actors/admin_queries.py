"""What the Admin API asks of the whole deployment rather than of one aggregate.

The deployment's feature level (its state, and finalizing it; the level alone, which the
heartbeat routes ask too, is `Registry.feature_level`), the live parties (every live member
and producer, with its client's feature level), and a stream's dead letters (counted, read
and replayed over its layout: `rsc.actors.stream_dead_letters`).

Imports `rsc.actors.registry` (the actors it reads) and `rsc.events`; nothing imports it
below `rsc.http`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from rsc.actors import stream_dead_letters
from rsc.actors.actor import Aggregate, fold_loaded
from rsc.actors.aggregates import StreamAggregate
from rsc.actors.effects.inspection import ShardStats
from rsc.actors.effects.positions import PendingEntry
from rsc.actors.features import FeatureState
from rsc.actors.keys import AggregateId
from rsc.actors.registry import Registry
from rsc.actors.stream_dead_letters import DeadLetterCount, DeadLetterEntry, ReplayOutcome
from rsc.events import admin_rules
from rsc.events.drain import DrainEvidence
from rsc.events.errors import UnknownGroup, UnknownStream
from rsc.events.group_position import entry_id
from rsc.events.model import MigrationPhase, Shard
from rsc.events.scaling import Scale, ShardWork, scale
from rsc.events.stream import StreamState
from rsc.events.versions import Party
from rsc.redis_errors import first_leaf


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
    registry: Registry,
    stream_prefix: str,
    shard: int | None,
    limit: int,
    after: tuple[int, str] | None = None,
) -> list[DeadLetterEntry]:
    """The oldest dead letters of the stream (of `shard` only, if given), at most `limit`,
    after `(shard, entry id)` if given.

    Raises `UnknownStream`, `UnknownShard` (no such shard), `StoreError`."""
    state = await _stream_state(registry, stream_prefix)
    shards = stream_dead_letters.shards_of(state, stream_prefix, shard)
    return await stream_dead_letters.entries(registry.effects, shards, limit, after)


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


#: How many streams `peek_streams` reads from Redis at once.
PEEK_CONCURRENCY = 32


async def peek_streams(registry: Registry, prefixes: Iterable[str]) -> dict[str, StreamState]:
    """The state of each of `prefixes` that exists (a deleted or missing one is left out), read
    only: a running actor's state as it is, else folded from what Redis holds, without starting
    an actor (a listing of 10,000 streams would start 10,000, each ticking from then on, each
    repairing its side effects), without creating, rebuilding or correcting anything. At most
    `PEEK_CONCURRENCY` reads at once; the cost is linear in the streams asked for.

    Raises `StoreError` if Redis does not answer."""
    found: dict[str, StreamState] = {}
    limiter = trio.CapacityLimiter(PEEK_CONCURRENCY)

    async def peek(prefix: str) -> None:
        aggregate_id = AggregateId(prefix)
        actor = registry.running_actor(aggregate_id)
        state = actor.state if actor is not None else None
        if actor is None:
            async with limiter:
                aggregate: Aggregate[StreamState, Any, Any] = StreamAggregate(
                    aggregate_id, registry.effects, _no_layout_listener
                )
                state = fold_loaded(aggregate, await registry.store.load(aggregate_id))
        if isinstance(state, StreamState) and not state.deleted:
            found[prefix] = state

    try:
        async with trio.open_nursery() as nursery:
            for prefix in prefixes:
                nursery.start_soon(peek, prefix)
    except BaseExceptionGroup as group:  # one Redis failure is the answer's, as one error
        raise first_leaf(group) from group
    return found


def _no_layout_listener(*_: object) -> None:
    """A peek folds states; it never pushes a layout."""


@attrs.frozen
class Pending:
    """One entry a group has pending: the shard it is on, what Redis says of it, and (asked
    for) its fields."""

    shard: Shard
    entry: PendingEntry
    fields: dict[str, str] | None = None


async def oldest_pending(
    registry: Registry, stream_prefix: str, group: str, limit: int, payloads: bool = False
) -> list[Pending]:
    """The group's `limit` oldest pending entries over the stream's readable shards, oldest
    first, with their fields when `payloads` (the admin's view). Raises `UnknownStream`,
    `UnknownGroup`, `StoreError`."""
    state = await _stream_state(registry, stream_prefix)
    if group not in state.groups:
        raise UnknownGroup(f"no group {group!r} reads {stream_prefix!r}")
    shards = [s for s in state.layout.shards if s.readable]
    found = await registry.effects.oldest_pending([s.key for s in shards], group, limit)
    pending = [Pending(s, e) for s in shards for e in found.get(s.key, [])]
    pending.sort(key=lambda p: (entry_id(p.entry.id), p.shard.index))
    pending = pending[:limit]
    if payloads:
        by_key: dict[str, list[str]] = {}
        for p in pending:
            by_key.setdefault(p.shard.key, []).append(p.entry.id)
        fields = {key: await registry.effects.entry_fields(key, ids) for key, ids in by_key.items()}
        pending = [attrs.evolve(p, fields=fields[p.shard.key].get(p.entry.id, {})) for p in pending]
    return pending


async def group_scale(registry: Registry, stream_prefix: str, group: str, members_per_replica: int) -> Scale:
    """What the group wants (`rsc.events.scaling`), from what Redis says of each readable shard.
    Raises `UnknownStream`, `UnknownGroup`, `StoreError`."""
    state = await _stream_state(registry, stream_prefix)
    if group not in state.groups:
        raise UnknownGroup(f"no group {group!r} reads {stream_prefix!r}")
    actor = await registry.group(stream_prefix, group, create=False)
    group_state = actor.state
    members = len(group_state.members) if group_state is not None else 0
    paused = group_state is not None and group_state.paused is not None
    keys = [s.key for s in state.layout.shards if s.readable]
    stats = await registry.effects.shard_stats(keys)
    works = []
    for key in keys:
        found = next((g for g in stats[key].groups if g.group == group), None)
        # no consumer group on the key yet: nothing delivered, its length is its lag
        works.append(
            ShardWork(stats[key].length if found is None else found.lag, found.pending if found else 0)
        )
    return scale(works, members, paused, members_per_replica)


@attrs.frozen
class StreamFacts:
    """What Redis says of a stream's shards for its view: each readable shard's statistics,
    the drain evidence of its DRAINING shards, and (while a quiesce migration waits in
    QUIESCED) the evidence of every readable shard (`consumed`)."""

    stats: Mapping[str, ShardStats]
    evidence: Mapping[str, DrainEvidence]
    consumed: Mapping[str, DrainEvidence] | None


async def stream_facts(registry: Registry, state: StreamState) -> StreamFacts:
    """Read a stream's `StreamFacts` from Redis. Raises `StoreError`."""
    effects = registry.effects
    stats = await effects.shard_stats(s.key for s in state.layout.shards if s.readable)
    evidence = await effects.drain_evidence(s.key for s in state.layout.draining)
    consumed = None
    if state.migration is not None and state.migration.phase is MigrationPhase.QUIESCED:
        consumed = await effects.drain_evidence(s.key for s in state.layout.shards if s.readable)
    return StreamFacts(stats, evidence, consumed)


@attrs.frozen
class ShardFigures:
    """The figures `/metrics` reports of a set of shard keys: statistics and dead letters."""

    stats: Mapping[str, ShardStats]
    dead_letters: Mapping[str, int]


async def shard_figures(registry: Registry, keys: Sequence[str]) -> ShardFigures:
    """Every key's statistics and dead-letter count, pipelined in chunks. Raises `StoreError`."""
    stats = await registry.effects.shard_stats(keys)
    return ShardFigures(stats, await registry.effects.dead_letter_counts(keys))


async def redis_answers(registry: Registry) -> bool:
    """Whether the coordinator's Redis answers (`PING`). Raises nothing."""
    return await registry.effects.ping()
