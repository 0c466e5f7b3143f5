"""Reconciliation: the target assignment, and each member moved one step towards it.

`refresh_target` computes a new target when the group epoch moved (and the
assignment interval allows: `assignment_interval_ms`, which folds a large
group's storms): the assignor balances the ACTIVE shards that are not held
over the staying members, DRAINING shards stay where they are read
(`draining_stays`), held shards stay with their static member. `reconcile`
moves the member a heartbeat came from one step (after Kafka's
`CurrentAssignmentBuilder`): acks, revokes, then the epoch and the free shards.

The rule it keeps: a shard moves from A to B only as A acknowledges the revoke
-> it is released -> it is installed to B; it is revoked from A only once B
(its next owner) is ready for it; a member still revoking keeps its old epoch
and gets nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping

from rsc.events import assignor
from rsc.events.commands import Heartbeat
from rsc.events.events import (
    MemberEpochAdvanced,
    ShardsInstalled,
    ShardsReleased,
    ShardsRevokeAcked,
    ShardsRevokeRequested,
    TargetAssignmentUpdated,
)
from rsc.events.group_state import Decision, GroupState, LastOf
from rsc.events.model import Layout, ReleaseReason
from rsc.events.versions import ADVANCE_LEVEL

_EMPTY: frozenset[int] = frozenset()


def reconcile(decision: Decision, hb: Heartbeat) -> None:
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
    # Only a heartbeat at the member's epoch acknowledges: a revoke is asked for at that epoch,
    # which stays until the member holds nothing outside its target, so an older one (a retry,
    # a delayed or duplicated request accepted as a lost answer's) predates the revoke.
    acked = (
        frozenset()
        if hb.recheck or hb.member_epoch != member.member_epoch
        else member.revoking - (hb.owned - hb.revoked)
    )
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
        # (The epoch it sent is the one it surely knows: a lost answer's retry carries it.)
        heard = hb.member_epoch if decision.level >= ADVANCE_LEVEL or member.quiet else None
        decision.emit(MemberEpochAdvanced(member.member_id, group.assignment_epoch, heard))
    free = frozenset(s for s in target - member.installed if s not in group.owners)
    if free and group.quarantine:
        free -= group.quarantined(hb.now_ms)
    if free:
        decision.emit(ShardsInstalled(member.member_id, free))


#: A group of more members than this folds the joins and leaves of a storm into one target
#: computation (`assignment_interval_ms`).
LARGE_GROUP = 100
#: The longest a large group folds them for (ms).
MAX_FOLD_MS = 250


def assignment_interval_ms(group: GroupState) -> int:
    """How long after a target computation the next one waits: the group's configured
    `assignment_interval_ms`, and for a group of more than `LARGE_GROUP` members at least a
    tenth of the heartbeat interval (at most `MAX_FOLD_MS`). A storm of joins and leaves in a
    large group is then one computation per fold, made by a tick between heartbeat batches
    (`due_ms` names its time), instead of one per join or leave on the heartbeats' path;
    each of those moved every member's epoch, so every heartbeat of the group reconciled again.
    A new member is told its shards by its first heartbeat after that computation."""
    configured = group.timing.assignment_interval_ms
    if len(group.members) <= LARGE_GROUP:
        return configured
    return max(configured, min(group.timing.heartbeat_interval_ms // 10, MAX_FOLD_MS))


def refresh_target(decision: Decision, now_ms: int, at_once: bool = False) -> None:
    """Compute a new target if the group epoch moved and the assignment interval allows (or
    `at_once`: an operator's pause or resume). A paused group's target is empty."""
    group = decision.group
    if group.group_epoch <= group.assignment_epoch:
        return
    last = group.assignment_computed_at_ms
    if not at_once and last is not None and now_ms - last < assignment_interval_ms(group):
        return
    advances = decision.level >= ADVANCE_LEVEL  # quiet members move with the target
    if group.paused is not None:
        emptied = {m: frozenset[int]() for m, shards in group.target.items() if shards}
        decision.emit(TargetAssignmentUpdated(group.group_epoch, emptied, now_ms, advances))
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
        assignor.assign(
            staying,
            group.layout.active_indexes - skip if skip else group.layout.active_indexes,
            group.target,
            remembered,
        ),
        group.layout,
        group.target,
        skip,
    )
    target.update(held)
    # (The assignor hands back the very sets of members that keep theirs: `is` settles most.)
    changed = {
        m: shards
        for m, shards in target.items()
        if (before := group.target.get(m)) is not shards and before != shards
    }
    changed.update({m: frozenset() for m, shards in group.target.items() if shards and m not in target})
    decision.emit(TargetAssignmentUpdated(group.group_epoch, changed, now_ms, advances))


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
    draining = layout.readable_indexes - layout.active_indexes - skip
    if not target or not draining:
        return target
    out = dict(target)
    owner_of = {s: m for m, shards in previous.items() for s in shards}
    for shard in sorted(draining):
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
    owner_of = _target_owners(group.target)
    ready = set()
    for shard in shards:
        owner = group.members.get(owner_of.get(shard, ""))
        static_leaving = owner is not None and owner.leaving and owner.static
        if owner is None or static_leaving or owner.member_epoch == group.assignment_epoch:
            ready.add(shard)
    return frozenset(ready)


#: Shard -> the member it is targeted to: inverted once per target, not once per heartbeat
#: that revokes (which made a revoke cost the whole group).
_target_owners: LastOf[Mapping[str, frozenset[int]], dict[int, str]] = LastOf(
    lambda target: {s: m for m, targeted in target.items() for s in targeted}
)
