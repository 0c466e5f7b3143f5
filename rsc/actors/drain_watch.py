"""Retiring drained shards and moving migrations on that wait for Redis, on a timer.

Every `drain_check_s`, each stream with DRAINING shards has their evidence read on their own
nodes (`Effects.drain_evidence`), and those the core accepts (`stream.retirable`: sealed,
drained, every live producer on the current layout) are retired; a migration in QUIESCED gets
the evidence of every readable shard (`AdvanceMigration`). No member's word is needed.

Imports `rsc.events` and the actor modules below the registry; the registry hands itself in
as `Streams` (no import back).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from rsc.actors.actor import Actor, Reply
from rsc.actors.aggregates import StreamActor
from rsc.actors.clock import Clock
from rsc.actors.effects.port import Effects
from rsc.actors.errors import ROUND_FAILURES, TermFenced, log_round_failure
from rsc.actors.keys import AggregateId
from rsc.events.commands import AdvanceMigration, RetireShards, StreamCommand
from rsc.events.drain import drain_check
from rsc.events.errors import UnknownStream
from rsc.events.events import StreamEvent
from rsc.events.migration import moving
from rsc.events.model import Layout, MigrationPhase
from rsc.events.stream import StreamState, retirable

log = logging.getLogger("rsc.registry")


class Streams(Protocol):
    """What the drain watch needs of the registry (`rsc.actors.registry.Registry`)."""

    clock: Clock
    effects: Effects
    #: Counts the terms that ended: what was learnt from earlier actors is stale.
    generation: int
    #: The layout of each stream as last seen this term.
    layouts: dict[str, Layout]

    async def stream_prefixes(self) -> list[str]: ...

    def running_actor(self, aggregate_id: AggregateId) -> Actor[Any, Any, Any] | None: ...

    async def stream(self, stream_prefix: str, create: bool | None = None) -> StreamActor: ...

    async def ask_stream(
        self, stream_prefix: str, command: StreamCommand
    ) -> Reply[StreamState, StreamEvent]: ...


async def watch_drains(
    streams: Streams, every_s: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Retire DRAINING shards once Redis says they are sealed and drained, and move
    migrations on that wait for Redis (QUIESCED), every `every_s`, forever.

    Shards retire with no member at all (the all-expired path), and never while an entry is
    left in them. A migration in QUIESCED switches the layout once every group has consumed
    and acknowledged everything. Raises nothing: a failed round is looked at again."""
    task_status.started()
    # Streams known to drain or migrate (None: not looked at yet, so the first round looks
    # at all). Others are looked at only while their actor runs anyway (a scale-in goes
    # through it), so this loop keeps no idle actor alive.
    busy: set[str] | None = None
    seen: set[str] = set()  # the streams of the last round (a new one is looked at)
    generation = streams.generation
    while True:
        await trio.sleep(every_s)
        if generation != streams.generation:  # a new term: look at every stream again
            generation, busy = streams.generation, None
        try:
            prefixes = await streams.stream_prefixes()
        except ROUND_FAILURES:
            continue
        for gone in set(streams.layouts) - set(prefixes):  # deleted (even by a failed answer)
            streams.layouts.pop(gone, None)
        still: set[str] = set()
        standby = False
        for prefix in prefixes:
            try:
                load = busy is None or prefix in busy or prefix not in seen
                if await _drive(streams, prefix, load=load):
                    still.add(prefix)
            except TermFenced:
                # A standby (found on a stream it had not looked at): streams are created,
                # scaled in and migrated by the active coordinator meanwhile, so once this
                # one is active, it looks at every one of them.
                standby = True
                break
            except UnknownStream:
                continue  # gone meanwhile: nothing drains there
            except ROUND_FAILURES as exc:
                still.add(prefix)  # look again next round
                log_round_failure(log, f"drain check of {prefix}", exc)
        busy = None if standby else still
        seen = set(prefixes)


async def _drive(streams: Streams, stream_prefix: str, load: bool) -> bool:
    """Retire what may be retired and move a QUIESCED migration on; whether the stream
    needs looking at again. Its actor is started for it only with `load` (else only one
    running already is looked at)."""
    generation = streams.generation  # what is learnt after a term ended is not recorded
    actor: Any = streams.running_actor(AggregateId(stream_prefix))
    if actor is None:
        if not load:
            return False
        actor = await streams.stream(stream_prefix, create=False)
    state = actor.state
    if state is None or state.deleted:
        streams.layouts.pop(stream_prefix, None)
        return False
    if generation == streams.generation:
        streams.layouts[stream_prefix] = state.layout
    draining = False
    if state.layout.draining:
        draining = await _retire_drained(streams, stream_prefix, state)
        state = actor.state
    m = state.migration
    if moving(state) and m is not None and m.phase is MigrationPhase.QUIESCED:
        clock, effects = streams.clock, streams.effects
        read_at = clock.now_ms()
        index_of = {s.key: s.index for s in state.layout.shards if s.readable}
        found = await effects.drain_evidence(index_of)
        evidence = {index_of[k]: drain_check(e, state.groups) for k, e in found.items()}
        topology = await effects.topology() if m.to_count > state.shard_count else None
        advance = AdvanceMigration(clock.now_ms(), evidence, topology, m.migration_id, read_at)
        await streams.ask_stream(stream_prefix, advance)
    # A stalled migration is looked at too: its actor stays up, its state in the metrics.
    after = actor.state
    if after is not None and not after.deleted and generation == streams.generation:
        streams.layouts[stream_prefix] = after.layout
    running = after is not None and not after.deleted and after.migration is not None
    return draining or (running and after.migration.running)


async def _retire_drained(streams: Streams, stream_prefix: str, state: StreamState) -> bool:
    """Retire what may be retired; whether DRAINING shards remain."""
    index_of = {s.key: s.index for s in state.layout.draining}
    found = await streams.effects.drain_evidence(index_of)
    evidence = {index_of[key]: drain_check(e, state.groups) for key, e in found.items()}
    ready = retirable(state, evidence)
    if ready:
        log.info("retiring drained shards %s of %s", sorted(ready), stream_prefix)
        command = RetireShards(ready, streams.clock.now_ms(), evidence)
        await streams.ask_stream(stream_prefix, command)
    return ready != frozenset(s.index for s in state.layout.draining)
