"""Liveness: who is still heard from. Kept beside an aggregate, never in it.

A lease (a member's or a producer's) ends at a deadline in milliseconds.
Heartbeats renew leases all the time and recovery restarts them in full, so
they are not history: no aggregate state holds them, no journal entry or
checkpoint records them. Whoever drives an aggregate (an actor, the
simulator, a test) owns one `Leases` table for it and keeps it up to date
from the liveness events alone, once the events of a batch are persisted:

* `MemberHeartbeated`, `ProducerHeartbeated`: the lease of that id now ends
  at the event's deadline (renewed or started);
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

from collections.abc import Iterable, Iterator, Mapping
from typing import assert_never

from rsc.events.events import (
    GroupConfigured,
    GroupCreated,
    GroupDeleted,
    GroupEvent,
    GroupRegistered,
    GroupUnregistered,
    HeartbeatRejected,
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
    ProducerExpired,
    ProducerHeartbeated,
    ProducerLeasesRestarted,
    ProducerLeft,
    ProducerRegistered,
    ProducersPaused,
    ProducersResumed,
    ReshardModeSet,
    ShardsAdded,
    ShardsDraining,
    ShardsInstalled,
    ShardsReleased,
    ShardsRetired,
    ShardsRevokeAcked,
    ShardsRevokeRequested,
    StreamCreated,
    StreamDeleted,
    StreamEvent,
    TargetAssignmentUpdated,
    TimersRestarted,
)


def expired(leases: Mapping[str, int], key: str, now_ms: int) -> bool:
    """The lease rule: `key`'s lease has ended at `now_ms` (no lease at all counts as ended)."""
    return now_ms >= leases.get(key, 0)


class Leases(Mapping[str, int]):
    """Member or producer id -> the deadline of its lease (ms), fed by liveness events."""

    __slots__ = ("_deadlines",)

    def __init__(self, deadlines: Mapping[str, int] | None = None) -> None:
        self._deadlines: dict[str, int] = dict(deadlines or {})

    def __getitem__(self, key: str) -> int:
        return self._deadlines[key]

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
        for event in events:
            match event:
                case MemberHeartbeated():
                    deadlines[event.member_id] = event.lease_deadline_ms
                case ProducerHeartbeated():
                    deadlines[event.producer_id] = event.lease_deadline_ms
                case MemberLeft() | MemberFenced():
                    deadlines.pop(event.member_id, None)
                case ProducerLeft() | ProducerExpired():
                    deadlines.pop(event.producer_id, None)
                case TimersRestarted() | ProducerLeasesRestarted() | GroupDeleted() | StreamDeleted():
                    deadlines.clear()
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
                    | HeartbeatRejected()
                    | StreamCreated()
                    | ShardsAdded()
                    | ShardsDraining()
                    | ShardsRetired()
                    | GroupRegistered()
                    | GroupUnregistered()
                    | ProducerRegistered()
                    | ProducerAcknowledged()
                    | ProducersPaused()
                    | ProducersResumed()
                    | ReshardModeSet()
                    | MigrationStarted()
                    | MigrationPhaseChanged()
                    | MigrationStalled()
                    | MigrationResumed()
                    | MigrationAborted()
                ):
                    pass  # no lease starts or ends (a join's or a registration's heartbeat follows it)
                case _:
                    assert_never(event)

    def clear(self) -> None:
        """Forget every lease."""
        self._deadlines.clear()
