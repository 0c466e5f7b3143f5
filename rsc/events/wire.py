"""The heartbeat wire schema and the pure rendering of a heartbeat response.

These types are what goes over HTTP (camelCase JSON through `rsc.events.codec`)
and the one module that both the server and `rsc.client` share.
"""

from __future__ import annotations

import attrs

from rsc.events.commands import Heartbeat
from rsc.events.errors import UnsupportedProtocolVersion
from rsc.events.events import GroupEvent, HeartbeatRejected
from rsc.events.group import GroupState
from rsc.events.model import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ClientInfo,
    DrainProgress,
    FenceReason,
    HeartbeatStatus,
    Layout,
)


@attrs.frozen
class HeartbeatRequest:
    """One member's heartbeat as sent by a client (PROTOCOL section 3)."""

    protocol_version: int
    stream_prefix: str
    consumer_group: str
    member_id: str
    incarnation: str
    member_epoch: int
    metadata_version: int = 0
    owned_shards: frozenset[int] = frozenset()
    revoked_shards: frozenset[int] = frozenset()
    drain_progress: tuple[DrainProgress, ...] = ()
    client: ClientInfo = ClientInfo()

    def to_command(self, now_ms: int) -> Heartbeat:
        """The core command for this request, arrived at `now_ms`."""
        if not MIN_PROTOCOL_VERSION <= self.protocol_version <= PROTOCOL_VERSION:
            raise UnsupportedProtocolVersion(
                f"protocolVersion {self.protocol_version} is not in "
                f"[{MIN_PROTOCOL_VERSION}, {PROTOCOL_VERSION}]"
            )
        return Heartbeat(
            member_id=self.member_id,
            incarnation=self.incarnation,
            member_epoch=self.member_epoch,
            now_ms=now_ms,
            metadata_version=self.metadata_version,
            owned=self.owned_shards,
            revoked=self.revoked_shards,
            drain_progress=self.drain_progress,
            client=self.client,
        )


@attrs.frozen
class ShardAssignment:
    """`assigned`: read these now; `pending`: yours once released; `revoke`: stop and ack."""

    assigned: frozenset[int] = frozenset()
    pending: frozenset[int] = frozenset()
    revoke: frozenset[int] = frozenset()


@attrs.frozen
class HeartbeatResponse:
    """The coordinator's answer to one heartbeat."""

    status: HeartbeatStatus
    member_epoch: int
    group_epoch: int
    assignment_epoch: int
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    metadata_version: int
    assignment: ShardAssignment
    max_concurrency: int
    layout: Layout | None = None
    fence_reason: FenceReason | None = None


def respond(state: GroupState, command: Heartbeat, events: list[GroupEvent]) -> HeartbeatResponse:
    """Render the response to `command`, given the state after its `events`.

    FENCED and UNKNOWN_MEMBER answers tell the member to send epoch 0 next;
    a leave is answered with epoch -1.
    """
    layout = state.layout
    base = HeartbeatResponse(
        status=HeartbeatStatus.OK,
        member_epoch=-1,
        group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.timing.heartbeat_interval_ms,
        lease_ttl_ms=state.timing.lease_ttl_ms,
        metadata_version=layout.metadata_version,
        assignment=ShardAssignment(),
        max_concurrency=state.config.max_concurrency,
        layout=layout if command.metadata_version != layout.metadata_version else None,
    )
    rejected = next((e for e in events if isinstance(e, HeartbeatRejected)), None)
    if rejected is not None:
        return attrs.evolve(base, status=rejected.status, member_epoch=0, fence_reason=rejected.reason)
    member = state.members.get(command.member_id)
    if command.member_epoch == -1 or member is None:
        return base
    assignment = ShardAssignment(member.assigned, state.pending_of(member), member.revoking)
    if command.metadata_version > layout.metadata_version:
        status = HeartbeatStatus.SYNC_METADATA
    elif assignment.pending or assignment.revoke:
        status = HeartbeatStatus.REVOKE_PENDING
    else:
        status = HeartbeatStatus.OK
    return attrs.evolve(base, status=status, member_epoch=member.member_epoch, assignment=assignment)


@attrs.frozen
class OwnerToken:
    """The data-plane owner token of one shard for one group (PROTOCOL section 4).

    Written next to the shard key when the shard is installed to a member and
    cleared when it is released; scripts that ack or claim entries compare the
    caller's member id and incarnation with it.
    """

    member_id: str
    incarnation: str
    member_epoch: int
