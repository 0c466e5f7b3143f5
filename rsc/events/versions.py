"""Every version rsc has, in one table: protocol versions and their lifecycle, feature levels.

Three things are versioned, each on its own:

* The **release** (`rsc.__version__`, semantic versioning): what `rsc --version`,
  `GET /v1/version` and the package metadata say.
* The **wire protocol** (`protocolVersion` in every heartbeat): a server speaks
  every version in `PROTOCOLS` that is not removed and answers in the highest one
  both sides speak; a client facing an older server steps down (`negotiated`).
* The **feature level** of a deployment (Kafka's finalized features): what the
  coordinators may write to Redis (events, event versions, journal schema, keys,
  scripts) and what clients may be asked to do. It is finalized explicitly by an
  operator (`PUT /v1/admin/features`) once every coordinator, member and producer
  supports it, and recorded in Redis (`rsc.actors.features`). Until then a newer
  coordinator writes exactly what the previous release wrote, so the two can run
  side by side and either can be rolled back to.

The rule for every change (docs/development.md): a new event type, a new version
of an event's data, a new Redis key or script semantics, or a new required request
field belongs to a new feature level, listed here; the compat tier
(`tests/compat`) runs the previous release beside this one and fails otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from rsc import __version__

Status = Literal["supported", "deprecated", "removed"]


@attrs.frozen
class ProtocolVersion:
    """One wire protocol version and where it is in its life: `supported`; `deprecated`
    (still spoken; `deprecated_after` is the date from which it may be removed, in the
    release `end_of_life` names); `removed` (refused with `UNSUPPORTED_PROTOCOL_VERSION`)."""

    version: int
    since: str
    status: Status
    summary: str
    deprecated_after: str | None = None
    end_of_life: str | None = None


PROTOCOLS: tuple[ProtocolVersion, ...] = (
    ProtocolVersion(1, "0.1.0", "supported", "heartbeats, producer heartbeats, routing metadata"),
    ProtocolVersion(
        2,
        "0.2.0",
        "supported",
        "answers name the protocolVersion they are in and the deployment's featureLevel; "
        "member answers carry revokeTimeoutMs (every number a member obeys is in the answer)",
    ),
)
#: The newest protocol version this code speaks, and the oldest it still accepts.
PROTOCOL_VERSION = max(p.version for p in PROTOCOLS if p.status != "removed")
MIN_PROTOCOL_VERSION = min(p.version for p in PROTOCOLS if p.status != "removed")


def negotiated(requested: int) -> int | None:
    """The version to answer a request of `requested` in: the highest both sides speak (None:
    `requested` is older than anything this server still speaks)."""
    if requested < MIN_PROTOCOL_VERSION:
        return None
    return min(requested, PROTOCOL_VERSION)


@attrs.frozen
class FeatureLevel:
    """What a feature level adds, the release that brought it, and the journal schema it writes."""

    level: int
    since: str
    summary: str
    journal_schema: int


FEATURE_LEVELS: tuple[FeatureLevel, ...] = (
    FeatureLevel(
        1,
        "0.1.0",
        "the baseline: journal schema 1 (entries kind, rev, data), the event types of 0.1.0",
        journal_schema=1,
    ),
    FeatureLevel(
        2,
        "0.2.0",
        "versioned journal: each entry names its event's version (v), read through upcasters; "
        "snapshots say schemaVersion 2 (a 0.1.0 coordinator refuses them); shard seals: "
        "producers append through a script that refuses a sealed (DRAINING) shard, which "
        "scale-in needs (0.1.0 producers do not check seals)",
        journal_schema=2,
    ),
    FeatureLevel(
        3,
        "0.2.0",
        "migrations: a resharding is journaled as a migration with phases (its progress in "
        "the stream view), reshardMode is stored, and reshardMode quiesce pauses producers "
        "and waits for consumers around the layout change (a 0.1.0 coordinator cannot replay "
        "these events)",
        journal_schema=2,
    ),
    FeatureLevel(
        4,
        "0.2.0",
        "static membership and sticky rejoins: a static member's shards are held for it while "
        "it restarts and a new incarnation of its id takes it over (the old one fenced with "
        "reason REPLACED); a departed member's last assignment is remembered for a lease; "
        "shards of a member fenced while its lease may still run are installed nowhere until "
        "it ends (AssignmentHeld, HoldEnded, ShardsQuarantined, QuarantineEnded; a 0.1.0 "
        "coordinator cannot replay these events)",
        journal_schema=2,
    ),
    FeatureLevel(
        5,
        "0.3.0",
        "retention: a stream's retention policy is stored (RetentionSet) and applied to its "
        "shard keys (coordinator/trim.lua: acknowledged entries, age, an entry cap), what a "
        "group lost to it is counted beside each shard and journaled (RetentionLoss); new "
        "streams keep only what some group has not acknowledged; `whenFull: refuse` writes a "
        "cap producers' append script checks (producers of 0.2.0 do not check it)",
        journal_schema=2,
    ),
    FeatureLevel(
        6,
        "0.3.0",
        "idempotent producers: the coordinator gives each producer process an epoch "
        "(ProducerEpochAssigned; a newer registration of the same id fences the older process) "
        "and producers' append script drops a repeat of an append it already made (per "
        "producer, shard and sequence, in a window), so a retry after a lost reply is appended "
        "once (producers of 0.2.0 publish without it)",
        journal_schema=2,
    ),
    FeatureLevel(
        7,
        "0.3.0",
        "operating a group's position: a group paused and resumed by an operator (GroupPaused, "
        "GroupResumed: its members hold no shard meanwhile; N-1 members see an empty "
        "assignment), and its position reset across every shard (GroupPositionReset)",
        journal_schema=2,
    ),
    FeatureLevel(
        8,
        "0.3.0",
        "quiet members advance with the target: a new target moves every member whose shards "
        "it keeps to the new assignment epoch at once (TargetAssignmentUpdated version 2, "
        "`advances`), without a MemberEpochAdvanced each; such a member's heartbeat is "
        "accepted with any epoch since the last it was surely told while it reports only what "
        "it holds, and its next MemberEpochAdvanced (version 2, `heard`) names the epoch its "
        "heartbeat carried (a 0.2.0 coordinator would replay these members at their old epochs)",
        journal_schema=2,
    ),
)
#: The level from which shards are sealed when they drain, and scale-in is allowed.
SEAL_LEVEL = 2
#: The level from which reshardings are journaled as migrations, and quiesce mode is allowed.
MIGRATION_LEVEL = 3
#: The level from which static members, holds, sticky rejoins and quarantines are journaled.
STATIC_LEVEL = 4
#: The level from which streams have a retention policy, trimmed and counted (and from which
#: producers check a shard's entry cap).
RETENTION_LEVEL = 5
#: The level from which producers get epochs and appends are deduplicated (idempotent producers).
IDEMPOTENCE_LEVEL = 6
#: The level from which an operator pauses, resumes and resets a group's position.
GROUP_OPS_LEVEL = 7
#: The level from which a new target advances the members whose shards it keeps (a rebalance
#: storm then journals one event per target, not one per member).
ADVANCE_LEVEL = 8
#: The highest level this code can run at (write and read), and the level a deployment that
#: never finalized one is at (every deployment made by 0.1.0).
MAX_FEATURE_LEVEL = FEATURE_LEVELS[-1].level
BASELINE_FEATURE_LEVEL = 1
#: The highest journal schema this code reads (every older one is migrated on read).
MAX_JOURNAL_SCHEMA = max(f.journal_schema for f in FEATURE_LEVELS)


def feature_level(level: int) -> FeatureLevel:
    """The table entry of `level` (ValueError if this code does not know it)."""
    for f in FEATURE_LEVELS:
        if f.level == level:
            return f
    raise ValueError(f"feature level {level} is not in [1, {MAX_FEATURE_LEVEL}]")


def level_of_schema(schema: int) -> int:
    """The lowest feature level that writes journal `schema` (for error messages)."""
    return min((f.level for f in FEATURE_LEVELS if f.journal_schema >= schema), default=schema)


#: Every journaled event type and the feature level that introduced it. A new event type is
#: added here with a new level (a coordinator of an older release cannot replay it); the
#: tests check that every durable event of the core is listed.
EVENT_LEVELS: Mapping[str, int] = {
    **dict.fromkeys(
        (
            # group events
            "GroupCreated",
            "MemberJoined",
            "MemberLeft",
            "MemberLeaving",
            "MemberFenced",
            "TargetAssignmentUpdated",
            "MemberEpochAdvanced",
            "ShardsRevokeRequested",
            "ShardsRevokeAcked",
            "ShardsReleased",
            "ShardsInstalled",
            "LayoutApplied",
            "GroupConfigured",
            "TimersRestarted",
            "GroupDeleted",
            # stream events
            "StreamCreated",
            "ShardsAdded",
            "ShardsDraining",
            "ShardsRetired",
            "GroupRegistered",
            "GroupUnregistered",
            "StreamDeleted",
            "ProducerRegistered",
            "ProducerAcknowledged",
            "ProducerExpired",
            "ProducerLeft",
            "ProducersPaused",
            "ProducersResumed",
        ),
        1,
    ),
    **dict.fromkeys(
        (
            "ReshardModeSet",
            "MigrationStarted",
            "MigrationPhaseChanged",
            "MigrationStalled",
            "MigrationResumed",
            "MigrationAborted",
        ),
        MIGRATION_LEVEL,
    ),
    **dict.fromkeys(("AssignmentHeld", "HoldEnded", "ShardsQuarantined", "QuarantineEnded"), STATIC_LEVEL),
    **dict.fromkeys(("RetentionSet", "RetentionLoss"), RETENTION_LEVEL),
    "ProducerEpochAssigned": IDEMPOTENCE_LEVEL,
    **dict.fromkeys(("GroupPaused", "GroupResumed", "GroupPositionReset"), GROUP_OPS_LEVEL),
}

#: An upcaster turns the JSON data of one version of an event into the next version's.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen
class EventVersion:
    """Version `version` of an event type's data, the level that may write it, and the
    upcaster that turns the previous version's data into this one."""

    version: int
    level: int
    upcast: Upcaster


def _as_it_is(data: dict[str, Any]) -> dict[str, Any]:
    """An upcaster for a version that only adds a field whose default means what the previous
    version meant (the previous version's data reads as it is)."""
    return data


#: The versions after 1 of each event type's data, oldest first. A change of an event's fields
#: that a reader of the previous version would misread adds an entry here, with its feature
#: level and the upcaster from the previous one.
EVENT_VERSIONS: Mapping[str, tuple[EventVersion, ...]] = {
    # `advances` (level 8): the target moves the members whose shards it keeps to its epoch.
    # A reader of version 1 would leave them at their old epochs and fence their next heartbeat.
    "TargetAssignmentUpdated": (EventVersion(2, ADVANCE_LEVEL, _as_it_is),),
    # `heard` (level 8): the epoch a quiet member's heartbeat carried, its retry's epoch.
    "MemberEpochAdvanced": (EventVersion(2, ADVANCE_LEVEL, _as_it_is),),
}


def written_level(kind: str, level: int) -> int:
    """The feature level a journal entry of `kind` written at `level` belongs to: its type's
    (`EVENT_LEVELS`), or that of the newest version of its data `level` writes, if higher.
    What the deployment records as written (a level written to is never lowered again)."""
    versions = EVENT_VERSIONS.get(kind, ())
    newest = max((v.level for v in versions if v.level <= level), default=BASELINE_FEATURE_LEVEL)
    return max(EVENT_LEVELS.get(kind, BASELINE_FEATURE_LEVEL), newest)


class UnsupportedEventVersion(ValueError):
    """A journal entry this code cannot read: written by a newer release at a higher level."""


def current_event_version(kind: str, level: int, versions: Mapping[str, tuple[EventVersion, ...]]) -> int:
    """The version of `kind` a writer at feature `level` writes: the newest that level allows."""
    allowed = [v.version for v in versions.get(kind, ()) if v.level <= level]
    return max(allowed, default=1)


def upcast(
    kind: str, version: int, data: dict[str, Any], versions: Mapping[str, tuple[EventVersion, ...]]
) -> dict[str, Any]:
    """`data` of version `version` of event `kind`, brought to the newest version this code has.

    Raises `UnsupportedEventVersion` for a version newer than that, naming the feature level
    that writes it where this code knows it."""
    steps = versions.get(kind, ())
    newest = max((v.version for v in steps), default=1)
    if version > newest or version < 1:
        raise UnsupportedEventVersion(
            f"{kind} version {version}: this release ({__version__}) reads versions 1 to {newest} "
            f"(up to feature level {MAX_FEATURE_LEVEL}); it was written by a newer release "
            "at a higher feature level: run that release, or one newer"
        )
    for step in steps:
        if step.version > version:
            data = step.upcast(data)
    return data


@attrs.frozen
class Party:
    """A coordinator, member or producer, with the release it runs and the highest feature level
    that release supports (what a change of the finalized level has to wait for)."""

    kind: Literal["coordinator", "member", "producer"]
    name: str
    version: str
    feature_level: int


def blockers(target: int, parties: Sequence[Party]) -> tuple[Party, ...]:
    """The parties that do not support feature level `target`: raising to it waits for them."""
    return tuple(p for p in parties if p.feature_level < target)
