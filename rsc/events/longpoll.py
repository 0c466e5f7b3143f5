"""Long-poll heartbeats: when a coordinator holds an answer, and how it asks again.

A member whose targeted shards are still held by another member (`pending`)
and that has nothing to acknowledge sends `waitMs` > 0. Instead of answering
"still pending" and hearing from the member one heartbeat interval later,
the coordinator holds the answer (`should_hold`: it only waits, nothing new
to start, its epoch did not move). Whenever a persisted batch of the group
concerns a held heartbeat (`concerns`: one of its pending shards was
released or came out of quarantine, its target changed, it left or was fenced, the layout changed),
the coordinator decides the same heartbeat again as a *recheck* (`again`:
renews the lease and installs what is free, never acknowledges, refused once
the member moved on), and answers as soon as the answer says something new
(`worth_answering`) or when `min(waitMs, heartbeat interval)` has passed.

So a moved shard is installed to its next owner within one round trip of
its release, only the heartbeats a change concerns are decided again, and a
coordinator in steady state (nothing pending) holds nothing. Both the HTTP
shell and `rsc simulate` use these rules.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from rsc.events.commands import Heartbeat
from rsc.events.events import (
    GroupEvent,
    LayoutApplied,
    MemberEpochAdvanced,
    MemberFenced,
    MemberLeft,
    QuarantineEnded,
    ShardsReleased,
    TargetAssignmentUpdated,
)
from rsc.events.model import HeartbeatStatus
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse


@attrs.frozen
class Change:
    """What a persisted batch of a group did that may concern a held heartbeat."""

    released: frozenset[int] = frozenset()
    #: Members whose target changed, or that left or were fenced.
    members: frozenset[str] = frozenset()
    layout: bool = False
    #: A member reconciled to a new epoch: the next owner of a shard someone holds may be ready.
    advanced: bool = False


def change_of(events: Iterable[GroupEvent]) -> Change | None:
    """The `Change` in `events`, or None when they concern no held heartbeat."""
    released: set[int] = set()
    members: set[str] = set()
    layout = advanced = False
    for event in events:
        match event:
            case ShardsReleased() | QuarantineEnded():  # installable now
                released.update(event.shards)
            case TargetAssignmentUpdated():
                members.update(event.changed)
                # (moving quiet members, level 8: next owners of shards someone holds are ready)
                advanced = advanced or event.advances
            case MemberFenced() | MemberLeft():
                members.add(event.member_id)
            case LayoutApplied():
                layout = True
            case MemberEpochAdvanced():
                advanced = True
    if not (released or members or layout or advanced):
        return None
    return Change(frozenset(released), frozenset(members), layout, advanced)


def concerns(change: Change, member_id: str, pending: frozenset[int]) -> bool:
    """Should the held heartbeat of `member_id`, waiting for `pending` (or, when nothing is
    pending, waiting for the next owners of shards it hands over), be decided again?"""
    if change.layout or member_id in change.members or not change.released.isdisjoint(pending):
        return True
    return not pending and change.advanced


def _only_waits(response: HeartbeatResponse) -> bool:
    """The answer only says "wait": for pending shards, or for the next owners of shards it
    holds to be ready (a handoff under way, nothing to revoke yet)."""
    return response.status is HeartbeatStatus.REVOKE_PENDING and not response.assignment.revoke


def should_hold(request: HeartbeatRequest, response: HeartbeatResponse) -> bool:
    """Is `response` worth holding for `request`? It asked to wait, and the answer only says
    "wait": nothing to revoke, nothing new to start, and its epoch did not move (a second move
    while held would make a lost answer's retry stale)."""
    return (
        request.wait_ms > 0
        and request.member_epoch in (0, response.member_epoch)
        and _only_waits(response)
        and response.assignment.assigned <= request.owned_shards
    )


def hold_ms(request: HeartbeatRequest, response: HeartbeatResponse) -> int:
    """How long the answer may be held at most: what the member asked, at most an interval."""
    return min(request.wait_ms, response.heartbeat_interval_ms)


def again(command: Heartbeat, latest: HeartbeatResponse, now_ms: int) -> Heartbeat:
    """The held heartbeat decided again at `now_ms`, as a recheck at the epoch `latest` gave."""
    return attrs.evolve(
        command, member_epoch=latest.member_epoch, revoked=frozenset(), now_ms=now_ms, recheck=True
    )


def worth_answering(first: HeartbeatResponse, latest: HeartbeatResponse) -> bool:
    """Answer now rather than go on holding: the answer says something new."""
    return (
        not _only_waits(latest)
        or latest.member_epoch != first.member_epoch
        or latest.assignment.assigned != first.assignment.assigned
    )
