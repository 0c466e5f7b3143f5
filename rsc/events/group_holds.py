"""What the group keeps of a member that stops: holds, memories and quarantines (feature level 4).

A member stops by leaving, by being fenced (its lease ended, a revoke timed out,
an operator removed it) or by being taken over by a new incarnation of its
static id. What is kept, each journaled as events (`group_state` applies them):

* a static member's *hold*: its shards stay targeted to its id, installed to
  nobody, for the group's `staticHoldMs` (`hold_shards`, `take_over`);
* a *memory* of any other member's target for one lease, for a sticky rejoin
  (`remember`; from level 4 only);
* a *quarantine* of the shards of a member fenced while its lease still runs:
  installed to nobody until it ends (`fence`, the self-fencing rule).

The rule it keeps: nothing here installs a shard; holds and quarantines only
keep shards from others until they end (`expire_holds`, `shorten_holds`), and
the target that follows is `reconcile.refresh_target`'s to compute.
"""

from __future__ import annotations

from collections.abc import Mapping

from rsc.events.events import (
    AssignmentHeld,
    HoldEnded,
    MemberFenced,
    QuarantineEnded,
    ShardsQuarantined,
    ShardsReleased,
)
from rsc.events.group_state import Decision, GroupState, LastOf
from rsc.events.model import FenceReason, Hold, Member, ReleaseReason


def hold_duration_ms(group: GroupState) -> int:
    """How long a static member's shards wait for it: the group's setting, or one lease."""
    configured = group.config.static_hold_ms
    return group.timing.lease_ttl_ms if configured is None else configured


def hold_shards(decision: Decision, member: Member, shards: frozenset[int], now_ms: int) -> None:
    """A static member stopped: its shards stay targeted to its id for the hold."""
    until = now_ms + hold_duration_ms(decision.group)
    decision.emit(AssignmentHeld(member.member_id, member.incarnation, shards, until, static=True))


def remember(decision: Decision, member: Member, now_ms: int) -> None:
    """A member that is not static stops: remember its target for a lease (from level 4), so
    that it gets those shards back if it rejoins soon and balance allows."""
    group = decision.group
    shards = group.target_of(member.member_id)
    if not decision.static_level or member.static or not shards:
        return
    until = now_ms + group.timing.lease_ttl_ms
    decision.emit(AssignmentHeld(member.member_id, member.incarnation, shards, until, static=False))


def take_over(decision: Decision, member: Member, now_ms: int) -> None:
    """A new incarnation of a live static member takes it over: the old one is fenced at once
    (its owner tokens go, so Redis refuses its reads, acks and claims), its shards are held for
    the new one, and quarantined until the old one can no longer be running a handler."""
    shards = decision.group.target_of(member.member_id)
    fence(decision, member.member_id, FenceReason.REPLACED, now_ms)
    hold_shards(decision, member, shards, now_ms)


def fence(decision: Decision, member_id: str, reason: FenceReason, now_ms: int) -> None:
    """Fence a live member: its installed shards are released, and quarantined (from level 4)
    while its lease still runs unless the lease is what ended; its target is remembered, or
    held if it is static and its lease ended."""
    group = decision.group
    member = group.members[member_id]
    shards = group.target_of(member_id)
    if not (member.static and reason is FenceReason.LEASE_EXPIRED):
        remember(decision, member, now_ms)
    if member.installed:
        decision.emit(ShardsReleased(member_id, member.installed, ReleaseReason.FENCED))
        until = decision.lease_end(member_id, now_ms)
        if decision.static_level and reason is not FenceReason.LEASE_EXPIRED and until > now_ms:
            # Its lease still runs: it may be handling them until it ends (self-fencing rule).
            decision.emit(ShardsQuarantined(member.installed, until))
    decision.emit(MemberFenced(member_id, member.incarnation, reason, now_ms, decision.group.group_epoch + 1))
    if member.static and reason is FenceReason.LEASE_EXPIRED:
        hold_shards(decision, member, shards, now_ms)


def shorten_holds(decision: Decision, now_ms: int) -> None:
    """A hold set shorter applies to the holds under way too: none lasts longer than the new
    setting from now (0 ends them at once). The caller refreshes the target then."""
    group = decision.group
    latest = now_ms + hold_duration_ms(group)
    for member_id, hold in sorted(group.holds.items()):
        if hold.static and hold.until_ms > latest and member_id not in group.members:
            decision.emit(AssignmentHeld(member_id, hold.incarnation, hold.shards, latest, static=True))
    expire_holds(decision, now_ms)


#: The earliest end of the holds, and of the quarantines: found once per mapping, not on every
#: heartbeat (which made every heartbeat of a group with holds cost its number of holds).
_earliest_hold: LastOf[Mapping[str, Hold], int] = LastOf(
    lambda holds: min(h.until_ms for h in holds.values())
)
_earliest_quarantine: LastOf[Mapping[int, int], int] = LastOf(lambda quarantine: min(quarantine.values()))


def expire_holds(decision: Decision, now_ms: int) -> None:
    """End the quarantines and holds that are over at `now_ms`."""
    group = decision.group
    if (not group.holds or now_ms < _earliest_hold(group.holds)) and (
        not group.quarantine or now_ms < _earliest_quarantine(group.quarantine)
    ):
        return  # (most heartbeats of a group with holds: none is over yet)
    ended = frozenset(s for s, until in group.quarantine.items() if now_ms >= until)
    if ended:
        decision.emit(QuarantineEnded(ended))
    # (Called on every heartbeat while holds exist: only those that ended are sorted.)
    over = [
        (member_id, hold)
        for member_id, hold in group.holds.items()
        if now_ms >= hold.until_ms and (not hold.static or member_id not in group.members)
    ]
    for member_id, hold in sorted(over):
        epoch = decision.group.group_epoch
        decision.emit(HoldEnded(member_id, epoch + 1 if hold.static else epoch))
