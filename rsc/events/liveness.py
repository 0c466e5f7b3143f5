"""Liveness: who is still heard from. Kept beside an aggregate, never in it.

A lease (a member's or a producer's) ends at a deadline in milliseconds.
Heartbeats renew leases all the time and recovery restarts them in full, so
they are not history: no aggregate state holds them, no journal entry or
checkpoint records them. Whoever drives an aggregate (an actor, the
simulator, a test) owns one `Leases` table for it and keeps it up to date
from the liveness events alone, once the events of a batch are persisted:

* `MemberHeartbeated`, `ProducerHeartbeated`: the lease of that id now ends
  at the event's deadline (renewed or started); a member's heartbeat also
  brings what it reports on the DRAINING shards assigned to it (its
  `drainProgress`, shown to operators, never trusted for retirement);
* `MemberLeft`, `MemberFenced`, `ProducerLeft`, `ProducerExpired`: the id
  has no lease any more;
* `TimersRestarted`, `ProducerLeasesRestarted`, `GroupDeleted`,
  `StreamDeleted`: every lease is dropped (a restart is followed by one
  heartbeat event per member or producer, which starts each lease again).

`decide` emits a heartbeat event wherever a lease starts (a join, a
producer's registration, `RestartTimers`), so the table needs the events,
never the state. The aggregates read it only through `Tick(now_ms, leases)`,
read-only; an id missing from the table counts as expired (`expired`).
A renewal is one dictionary write: no copy of the state or of the table.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, assert_never

from rsc.events.events import (
    AssignmentHeld,
    GroupConfigured,
    GroupCreated,
    GroupDeleted,
    GroupEvent,
    GroupPaused,
    GroupPositionReset,
    GroupRegistered,
    GroupResumed,
    GroupUnregistered,
    HeartbeatRejected,
    HoldEnded,
    LayoutApplied,
    MemberEpochAdvanced,
    MemberFenced,
    MemberHeartbeated,
    MemberJoined,
    MemberLeaving,
    MemberLeft,
    MigrationAborted,
    MigrationPhaseChanged,
    MigrationResumed,
    MigrationStalled,
    MigrationStarted,
    ProducerAcknowledged,
    ProducerEpochAssigned,
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    QuarantineEnded,
    ReshardModeSet,
    RetentionLoss,
    RetentionSet,
    ShardsAdded,
    ShardsDraining,
    ShardsInstalled,
    ShardsQuarantined,
    ShardsReleased,
    ShardsReportedStalled,
    ShardsRetired,
    ShardsRevokeAcked,
    ShardsRevokeRequested,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
    TargetAssignmentUpdated,
    TimersRestarted,
)
from rsc.events.model import DrainProgress


def expired(leases: Mapping[str, int], key: str, now_ms: int) -> bool:
    """The lease rule: `key`'s lease has ended at `now_ms` (no lease at all counts as ended)."""
    return now_ms >= leases.get(key, 0)


class Leases(Mapping[str, int]):
    """Member or producer id -> the deadline of its lease (ms), fed by liveness events."""

    __slots__ = ("_deadlines", "_drains", "_owned")

    def __init__(self, deadlines: Mapping[str, int] | None = None) -> None:
        self._deadlines: dict[str, int] = dict(deadlines or {})
        self._drains: dict[str, tuple[DrainProgress, ...]] = {}
        self._owned: dict[str, frozenset[int]] = {}

    def snapshot(self) -> Leases:
        """A copy of the table as it is now, which the actor's later heartbeats leave alone
        (a view rendered beside the event loop reads it)."""
        copy = Leases(self._deadlines)
        copy._drains = dict(self._drains)
        copy._owned = dict(self._owned)
        return copy

    def owned(self, member_id: str) -> frozenset[int]:
        """What `member_id` reported reading (`ownedShards`) in its last heartbeat."""
        return self._owned.get(member_id, frozenset())

    def drain_progress(self, member_id: str) -> tuple[DrainProgress, ...]:
        """What `member_id` last reported on the DRAINING shards assigned to it (its last heartbeat's)."""
        return self._drains.get(member_id, ())

    def __getitem__(self, key: str) -> int:
        return self._deadlines[key]

    # (The mapping's reads straight from the dict: `Mapping`'s own go through `__getitem__` and
    # an exception per missing key, and the actor reads every lease after each batch.)
    def get(self, key: str, default: Any = None) -> Any:
        return self._deadlines.get(key, default)

    def keys(self) -> KeysView[str]:
        return self._deadlines.keys()

    def values(self) -> ValuesView[int]:
        return self._deadlines.values()

    def items(self) -> ItemsView[str, int]:
        return self._deadlines.items()

    def __contains__(self, key: object) -> bool:
        return key in self._deadlines

    def __iter__(self) -> Iterator[str]:
        return iter(self._deadlines)

    def __len__(self) -> int:
        return len(self._deadlines)

    def __repr__(self) -> str:
        return f"Leases({self._deadlines!r})"

    def apply(self, events: Iterable[GroupEvent | StreamEvent]) -> None:
        """Bring the table up to date with `events` (persisted ones, in order)."""
        deadlines = self._deadlines
        drains = self._drains
        for event in events:
            match event:
                case MemberHeartbeated():
                    deadlines[event.member_id] = event.lease_deadline_ms
                    if event.owned is not None:
                        self._owned[event.member_id] = event.owned
                    if event.drain_progress:
                        drains[event.member_id] = event.drain_progress
                    elif drains:
                        drains.pop(event.member_id, None)
                case ProducerHeartbeated():
                    deadlines[event.producer_id] = event.lease_deadline_ms
                case MemberLeft() | MemberFenced():
                    deadlines.pop(event.member_id, None)
                    drains.pop(event.member_id, None)
                    self._owned.pop(event.member_id, None)
                case ProducerLeft() | ProducerExpired():
                    deadlines.pop(event.producer_id, None)
                case TimersRestarted() | ProducerLeasesRestarted() | GroupDeleted() | StreamDeleted():
                    deadlines.clear()
                    drains.clear()
                    if not isinstance(event, ProducerLeasesRestarted):
                        self._owned.clear()
                case ShardsReleased() if event.member_id in drains:
                    _keep(drains, event.member_id, _outside(event.shards))
                case LayoutApplied() if drains:
                    draining = {s.index for s in event.layout.draining}
                    for member_id in list(drains):
                        _keep(drains, member_id, draining.__contains__)
                case (
                    GroupCreated()
                    | MemberJoined()
                    | MemberLeaving()
                    | TargetAssignmentUpdated()
                    | MemberEpochAdvanced()
                    | ShardsRevokeRequested()
                    | ShardsRevokeAcked()
                    | ShardsReleased()
                    | ShardsInstalled()
                    | LayoutApplied()
                    | GroupConfigured()
                    | GroupPaused()
                    | GroupResumed()
                    | GroupPositionReset()
                    | HeartbeatRejected()
                    | ShardsReportedStalled()
                    | StreamCreated()
                    | ShardsAdded()
                    | ShardsDraining()
                    | ShardsRetired()
                    | GroupRegistered()
                    | GroupUnregistered()
                    | ProducerRegistered()
                    | ProducerEpochAssigned()
                    | ProducerAcknowledged()
                    | ProducersPaused()
                    | ProducersResumed()
                    | ReshardModeSet()
                    | RetentionSet()
                    | RetentionLoss()
                    | MigrationStarted()
                    | MigrationPhaseChanged()
                    | MigrationStalled()
                    | MigrationResumed()
                    | MigrationAborted()
                    | AssignmentHeld()
                    | HoldEnded()
                    | ShardsQuarantined()
                    | QuarantineEnded()
                ):
                    pass  # no lease starts or ends (a join's or a registration's heartbeat follows it)
                case _:
                    assert_never(event)

    def clear(self) -> None:
        """Forget every lease (and every drain report and owned report)."""
        self._deadlines.clear()
        self._drains.clear()
        self._owned.clear()


class BatchLeases(Mapping[str, int]):
    """The lease table as the commands of one batch see it while they are decided: the table
    (which moves only once the batch is persisted) with the leases the batch's earlier commands
    started, renewed or ended. A decision that depends on a live lease's end (a static
    member's takeover waits it out) then never reads one that an earlier heartbeat of the
    same batch extended. Only read; the table itself still moves after the write."""

    __slots__ = ("_base", "_batch")

    def __init__(self, base: Mapping[str, int]) -> None:
        self._base = base
        #: Id -> deadline set by this batch (None: ended by it).
        self._batch: dict[str, int | None] = {}

    def note(self, events: Iterable[GroupEvent | StreamEvent]) -> None:
        """Take in the liveness of one command's events."""
        for event in events:
            if isinstance(event, MemberHeartbeated):
                self._batch[event.member_id] = event.lease_deadline_ms
            elif isinstance(event, ProducerHeartbeated):
                self._batch[event.producer_id] = event.lease_deadline_ms
            elif isinstance(event, MemberLeft | MemberFenced):
                self._batch[event.member_id] = None
            elif isinstance(event, ProducerLeft | ProducerExpired):
                self._batch[event.producer_id] = None

    def __getitem__(self, key: str) -> int:
        if key in self._batch:
            deadline = self._batch[key]
            if deadline is None:
                raise KeyError(key)
            return deadline
        return self._base[key]

    def __iter__(self) -> Iterator[str]:
        batch = self._batch
        yield from (k for k, v in batch.items() if v is not None)
        yield from (k for k in self._base if k not in batch)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _outside(shards: Iterable[int]) -> Callable[[int], bool]:
    gone = frozenset(shards)
    return lambda shard: shard not in gone


def _keep(drains: dict[str, tuple[DrainProgress, ...]], member_id: str, keep: Callable[[int], bool]) -> None:
    """A member's drain reports cover only shards it still holds that still drain."""
    kept = tuple(r for r in drains[member_id] if keep(r.shard))
    if kept:
        drains[member_id] = kept
    else:
        del drains[member_id]
