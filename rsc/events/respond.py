"""Rendering answers from aggregate state: the server's half of the wire schema.

`respond` renders a member's heartbeat response from the group state after
its events, `respond_producer` a producer's from the stream state. They live
apart from the wire types (`rsc.events.wire`) because they need the
aggregates, which clients never load.
"""

from __future__ import annotations

from rsc.events.commands import Heartbeat, ProducerHeartbeat
from rsc.events.events import GroupEvent, HeartbeatRejected
from rsc.events.group import GroupState
from rsc.events.model import HeartbeatStatus
from rsc.events.stream import StreamState
from rsc.events.wire import HeartbeatResponse, ProducerHeartbeatResponse, ShardAssignment

_NOTHING = ShardAssignment()


def respond(state: GroupState, command: Heartbeat, events: list[GroupEvent]) -> HeartbeatResponse:
    """Render the response to `command`, given the state after its `events`.

    FENCED and UNKNOWN_MEMBER answers tell the member to send epoch 0 next;
    a leave is answered with epoch -1.
    """
    layout = state.layout
    status, member_epoch, assignment, reason = HeartbeatStatus.OK, -1, _NOTHING, None
    rejected = next((e for e in events if isinstance(e, HeartbeatRejected)), None)
    member = state.members.get(command.member_id)
    if rejected is not None:
        status, member_epoch, reason = rejected.status, 0, rejected.reason
    elif command.member_epoch != -1 and member is not None:
        member_epoch = member.member_epoch
        pending = state.pending_of(member)
        if pending or member.assigned or member.revoking:
            assignment = ShardAssignment(member.assigned, pending, member.revoking)
        if command.metadata_version > layout.metadata_version:
            status = HeartbeatStatus.SYNC_METADATA
        elif pending or member.revoking or not member.assigned <= state.target_of(member.member_id):
            # a handoff involving it: it waits for shards, revokes, or holds some that move
            # once their next owner is ready
            status = HeartbeatStatus.REVOKE_PENDING
    # One construction (no attrs.evolve): this runs for every heartbeat.
    return HeartbeatResponse(
        status=status,
        member_epoch=member_epoch,
        group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.timing.heartbeat_interval_ms,
        lease_ttl_ms=state.timing.lease_ttl_ms,
        metadata_version=layout.metadata_version,
        assignment=assignment,
        max_concurrency=state.config.max_concurrency,
        layout=layout if command.metadata_version != layout.metadata_version else None,
        fence_reason=reason,
        static=True if member is not None and member.static and rejected is None else None,
        revoke_timeout_ms=state.timing.revoke_timeout_ms,
    )


def respond_producer(
    state: StreamState, command: ProducerHeartbeat, heartbeat_interval_ms: int
) -> ProducerHeartbeatResponse:
    """Render the answer to a producer heartbeat from the stream state after it."""
    layout = state.layout
    stale = command.metadata_version != layout.metadata_version
    ahead = command.metadata_version > layout.metadata_version
    return ProducerHeartbeatResponse(
        status=HeartbeatStatus.SYNC_METADATA if ahead else HeartbeatStatus.OK,
        producer_id=command.producer_id,
        metadata_version=layout.metadata_version,
        routing=layout.routing,
        shard_count=state.shard_count,
        paused=state.paused is not None,
        heartbeat_interval_ms=heartbeat_interval_ms,
        lease_ttl_ms=command.lease_ttl_ms,
        layout=layout if stale else None,
        producer_epoch=_epoch(state, command),
    )


def _epoch(state: StreamState, command: ProducerHeartbeat) -> int | None:
    """The epoch the producer appends with (feature level 6, to a client that asked), else None."""
    if not command.epochs or command.epoch is None or command.leave:
        return None
    producer = state.producers.get(command.producer_id)
    return None if producer is None or not producer.epoch else producer.epoch
