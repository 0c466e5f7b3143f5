"""The heartbeat wire schema: what members and producers send and are answered.

Wire types made per heartbeat are plain (not frozen) attrs classes: a frozen
class's constructor costs several times more, and these are built and
thrown away for every heartbeat. Nothing mutates them.

These types are what goes over HTTP (camelCase JSON through `rsc.events.codec`)
and the one module that both the server and `rsc.client` share. It knows no
aggregate: rendering a response from an aggregate's state is
`rsc.events.respond`, so importing a client loads no assignor, placement or
aggregate.
"""

from __future__ import annotations

from typing import Any

import attrs

from rsc.events.commands import Heartbeat, ProducerHeartbeat
from rsc.events.errors import UnsupportedProtocolVersion
from rsc.events.model import (
    ID_PATTERN,
    MAX_COUNTER,
    NAME_PATTERN,
    ClientInfo,
    DrainProgress,
    FenceReason,
    HeartbeatStatus,
    Layout,
    wire_field,
)
from rsc.events.versions import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, negotiated

_SHARD_INDEX = {"minimum": 0, "maximum": 16_383}
#: The longest a heartbeat may ask to be held (`waitMs`).
MAX_WAIT_MS = 60_000
#: The revoke timeout a member assumes when the answer does not say (`revokeTimeoutMs` came
#: with protocol version 2): the group default of every release.
DEFAULT_REVOKE_TIMEOUT_MS = 60_000


@attrs.define
class HeartbeatRequest:
    """One member's heartbeat as sent by a client (PROTOCOL section 3).

    The documented constraints are enforced by the core (`group._validate_heartbeat`)
    and the registry (names), with the same `INVALID_REQUEST`, not twice here."""

    protocol_version: int = wire_field(enforce=False, minimum=MIN_PROTOCOL_VERSION, maximum=MAX_COUNTER)
    stream_prefix: str = wire_field(enforce=False, pattern=NAME_PATTERN)
    consumer_group: str = wire_field(enforce=False, pattern=NAME_PATTERN)
    member_id: str = wire_field(enforce=False, pattern=ID_PATTERN)
    incarnation: str = wire_field(enforce=False, pattern=ID_PATTERN)
    member_epoch: int = wire_field(enforce=False, minimum=-1, maximum=MAX_COUNTER)
    metadata_version: int = wire_field(0, enforce=False, minimum=0, maximum=MAX_COUNTER)
    owned_shards: frozenset[int] = wire_field(frozenset(), enforce=False, items=_SHARD_INDEX)
    revoked_shards: frozenset[int] = wire_field(frozenset(), enforce=False, items=_SHARD_INDEX)
    drain_progress: tuple[DrainProgress, ...] = ()
    client: ClientInfo = ClientInfo()
    #: Long poll: the most the coordinator may hold the answer while shards targeted to this
    #: member are pending, waiting for them to become installable (0: answer at once).
    wait_ms: int = wire_field(0, minimum=0, maximum=MAX_WAIT_MS)
    #: Leaving gracefully: hand the shards over to their next owners, then send epoch -1.
    leaving: bool = False
    #: Shards it owns but cannot read: their key, consumer group or owner token is gone (Redis
    #: lost data). The coordinator recreates them; the member never does (optional: older
    #: coordinators ignore it, older members never send it).
    stalled_shards: frozenset[int] = wire_field(frozenset(), enforce=False, items=_SHARD_INDEX)
    #: A static member: a stable instance identity (`memberId`) that keeps its shards while it
    #: restarts and whose new incarnation takes the id over instead of being refused (feature
    #: level 4; older coordinators ignore it; left out while false).
    static: bool = attrs.field(default=False, metadata={"omit_if_default": True})

    def to_command(self, now_ms: int) -> Heartbeat:
        """The core command for this request, arrived at `now_ms`."""
        check_protocol_version(self.protocol_version)
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
            leaving=self.leaving,
            stalled=self.stalled_shards,
            static=self.static,
        )


def check_protocol_version(version: int) -> int:
    """The protocol version to answer a request of `version` in: the highest both sides speak.

    Refuses (`UNSUPPORTED_PROTOCOL_VERSION`) only a version older than every one this server
    still speaks; a newer one is answered in this server's newest, which the client reads
    from the answer (`protocolVersion`, from version 2 on) and steps down to."""
    answer = negotiated(version) if version <= MAX_COUNTER else None
    if answer is None:
        raise UnsupportedProtocolVersion(
            f"protocolVersion {version} is not supported: this server speaks "
            f"{MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION} (a newer one is answered in {PROTOCOL_VERSION})"
        )
    return answer


def omitted_unless_set(**json_schema: Any) -> Any:
    """An optional answer field that is left out of the JSON while None: answers in an older
    protocol version keep exactly that version's shape."""
    return attrs.field(default=None, metadata={"json_schema": json_schema, "omit_if_default": True})


@attrs.define
class ShardAssignment:
    """`assigned`: read these now; `pending`: yours once released; `revoke`: stop and ack."""

    assigned: frozenset[int] = frozenset()
    pending: frozenset[int] = frozenset()
    revoke: frozenset[int] = frozenset()


@attrs.define
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
    #: From protocol version 2: the version this answer is in, and the deployment's feature level.
    protocol_version: int | None = omitted_unless_set()
    feature_level: int | None = omitted_unless_set()
    #: True when the coordinator treats the member as static (it asked, and the deployment is
    #: at feature level 4 or above); left out otherwise.
    static: bool | None = omitted_unless_set()
    #: From protocol version 2: how long the member has, from the answer that first names a
    #: shard in `assignment.revoke`, to stop it and acknowledge the revoke (else `FENCED`,
    #: `REVOKE_TIMEOUT`). A client of an older coordinator assumes 60,000 (docs/protocol.md).
    revoke_timeout_ms: int | None = omitted_unless_set()


@attrs.frozen
class ProducerHeartbeatRequest:
    """A producer's registration and lease renewal (PROTOCOL section 5).

    `metadataVersion` is the layout version it routes with (0: none yet);
    `quiesced` says it stopped publishing and flushed while the stream is paused;
    `leave` says it is closing (it stops counting as a live producer at once).
    """

    protocol_version: int = wire_field(enforce=False, minimum=MIN_PROTOCOL_VERSION, maximum=MAX_COUNTER)
    stream_prefix: str = wire_field(enforce=False, pattern=NAME_PATTERN)
    producer_id: str = wire_field(enforce=False, pattern=ID_PATTERN)
    metadata_version: int = wire_field(0, enforce=False, minimum=0, maximum=MAX_COUNTER)
    quiesced: bool = False
    client: ClientInfo = ClientInfo()
    leave: bool = False
    #: Shards that refused its appends as full (`FULL`: the stream's `maxEntriesPerShard` with
    #: `whenFull: refuse`) since its last heartbeat, which it then sends at once: the
    #: coordinator trims them early by the stream's policy (feature level 5; older coordinators
    #: ignore it; left out while empty).
    full_shards: frozenset[int] = wire_field(frozenset(), omit_if_default=True, items=_SHARD_INDEX)
    #: Idempotent producers (feature level 6): 0 asks for an epoch (a new process), else the
    #: epoch it was given; left out by a client without them (older coordinators ignore it).
    producer_epoch: int | None = wire_field(
        None, omit_if_default=True, nullable=True, minimum=0, maximum=MAX_COUNTER
    )

    def to_command(self, now_ms: int, lease_ttl_ms: int) -> ProducerHeartbeat:
        check_protocol_version(self.protocol_version)
        return ProducerHeartbeat(
            self.producer_id,
            self.metadata_version,
            self.quiesced,
            now_ms,
            lease_ttl_ms,
            self.client,
            self.leave,
            epoch=self.producer_epoch,
        )


@attrs.frozen
class ProducerHeartbeatResponse:
    """Routing metadata for a producer: `layout` is sent when its version differs.

    `status` is OK, or SYNC_METADATA when the producer knows a newer version
    than the coordinator stores (it must switch to the layout sent). While
    `paused`, a producer must not publish; it flushes and heartbeats with
    `quiesced: true`.
    """

    status: HeartbeatStatus
    producer_id: str
    metadata_version: int
    routing: str
    shard_count: int
    paused: bool
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    layout: Layout | None = None
    #: From protocol version 2: the version this answer is in, and the deployment's feature level.
    protocol_version: int | None = omitted_unless_set()
    feature_level: int | None = omitted_unless_set()
    #: Idempotent producers (feature level 6, to a request with `producerEpoch`): the epoch
    #: this process appends with.
    producer_epoch: int | None = omitted_unless_set()


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


#: The owner-token hash next to a shard key (same hash slot), field = group (metadata schema v1).
OWNERS_SUFFIX = ":rsc:v1:owners"


def owner_key(shard_key: str) -> str:
    """The hash of owner tokens of one shard (field: group), in the shard key's slot."""
    return f"{shard_key}{OWNERS_SUFFIX}"


#: The seal next to a shard key (same hash slot): while it exists, producers' appends to the
#: shard are refused with `SEALED <metadata version>` (feature level 2; docs/producers.md).
SEAL_SUFFIX = ":rsc:v1:seal"


DEAD_LETTER_SUFFIX = ":dlq"


def dead_letter_key(shard_key: str) -> str:
    """Where a shard's entries go after `max_deliveries` failed handlings (same hash slot)."""
    return f"{shard_key}{DEAD_LETTER_SUFFIX}"


def seal_key(shard_key: str) -> str:
    """The seal of one shard: set when the shard starts DRAINING, gone with the shard key."""
    return f"{shard_key}{SEAL_SUFFIX}"


#: The entry cap next to a shard key (same hash slot; feature level 5): while it exists,
#: producers' appends that would take the shard past it are refused with `FULL` (`append.lua`).
CAP_SUFFIX = ":rsc:v1:cap"
#: What retention removed from a shard key (same hash slot; feature level 5): a hash, field =
#: consumer group -> entries it lost (removed before it acknowledged them), `:trimmed` -> all.
TRIMMED_SUFFIX = ":rsc:v1:trimmed"
#: The field of `TRIMMED_SUFFIX` that counts every entry removed (no group name has a ':' first).
TRIMMED_TOTAL_FIELD = ":trimmed"


def cap_key(shard_key: str) -> str:
    """The entry cap of one shard (a string: the most entries it may hold)."""
    return f"{shard_key}{CAP_SUFFIX}"


def trimmed_key(shard_key: str) -> str:
    """The counts of what retention removed from one shard, per group and in all."""
    return f"{shard_key}{TRIMMED_SUFFIX}"


#: What one producer appended to a shard (same hash slot; feature level 6): a hash with its
#: epoch (`e`), its floor (`f`: every call of a lower first sequence is settled) and one field
#: per script call, its first sequence -> its entry ids (`member/append.lua`). It expires
#: `window` after the producer's last append to the shard.
PRODUCER_SUFFIX = ":rsc:v1:producer:"


def producer_key(shard_key: str, producer_id: str) -> str:
    """The record of producer `producer_id`'s appends to one shard (a hash)."""
    return f"{shard_key}{PRODUCER_SUFFIX}{producer_id}"
