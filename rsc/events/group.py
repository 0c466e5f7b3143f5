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

Leases are not part of the state (`rsc.events.liveness`): a heartbeat emits
`MemberHeartbeated` (also after `MemberJoined`, and for every member after
`TimersRestarted`), the driver keeps the lease table, and a `Tick` brings it
in to fence those whose lease ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, assert_never

import attrs

from rsc.events import assignor, quotas
from rsc.events.admin_rules import check_group_change
from rsc.events.commands import (
    ApplyLayout,
    ConfigureGroup,
    CreateGroup,
    DeleteGroup,
    GroupCommand,
    Heartbeat,
    RemoveMember,
    RestartTimers,
    Tick,
)
from rsc.events.errors import (
    AggregateNotFound,
    CorruptHistory,
    Deleted,
    IncarnationMismatch,
    InvalidCommand,
    NotEmpty,
    QuotaExceeded,
    StaleRecheck,
)
from rsc.events.events import (
    AssignmentHeld,
    GroupConfigured,
    GroupCreated,
    GroupDeleted,
    GroupEvent,
    HeartbeatRejected,
    HoldEnded,
    LayoutApplied,
    MemberEpochAdvanced,
    MemberFenced,
    MemberHeartbeated,
    MemberJoined,
    MemberLeaving,
    MemberLeft,
    QuarantineEnded,
    ShardsInstalled,
    ShardsQuarantined,
    ShardsReleased,
    ShardsReportedStalled,
    ShardsRevokeAcked,
    ShardsRevokeRequested,
    TargetAssignmentUpdated,
    TimersRestarted,
)
from rsc.events.liveness import expired
from rsc.events.model import (
    MAX_STATIC_HOLD_MS,
    DrainProgress,
    FencedMember,
    FenceReason,
    GroupConfig,
    HeartbeatStatus,
    Hold,
    Layout,
    Member,
    MemberState,
    ReleaseReason,
    Timing,
    check_client,
    check_counter,
    check_id,
    check_name,
)
from rsc.events.stream import MAX_CONCURRENCY, MAX_SHARDS
from rsc.events.versions import MAX_FEATURE_LEVEL, STATIC_LEVEL

#: Tombstones of fenced members kept so that they hear FENCED, oldest dropped first.
FENCED_MEMORY = 1024
#: Superseded incarnations kept per static member id (they are told FENCED, reason REPLACED).
SUPERSEDED_PER_ID = 8

_EMPTY: frozenset[int] = frozenset()


def _omitted_while_empty() -> Any:
    """A state mapping left out of snapshots while empty (levels below 4 never fill it)."""
    return attrs.field(factory=dict, metadata={"omit_if_default": True})


@attrs.frozen
class GroupState:
    """Everything the coordinator knows about one consumer group."""

    stream_prefix: str
    group: str
    layout: Layout
    timing: Timing
    config: GroupConfig
    created_at_ms: int
    #: Readable shards when the group was created: they start at `config.start_from`;
    #: shards added later always start at the beginning.
    initial_shards: frozenset[int] = frozenset()
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignment_computed_at_ms: int | None = None
    target: Mapping[str, frozenset[int]] = attrs.field(factory=dict)
    members: Mapping[str, Member] = attrs.field(factory=dict)
    owners: Mapping[int, str] = attrs.field(factory=dict)
    fenced: Mapping[str, FencedMember] = attrs.field(factory=dict)
    #: Deleted by the Admin API: refuses everything until created afresh.
    deleted: bool = False
    #: Member ids that stopped, with what they were targeted (`Hold`): a static member's shards
    #: stay targeted to it (installed to nobody else); for others, a memory for a rejoin.
    holds: Mapping[str, Hold] = _omitted_while_empty()
    #: Static member id -> incarnations taken over by a newer one: told FENCED (REPLACED) for ever.
    superseded: Mapping[str, tuple[str, ...]] = _omitted_while_empty()
    #: Shard -> until when it is installed to nobody (its fenced holder may still be handling it).
    quarantine: Mapping[int, int] = _omitted_while_empty()

    def target_of(self, member_id: str) -> frozenset[int]:
        """The shards the current target gives `member_id`."""
        return self.target.get(member_id, _EMPTY)

    def pending_of(self, member: Member) -> frozenset[int]:
        """Targeted shards not yet installed to `member` (someone else holds them, it must revoke
        first, or they are quarantined); nothing for a static member that is leaving (its target
        is kept for its return, not for now)."""
        if member.leaving and member.static:
            return _EMPTY
        return self.target_of(member.member_id) - member.installed

    def held(self) -> dict[str, frozenset[int]]:
        """Member id -> ACTIVE shards held for it: a static member that stopped, within its
        hold, and a static member that is leaving (its shards wait for it, not for others).
        The assignor balances the other shards over the other members. A DRAINING shard is
        never held: it is not new work, and a scale-in (or a quiesce migration) waits for it to
        be read to its end, so it goes to another member as when any member leaves."""
        active = self.layout.active_indexes
        out = {m: self.target_of(m) & active for m, hold in self.holds.items() if hold.static}
        for m, member in self.members.items():
            if member.static and member.leaving:
                out[m] = self.target_of(m) & active
        return out

    def quarantined(self, now_ms: int) -> frozenset[int]:
        """Shards that may not be installed at `now_ms`."""
        if not self.quarantine:
            return _EMPTY
        return frozenset(s for s, until in self.quarantine.items() if now_ms < until)

    def member_state(self, member: Member) -> MemberState:
        """Where `member` stands in its reconciliation."""
        if member.revoking or not member.assigned <= self.target_of(member.member_id):
            return MemberState.UNREVOKED  # revoking, or holding what it must hand over
        if self.pending_of(member) or member.member_epoch != self.assignment_epoch:
            return MemberState.UNRELEASED
        return MemberState.STABLE


# --- evolve ---------------------------------------------------------------


def evolve(state: GroupState | None, event: GroupEvent) -> GroupState:
    """Apply one event; raise `CorruptHistory` if it cannot follow `state`."""
    if state is None or state.deleted:
        if not isinstance(event, GroupCreated):
            raise CorruptHistory(f"{type(event).__name__} before GroupCreated")
        return GroupState(
            stream_prefix=event.stream_prefix,
            group=event.group,
            layout=event.layout,
            timing=event.timing,
            config=event.config,
            created_at_ms=event.created_at_ms,
            initial_shards=event.layout.readable_indexes,
        )
    match event:
        case GroupCreated():
            raise CorruptHistory("GroupCreated twice")
        case MemberJoined():
            return _join(state, event)
        case GroupDeleted():
            if state.members:
                raise CorruptHistory("group deleted with live members")
            return attrs.evolve(
                state,
                deleted=True,
                target={},
                fenced={},
                assignment_computed_at_ms=None,
                holds={},
                superseded={},
                quarantine={},
            )
        case MemberHeartbeated() | ShardsReportedStalled():
            _member(state, event.member_id)  # liveness only: the lease table takes the deadline
            return state
        case MemberLeft():
            return _drop_member(state, event.member_id, event.group_epoch)
        case MemberLeaving():
            member = attrs.evolve(_member(state, event.member_id), leaving=True)
            return attrs.evolve(_put(state, member), group_epoch=event.group_epoch)
        case MemberFenced():
            tomb = FencedMember(event.member_id, event.incarnation, event.reason, event.fenced_at_ms)
            fenced = {k: v for k, v in state.fenced.items() if k != event.member_id}
            fenced[event.member_id] = tomb
            while len(fenced) > FENCED_MEMORY:
                del fenced[next(iter(fenced))]
            return attrs.evolve(_drop_member(state, event.member_id, event.group_epoch), fenced=fenced)
        case TargetAssignmentUpdated():
            return _retarget(state, event)
        case AssignmentHeld() | HoldEnded() | ShardsQuarantined() | QuarantineEnded():
            return _evolve_holds(state, event)
        case MemberEpochAdvanced():
            member = _member(state, event.member_id)
            return _put(
                state,
                attrs.evolve(member, member_epoch=event.member_epoch, previous_epoch=member.member_epoch),
            )
        case ShardsRevokeRequested():
            member = _member(state, event.member_id)
            if not event.shards <= member.assigned:
                raise CorruptHistory(f"revoke of shards {member.member_id} does not hold")
            return _put(
                state,
                attrs.evolve(
                    member,
                    assigned=member.assigned - event.shards,
                    revoking=member.revoking | event.shards,
                    revoking_since_ms=member.revoking_since_ms or event.requested_at_ms,
                    revoke_deadline_ms=member.revoke_deadline_ms or event.deadline_ms,
                ),
            )
        case ShardsRevokeAcked():
            # The member's word only; the release that follows changes ownership.
            if not event.shards <= _member(state, event.member_id).revoking:
                raise CorruptHistory(f"ack of shards {event.member_id} was not revoking")
            return state
        case ShardsReleased():
            member = _member(state, event.member_id)
            if any(state.owners.get(s) != member.member_id for s in event.shards):
                raise CorruptHistory(f"release of shards {member.member_id} does not own")
            owners = {s: m for s, m in state.owners.items() if s not in event.shards}
            return attrs.evolve(_put(state, _without(member, event.shards)), owners=owners)
        case ShardsInstalled():
            member = _member(state, event.member_id)
            if any(s in state.owners for s in event.shards):
                raise CorruptHistory("install of a shard another member holds")
            owners = {**state.owners, **dict.fromkeys(event.shards, member.member_id)}
            member = attrs.evolve(member, assigned=member.assigned | event.shards)
            return attrs.evolve(_put(state, member), owners=owners)
        case LayoutApplied():
            return attrs.evolve(state, layout=event.layout, group_epoch=event.group_epoch)
        case GroupConfigured():
            return attrs.evolve(state, config=event.config)
        case TimersRestarted():
            return _restart_timers(state, event.restarted_at_ms)
        case HeartbeatRejected():
            return state
        case _:
            assert_never(event)


def _retarget(state: GroupState, event: TargetAssignmentUpdated) -> GroupState:
    """A new target; the memories it served (of members now staying with a target) are done."""
    holds = state.holds
    if holds:  # a memory has served once its (rejoined, staying) member has a target
        holds = {m: h for m, h in holds.items() if h.static or m not in event.changed or _departed(state, m)}
    return attrs.evolve(
        state,
        target={**state.target, **event.changed},
        assignment_epoch=event.assignment_epoch,
        assignment_computed_at_ms=event.computed_at_ms,
        holds=holds,
    )


def _evolve_holds(
    state: GroupState, event: AssignmentHeld | HoldEnded | ShardsQuarantined | QuarantineEnded
) -> GroupState:
    """Holds, memories and quarantines (feature level 4)."""
    match event:
        case AssignmentHeld():
            new = Hold(event.incarnation, event.shards, event.until_ms, event.static)
            target = {**state.target, event.member_id: event.shards} if event.static else state.target
            return attrs.evolve(state, holds={**state.holds, event.member_id: new}, target=target)
        case HoldEnded():
            ended = state.holds.get(event.member_id)
            if ended is None:
                raise CorruptHistory(f"end of a hold {event.member_id} does not have")
            holds = {m: h for m, h in state.holds.items() if m != event.member_id}
            target = state.target
            if ended.static and event.member_id not in state.members:
                target = {m: t for m, t in target.items() if m != event.member_id}
            return attrs.evolve(state, holds=holds, target=target, group_epoch=event.group_epoch)
        case ShardsQuarantined():
            quarantine = dict(state.quarantine)
            for s in event.shards:
                quarantine[s] = max(quarantine.get(s, 0), event.until_ms)
            return attrs.evolve(state, quarantine=quarantine)
        case QuarantineEnded():
            quarantine = {s: t for s, t in state.quarantine.items() if s not in event.shards}
            return attrs.evolve(state, quarantine=quarantine)


def fold(events: Iterable[GroupEvent], state: GroupState | None = None) -> GroupState | None:
    """Apply `events` in order, starting from `state` (None: from nothing)."""
    for event in events:
        state = evolve(state, event)
    return state


def _member(state: GroupState, member_id: str) -> Member:
    try:
        return state.members[member_id]
    except KeyError:
        raise CorruptHistory(f"event for unknown member {member_id!r}") from None


def _put(state: GroupState, member: Member) -> GroupState:
    return attrs.evolve(state, members={**state.members, member.member_id: member})


def _without(member: Member, shards: frozenset[int]) -> Member:
    """`member` no longer holding `shards`, whether they were readable or being revoked."""
    revoking = member.revoking - shards
    return attrs.evolve(
        member,
        assigned=member.assigned - shards,
        revoking=revoking,
        revoking_since_ms=member.revoking_since_ms if revoking else None,
        revoke_deadline_ms=member.revoke_deadline_ms if revoking else None,
    )


def _drop_member(state: GroupState, member_id: str, group_epoch: int) -> GroupState:
    member = _member(state, member_id)
    if member.installed:
        raise CorruptHistory(f"{member_id} removed while holding shards")
    members = {k: v for k, v in state.members.items() if k != member_id}
    target = {k: v for k, v in state.target.items() if k != member_id}
    return attrs.evolve(state, members=members, target=target, group_epoch=group_epoch)


def _restart_timers(state: GroupState, now_ms: int) -> GroupState:
    """Every revoke in progress gets a whole timeout from `now_ms` (the leases restart by events)."""
    revoke = now_ms + state.timing.revoke_timeout_ms
    members = {
        k: attrs.evolve(m, revoke_deadline_ms=revoke if m.revoking else None)
        for k, m in state.members.items()
    }
    return attrs.evolve(state, members=members)


def _departed(state: GroupState, member_id: str) -> bool:
    """`member_id` is not a staying member (gone, or leaving)."""
    member = state.members.get(member_id)
    return member is None or member.leaving


def _join(state: GroupState, event: MemberJoined) -> GroupState:
    member_id = event.member_id
    member = Member(
        member_id=member_id,
        incarnation=event.incarnation,
        member_epoch=0,
        previous_epoch=-1,
        client=event.client,
        joined_at_ms=event.joined_at_ms,
        static=event.static,
    )
    tomb = state.fenced.get(member_id)
    fenced = {k: v for k, v in state.fenced.items() if k != member_id} if tomb else state.fenced
    holds, superseded = state.holds, state.superseded
    hold = holds.get(member_id)
    if event.static:  # the incarnation it stopped with, or was fenced with, is over for good
        before = hold.incarnation if hold is not None else tomb.incarnation if tomb else None
        if before is not None and before != event.incarnation:
            superseded = _supersede(superseded, member_id, before)
    if hold is not None and hold.static:  # back within its hold: its target is its own again
        holds = {m: h for m, h in holds.items() if m != member_id}
    return attrs.evolve(
        state,
        members={**state.members, member_id: member},
        fenced=fenced,
        group_epoch=event.group_epoch,
        holds=holds,
        superseded=superseded,
    )


def _supersede(
    superseded: Mapping[str, tuple[str, ...]], member_id: str, incarnation: str
) -> dict[str, tuple[str, ...]]:
    """`superseded` with `incarnation` of `member_id` added (bounded per id and in all)."""
    out = {k: v for k, v in superseded.items() if k != member_id}
    kept = superseded.get(member_id, ())
    out[member_id] = (*[i for i in kept if i != incarnation], incarnation)[-SUPERSEDED_PER_ID:]
    while len(out) > FENCED_MEMORY:
        del out[next(iter(out))]
    return out


# --- decide ---------------------------------------------------------------


class _Decision:
    """Collects events and keeps the state they lead to, so later rules see earlier effects."""

    def __init__(
        self,
        state: GroupState | None,
        level: int = MAX_FEATURE_LEVEL,
        leases: Mapping[str, int] | None = None,
    ) -> None:
        self.state = state
        self.events: list[GroupEvent] = []
        #: The deployment's feature level: static members, holds and quarantines from 4.
        self.level = level
        #: The lease table as of this command (None: not known; a lease then counts as running
        #: for a whole lease from now wherever that is the safe side).
        self.leases = leases

    def lease_end(self, member_id: str, now_ms: int) -> int:
        """When `member_id`'s lease ends: as the table says, else (not known) one lease from now."""
        if self.leases is not None and member_id in self.leases:
            return self.leases[member_id]
        return now_ms + self.group.timing.lease_ttl_ms

    @property
    def static_level(self) -> bool:
        return self.level >= STATIC_LEVEL

    @property
    def group(self) -> GroupState:
        if self.state is None:
            raise AggregateNotFound("the group does not exist")
        return self.state

    def emit(self, event: GroupEvent) -> None:
        self.events.append(event)
        self.state = evolve(self.state, event)


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
) -> _Decision:
    if state is not None and state.deleted:
        return _decide_deleted(state, command)
    decision = _Decision(state, level, leases)
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
                _shorten_holds(decision, command.now_ms)
        case RemoveMember():
            group = decision.group
            if command.member_id not in group.members:
                hold = group.holds.get(command.member_id)
                if hold is None or not hold.static:
                    raise AggregateNotFound(f"no live member {command.member_id!r}")
                # A static member's hold ends by hand: its shards go to the others now.
                decision.emit(HoldEnded(command.member_id, group.group_epoch + 1))
            else:
                _fence(decision, command.member_id, FenceReason.REMOVED, command.now_ms)
            _refresh_target(decision, command.now_ms)
        case RestartTimers():
            _restart(decision, command.now_ms)
        case DeleteGroup():
            members = sorted(decision.group.members)
            if members:
                shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
                raise NotEmpty(f"the group has {len(members)} live member(s): {shown}; stop them first")
            decision.emit(GroupDeleted(command.now_ms))
        case _:
            assert_never(command)
    return decision


def _decide_deleted(state: GroupState, command: GroupCommand) -> _Decision:
    """A deleted group: created afresh by `CreateGroup`; deleting again changes nothing."""
    decision = _Decision(state)
    match command:
        case CreateGroup():
            decision.state = None  # created afresh: `GroupCreated` follows `GroupDeleted`
            _create(decision, command)
        case DeleteGroup() | Tick() | RestartTimers():
            pass
        case Heartbeat() | ApplyLayout() | ConfigureGroup() | RemoveMember():
            raise Deleted(f"group {state.group!r} of {state.stream_prefix!r} was deleted")
        case _:
            assert_never(command)
    return decision


def _create(decision: _Decision, command: CreateGroup) -> None:
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


def _heartbeat(decision: _Decision, hb: Heartbeat) -> None:
    group = decision.group
    member = group.members.get(hb.member_id)
    # A live member's id and incarnation were checked when it joined.
    _validate_heartbeat(hb, ids=member is None or member.incarnation != hb.incarnation)
    if group.superseded and hb.incarnation in group.superseded.get(hb.member_id, ()):
        # Taken over by a newer process with its id: this one stops for good.
        decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.FENCED, FenceReason.REPLACED))
        return
    if group.holds or group.quarantine:
        _expire(decision, hb.now_ms)
        _refresh_target(decision, hb.now_ms)  # a hold that ended gives its shards out now
        group = decision.group
    static = hb.static and decision.static_level
    if member is not None and member.incarnation != hb.incarnation:
        if not (member.static and static and hb.member_epoch == 0 and not hb.recheck):
            raise IncarnationMismatch(
                f"member {hb.member_id!r} is live with another incarnation; wait for its lease to end"
                + ("" if member.static else " (or make it static: a new incarnation then takes over)")
            )
        _replace(decision, member, hb.now_ms)
        group = decision.group
        member = None
    if hb.recheck and (member is None or hb.member_epoch <= 0 or hb.member_epoch != member.member_epoch):
        raise StaleRecheck(f"member {hb.member_id!r} moved on since its held heartbeat")
    if hb.member_epoch == -1:
        _leave(decision, hb)
        return
    if member is None and hb.member_epoch > 0:
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
        _remember(decision, member, hb.now_ms)
        decision.emit(MemberLeaving(hb.member_id, decision.group.group_epoch + 1))
    _refresh_target(decision, hb.now_ms)
    _reconcile(decision, hb)


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
    """The member's own epoch, or the previous one when a response was lost."""
    if hb.member_epoch == member.member_epoch:
        return True
    return hb.member_epoch == member.previous_epoch and hb.owned <= member.installed


def _leave(decision: _Decision, hb: Heartbeat) -> None:
    member = decision.group.members.get(hb.member_id)
    if member is None:
        decision.emit(HeartbeatRejected(hb.member_id, HeartbeatStatus.UNKNOWN_MEMBER))
        return
    shards = decision.group.target_of(member.member_id)
    if not member.static:
        _remember(decision, member, hb.now_ms)
    if member.installed:
        decision.emit(ShardsReleased(hb.member_id, member.installed, ReleaseReason.LEFT))
    decision.emit(MemberLeft(hb.member_id, decision.group.group_epoch + 1))
    if member.static:
        _hold(decision, member, shards, hb.now_ms)
    _refresh_target(decision, hb.now_ms)


def _hold_ms(group: GroupState) -> int:
    """How long a static member's shards wait for it: the group's setting, or one lease."""
    configured = group.config.static_hold_ms
    return group.timing.lease_ttl_ms if configured is None else configured


def _hold(decision: _Decision, member: Member, shards: frozenset[int], now_ms: int) -> None:
    """A static member stopped: its shards stay targeted to its id for the hold."""
    until = now_ms + _hold_ms(decision.group)
    decision.emit(AssignmentHeld(member.member_id, member.incarnation, shards, until, static=True))


def _remember(decision: _Decision, member: Member, now_ms: int) -> None:
    """A member that is not static stops: remember its target for a lease (from level 4), so
    that it gets those shards back if it rejoins soon and balance allows."""
    group = decision.group
    shards = group.target_of(member.member_id)
    if not decision.static_level or member.static or not shards:
        return
    until = now_ms + group.timing.lease_ttl_ms
    decision.emit(AssignmentHeld(member.member_id, member.incarnation, shards, until, static=False))


def _replace(decision: _Decision, member: Member, now_ms: int) -> None:
    """A new incarnation of a live static member takes it over: the old one is fenced at once
    (its owner tokens go, so Redis refuses its reads, acks and claims), its shards are held for
    the new one, and quarantined until the old one can no longer be running a handler."""
    shards = decision.group.target_of(member.member_id)
    _fence(decision, member.member_id, FenceReason.REPLACED, now_ms)
    _hold(decision, member, shards, now_ms)


def _shorten_holds(decision: _Decision, now_ms: int) -> None:
    """A hold set shorter applies to the holds under way too: none lasts longer than the new
    setting from now (0 ends them at once)."""
    group = decision.group
    latest = now_ms + _hold_ms(group)
    for member_id, hold in sorted(group.holds.items()):
        if hold.static and hold.until_ms > latest and member_id not in group.members:
            decision.emit(AssignmentHeld(member_id, hold.incarnation, hold.shards, latest, static=True))
    _expire(decision, now_ms)
    _refresh_target(decision, now_ms)


def _expire(decision: _Decision, now_ms: int) -> None:
    """End the quarantines and holds that are over at `now_ms`."""
    group = decision.group
    ended = frozenset(s for s, until in group.quarantine.items() if now_ms >= until)
    if ended:
        decision.emit(QuarantineEnded(ended))
    for member_id, hold in sorted(group.holds.items()):
        if now_ms >= hold.until_ms and (not hold.static or member_id not in group.members):
            epoch = decision.group.group_epoch
            decision.emit(HoldEnded(member_id, epoch + 1 if hold.static else epoch))


def _reconcile(decision: _Decision, hb: Heartbeat) -> None:
    """Move one member one step towards its target (Kafka's CurrentAssignmentBuilder)."""
    group = decision.group
    member = group.members[hb.member_id]
    if (
        not member.revoking
        and member.member_epoch == group.assignment_epoch
        and member.assigned == group.target_of(member.member_id)
    ):
        return  # reconciled: nothing to acknowledge, revoke, advance or install
    # A revoking shard is still held only while reported owned and not acked (a recheck
    # speaks for what the member reported when it sent the heartbeat: it acknowledges nothing).
    acked = frozenset() if hb.recheck else member.revoking - (hb.owned - hb.revoked)
    if acked:
        decision.emit(ShardsRevokeAcked(member.member_id, acked))
        decision.emit(ShardsReleased(member.member_id, acked, ReleaseReason.REVOKE_ACKED))
    group = decision.group
    member = group.members[hb.member_id]
    # (A static member that is leaving keeps its target for its return: it holds nothing now.)
    target = _EMPTY if member.leaving and member.static else group.target_of(member.member_id)
    to_revoke = _ready_to_move(group, member.assigned - target)
    if to_revoke:
        deadline = hb.now_ms + group.timing.revoke_timeout_ms
        decision.emit(ShardsRevokeRequested(member.member_id, to_revoke, hb.now_ms, deadline))
    if decision.group.members[member.member_id].revoking:
        return  # keeps its old epoch and gets nothing new until it has acked
    if member.member_epoch != group.assignment_epoch:
        decision.emit(MemberEpochAdvanced(member.member_id, group.assignment_epoch))
    free = frozenset(s for s in target - member.installed if s not in group.owners)
    if free and group.quarantine:
        free -= group.quarantined(hb.now_ms)
    if free:
        decision.emit(ShardsInstalled(member.member_id, free))


def _restart(decision: _Decision, now_ms: int) -> None:
    """Every member's lease and revoke timeout start again in full (after a recovery or a reload)."""
    group = decision.group
    if not group.members:
        return
    decision.emit(TimersRestarted(now_ms))
    deadline = now_ms + group.timing.lease_ttl_ms
    for member_id in sorted(group.members):
        decision.emit(MemberHeartbeated(member_id, deadline))


def _tick(decision: _Decision, tick: Tick) -> None:
    now_ms = tick.now_ms
    decision.leases = tick.leases
    _expire(decision, now_ms)
    for member_id in sorted(decision.group.members):
        member = decision.group.members[member_id]
        if expired(tick.leases, member_id, now_ms):
            _fence(decision, member_id, FenceReason.LEASE_EXPIRED, now_ms)
        elif member.revoke_deadline_ms is not None and now_ms >= member.revoke_deadline_ms:
            _fence(decision, member_id, FenceReason.REVOKE_TIMEOUT, now_ms)
    _refresh_target(decision, now_ms)


def _fence(decision: _Decision, member_id: str, reason: FenceReason, now_ms: int) -> None:
    group = decision.group
    member = group.members[member_id]
    shards = group.target_of(member_id)
    if not (member.static and reason is FenceReason.LEASE_EXPIRED):
        _remember(decision, member, now_ms)
    if member.installed:
        decision.emit(ShardsReleased(member_id, member.installed, ReleaseReason.FENCED))
        until = decision.lease_end(member_id, now_ms)
        if decision.static_level and reason is not FenceReason.LEASE_EXPIRED and until > now_ms:
            # Its lease still runs: it may be handling them until it ends (self-fencing rule).
            decision.emit(ShardsQuarantined(member.installed, until))
    decision.emit(MemberFenced(member_id, member.incarnation, reason, now_ms, decision.group.group_epoch + 1))
    if member.static and reason is FenceReason.LEASE_EXPIRED:
        _hold(decision, member, shards, now_ms)


def _apply_layout(decision: _Decision, command: ApplyLayout) -> None:
    group = decision.group
    if command.layout.metadata_version <= group.layout.metadata_version:
        return  # already applied (layouts only move forward)
    decision.emit(LayoutApplied(command.layout, group.group_epoch + 1))
    _refresh_target(decision, command.now_ms)


def _refresh_target(decision: _Decision, now_ms: int) -> None:
    """Compute a new target if the group epoch moved and the assignment interval allows."""
    group = decision.group
    if group.group_epoch <= group.assignment_epoch:
        return
    last = group.assignment_computed_at_ms
    if last is not None and now_ms - last < group.timing.assignment_interval_ms:
        return
    staying = [m for m, member in group.members.items() if not member.leaving]
    held = group.held() if group.holds or any(m.static for m in group.members.values()) else {}
    skip = frozenset().union(*held.values()) if held else _EMPTY
    remembered = {
        m: h.shards
        for m, h in group.holds.items()
        if not h.static and m in group.members and not group.target.get(m)
    }
    target = draining_stays(
        assignor.assign(staying, group.layout.active_indexes - skip, group.target, remembered),
        group.layout,
        group.target,
        skip,
    )
    target.update(held)
    changed = {m: shards for m, shards in target.items() if group.target.get(m) != shards}
    changed.update({m: frozenset() for m, shards in group.target.items() if shards and m not in target})
    decision.emit(TargetAssignmentUpdated(group.group_epoch, changed, now_ms))


def draining_stays(
    target: dict[str, frozenset[int]],
    layout: Layout,
    previous: Mapping[str, frozenset[int]],
    skip: frozenset[int] = _EMPTY,
) -> dict[str, frozenset[int]]:
    """`target` (a balanced assignment of the ACTIVE shards) with each DRAINING shard added.

    A DRAINING shard is not new work and does not move while it drains: it stays targeted to
    the member it was targeted to, as long as that member is in `target`. Only when that
    member left (or the shard had none) does it go to the member with the fewest shards
    (ties by member id), so that someone reads what is left in it. Shards in `skip` (held
    for a static member) are left out.
    """
    if not target:
        return target
    out = dict(target)
    owner_of = {s: m for m, shards in previous.items() for s in shards}
    for shard in sorted(layout.readable_indexes - layout.active_indexes - skip):
        owner = owner_of.get(shard)
        if owner not in out:
            owner = min(out, key=lambda m: (len(out[m]), m))
        out[owner] = out[owner] | {shard}
    return out


def _ready_to_move(group: GroupState, shards: frozenset[int]) -> frozenset[int]:
    """The shards, of those a member must give up, whose next owner is ready for them.

    A shard is revoked only once the member it is targeted to has reconciled to the current
    assignment epoch (it has been told the shard is pending for it, and waits for it in a long
    poll), or once it is targeted to nobody. Until then the old owner keeps reading it: a
    handoff never leaves a shard idle while its next owner has not yet heard of it. This never
    blocks a member's own progress (shards it keeps this way are not `revoking`), so it cannot
    deadlock; a next owner that never heartbeats again is fenced at the end of its lease,
    which retargets the shard.
    """
    if not shards:
        return shards
    owner_of = {s: m for m, targeted in group.target.items() for s in targeted & shards}
    ready = set()
    for shard in shards:
        owner = group.members.get(owner_of.get(shard, ""))
        static_leaving = owner is not None and owner.leaving and owner.static
        if owner is None or static_leaving or owner.member_epoch == group.assignment_epoch:
            ready.add(shard)
    return frozenset(ready)


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
