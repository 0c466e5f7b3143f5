"""The persistence port: an append-only journal with a CAS-guarded snapshot.

An aggregate's history is a journal of entries, each an event (`kind` is the
event class) or a checkpoint (`kind == "Checkpoint"`, `data` is the whole
state). `append` adds a batch atomically and only if the stored revision is
the expected one, else raises `ConcurrencyConflict`; with a checkpoint it
also replaces the snapshot state and may trim the journal, always keeping it
replayable from its oldest entry (which is then a checkpoint). The revision
counts events, not checkpoints.

`MemoryStore` is a faithful in-process implementation for tests of pure
actor logic; the same contract tests run against it and `RedisStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from rsc.actors.errors import ConcurrencyConflict
from rsc.actors.keys import AggregateId

CHECKPOINT = "Checkpoint"


@attrs.frozen
class JournalEntry:
    entry_id: str
    kind: str
    revision: int
    data: str

    @property
    def is_checkpoint(self) -> bool:
        return self.kind == CHECKPOINT


@attrs.frozen
class Loaded:
    """What `load` returns: the latest checkpoint (if any) and the events after it."""

    revision: int
    last_id: str | None
    checkpoint: JournalEntry | None
    events: tuple[JournalEntry, ...]


@attrs.frozen
class Appended:
    revision: int
    last_id: str


class Store(Protocol):
    async def load(self, aggregate: AggregateId) -> Loaded:
        """The aggregate's latest checkpoint and every event after it (revision 0: new)."""
        ...

    async def append(
        self,
        aggregate: AggregateId,
        expected_revision: int,
        events: Sequence[tuple[str, str]],
        checkpoint: str | None = None,
    ) -> Appended:
        """Append `(kind, data)` events (and a checkpoint) atomically; raise `ConcurrencyConflict`."""
        ...

    async def read(
        self, aggregate: AggregateId, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[JournalEntry]:
        """Journal entries between two ids (inclusive, `-`/`+` for the ends), oldest first."""
        ...


@attrs.define
class _MemoryAggregate:
    entries: list[JournalEntry] = attrs.field(factory=list)
    revision: int = 0
    checkpoints: list[JournalEntry] = attrs.field(factory=list)


class MemoryStore:
    """A `Store` kept in a dict, with the same trimming rule as the Redis one."""

    def __init__(self, retention: int = 10_000) -> None:
        self.retention = retention
        self.aggregates: dict[AggregateId, _MemoryAggregate] = {}
        self.sequence = 0
        self.appends = 0

    async def load(self, aggregate: AggregateId) -> Loaded:
        agg = self.aggregates.get(aggregate)
        if agg is None:
            return Loaded(0, None, None, ())
        checkpoint = agg.checkpoints[-1] if agg.checkpoints else None
        after = agg.entries.index(checkpoint) + 1 if checkpoint else 0
        events = tuple(e for e in agg.entries[after:] if not e.is_checkpoint)
        last = agg.entries[-1].entry_id if agg.entries else None
        return Loaded(agg.revision, last, checkpoint, events)

    async def append(
        self,
        aggregate: AggregateId,
        expected_revision: int,
        events: Sequence[tuple[str, str]],
        checkpoint: str | None = None,
    ) -> Appended:
        agg = self.aggregates.setdefault(aggregate, _MemoryAggregate())
        if agg.revision != expected_revision:
            raise ConcurrencyConflict(expected_revision, agg.revision)
        self.appends += 1
        for kind, data in events:
            agg.revision += 1
            agg.entries.append(JournalEntry(self._next_id(), kind, agg.revision, data))
        if checkpoint is not None:
            entry = JournalEntry(self._next_id(), CHECKPOINT, agg.revision, checkpoint)
            agg.entries.append(entry)
            agg.checkpoints.append(entry)
            if len(agg.checkpoints) >= 2 and agg.revision - agg.checkpoints[1].revision >= self.retention:
                while (
                    len(agg.checkpoints) >= 2 and agg.revision - agg.checkpoints[1].revision >= self.retention
                ):
                    agg.checkpoints.pop(0)
                agg.entries = agg.entries[agg.entries.index(agg.checkpoints[0]) :]
        return Appended(agg.revision, agg.entries[-1].entry_id)

    async def read(
        self, aggregate: AggregateId, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[JournalEntry]:
        agg = self.aggregates.get(aggregate)
        entries = [
            e
            for e in (agg.entries if agg else [])
            if (start == "-" or _id_key(e.entry_id) >= _id_key(start))
            and (end == "+" or _id_key(e.entry_id) <= _id_key(end))
        ]
        return entries[:count] if count is not None else entries

    def _next_id(self) -> str:
        self.sequence += 1
        return f"{self.sequence}-0"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
