"""An operator's reset of a group's position over every shard (feature level 7): the plan,
and its execution (the Admin API's `POST .../groups/{g}/reset`; `rsc groups reset`).

The plan reads where the group stands on each ACTIVE shard key and counts, in bounded chunks,
the entries between its current and its new last-delivered id (delivered again, or skipped);
DRAINING and RETIRED shards are named and left alone (a draining shard's drain evidence must
stay true). Executing: refused while the stream migrates, and while the group has members
unless forced; the group is paused (every member hands its shards back through the ordinary
revoke protocol: never two handlers on a shard at once), the plan is read again over the
positions the members left, each shard's position is set (`Positions.set_position`: fenced,
only where no member holds the shard; the group's pending entries there dropped), the reset is
journaled (`GroupPositionReset`, with the plan and who asked), and the group resumes (unless an
operator had paused it before).
"""

from __future__ import annotations

import json
import logging

import attrs
import coredis
import trio

from rsc.actors.registry import Registry
from rsc.events import codec
from rsc.events.commands import PauseGroup, RecordPositionReset, ResumeGroup
from rsc.events.errors import (
    FeatureLevelRequired,
    InvalidCommand,
    MigrationConflict,
    NotEmpty,
    PreconditionFailed,
    UnknownGroup,
)
from rsc.events.group_position import (
    COUNT_LIMIT,
    ResetPlan,
    ResetTarget,
    ShardPlan,
    ShardPosition,
    ToIds,
    entry_id,
    new_position,
)
from rsc.events.model import ShardState
from rsc.events.versions import GROUP_OPS_LEVEL
from rsc.redis_errors import error_code

log = logging.getLogger("rsc.reset")

#: The most entries one count call reads (Redis is never blocked long).
COUNT_CHUNK = 10_000
#: How often the execution looks whether every member has handed its shards back.
POLL_S = 0.05


@attrs.frozen
class _Read:
    plan: ResetPlan
    positions: dict[str, ShardPosition]


async def plan_reset(registry: Registry, stream_prefix: str, group: str, target: ResetTarget) -> ResetPlan:
    """The plan of a reset of `group` to `target` (nothing changes). Raises `UnknownStream`,
    `UnknownGroup`, `StoreUnavailable`."""
    return (await _read(registry, stream_prefix, group, target)).plan


async def reset_group(
    registry: Registry,
    stream_prefix: str,
    group: str,
    target: ResetTarget,
    force: bool,
    by: str,
    expect: int | None = None,
) -> ResetPlan:
    """Reset `group` to `target` on every ACTIVE shard (see the module); the plan executed.

    Raises `FeatureLevelRequired` below level 7, `MigrationConflict` while the stream migrates,
    `NotEmpty` while the group has members (unless `force`) or when they did not hand their
    shards back within the revoke timeout, what `plan_reset` raises, `PreconditionFailed`
    (`expect`), `TermFenced`, `StoreUnavailable`."""
    level = await registry.feature_level()
    if level < GROUP_OPS_LEVEL:
        raise FeatureLevelRequired(
            f"resetting a group's position needs feature level {GROUP_OPS_LEVEL}", GROUP_OPS_LEVEL, level
        )
    stream = await registry.stream(stream_prefix, create=False)
    if stream.state is not None and stream.state.migration is not None and stream.state.migration.running:
        migration = stream.state.migration.migration_id
        raise MigrationConflict(f"stream {stream_prefix!r} is migrating ({migration}): reset once it is done")
    actor = await registry.group(stream_prefix, group, create=False)
    state = actor.state
    if state is None:
        raise UnknownGroup(f"no group {group!r} reads {stream_prefix!r}")
    members = tuple(sorted(state.members))
    if members and not force:
        shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
        raise NotEmpty(
            f"the group has {len(members)} live member(s): {shown}; stop them, or reset with force "
            "(the group is paused while its position is set)"
        )
    paused_here = state.paused is None
    if not paused_here and expect is not None and actor.revision != expect:  # before any write
        raise PreconditionFailed(f"group {group!r} is at revision {actor.revision}, not {expect}")
    if paused_here:
        command = PauseGroup("reset of the group's position", registry.clock.now_ms())
        await registry.ask_group(stream_prefix, group, command, create=False, expect=expect)
    # From here on the reset goes to its end even if the caller goes away (a client's timeout):
    # never half the shards moved and nothing journaled, never a group left paused by it.
    with trio.CancelScope(shield=True):
        try:
            await _released(registry, stream_prefix, group)
            read = await _read(registry, stream_prefix, group, target)  # where the members left it
            positions = await _set(registry, group, read)
            done = attrs.evolve(read.plan, dry_run=False, executed=True, members=members)
            plan = json.dumps(codec.wire.unstructure(done))
            record = RecordPositionReset(positions, by, plan, registry.clock.now_ms())
            await registry.ask_group(stream_prefix, group, record, create=False)
            log.warning(
                "group %r of %r reset by %s on %d shard(s): %s",
                group,
                stream_prefix,
                by,
                len(positions),
                ", ".join(f"{s} -> {p}" for s, p in sorted(positions.items())),
            )
        finally:
            if paused_here:
                resume = ResumeGroup(registry.clock.now_ms())
                await registry.ask_group(stream_prefix, group, resume, create=False)
    return done


async def _set(registry: Registry, group: str, read: _Read) -> dict[int, str]:
    """Set each reachable shard's position (its entries-read counted when it can be exactly);
    the positions set. Raises `NotEmpty` if a member holds a shard after all (nothing more is
    set), skips a key that vanished meanwhile."""
    positions: dict[int, str] = {}
    for shard in read.plan.shards:
        if not shard.reachable or shard.new is None:
            continue
        at = read.positions[shard.key]
        entries_read = await _entries_read(registry, shard.key, at, shard.new)
        try:
            await registry.effects.set_position(shard.key, group, shard.new, entries_read)
        except coredis.exceptions.ResponseError as exc:
            if error_code(exc) == "MISSING":
                continue  # the key is gone (Redis lost it): the group starts there as configured
            if error_code(exc) == "OWNED":
                raise NotEmpty(f"shard {shard.shard} is held by a member of {group!r}: {exc}") from exc
            raise
        positions[shard.shard] = shard.new
    return positions


async def _entries_read(registry: Registry, key: str, at: ShardPosition, new: str) -> int | None:
    """The group's entries-read at `new`: the entries ever added less those after `new` (counted
    exactly up to `COUNT_LIMIT`, else unknown: None, and Redis learns it as the group reads)."""
    if new == at.last_id:
        return at.entries_added
    after, exact = await _count(registry, key, new, at.last_id)
    return max(0, at.entries_added - after) if exact else None


async def _released(registry: Registry, stream_prefix: str, group: str) -> None:
    """Wait until no member holds a shard of the paused group: each revoked and handed back
    (at most the revoke timeout, then a fenced member's lease). Raises `NotEmpty` past that."""
    actor = await registry.group(stream_prefix, group, create=False)
    timing = actor.state.timing if actor.state is not None else None
    bound_s = 5.0 + (0 if timing is None else (timing.revoke_timeout_ms + timing.lease_ttl_ms) / 1000)
    with trio.move_on_after(bound_s):
        while True:
            actor = await registry.group(stream_prefix, group, create=False)
            if actor.state is None or not actor.state.owners:
                return
            await trio.sleep(POLL_S)
    held = sorted(actor.state.owners) if actor.state is not None else []
    raise NotEmpty(
        f"shards {held} of group {group!r} were still held after {bound_s:.0f} s: nothing was reset"
    )


async def _read(registry: Registry, stream_prefix: str, group: str, target: ResetTarget) -> _Read:
    stream = await registry.stream(stream_prefix, create=False)
    state = stream.state
    assert state is not None
    if group not in state.groups:
        raise UnknownGroup(f"no group {group!r} reads {stream_prefix!r}")
    actor = await registry.group(stream_prefix, group, create=False)
    members = tuple(sorted(actor.state.members)) if actor.state is not None else ()
    if isinstance(target, ToIds):
        unknown = sorted({int(k) for k in target.ids} - {s.index for s in state.layout.shards})
        if unknown:
            raise InvalidCommand(f"to.ids names shard(s) {unknown} the stream does not have")
    active = [s for s in state.layout.shards if s.state is ShardState.ACTIVE]
    positions = await registry.effects.positions([s.key for s in active], group)
    shards: list[ShardPlan] = []
    for shard in state.layout.shards:
        if shard.state is not ShardState.ACTIVE:
            why = (
                "draining (a scale-in): left as it is, so that its drain evidence stays true"
                if shard.state is ShardState.DRAINING
                else "retired: never read again"
            )
            shards.append(ShardPlan(shard.index, shard.key, shard.state.value, False, why=why))
            continue
        at = positions[shard.key]
        if not at.key_exists or not at.group_exists:
            why = (
                "the shard key or its consumer group does not exist yet: the group starts there as configured"
            )
            shards.append(ShardPlan(shard.index, shard.key, shard.state.value, False, why=why))
            continue
        shards.append(
            await _shard_plan(registry, shard.index, shard.key, at, new_position(target, shard.index, at))
        )
    ids = {str(s.shard): s.new for s in shards if s.reachable and s.new is not None}
    plan = ResetPlan(stream_prefix, group, True, False, tuple(shards), ids, members)
    return _Read(plan, positions)


async def _shard_plan(
    registry: Registry, index: int, key: str, at: ShardPosition, new: str | None
) -> ShardPlan:
    base = ShardPlan(
        index,
        key,
        ShardState.ACTIVE.value,
        True,
        at.last_delivered,
        new,
        pending=at.pending,
        oldest=at.first_id,
    )
    if new is None:
        return attrs.evolve(base, why="not named: unchanged")
    current, target = entry_id(at.last_delivered), entry_id(new)
    trimmed = at.entries_added - at.length
    before_oldest = at.first_id is not None and trimmed > 0 and target < entry_id(at.first_id)
    why = (
        f"{trimmed} entr{'y' if trimmed == 1 else 'ies'} before {at.first_id} are gone (retention or XDEL): "
        f"the rewind starts at {at.first_id}"
        if before_oldest
        else None
    )
    if target < current:
        count, exact = await _count(registry, key, new, at.last_delivered)
        return attrs.evolve(base, redelivered=count, exact=exact, before_oldest=before_oldest, why=why)
    if target > current:
        count, exact = await _count(registry, key, at.last_delivered, new)
        beyond = None
        if target > entry_id(at.last_id):
            beyond = (
                f"beyond the last entry ({at.last_id}): entries appended later are skipped too, up to {new}"
            )
        return attrs.evolve(base, skipped=count, exact=exact, why=beyond)
    return base


async def _count(registry: Registry, key: str, after: str, upto: str) -> tuple[int, bool]:
    """Entries after `after` up to `upto`, exact up to `COUNT_LIMIT` (then a lower bound)."""
    total, start = 0, after
    while total < COUNT_LIMIT:
        found, last = await registry.effects.count_entries(key, start, upto, COUNT_CHUNK)
        total += found
        if found < COUNT_CHUNK or last is None:
            return total, True
        start = last
    return total, False


__all__ = ["plan_reset", "reset_group"]
