"""Events: what happened to an aggregate, named in the past tense.

Folding an aggregate's events from nothing gives its state. Events marked
`durable = False` record liveness (a heartbeat was heard) or an answer that
changed nothing (a heartbeat was rejected): they change no state and are
never journaled, because liveness restarts in full on recovery. The liveness
events feed the lease table kept beside the state (`rsc.events.liveness`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import attrs

from rsc.events.model import (
    ClientInfo,
    DrainProgress,
    FenceReason,
    GroupConfig,
    HeartbeatStatus,
    Layout,
    Migration,
    MigrationPhase,
    ReleaseReason,
    ReshardMode,
    Shard,
    Stall,
    StartFrom,
    Timing,
)
from rsc.events.retention import Retention
from rsc.events.versions import ADVANCE_LEVEL, BASELINE_FEATURE_LEVEL, EVENT_LEVELS

# --- group events ---------------------------------------------------------


@attrs.frozen
class GroupCreated:
    durable: ClassVar[bool] = True
    stream_prefix: str
    group: str
    layout: Layout
    timing: Timing
    config: GroupConfig
    created_at_ms: int


@attrs.frozen
class MemberJoined:
    durable: ClassVar[bool] = True
    member_id: str
    incarnation: str
    client: ClientInfo
    joined_at_ms: int
    group_epoch: int
    #: A static member (feature level 4; left out of the JSON while false).
    static: bool = attrs.field(default=False, metadata={"omit_if_default": True})


@attrs.frozen
class MemberHeartbeated:
    """The member was heard: its lease now ends at `lease_deadline_ms`. `drain_progress`: what
    it reported on the DRAINING shards assigned to it (liveness, like the lease: never journaled)."""

    durable: ClassVar[bool] = False
    member_id: str
    lease_deadline_ms: int
    drain_progress: tuple[DrainProgress, ...] = ()
    #: What it reported reading (`ownedShards`): shown to operators beside what it was given.
    owned: frozenset[int] | None = None


@attrs.frozen
class ShardsReportedStalled:
    """The member cannot read these shards installed to it: their key, consumer group or owner
    token is gone (Redis lost data, an eviction). The coordinator recreates them (an effect);
    liveness only, like the lease: never journaled."""

    durable: ClassVar[bool] = False
    member_id: str
    shards: frozenset[int]


@attrs.frozen
class MemberLeft:
    durable: ClassVar[bool] = True
    member_id: str
    group_epoch: int


@attrs.frozen
class MemberLeaving:
    """The member asked to leave gracefully: it is left out of the target from now on and
    hands its shards over (each once its next owner is ready), then leaves."""

    durable: ClassVar[bool] = True
    member_id: str
    group_epoch: int


@attrs.frozen
class MemberFenced:
    durable: ClassVar[bool] = True
    member_id: str
    incarnation: str
    reason: FenceReason
    fenced_at_ms: int
    group_epoch: int


@attrs.frozen
class TargetAssignmentUpdated:
    """A new target at `assignment_epoch`; `changed` lists only members whose target changed.

    `advances` (feature level 8, the event's version 2): every member reconciled to the
    previous target whose target this one keeps moves to `assignment_epoch` with it
    (`rsc.events.group_state.advance_quiet`), instead of by a `MemberEpochAdvanced` each."""

    durable: ClassVar[bool] = True
    assignment_epoch: int
    changed: Mapping[str, frozenset[int]]
    computed_at_ms: int
    advances: bool = attrs.field(default=False, metadata={"omit_if_default": True})


@attrs.frozen
class MemberEpochAdvanced:
    """The member reconciled to `member_epoch` on a heartbeat. `heard` (feature level 8, the
    event's version 2): the epoch that heartbeat carried, the one the member surely knows and a
    lost answer's retry carries (a quiet member, moved by targets, may have heard none of its
    epochs since). None (version 1): the member's epoch before this one."""

    durable: ClassVar[bool] = True
    member_id: str
    member_epoch: int
    heard: int | None = attrs.field(default=None, metadata={"omit_if_default": True})


@attrs.frozen
class ShardsRevokeRequested:
    durable: ClassVar[bool] = True
    member_id: str
    shards: frozenset[int]
    requested_at_ms: int
    deadline_ms: int


@attrs.frozen
class ShardsRevokeAcked:
    durable: ClassVar[bool] = True
    member_id: str
    shards: frozenset[int]


@attrs.frozen
class ShardsReleased:
    durable: ClassVar[bool] = True
    member_id: str
    shards: frozenset[int]
    reason: ReleaseReason


@attrs.frozen
class ShardsInstalled:
    durable: ClassVar[bool] = True
    member_id: str
    shards: frozenset[int]


@attrs.frozen
class LayoutApplied:
    durable: ClassVar[bool] = True
    layout: Layout
    group_epoch: int


@attrs.frozen
class GroupConfigured:
    durable: ClassVar[bool] = True
    config: GroupConfig


@attrs.frozen
class TimersRestarted:
    """After recovery every revoke timeout and lease starts again (a `MemberHeartbeated` each follows)."""

    durable: ClassVar[bool] = True
    restarted_at_ms: int


@attrs.frozen
class GroupPaused:
    """An operator paused the group: its target is empty (every member revokes what it holds
    through the ordinary protocol, and gets nothing) until `GroupResumed` (feature level 7)."""

    durable: ClassVar[bool] = True
    reason: str
    paused_at_ms: int
    group_epoch: int


@attrs.frozen
class GroupResumed:
    """The pause ended: the group is assigned again (feature level 7)."""

    durable: ClassVar[bool] = True
    resumed_at_ms: int
    group_epoch: int


@attrs.frozen
class GroupPositionReset:
    """An operator set the group's position on every shard it names (feature level 7): shard
    index -> the new last-delivered id, its pending entries acknowledged. A record (the
    position is in Redis); `plan` is the reset's plan as the Admin API answered it (JSON)."""

    durable: ClassVar[bool] = True
    positions: Mapping[int, str]
    by: str
    plan: str
    reset_at_ms: int


@attrs.frozen
class GroupDeleted:
    """Terminal until a `GroupCreated` starts the group afresh."""

    durable: ClassVar[bool] = True
    deleted_at_ms: int


@attrs.frozen
class AssignmentHeld:
    """A member stopped (left, or was fenced): what it was targeted is kept for it until
    `until_ms` (`rsc.events.model.Hold`). Static: its shards stay targeted to its id and are
    installed to nobody else; otherwise a memory the assignor uses if it rejoins. Feature
    level 4."""

    durable: ClassVar[bool] = True
    member_id: str
    incarnation: str
    shards: frozenset[int]
    until_ms: int
    static: bool


@attrs.frozen
class HoldEnded:
    """The hold (or memory) of `member_id` ended unused: a static member's shards go to the
    others (`group_epoch` moves); a memory is forgotten. Feature level 4."""

    durable: ClassVar[bool] = True
    member_id: str
    group_epoch: int


@attrs.frozen
class ShardsQuarantined:
    """A member fenced while its lease may still run (replaced, removed, past its revoke
    timeout) may still be running a handler on these shards until `until_ms`: they are
    installed to nobody before then. Feature level 4."""

    durable: ClassVar[bool] = True
    shards: frozenset[int]
    until_ms: int


@attrs.frozen
class QuarantineEnded:
    """The shards may be installed again (the fenced member can no longer be handling them)."""

    durable: ClassVar[bool] = True
    shards: frozenset[int]


@attrs.frozen
class HeartbeatRejected:
    """A heartbeat answered FENCED or UNKNOWN_MEMBER; nothing changed."""

    durable: ClassVar[bool] = False
    member_id: str
    status: HeartbeatStatus
    reason: FenceReason | None = None


GroupEvent = (
    GroupCreated
    | MemberJoined
    | MemberHeartbeated
    | MemberLeft
    | MemberLeaving
    | MemberFenced
    | TargetAssignmentUpdated
    | MemberEpochAdvanced
    | ShardsRevokeRequested
    | ShardsRevokeAcked
    | ShardsReleased
    | ShardsInstalled
    | LayoutApplied
    | GroupConfigured
    | TimersRestarted
    | GroupPaused
    | GroupResumed
    | GroupPositionReset
    | GroupDeleted
    | HeartbeatRejected
    | ShardsReportedStalled
    | AssignmentHeld
    | HoldEnded
    | ShardsQuarantined
    | QuarantineEnded
)

# --- stream events --------------------------------------------------------


@attrs.frozen
class StreamCreated:
    durable: ClassVar[bool] = True
    stream_prefix: str
    layout: Layout
    created_at_ms: int


@attrs.frozen
class ShardsAdded:
    durable: ClassVar[bool] = True
    shards: tuple[Shard, ...]
    metadata_version: int


@attrs.frozen
class ShardsDraining:
    durable: ClassVar[bool] = True
    indexes: frozenset[int]
    metadata_version: int


@attrs.frozen
class ShardsRetired:
    durable: ClassVar[bool] = True
    indexes: frozenset[int]
    metadata_version: int


@attrs.frozen
class GroupRegistered:
    durable: ClassVar[bool] = True
    group: str
    start_from: StartFrom


@attrs.frozen
class GroupUnregistered:
    durable: ClassVar[bool] = True
    group: str


@attrs.frozen
class StreamDeleted:
    """Terminal until a `StreamCreated` starts the stream afresh."""

    durable: ClassVar[bool] = True
    deleted_at_ms: int


@attrs.frozen
class ProducerRegistered:
    durable: ClassVar[bool] = True
    producer_id: str
    acked_version: int
    quiesced: bool
    lease_ttl_ms: int
    client: ClientInfo
    registered_at_ms: int


@attrs.frozen
class ProducerEpochAssigned:
    """Producer `producer_id` (a process of it) appends with `epoch` from now on: a heartbeat
    of an older epoch is refused (`PRODUCER_FENCED`) and so are its appends to every shard a
    newer epoch wrote (feature level 6)."""

    durable: ClassVar[bool] = True
    producer_id: str
    epoch: int


@attrs.frozen
class ProducerAcknowledged:
    """The producer now routes with `acked_version` (and is, or is no longer, quiesced)."""

    durable: ClassVar[bool] = True
    producer_id: str
    acked_version: int
    quiesced: bool


@attrs.frozen
class ProducerHeartbeated:
    """Liveness only: the producer's lease now ends at `lease_deadline_ms`."""

    durable: ClassVar[bool] = False
    producer_id: str
    lease_deadline_ms: int


@attrs.frozen
class ProducerExpired:
    durable: ClassVar[bool] = True
    producer_id: str
    expired_at_ms: int


@attrs.frozen
class ProducerLeft:
    """The producer closed (a heartbeat with `leave`): it no longer counts as live."""

    durable: ClassVar[bool] = True
    producer_id: str
    left_at_ms: int


@attrs.frozen
class ProducerLeasesRestarted:
    """After recovery every lease starts again (a `ProducerHeartbeated` each follows); liveness only."""

    durable: ClassVar[bool] = False
    restarted_at_ms: int


@attrs.frozen
class ProducersPaused:
    durable: ClassVar[bool] = True
    reason: str
    paused_at_ms: int


@attrs.frozen
class ProducersResumed:
    durable: ClassVar[bool] = True
    resumed_at_ms: int


@attrs.frozen
class ReshardModeSet:
    """The stream's stored `reshardMode` (the mode its next reshardings use) changed."""

    durable: ClassVar[bool] = True
    mode: ReshardMode


@attrs.frozen
class RetentionSet:
    """The stream's retention policy (what the coordinator trims of its shard keys) changed
    (feature level 5)."""

    durable: ClassVar[bool] = True
    retention: Retention


@attrs.frozen
class RetentionLoss:
    """Retention removed entries of shard `shard` before consumer group `group` acknowledged
    them: `lost` more of them (never delivered, or delivered and pending; feature level 5).
    A record: the exact count is the one kept in Redis beside the shard (`:rsc:v1:trimmed`)."""

    durable: ClassVar[bool] = True
    shard: int
    group: str
    lost: int
    at_ms: int


@attrs.frozen
class MigrationStarted:
    """A resharding began (its first phase is in `migration.phases`)."""

    durable: ClassVar[bool] = True
    migration: Migration


@attrs.frozen
class MigrationPhaseChanged:
    """The running migration entered `phase` (DONE: it finished)."""

    durable: ClassVar[bool] = True
    phase: MigrationPhase
    at_ms: int
    deadline_ms: int | None = None


@attrs.frozen
class MigrationStalled:
    """A phase ran out of time: the migration stops where it is until resumed or aborted."""

    durable: ClassVar[bool] = True
    stall: Stall


@attrs.frozen
class MigrationResumed:
    """An operator resumed a stalled migration: its phase gets a new bound from now."""

    durable: ClassVar[bool] = True
    at_ms: int
    deadline_ms: int | None = None


@attrs.frozen
class MigrationAborted:
    """An operator aborted a migration before its layout change: nothing changed."""

    durable: ClassVar[bool] = True
    at_ms: int
    reason: str


StreamEvent = (
    StreamCreated
    | ShardsAdded
    | ShardsDraining
    | ShardsRetired
    | GroupRegistered
    | GroupUnregistered
    | StreamDeleted
    | ProducerRegistered
    | ProducerEpochAssigned
    | ProducerAcknowledged
    | ProducerHeartbeated
    | ProducerExpired
    | ProducerLeft
    | ProducerLeasesRestarted
    | ProducersPaused
    | ProducersResumed
    | ReshardModeSet
    | RetentionSet
    | RetentionLoss
    | MigrationStarted
    | MigrationPhaseChanged
    | MigrationStalled
    | MigrationResumed
    | MigrationAborted
)


def level_needed(event: GroupEvent | StreamEvent) -> int:
    """The feature level that may write `event`: its type's (`EVENT_LEVELS`), or the level of
    the version of its data that carries a field it sets (`advances`, `heard`: version 2 of
    their events, level 8)."""
    needs = EVENT_LEVELS.get(type(event).__name__, BASELINE_FEATURE_LEVEL)
    if (isinstance(event, TargetAssignmentUpdated) and event.advances) or (
        isinstance(event, MemberEpochAdvanced) and event.heard is not None
    ):
        needs = max(needs, ADVANCE_LEVEL)
    return needs
