"""The group aggregate: membership, epochs, target and current assignment.

The rules this module keeps (PROTOCOL sections 2-4):

* `group_epoch` bumps whenever the target must change (join, leave, fence,
  layout change); `assignment_epoch` is the group epoch the target was
  computed at; a member's `member_epoch` is the assignment epoch it has
  reconciled to.
* A shard is installed to at most one live member (`owners`). A member must
  acknowledge a revoke before its shard is released, and only a released
  shard is installed to its next owner: revoke ack -> release -> install.
* Each member reconciles on its own heartbeats, with no group-wide barrier:
  a member with shards to revoke keeps its old epoch and gets nothing new;
  once it holds nothing outside its target it advances to the assignment
  epoch and takes the targeted shards that are free (the rest stay pending).

`decide(state, command)` validates a command and returns the events it
causes; `evolve(state, event)` applies one event. Folding the events from
`None` gives the state. Neither changes what it is given.

This module is the aggregate's API and its decisions per command (creation,
heartbeats: joins, takeovers, leaves; ticks, layouts, settings, removals,
deletion); the rest of the aggregate is beside it, each module one job:
`group_state` (the state and `evolve`), `reconcile` (the target and each
member's steps towards it), `group_holds` (holds, memories and quarantines of
members that stop, fencing among them).

Leases are not part of the state (`rsc.events.liveness`): a heartbeat emits
`MemberHeartbeated` (also after `MemberJoined`, and for every member after
`TimersRestarted`), the driver keeps the lease table, and a `Tick` brings it
in to fence those whose lease ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

from rsc.events import quotas
from rsc.events.admin_rules import check_group_change
from rsc.events.commands import (
    ApplyLayout,
    ConfigureGroup,
    CreateGroup,
    DeleteGroup,
    GroupCommand,
    Heartbeat,
    PauseGroup,
    RecordPositionReset,
    RemoveMember,
    RestartTimers,
    ResumeGroup,
    Tick,
)
from rsc.events.errors import (
    AggregateNotFound,
    Deleted,
    FeatureLevelRequired,
    IncarnationMismatch,
    InvalidCommand,
    NotEmpty,
    QuotaExceeded,
    StaleRecheck,
)
from rsc.events.events import (
    GroupConfigured,
    GroupCreated,
    GroupDeleted,
    GroupEvent,
    GroupPaused,
    GroupPositionReset,
    GroupResumed,
    HeartbeatRejected,
    HoldEnded,
    LayoutApplied,
    MemberHeartbeated,
    MemberJoined,
    MemberLeaving,
    MemberLeft,
    QuarantineEnded,
    ShardsInstalled,
    ShardsQuarantined,
    ShardsReleased,
    ShardsReportedStalled,
    TimersRestarted,
)
from rsc.events.group_holds import expire_holds, fence, hold_shards, remember, shorten_holds, take_over
from rsc.events.group_state import Decision, GroupState, LastOf, evolve, fold
from rsc.events.liveness import expired
from rsc.events.model import (
    MAX_STATIC_HOLD_MS,
    DrainProgress,
    FenceReason,
    HeartbeatStatus,
    Member,
    ReleaseReason,
    check_client,
    check_counter,
    check_id,
    check_name,
    is_plain_text,
)
from rsc.events.reconcile import assignment_interval_ms, reconcile, refresh_target
from rsc.events.stream import MAX_CONCURRENCY, MAX_SHARDS
from rsc.events.versions import GROUP_OPS_LEVEL, MAX_FEATURE_LEVEL

#: The aggregate's API: its state, deciding and applying events; the heartbeat's field checks.
__all__ = ["GroupState", "decide", "evolve", "execute", "fold", "validate_heartbeat"]


def decide(
    state: GroupState | None,
    command: GroupCommand,
    level: int = MAX_FEATURE_LEVEL,
    leases: Mapping[str, int] | None = None,
) -> list[GroupEvent]:
    """Return the events `command` causes at feature `level`; raise a `CoordinationError` to
    refuse it."""
    return _decide(state, command, level, leases).events


def execute(
    state: GroupState | None,
    command: GroupCommand,
    level: int = MAX_FEATURE_LEVEL,
    leases: Mapping[str, int] | None = None,
) -> tuple[GroupState, list[GroupEvent]]:
    """Decide `command` and apply its events: the new state and what happened.

    The same as `decide` followed by `fold`, without applying the events twice. `level` is
    the deployment's feature level: nothing a lower level cannot replay is emitted. `leases`:
    the lease table as of this command (`Tick` brings its own); where it is not given, a live
    member's lease counts as running for one whole lease from now.
    """
    decision = _decide(state, command, level, leases)
    return decision.group, decision.events


def _decide(
    state: GroupState | None, command: GroupCommand, level: int, leases: Mapping[str, int] | None
) -> Decision:
    if state is not None and state.deleted:
        return _decide_deleted(state, command)
    decision = Decision(state, level, leases)
    match command:
        case CreateGroup():
            _create(decision, command)
        case Heartbeat():
            _heartbeat(decision, command)
        case Tick():
            _tick(decision, command)
        case ApplyLayout():
            _apply_layout(decision, command)
        case ConfigureGroup():
            check_group_change(decision.group.config, command.config)
            if not 1 <= command.config.max_concurrency <= MAX_CONCURRENCY:
                raise InvalidCommand(f"maxConcurrency must be between 1 and {MAX_CONCURRENCY}")
            hold_ms = command.config.static_hold_ms
            if hold_ms is not None and not 0 <= hold_ms <= MAX_STATIC_HOLD_MS:
                raise InvalidCommand(f"staticHoldMs must be between 0 and {MAX_STATIC_HOLD_MS}")
            if decision.group.config != command.config:
                decision.emit(GroupConfigured(command.config))
                shorten_holds(decision, command.now_ms)
                refresh_target(decision, command.now_ms)
        case RemoveMember():
            group = decision.group
            if command.member_id not in group.members:
                hold = group.holds.get(command.member_id)
                if hold is None or not hold.static:
                    raise AggregateNotFound(f"no live member {command.member_id!r}")
                # A static member's hold ends by hand: its shards go to the others now.
                decision.emit(HoldEnded(command.member_id, group.group_epoch + 1))
            else:
                fence(decision, command.member_id, FenceReason.REMOVED, command.now_ms)
            refresh_target(decision, command.now_ms)
        case RestartTimers():
            _restart(decision, command.now_ms)
        case PauseGroup() | ResumeGroup() | RecordPositionReset():
            _operate(decision, command)
        case DeleteGroup():
            members = sorted(decision.group.members)
            if members:
                shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
                raise NotEmpty(f"the group has {len(members)} live member(s): {shown}; stop them first")
            waiting = decision.group.quarantined(command.now_ms)
            if waiting:  # a group made afresh would give them out at once
                until = max(decision.group.quarantine[s] for s in waiting)
                raise NotEmpty(
                    f"shards {sorted(waiting)} may still be handled by a member that was fenced (or of "
                    f"a group Redis lost) for {until - command.now_ms} ms more; delete it after that"
                )
            decision.emit(GroupDeleted(command.now_ms))
        case _:
            assert_never(command)
    return decision


def _decide_deleted(state: GroupState, command: GroupCommand) -> Decision:
    """A deleted group: created afresh by `CreateGroup`; deleting again changes nothing."""
    decision = Decision(state)
    match command:
        case CreateGroup():
            decision.state = None  # created afresh: `GroupCreated` follows `GroupDeleted`
            _create(decision, command)
        case DeleteGroup() | Tick() | RestartTimers():
            pass
        case (
            Heartbeat()
            | ApplyLayout()
            | ConfigureGroup()
            | RemoveMember()
            | PauseGroup()
            | ResumeGroup()
            | RecordPositionReset()
        ):
            raise Deleted(f"group {state.group!r} of {state.stream_prefix!r} was deleted")
        case _:
            assert_never(command)
    return decision


def _operate(decision: Decision, command: PauseGroup | ResumeGroup | RecordPositionReset) -> None:
    """An operator's pause, resume or position reset (feature level 7). A pause empties the
    target at once (not at the next assignment interval): every member revokes what it holds
    through the ordinary protocol; a resume assigns again. Both are idempotent (a second
    pause keeps the first reason and time)."""
    if decision.level < GROUP_OPS_LEVEL:
        raise FeatureLevelRequired(
            f"pausing, resuming and resetting a group needs feature level {GROUP_OPS_LEVEL}",
            GROUP_OPS_LEVEL,
            decision.level,
        )
    group = decision.group
    match command:
        case PauseGroup():
            if not command.reason or not is_plain_text(command.reason, 200):
                raise InvalidCommand("reason must be 1-200 characters of plain text")
            if group.paused is None:
                decision.emit(GroupPaused(command.reason, command.now_ms, group.group_epoch + 1))
                refresh_target(decision, command.now_ms, at_once=True)
        case ResumeGroup():
            if group.paused is not None:
                decision.emit(GroupResumed(command.now_ms, group.group_epoch + 1))
                refresh_target(decision, command.now_ms, at_once=True)
        case RecordPositionReset():
            decision.emit(GroupPositionReset(command.positions, command.by, command.plan, command.now_ms))


def _create(decision: Decision, command: CreateGroup) -> None:
    if decision.state is not None:
        return  # idempotent: the group exists
    check_name(command.stream_prefix, "streamPrefix")
    check_name(command.group, "consumerGroup")
    decision.emit(
        GroupCreated(
            stream_prefix=command.stream_prefix,
            group=command.group,
            layout=command.layout,
            timing=command.timing,
            config=command.config,
            created_at_ms=command.now_ms,
        )
    )
    readable = command.layout.readable_indexes
    if command.rebuilt and decision.static_level and readable:
        # The lost group's members may be handling any shard until their leases end: nobody
        # is installed one before then unless its holder reports it (`_adopt`) and releases it.
        decision.emit(ShardsQuarantined(readable, command.now_ms + command.timing.lease_ttl_ms))


def _heartbeat(decision: Decision, hb: Heartbeat) -> None:
    group = decision.group
    member = group.members.get(hb.member_id)
    # A live member's id and incarnation were checked when it joined.
    _validate_heartbeat(hb, ids=member is None or member.incarnation != hb.incarnation)
    if group.superseded and hb.incarnation in group.superseded.get(hb.member_id, ()):
        # Taken over by a newer process with its id: this one stops for good.
        decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.FENCED, FenceReason.REPLACED))
        return
    if group.holds or group.quarantine:
        expire_holds(decision, hb.now_ms)
        refresh_target(decision, hb.now_ms)  # a hold that ended gives its shards out now
        group = decision.group
    static = hb.static and decision.static_level
    if member is not None and member.incarnation != hb.incarnation:
        if not (member.static and static and hb.member_epoch == 0 and not hb.recheck):
            raise IncarnationMismatch(
                f"member {hb.member_id!r} is live with another incarnation; wait for its lease to end"
                + ("" if member.static else " (or make it static: a new incarnation then takes over)")
            )
        take_over(decision, member, hb.now_ms)
        group = decision.group
        member = None
    if hb.recheck and (member is None or hb.member_epoch <= 0 or not _recheck_accepted(member, hb)):
        raise StaleRecheck(f"member {hb.member_id!r} moved on since its held heartbeat")
    if hb.member_epoch == -1:
        _leave(decision, hb)
        return
    claimed = _claimed(decision, hb) if member is None and hb.member_epoch > 0 else None
    if member is None and hb.member_epoch > 0 and not claimed:
        tomb = group.fenced.get(hb.member_id)
        if tomb is None:
            decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.UNKNOWN_MEMBER))
        else:
            decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.FENCED, tomb.reason))
        return
    if member is None:
        if hb.max_members and len(group.members) >= hb.max_members:
            raise QuotaExceeded(
                f"the group has {hb.max_members} live members, as many as this caller's quota "
                f"{quotas.MEMBERS_PER_GROUP} allows; a member may join once another leaves",
                quotas.MEMBERS_PER_GROUP,
                hb.max_members,
            )
        decision.emit(
            MemberJoined(
                hb.member_id, hb.incarnation, hb.client, hb.now_ms, group.group_epoch + 1, static=static
            )
        )
        if claimed:  # a holder of the lost group: it keeps what it reports until revoked
            decision.emit(QuarantineEnded(claimed))
            decision.emit(ShardsInstalled(hb.member_id, claimed))
    elif hb.member_epoch > 0 and not _epoch_accepted(member, hb):
        decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.FENCED, FenceReason.STALE_EPOCH))
        return
    decision.emit(
        MemberHeartbeated(
            hb.member_id, hb.now_ms + group.timing.lease_ttl_ms, _drain_reports(group, member, hb), hb.owned
        )
    )
    if member is not None and (stalled := hb.stalled & member.installed):
        decision.emit(ShardsReportedStalled(hb.member_id, stalled))
    if hb.leaving and member is not None and not member.leaving:
        remember(decision, member, hb.now_ms)
        decision.emit(MemberLeaving(hb.member_id, decision.group.group_epoch + 1))
    refresh_target(decision, hb.now_ms)
    reconcile(decision, hb)


def _claimed(decision: Decision, hb: Heartbeat) -> frozenset[int]:
    """The shards a member the group does not know (`memberEpoch` > 0) reports holding, if it
    is a holder of a group Redis lost: it is not fenced, reports shards, and every readable one
    it reports is quarantined and installed to nobody (the rebuilt group waits for exactly
    these holders). It is then taken in holding them, and they move on through the ordinary
    revoke -> release -> install, `REVOKE_PENDING` for whoever waits for them. Anything else
    (a shard another member holds or that is free: a conflict, or a stale member): nothing,
    and it is answered `UNKNOWN_MEMBER` as before. Raises nothing."""
    group = decision.group
    if not decision.static_level or not hb.owned or hb.member_id in group.fenced or hb.leaving:
        return frozenset()
    claimed = hb.owned & group.layout.readable_indexes
    quarantined = group.quarantined(hb.now_ms)
    if not claimed or not claimed <= quarantined or any(s in group.owners for s in claimed):
        return frozenset()
    return claimed


def _drain_reports(group: GroupState, member: Member | None, hb: Heartbeat) -> tuple[DrainProgress, ...]:
    """The member's reports on DRAINING shards assigned to it (the rest of what it sent is ignored:
    a report is telemetry for operators, never evidence for retirement)."""
    if member is None or not hb.drain_progress:
        return ()
    draining = {s.index for s in group.layout.draining}
    mine = (member.assigned | member.revoking) & draining
    return tuple(
        sorted({r.shard: r for r in hb.drain_progress if r.shard in mine}.values(), key=lambda r: r.shard)
    )


def _epoch_accepted(member: Member, hb: Heartbeat) -> bool:
    """The member's own epoch, or the previous one when a response was lost; for a quiet
    member (moved by a target that kept its shards, feature level 8), any epoch since the last
    one it was surely told. An older epoch than those only while it reports nothing it does
    not hold."""
    if hb.member_epoch == member.member_epoch:
        return True
    if not hb.owned <= member.installed:
        return False
    return _quietly_passed(member, hb.member_epoch) or hb.member_epoch == member.previous_epoch


def _recheck_accepted(member: Member, hb: Heartbeat) -> bool:
    """A held heartbeat decided again at the epoch its answer gave: the member's epoch still,
    or one a target that kept its shards moved on from since (it then learns the new one)."""
    return hb.member_epoch == member.member_epoch or _quietly_passed(member, hb.member_epoch)


def _quietly_passed(member: Member, epoch: int) -> bool:
    """`epoch` is one a quiet member may still know: from the one it surely knows to its own."""
    return member.quiet and member.previous_epoch <= epoch < member.member_epoch


def _leave(decision: Decision, hb: Heartbeat) -> None:
    member = decision.group.members.get(hb.member_id)
    if member is None:
        decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.UNKNOWN_MEMBER))
        return
    shards = decision.group.target_of(member.member_id)
    if not member.static:
        remember(decision, member, hb.now_ms)
    if member.installed:
        decision.emit(ShardsReleased(hb.member_id, member.installed, ReleaseReason.LEFT))
    decision.emit(MemberLeft(hb.member_id, decision.group.group_epoch + 1))
    if member.static:
        hold_shards(decision, member, shards, hb.now_ms)
    refresh_target(decision, hb.now_ms)


def _restart(decision: Decision, now_ms: int) -> None:
    """Every member's lease and revoke timeout start again in full (after a recovery or a reload)."""
    group = decision.group
    if not group.members:
        return
    decision.emit(TimersRestarted(now_ms))
    deadline = now_ms + group.timing.lease_ttl_ms
    for member_id in sorted(group.members):
        decision.emit(MemberHeartbeated(member_id, deadline))


def _tick(decision: Decision, tick: Tick) -> None:
    now_ms = tick.now_ms
    decision.leases = tick.leases
    expire_holds(decision, now_ms)
    for member_id in sorted(decision.group.members):
        member = decision.group.members[member_id]
        if expired(tick.leases, member_id, now_ms):
            fence(decision, member_id, FenceReason.LEASE_EXPIRED, now_ms)
        elif member.revoke_deadline_ms is not None and now_ms >= member.revoke_deadline_ms:
            fence(decision, member_id, FenceReason.REVOKE_TIMEOUT, now_ms)
    refresh_target(decision, now_ms)


def due_ms(group: GroupState, leases: Mapping[str, int]) -> int | None:
    """The earliest time (ms) at which a `Tick` may change `group`, reading `leases`; None when
    no tick will until a command changes it (no members, holds or quarantine).

    A tick before it emits nothing (tests/core/test_group_machine.py checks it after every
    step), so a driver may sleep until then instead of ticking on every interval: the earliest
    of the members' lease ends and revoke deadlines, the ends of holds and quarantines, and,
    when the group epoch is ahead of the target, when the assignment interval allows a new one.
    A time already past means: tick now."""
    if group.deleted or not (group.members or group.holds or group.quarantine):
        return None
    times = list(group.quarantine.values())
    times.extend(hold.until_ms for hold in group.holds.values())
    members = group.members
    if len(leases) == len(members) and members.keys() <= leases.keys():
        # The table holds exactly the members (as it does between batches): its earliest
        # deadline, read in one pass over the table (the actor asks after every batch).
        if members:
            times.append(min(leases.values()))
        times.extend(_revoke_deadlines(members))
    else:
        for member_id, member in members.items():
            times.append(leases.get(member_id, 0))
            if member.revoke_deadline_ms is not None:
                times.append(member.revoke_deadline_ms)
    if group.group_epoch > group.assignment_epoch:
        last = group.assignment_computed_at_ms
        times.append(0 if last is None else last + assignment_interval_ms(group))
    return min(times, default=None)


#: The members' revoke deadlines, once per members mapping (a steady group's batch keeps it).
_revoke_deadlines: LastOf[Mapping[str, Member], list[int]] = LastOf(
    lambda members: [m.revoke_deadline_ms for m in members.values() if m.revoke_deadline_ms is not None]
)


def _apply_layout(decision: Decision, command: ApplyLayout) -> None:
    group = decision.group
    if command.layout.metadata_version <= group.layout.metadata_version:
        return  # already applied (layouts only move forward)
    decision.emit(LayoutApplied(command.layout, group.group_epoch + 1))
    refresh_target(decision, command.now_ms)


def validate_heartbeat(hb: Heartbeat, ids: bool) -> None:
    """Refuse (`InvalidCommand`) a heartbeat with a field out of range, whatever the group's
    state (`ids`: check the member id, incarnation and client too, which are stored on a join).
    The HTTP layer calls it before looking the group up, so a bad request is a 400 even for a
    group that does not exist."""
    _validate_heartbeat(hb, ids)


def _validate_heartbeat(hb: Heartbeat, ids: bool) -> None:
    if ids:  # a join (or a new incarnation): what is stored then is checked then
        check_id(hb.member_id, "memberId")
        check_id(hb.incarnation, "incarnation")
        check_client(hb.client)
    if hb.member_epoch < -1:
        raise InvalidCommand("memberEpoch must be -1 (leave), 0 (join) or a received epoch")
    check_counter(hb.member_epoch, "memberEpoch")
    if hb.metadata_version < 0:
        raise InvalidCommand("metadataVersion must not be negative")
    check_counter(hb.metadata_version, "metadataVersion")
    if (hb.owned and min(hb.owned) < 0) or (hb.revoked and min(hb.revoked) < 0):
        raise InvalidCommand("shard indexes are never negative")
    if hb.stalled and (min(hb.stalled) < 0 or max(hb.stalled) >= MAX_SHARDS):
        raise InvalidCommand(f"stalledShards are shard indexes from 0 to {MAX_SHARDS - 1}")
    if (hb.owned and max(hb.owned) >= MAX_SHARDS) or (hb.revoked and max(hb.revoked) >= MAX_SHARDS):
        raise InvalidCommand(f"shard indexes are below {MAX_SHARDS}")
    if len(hb.drain_progress) > MAX_SHARDS:
        raise InvalidCommand(f"drainProgress has at most {MAX_SHARDS} reports")
    for report in hb.drain_progress:
        if report.shard < 0 or report.pending < 0 or (report.lag is not None and report.lag < 0):
            raise InvalidCommand("drainProgress figures are never negative")
