"""The group aggregate's state, and how each event changes it.

`GroupState` is everything the coordinator knows about one consumer group, with
the questions the rules ask of it (a member's target, pending shards, held and
quarantined shards, where a member stands in its reconciliation). `evolve(state,
event)` applies one event and `fold` a sequence of them, from `None` (nothing
yet); neither changes what it is given, and an event that cannot follow the
state raises `CorruptHistory`. Every event's effect is here, holds, memories,
quarantines and superseded incarnations (feature level 4) included.

The rule it keeps: the state changes by events only. `Decision` is how the
deciding modules (`group`, `group_holds`, `reconcile`) emit them: each event is
applied as it is emitted, so later rules of one command see earlier effects.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar, assert_never, cast

import attrs

from rsc.events.errors import AggregateNotFound, CorruptHistory
from rsc.events.events import (
    AssignmentHeld,
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
from rsc.events.model import (
    FencedMember,
    GroupConfig,
    Hold,
    Layout,
    Member,
    MemberState,
    Timing,
)
from rsc.events.versions import MAX_FEATURE_LEVEL, STATIC_LEVEL

T = TypeVar("T")


def _replacer(cls: type[T]) -> Callable[..., T]:
    """`attrs.evolve` for `cls`, without its per-call look-ups: every event of a heartbeat
    evolves the state and a member (the same `__init__` runs, with every field positionally)."""
    fields = attrs.fields(cast(Any, cls))
    assert all(f.init and not f.kw_only and f.alias == f.name for f in fields)
    names = tuple(f.name for f in fields)
    values_of = operator.attrgetter(*names)
    index = {name: i for i, name in enumerate(names)}

    def replace(instance: T, **changes: Any) -> T:
        values = list(values_of(instance))
        for name, value in changes.items():
            values[index[name]] = value
        return cls(*values)

    return replace


A = TypeVar("A")
R = TypeVar("R")


class LastOf(Generic[A, R]):
    """`compute` memoized for the argument last asked about, by identity.

    For the state's mappings (a target, holds, quarantines): they are never changed in place (a
    change is a new mapping, and the states between two changes share it), so what is derived
    from one is computed once per mapping, not on every heartbeat that asks. What it returns
    depends on its argument only."""

    def __init__(self, compute: Callable[[A], R]) -> None:
        self._compute = compute
        self._last: tuple[A, R] | None = None

    def __call__(self, argument: A) -> R:
        last = self._last
        if last is None or last[0] is not argument:
            last = self._last = (argument, self._compute(argument))
        return last[1]


#: Tombstones of fenced members kept so that they hear FENCED, oldest dropped first.
FENCED_MEMORY = 1024
#: Superseded incarnations kept per static member id (they are told FENCED, reason REPLACED).
SUPERSEDED_PER_ID = 8

_EMPTY: frozenset[int] = frozenset()


def _omitted_while_empty() -> Any:
    """A state mapping left out of snapshots while empty (levels below 4 never fill it)."""
    return attrs.field(factory=dict, metadata={"omit_if_default": True})


@attrs.frozen
class GroupPause:
    """Why and since when an operator paused a group (feature level 7)."""

    reason: str
    since_ms: int


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
    #: Paused by an operator (feature level 7): why and since when; its target is empty.
    paused: GroupPause | None = attrs.field(default=None, metadata={"omit_if_default": True})

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


#: `attrs.evolve` of a state and of a member, for the events every heartbeat may emit.
_state_with = _replacer(GroupState)
_member_with = _replacer(Member)


# --- evolve ---------------------------------------------------------------


def _operated(
    state: GroupState, event: GroupConfigured | GroupPaused | GroupResumed | GroupPositionReset
) -> GroupState:
    """An operator's change: the config, a pause, a resume, a position reset (level 7)."""
    match event:
        case GroupConfigured():
            return attrs.evolve(state, config=event.config)
        case GroupPaused():
            pause = GroupPause(event.reason, event.paused_at_ms)
            return attrs.evolve(state, paused=pause, group_epoch=event.group_epoch)
        case GroupResumed():
            return attrs.evolve(state, paused=None, group_epoch=event.group_epoch)
        case GroupPositionReset():
            return state  # a record: the positions are in Redis


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
            member = _member_with(_member(state, event.member_id), leaving=True)
            return _state_with(_put(state, member), group_epoch=event.group_epoch)
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
            return _advanced(state, event)
        case ShardsRevokeRequested():
            member = _member(state, event.member_id)
            if not event.shards <= member.assigned:
                raise CorruptHistory(f"revoke of shards {member.member_id} does not hold")
            return _put(
                state,
                _member_with(
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
            return _state_with(_put(state, _without(member, event.shards)), owners=owners)
        case ShardsInstalled():
            member = _member(state, event.member_id)
            if any(s in state.owners for s in event.shards):
                raise CorruptHistory("install of a shard another member holds")
            owners = {**state.owners, **dict.fromkeys(event.shards, member.member_id)}
            member = _member_with(member, assigned=member.assigned | event.shards)
            return _state_with(_put(state, member), owners=owners)
        case LayoutApplied():
            return attrs.evolve(state, layout=event.layout, group_epoch=event.group_epoch)
        case GroupConfigured() | GroupPaused() | GroupResumed() | GroupPositionReset():
            return _operated(state, event)
        case TimersRestarted():
            return _restart_timers(state, event.restarted_at_ms)
        case HeartbeatRejected():
            return state
        case _:
            assert_never(event)


def _advanced(state: GroupState, event: MemberEpochAdvanced) -> GroupState:
    """A member reconciled to a new epoch on its heartbeat; the epoch it leaves, or the one a
    quiet member's heartbeat carried (`heard`), is what a lost answer's retry carries."""
    member = _member(state, event.member_id)
    previous = member.member_epoch if event.heard is None else event.heard
    return _put(
        state, _member_with(member, member_epoch=event.member_epoch, previous_epoch=previous, quiet=False)
    )


def _retarget(state: GroupState, event: TargetAssignmentUpdated) -> GroupState:
    """A new target; the memories it served (of members now staying with a target) are done."""
    holds = state.holds
    if holds:  # a memory has served once its (rejoined, staying) member has a target
        holds = {m: h for m, h in holds.items() if h.static or m not in event.changed or _departed(state, m)}
    members = advance_quiet(state, event) if event.advances else state.members
    return attrs.evolve(
        state,
        target={**state.target, **event.changed},
        members=members,
        assignment_epoch=event.assignment_epoch,
        assignment_computed_at_ms=event.computed_at_ms,
        holds=holds,
    )


def advance_quiet(state: GroupState, event: TargetAssignmentUpdated) -> Mapping[str, Member]:
    """The members with those a new target keeps moved to its epoch (feature level 8).

    A member moves when it had reconciled to the previous target (its epoch is the previous
    assignment epoch, it revokes nothing and holds nothing outside its target) and the new
    target gives it the same shards (it is not in `changed`): it was told everything this
    target asks of it, so it has reconciled to this one too, as a `MemberEpochAdvanced` on its
    next heartbeat would have said. It is marked `quiet`: it learns the epoch from its next
    answer, and until its next advance of its own, `previous_epoch` stays the epoch it surely
    knows (the one its heartbeat carried when it last advanced; the epoch it advanced to was
    only in an answer, which may have been lost). A leaving member, one that must still
    revoke, and one behind (a joiner before its first target) move on their own heartbeats,
    as before."""
    before, epoch, changed = state.assignment_epoch, event.assignment_epoch, event.changed
    if before <= 0:  # no target before this one: every member is a joiner
        return state.members
    target = state.target
    members = dict(state.members)
    for member_id, m in state.members.items():
        if (
            m.member_epoch != before
            or m.revoking
            or m.leaving
            or member_id in changed
            or not m.assigned <= target.get(member_id, _EMPTY)
        ):
            continue
        # (`previous_epoch` is the epoch the heartbeat that last advanced it carried: the one
        # it surely knows; the epoch it advanced to was only in an answer, which may be lost.)
        members[member_id] = _member_with(m, member_epoch=epoch, quiet=True)
    return members


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
    return _state_with(state, members={**state.members, member.member_id: member})


def _without(member: Member, shards: frozenset[int]) -> Member:
    """`member` no longer holding `shards`, whether they were readable or being revoked."""
    revoking = member.revoking - shards
    return _member_with(
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


# --- deciding -------------------------------------------------------------


class Decision:
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
