"""Long-poll heartbeats: when a coordinator holds an answer, and how it asks again.

A member whose targeted shards are still held by another member (`pending`)
and that has nothing to acknowledge sends `waitMs` > 0. Instead of answering
"still pending" and hearing from the member one heartbeat interval later,
the coordinator holds the answer: whenever the group changes (a release, a
new target) it decides the same heartbeat again (`again`), and answers as
soon as the answer is worth sending (`worth_answering`: something was
installed, something must be revoked, the member was fenced, nothing is
pending any more) or when `min(waitMs, heartbeat interval)` has passed.

So a moved shard is installed to its next owner within one round trip of
its release, and a coordinator in steady state (nothing pending) does no
more work than before: it holds nothing. Both the HTTP shell and
`rsc simulate` use these rules.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from rsc.events.commands import Heartbeat
from rsc.events.events import (
    GroupEvent,
    LayoutApplied,
    MemberFenced,
    MemberLeft,
    ShardsReleased,
    TargetAssignmentUpdated,
)
from rsc.events.model import HeartbeatStatus
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

#: Events after which a held answer may say something new (a release, a new target).
WAKING = (ShardsReleased, TargetAssignmentUpdated, LayoutApplied, MemberFenced, MemberLeft)


def wakes(events: Iterable[GroupEvent]) -> bool:
    """Should held heartbeats of the group be decided again after `events`?"""
    return any(isinstance(e, WAKING) for e in events)


def should_hold(request: HeartbeatRequest, response: HeartbeatResponse) -> bool:
    """Is `response` an answer worth holding for `request`? (It asked to wait and only waits.)"""
    return (
        request.wait_ms > 0
        and request.member_epoch >= 0
        and response.status is HeartbeatStatus.REVOKE_PENDING
        and bool(response.assignment.pending)
        and not response.assignment.revoke
    )


def hold_ms(request: HeartbeatRequest, response: HeartbeatResponse) -> int:
    """How long the answer may be held at most: what the member asked, at most an interval."""
    return min(request.wait_ms, response.heartbeat_interval_ms)


def again(command: Heartbeat, response: HeartbeatResponse, now_ms: int) -> Heartbeat:
    """The same heartbeat decided again at `now_ms`, at the epoch `response` gave.

    Its acknowledgements were taken the first time; what the member reads has not
    changed while it waited."""
    return attrs.evolve(command, member_epoch=response.member_epoch, revoked=frozenset(), now_ms=now_ms)


def worth_answering(request: HeartbeatRequest, first: HeartbeatResponse, latest: HeartbeatResponse) -> bool:
    """Answer now rather than go on holding: the answer says something new."""
    return not should_hold(request, latest) or latest.assignment.assigned != first.assignment.assigned
