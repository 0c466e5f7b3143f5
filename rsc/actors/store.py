"""The persistence port: an append-only journal with a CAS-guarded snapshot.

An aggregate's history is a journal of entries, each an event (`kind` is the
event class) or a checkpoint (`kind == "Checkpoint"`, `data` is the whole
state). `append` adds a batch atomically and only if the stored revision is
the expected one, else raises `ConcurrencyConflict`; with a checkpoint it
also replaces the snapshot state and may trim the journal, always keeping it
replayable from its oldest entry (which is then a checkpoint). The revision
counts events, not checkpoints.

Fencing: a store may be given a fence-token provider (the current token of
this coordinator's term, see `rsc.actors.leadership`). Each aggregate keeps
the highest token that wrote or loaded it (its *fence*). `append` refuses
with `TermFenced` when the fence is above the writer's token, and otherwise
raises the fence to it, atomically with the revision check; `load` of an
existing aggregate first raises the fence the same way, so a deposed
coordinator cannot append after the new one has read. A store without a
provider writes as token 0 (refused on any fenced aggregate) and never
raises a fence on load, so tools that only read (`rsc journal`) change
nothing.

`MemoryStore` is a faithful in-process implementation for tests of pure
actor logic; the same contract tests run against it and `RedisStore`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs

from rsc.actors.errors import ConcurrencyConflict, NotFinalized, TermFenced
from rsc.actors.features import FeatureSource, StaticFeatures
from rsc.actors.keys import AggregateId
from rsc.events.events import GroupEvent, StreamEvent, level_needed
from rsc.events.versions import (
    BASELINE_FEATURE_LEVEL,
    EVENT_LEVELS,
    EVENT_VERSIONS,
    MAX_FEATURE_LEVEL,
    current_event_version,
    written_level,
)

CHECKPOINT = "Checkpoint"
#: The current fence token of this writer; raises `TermFenced` when it holds none.
FenceToken = Callable[[], int]


@attrs.frozen
class JournalEntry:
    entry_id: str
    kind: str
    revision: int
    data: str
    #: The version of the event's data (journal schema 2 names it; schema 1 entries are 1).
    version: int = 1
    #: On a checkpoint written back after Redis lost data (`Store.restore`): why ('' otherwise).
    restored: str = ""

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
    #: The journal schema the snapshot hash names (what an older one means is read as today's).
    schema: int = 1


@attrs.frozen
class Appended:
    revision: int
    last_id: str


class Store(Protocol):
    #: The deployment's feature level: what may be written.
    features: FeatureSource

    async def load(self, aggregate: AggregateId) -> Loaded:
        """The aggregate's latest checkpoint and every event after it (revision 0: new).

        With a fence-token provider, first raises the aggregate's fence to the
        token (`TermFenced` if it is already higher).
        """
        ...

    async def append(
        self,
        aggregate: AggregateId,
        expected_revision: int,
        events: Sequence[tuple[str, str]],
        checkpoint: str | None = None,
    ) -> Appended:
        """Append `(kind, data)` events (and a checkpoint) atomically.

        Raises `TermFenced` (a newer term owns the aggregate) before
        `ConcurrencyConflict` (another writer moved the revision); either way
        nothing is written.
        """
        ...

    async def read(
        self, aggregate: AggregateId, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[JournalEntry]:
        """Journal entries between two ids (inclusive, `-`/`+` for the ends), oldest first."""
        ...

    async def revision(self, aggregate: AggregateId) -> int:
        """The stored revision (0: nothing stored), read without loading or fencing."""
        ...

    async def restore(
        self, aggregate: AggregateId, expected_revision: int, revision: int, state: str, reason: str
    ) -> Appended:
        """Write `state` back after Redis lost or rolled back the aggregate: if the stored
        revision is still `expected_revision` (what a load just found), the journal becomes
        one checkpoint at `revision` (above every revision written before the loss, so no
        revision, hence no ETag, is reused), marked `restored` with `reason`, and the
        snapshot holds it. TermFenced and conflicting like `append`."""
        ...


@attrs.define
class _MemoryAggregate:
    entries: list[JournalEntry] = attrs.field(factory=list)
    revision: int = 0
    checkpoints: list[JournalEntry] = attrs.field(factory=list)
    fence: int = 0


def level_of_events(kinds: Iterable[str], level: int = BASELINE_FEATURE_LEVEL) -> int:
    """The highest feature level among event types `kinds` written at `level`: each type's, or
    that of the version of its data `level` writes (`written_level`; the baseline for none)."""
    return max((written_level(kind, level) for kind in kinds), default=BASELINE_FEATURE_LEVEL)


def check_levels(events: Iterable[GroupEvent | StreamEvent], level: int) -> None:
    """Refuse to write an event whose data needs a higher feature level than `level` (a field
    of a newer version of its event set: `level_needed`), as `NotFinalized`."""
    for event in events:
        needs = level_needed(event)
        if needs > level:
            raise NotFinalized(
                f"{type(event).__name__} as decided needs feature level {needs}; the deployment "
                f"is finalized at {level} (decided again at that level)"
            )


def check_writable(kinds: Sequence[str], level: int) -> None:
    """Refuse to write an event type that feature `level` does not allow (`NotFinalized`)."""
    for kind in kinds:
        needs = EVENT_LEVELS.get(kind)
        if needs is None:
            raise NotFinalized(f"event type {kind} belongs to no feature level (rsc.events.versions)")
        if needs > level:
            raise NotFinalized(
                f"event type {kind} needs feature level {needs}; the deployment is finalized at {level}"
            )


class MemoryStore:
    """A `Store` kept in a dict, with the same trimming, fencing and feature-level rules as the
    Redis one (at feature level `level`)."""

    def __init__(
        self, retention: int = 10_000, fence_token: FenceToken | None = None, level: int = MAX_FEATURE_LEVEL
    ) -> None:
        self.retention = retention
        self.fence_token = fence_token
        self.features = StaticFeatures(level)
        self.aggregates: dict[AggregateId, _MemoryAggregate] = {}
        self.appends = 0
        self._ids = itertools.count(1)

    def fenced_by(self, fence_token: FenceToken | None) -> MemoryStore:
        """Another writer on the same data (as a second coordinator on one Redis), with its own token."""
        other = MemoryStore(self.retention, fence_token)
        other.features = self.features
        other.aggregates = self.aggregates
        other._ids = self._ids
        return other

    def _token(self) -> int:
        return self.fence_token() if self.fence_token is not None else 0

    @staticmethod
    def _raise_fence(aggregate: AggregateId, agg: _MemoryAggregate, token: int) -> None:
        if agg.fence > token:
            raise TermFenced(f"{aggregate}: fenced by token {agg.fence} (writer's {token})", agg.fence, token)
        agg.fence = token

    async def load(self, aggregate: AggregateId) -> Loaded:
        token = self._token()  # no term, no load (a provider raises `TermFenced`)
        agg = self.aggregates.get(aggregate)
        if agg is None:
            return Loaded(0, None, None, ())
        if self.fence_token is not None:
            self._raise_fence(aggregate, agg, token)
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
        token = self._token()
        level = self.features.level
        agg = self.aggregates.setdefault(aggregate, _MemoryAggregate())
        self._raise_fence(aggregate, agg, token)
        if agg.revision != expected_revision:
            raise ConcurrencyConflict(expected_revision, agg.revision)
        self.appends += 1
        kinds = [kind for kind, _ in events]
        versioned = await self.features.schema_for_write(lambda at: level_of_events(kinds, at)) >= 2
        for kind, data in events:
            agg.revision += 1
            version = current_event_version(kind, level, EVENT_VERSIONS) if versioned else 1
            agg.entries.append(JournalEntry(self._next_id(), kind, agg.revision, data, version))
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

    async def revision(self, aggregate: AggregateId) -> int:
        agg = self.aggregates.get(aggregate)
        return 0 if agg is None else agg.revision

    async def restore(
        self, aggregate: AggregateId, expected_revision: int, revision: int, state: str, reason: str
    ) -> Appended:
        token = self._token()
        agg = self.aggregates.setdefault(aggregate, _MemoryAggregate())
        self._raise_fence(aggregate, agg, token)
        if agg.revision != expected_revision:
            raise ConcurrencyConflict(expected_revision, agg.revision)
        entry = JournalEntry(self._next_id(), CHECKPOINT, revision, state, restored=reason)
        agg.entries = [entry]
        agg.checkpoints = [entry]
        agg.revision = revision
        return Appended(revision, entry.entry_id)

    def lose(self, aggregates: Iterable[AggregateId] | None = None) -> None:
        """Forget aggregates (all when None), as Redis does on a restart without persistence."""
        for aggregate in list(self.aggregates) if aggregates is None else aggregates:
            self.aggregates.pop(aggregate, None)

    def snapshot(self) -> dict[AggregateId, _MemoryAggregate]:
        """A copy of everything stored, to roll back to (`roll_back`), as an older RDB does."""
        return self.snapshot_of(self.aggregates)

    def roll_back(self, copy: dict[AggregateId, _MemoryAggregate]) -> None:
        self.aggregates.clear()
        self.aggregates.update(self.snapshot_of(copy))

    @staticmethod
    def snapshot_of(copy: dict[AggregateId, _MemoryAggregate]) -> dict[AggregateId, _MemoryAggregate]:
        return {
            a: _MemoryAggregate(list(g.entries), g.revision, list(g.checkpoints), g.fence)
            for a, g in copy.items()
        }

    def _next_id(self) -> str:
        return f"{next(self._ids)}-0"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
