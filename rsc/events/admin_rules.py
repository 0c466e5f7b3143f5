"""The rules of an operator's changes (the Admin API's specs and feature levels), pure.

* Which spec field needs which feature level (`FeatureGate`): `reshardMode: quiesce` runs a
  journaled migration (`MIGRATION_LEVEL`), a scale-in seals the shards it drains
  (`SEAL_LEVEL`), `staticHoldMs` applies to static members (`STATIC_LEVEL`). A spec the
  finalized level does not allow is refused (`FeatureLevelRequired`) before anything is
  created or changed.
* What a group fixes when it is created: `startFrom` (`ImmutableField`; the group aggregate
  checks it when it is configured).
* The `shards_per_stream` quota of a spec: a stream already above a lowered quota may still
  change its mode, or shrink.
* When a spec reshards a stream (`reshard_for`): its shard count differs from the one it is at
  or on its way to, or (where migrations are journaled) its mode differs.
* Finalizing a feature level: only levels this release knows; raising it waits for every
  coordinator, member and producer to support it, lowering (or keeping) it waits for none.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from rsc import __version__
from rsc.events import codec, quotas
from rsc.events.errors import (
    FeatureLevelNotSupported,
    FeatureLevelRequired,
    ImmutableField,
    InvalidCommand,
    QuotaExceeded,
    UnknownFeatureLevel,
)
from rsc.events.migration import target_count
from rsc.events.model import GroupConfig, ReshardMode
from rsc.events.retention import Retention
from rsc.events.stream import StreamState
from rsc.events.versions import (
    GROUP_OPS_LEVEL,
    MAX_FEATURE_LEVEL,
    MIGRATION_LEVEL,
    RETENTION_LEVEL,
    SEAL_LEVEL,
    STATIC_LEVEL,
    Party,
    blockers,
)


@attrs.frozen
class FeatureGate:
    """A spec asks for something feature `level` brings; `why` says what (in the refusal)."""

    level: int
    why: str


@attrs.frozen
class Reshard:
    """What bringing a stream to a spec asks of it: `ChangeShardCount`'s arguments."""

    shard_count: int
    mode: ReshardMode
    #: The feature level journals migrations (a quiesce-mode reshard, a stored mode).
    migrations: bool


def require(gate: FeatureGate | None, level: int) -> None:
    """Refuse what `gate` guards at the finalized feature `level` (None: nothing to guard).

    Raises `FeatureLevelRequired` if `level` is below the gate's."""
    if gate is not None and level < gate.level:
        raise FeatureLevelRequired(
            f"{gate.why}; the deployment is at {level} (PUT /v1/admin/features)", gate.level, level
        )


def reshard_mode_gate(mode: ReshardMode) -> FeatureGate | None:
    """The feature level a stream spec's `reshardMode` needs (None: every level runs it)."""
    if mode is ReshardMode.QUIESCE:
        return FeatureGate(
            MIGRATION_LEVEL,
            f"reshardMode quiesce runs a journaled migration, which needs feature level {MIGRATION_LEVEL}",
        )
    return None


def scale_in_gate(shard_count: int, state: StreamState) -> FeatureGate | None:
    """The feature level a change of the stream in `state` to `shard_count` shards needs: a
    scale-in seals the shards it drains (None: not a scale-in)."""
    if shard_count < state.shard_count:
        return FeatureGate(
            SEAL_LEVEL,
            f"scale-in seals the shards it drains, which needs feature level {SEAL_LEVEL} "
            "(every producer checks seals)",
        )
    return None


def retention_gate(retention: Retention | None) -> FeatureGate | None:
    """The feature level a stream spec's `retention` needs (None: none given)."""
    if retention is not None:
        return FeatureGate(
            RETENTION_LEVEL,
            f"a retention policy trims shard keys and counts what groups lose, which needs feature "
            f"level {RETENTION_LEVEL} (whenFull refuse: every producer checks the cap)",
        )
    return None


def retention_for(asked: Retention | None, current: Retention | None) -> Retention | None:
    """The policy a stream spec's `retention` (`asked`; None: left out) stores on a stream
    whose policy is `current`; None: nothing to store. A spec that leaves it out keeps the
    stream's policy (a new stream has the default from its creation at the retention level:
    `creation_retention`), so an upgrade never starts trimming a stream by itself."""
    return None if asked is None or asked == current else asked


def creation_retention(level: int) -> Retention | None:
    """The policy a stream created at feature `level` starts with: from the retention level,
    keep what some group has not acknowledged (no limit); below it, none (it keeps all)."""
    return Retention() if level >= RETENTION_LEVEL else None


def group_spec_gate(config: GroupConfig) -> FeatureGate | None:
    """The feature level a group's spec needs (None: every level runs it)."""
    if config.start_at is not None:
        return FeatureGate(
            GROUP_OPS_LEVEL,
            f"startAt (a group starting at a time or at ids) needs feature level {GROUP_OPS_LEVEL}",
        )
    if config.static_hold_ms is not None:
        return FeatureGate(
            STATIC_LEVEL,
            f"staticHoldMs applies to static members, which need feature level {STATIC_LEVEL}",
        )
    return None


def check_shard_quota(shard_count: int, limit: int, state: StreamState | None) -> None:
    """Refuse a stream spec of `shard_count` shards above the `shards_per_stream` quota `limit`,
    unless the stream (`state`; None: it does not exist yet) is at or on its way to at least
    as many (a stream above a lowered quota may still change its mode, or shrink).

    Raises `QuotaExceeded`."""
    if shard_count > limit and (state is None or shard_count > target_count(state)):
        raise QuotaExceeded(
            f"shardCount {shard_count} is above the quota {quotas.SHARDS_PER_STREAM} ({limit})",
            quotas.SHARDS_PER_STREAM,
            limit,
        )


def reshard_for(state: StreamState, shard_count: int, mode: ReshardMode, level: int) -> Reshard | None:
    """What bringing the stream in `state` to `shard_count` shards in `mode` asks of it at the
    finalized feature `level`; None if it is there already (below the level that journals
    migrations, the mode is not stored: a mode alone changes nothing)."""
    migrations = level >= MIGRATION_LEVEL
    changes_mode = migrations and mode is not state.reshard_mode
    if shard_count != target_count(state) or changes_mode:
        return Reshard(shard_count, mode, migrations)
    return None


def check_group_change(stored: GroupConfig, wanted: GroupConfig) -> None:
    """Refuse a change of a group's config to `wanted` that changes what applies only when the
    group is created (`startFrom`).

    Raises `ImmutableField`."""
    if stored.start_from is not wanted.start_from:
        raise ImmutableField(
            f"startFrom is {stored.start_from.value!r}: it applies when a group is created and cannot "
            "change (delete the group and create it again to start elsewhere)",
            "startFrom",
            stored.start_from.value,
        )
    if stored.start_at != wanted.start_at:
        raise ImmutableField(
            "startAt applies when a group is created and cannot change (reset the group's position "
            "instead: POST .../reset)",
            "startAt",
            None,
        )


def check_known_level(level: int) -> None:
    """Refuse a feature level to finalize that this release does not know.

    Raises `InvalidCommand` below 1, `UnknownFeatureLevel` above `MAX_FEATURE_LEVEL`."""
    if level < 1:
        raise InvalidCommand("level must be at least 1")
    if level > MAX_FEATURE_LEVEL:
        raise UnknownFeatureLevel(
            f"feature level {level} is unknown to this coordinator ({__version__}), "
            f"which supports 1 to {MAX_FEATURE_LEVEL}",
            1,
            MAX_FEATURE_LEVEL,
        )


def raises_level(target: int, finalized: int) -> bool:
    """Whether finalizing `target` raises the `finalized` level: only then do the parties count."""
    return target > finalized


def check_supported(target: int, parties: Sequence[Party]) -> None:
    """Refuse to raise the finalized level to `target` while one of `parties` does not
    support it.

    Raises `FeatureLevelNotSupported`, naming each of them."""
    waiting = blockers(target, parties)
    if waiting:
        names = ", ".join(f"{p.kind} {p.name} ({p.version}, up to {p.feature_level})" for p in waiting)
        raise FeatureLevelNotSupported(
            f"cannot finalize feature level {target}: not supported by {names}; upgrade (or stop) them first",
            [codec.wire.unstructure(p) for p in waiting],
        )
