"""Commands: what someone asks an aggregate to do, in the imperative.

A command carries every input its decision needs, including the time
(`now_ms`) and, for a `Tick`, the lease table, so deciding is a pure
function: it never changes the state or the table it is given. Commands are validated by
`decide`; they are never stored, only the events they produce are.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from rsc.events.model import (
    ClientInfo,
    DrainCheck,
    DrainProgress,
    GroupConfig,
    Layout,
    MigrationBounds,
    ReshardMode,
    StartFrom,
    Timing,
)
from rsc.events.retention import Retention
from rsc.events.slots import Topology

# --- group commands -------------------------------------------------------


@attrs.frozen
class CreateGroup:
    """Create the group aggregate (on its first member's join)."""

    stream_prefix: str
    group: str
    layout: Layout
    timing: Timing = Timing()
    config: GroupConfig = GroupConfig()
    now_ms: int = 0
    #: Recreated after Redis lost the group (feature level 4): a member of the lost group may
    #: still be handling any shard, so every readable one is quarantined for one lease, and a
    #: member of the lost group that reports the shards it holds is taken in holding them.
    rebuilt: bool = False


@attrs.define(unsafe_hash=True)
class Heartbeat:
    """One member's heartbeat (PROTOCOL section 3), stamped with arrival time.

    Made for every heartbeat, so a plain attrs class (as the wire types are, `rsc.events.wire`):
    a frozen one's constructor costs three times as much. Nothing changes one once made (a
    changed copy is `attrs.evolve`'s).

    `member_epoch` is 0 to join, -1 to leave, else the epoch the member last
    received. `owned` is what it reads now; `revoked` acknowledges revokes.
    `recheck`: a held long-poll heartbeat decided again (`rsc.events.longpoll`):
    it renews the lease and installs what is free, but never joins, leaves,
    fences or acknowledges; one that no longer matches the live member is
    refused (`StaleRecheck`).
    """

    member_id: str
    incarnation: str
    member_epoch: int
    now_ms: int
    metadata_version: int = 0
    owned: frozenset[int] = frozenset()
    revoked: frozenset[int] = frozenset()
    drain_progress: tuple[DrainProgress, ...] = ()
    client: ClientInfo = ClientInfo()
    recheck: bool = False
    leaving: bool = False
    #: Shards it cannot read: key, consumer group or owner token gone (`ShardsReportedStalled`).
    stalled: frozenset[int] = frozenset()
    #: A join is refused (`QuotaExceeded`) when the group has this many live members (0: no limit).
    max_members: int = 0
    #: A static member (a stable instance identity; honoured from feature level 4).
    static: bool = False


@attrs.frozen
class Tick:
    """Time passed: fence (or expire) those whose lease ended, and missed revokes; refresh the target.

    `leases` is the lease table of the aggregate (`rsc.events.liveness`), as
    of the state the tick is decided on: member or producer id -> deadline.
    It is only read; an id missing from it counts as expired.
    """

    now_ms: int
    leases: Mapping[str, int]


@attrs.frozen
class ApplyLayout:
    """The stream's layout changed; the group reassigns over the new shards."""

    layout: Layout
    now_ms: int


@attrs.frozen
class ConfigureGroup:
    """Change per-group settings (Admin API), at `now_ms` (a shorter static hold applies to the
    holds under way from then); `startFrom` cannot change (`ImmutableField`)."""

    config: GroupConfig
    now_ms: int = 0


@attrs.frozen
class PauseGroup:
    """Admin API: the group's members hand every shard back and get none until `ResumeGroup`."""

    reason: str
    now_ms: int


@attrs.frozen
class ResumeGroup:
    """Admin API: the pause ends; the group is assigned again."""

    now_ms: int


@attrs.frozen
class RecordPositionReset:
    """Admin API: the group's position was set on these shards (index -> last-delivered id)."""

    positions: Mapping[int, str]
    by: str
    plan: str
    now_ms: int


@attrs.frozen
class RemoveMember:
    """Remove a live member by hand (Admin API); it is told FENCED."""

    member_id: str
    now_ms: int


@attrs.frozen
class RestartTimers:
    """After recovery (or a reload) every lease starts again in full, and every revoke timeout.

    For a group, `TimersRestarted` and one `MemberHeartbeated` per member; for a
    stream, `ProducerLeasesRestarted` and one `ProducerHeartbeated` per producer.
    """

    now_ms: int


@attrs.frozen
class DeleteGroup:
    """Delete the group (Admin API): only without live members; its Redis consumer groups go too."""

    now_ms: int


GroupCommand = (
    CreateGroup
    | Heartbeat
    | Tick
    | ApplyLayout
    | ConfigureGroup
    | RemoveMember
    | RestartTimers
    | DeleteGroup
    | PauseGroup
    | ResumeGroup
    | RecordPositionReset
)

# --- stream commands ------------------------------------------------------


@attrs.frozen
class CreateStream:
    """Create a logical stream with `shard_count` ACTIVE shards (named to spread over `topology`)."""

    stream_prefix: str
    shard_count: int
    now_ms: int = 0
    topology: Topology | None = None
    #: The first layout's version: 1, or above the highest the fleet reported when Redis lost
    #: the stream (`rebuild`), so that members and producers take it as a layout change.
    metadata_version: int = 1
    #: Rebuilding a lost stream: the shard keys found in Redis (index -> key); the layout has
    #: these (ACTIVE) instead of `shard_count` new ones. Empty: new shards.
    found_keys: tuple[tuple[int, str], ...] = ()
    #: Of `found_keys`, the indexes whose keys Redis holds sealed (feature level 2): they were
    #: DRAINING or RETIRED in the lost layout, so they are DRAINING in the rebuilt one (read to
    #: their end, then retired), never ACTIVE again (producers would meet their seal).
    sealed: frozenset[int] = frozenset()
    #: The new stream's retention policy (feature level 5; None: none is stored, it keeps all).
    retention: Retention | None = None


@attrs.frozen
class SetRetention:
    """Store the stream's retention policy (feature level 5)."""

    retention: Retention


@attrs.frozen
class RecordRetentionLoss:
    """Journal what groups lost to a trim of one shard: (group, entries lost) each."""

    shard: int
    losses: tuple[tuple[str, int], ...]
    now_ms: int


@attrs.frozen
class ChangeShardCount:
    """The next resharding (a `Migration`): scale out (new shards) or in (shards start
    draining), online or in quiesce mode; with the same count, only `mode` is stored."""

    shard_count: int
    mode: ReshardMode = ReshardMode.ONLINE
    now_ms: int = 0
    #: The Redis Cluster primaries now (None: standalone), so that new shards spread over them.
    topology: Topology | None = None
    bounds: MigrationBounds = MigrationBounds()
    #: The deployment's feature level journals migrations (`versions.MIGRATION_LEVEL`); below
    #: it only online reshards run, with no migration record and no stored mode.
    migrations: bool = False


@attrs.frozen
class AdvanceMigration:
    """Move the running migration on where it can: the coordinator's drain watcher sends it
    with Redis evidence of every readable shard (`drained`: every group consumed and
    acknowledged everything on it), which QUIESCED waits for."""

    now_ms: int
    evidence: Mapping[int, DrainCheck] = attrs.field(factory=dict)
    topology: Topology | None = None
    #: The migration the evidence was read for, and when its reading began: QUIESCED takes
    #: only evidence read for it, after it began (else an entry appended before the producers
    #: quiesced could be missing from it).
    migration_id: int = 0
    read_at_ms: int = 0


@attrs.frozen
class ResumeMigration:
    """An operator resumes a stalled migration: its phase gets a new bound from now."""

    now_ms: int
    topology: Topology | None = None


@attrs.frozen
class AbortMigration:
    """An operator aborts a migration that has not changed the layout yet (producers resume)."""

    now_ms: int
    reason: str = "aborted by an operator"


@attrs.frozen
class RetireShards:
    """Retire DRAINING shards, given the Redis-level drain evidence of each (the coordinator
    reads it on the shard's own node); the core checks it, and the producers' acknowledgements."""

    indexes: frozenset[int]
    now_ms: int = 0
    evidence: Mapping[int, DrainCheck] = attrs.field(factory=dict)


@attrs.frozen
class RegisterGroup:
    """Record a consumer group reading this stream (its shard groups get created)."""

    group: str
    start_from: StartFrom = StartFrom.EARLIEST


@attrs.frozen
class UnregisterGroup:
    """The group is being deleted: new shard keys no longer get its consumer group."""

    group: str


@attrs.frozen
class DeleteStream:
    """Delete the stream and its shard keys (Admin API): only without groups or live producers."""

    now_ms: int


@attrs.frozen
class ProducerHeartbeat:
    """A producer registers or renews its lease, acknowledging the layout version it routes with."""

    producer_id: str
    metadata_version: int
    quiesced: bool
    now_ms: int
    lease_ttl_ms: int
    client: ClientInfo = ClientInfo()
    #: The producer is closing: forget it now instead of at its lease's end.
    leave: bool = False
    #: A new producer is refused (`QuotaExceeded`) when the stream has this many (0: no limit).
    max_producers: int = 0
    #: The producer epoch it holds (feature level 6): None from a client without epochs, 0 from
    #: a new process asking for one.
    epoch: int | None = None
    #: Whether epochs are given (the deployment is at feature level 6 or above).
    epochs: bool = False


@attrs.frozen
class PauseProducers:
    """Producers must stop publishing, flush and acknowledge with `quiesced` (Admin API)."""

    reason: str
    now_ms: int


@attrs.frozen
class ResumeProducers:
    """Producers may publish again."""

    now_ms: int


@attrs.frozen
class AdoptShardKeys:
    """Shard keys of the stream that Redis holds and its layout lacks (index -> key): a layout
    the stored state never had (Redis came back from an older copy while producers routed by a
    newer one) named them. They are added DRAINING: read to their end, then retired."""

    found: tuple[tuple[int, str], ...]


StreamCommand = (
    CreateStream
    | AdoptShardKeys
    | ChangeShardCount
    | RetireShards
    | RegisterGroup
    | UnregisterGroup
    | DeleteStream
    | ProducerHeartbeat
    | PauseProducers
    | ResumeProducers
    | AdvanceMigration
    | ResumeMigration
    | AbortMigration
    | SetRetention
    | RecordRetentionLoss
    | Tick
    | RestartTimers
)
