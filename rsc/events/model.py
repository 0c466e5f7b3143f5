"""Value types shared by the stream and group aggregates.

Everything here is a frozen attrs class or an enum: plain values with no
behaviour beyond small derived properties. Time is always an integer number
of milliseconds supplied by the caller; nothing here reads a clock.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from typing import Any

import attrs

from rsc.events.errors import InvalidCommand

#: The routing protocol every new stream uses (defined in docs/routing.md later).
DEFAULT_ROUTING = "jump-v1"
#: Stream prefixes and group names: they become parts of Redis keys.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
#: Member ids, incarnations and producer ids: 1-256 printable ASCII characters.
ID_PATTERN = r"^[ -~]{1,256}$"
#: Free text that is stored and shown (client name and version, pause reasons): no control
#: characters (C0, DEL, C1), no line or paragraph separators, no invisible format characters
#: (zero-width ones, bidirectional overrides that reorder what a terminal shows, the BOM), so
#: nothing sent can rewrite or disguise a log line or a terminal. (Lone
#: surrogates, which cannot be encoded as UTF-8 for Redis, never get this far: the HTTP
#: layer refuses a body that holds one in any string.)
TEXT_PATTERN = (
    r"^[^\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]*$"
)
#: A surrogate code point: in a Python string, only a lone one (a pair decodes to one character).
SURROGATE = re.compile("[\ud800-\udfff]")
#: The longest client name and client version kept.
MAX_CLIENT_NAME = 128
MAX_CLIENT_VERSION = 64
#: The largest epoch or metadata version accepted: JSON's safe integers (2**53 - 1), so
#: every client language reads them exactly.
MAX_COUNTER = 2**53 - 1
#: The largest pending count or lag a member may report (Redis counts in 64 bits).
MAX_REDIS_COUNT = 2**63 - 1


def wire_field(
    default: Any = attrs.NOTHING, *, enforce: bool = True, omit_if_default: bool = False, **json_schema: Any
) -> Any:
    """An attrs field whose JSON Schema (in `/openapi.json`) carries `json_schema` constraints.

    The constraints are also enforced as attrs validators (unless `enforce` is
    false, where a more specific check exists), so the document and the
    server cannot disagree: a request within them is not refused as invalid,
    and one outside them is.
    """
    nullable = json_schema.pop("nullable", False)
    checks = _validators(json_schema) if enforce else []
    if nullable and checks:
        checks = [attrs.validators.optional(checks)]
    metadata = {"json_schema": json_schema, "omit_if_default": omit_if_default}
    return attrs.field(default=default, validator=checks or None, metadata=metadata)


#: The JSON Schema keywords `wire_field` enforces; any other is refused when the field is
#: declared, so that `/openapi.json` never states a constraint the server does not check.
_ENFORCED = frozenset(
    {"minimum", "maximum", "pattern", "minLength", "maxLength", "items", "minItems", "maxItems"}
)


def up_to(limit: int) -> str:
    """A regular expression (no anchors) for the decimal numbers from 0 to `limit` (leading
    zeros allowed, as many digits as `limit` has at most)."""
    digits = str(limit)
    shorter = [f"[0-9]{{1,{len(digits) - 1}}}"] if len(digits) > 1 else []
    lower = [
        f"{digits[:i]}[0-{int(d) - 1}][0-9]{{{len(digits) - i - 1}}}"
        for i, d in enumerate(digits)
        if d != "0"
    ]
    return "(?:" + "|".join([*shorter, *lower, digits]) + ")"


#: A Redis stream id: `<ms>-<seq>`, each an unsigned 64-bit integer.
STREAM_ID_PATTERN = f"^{up_to(2**64 - 1)}-{up_to(2**64 - 1)}$"


def _validators(schema: Mapping[str, Any]) -> list[Any]:
    unknown = set(schema) - _ENFORCED
    if unknown:
        raise TypeError(f"wire_field cannot enforce {sorted(unknown)}")
    v = attrs.validators
    checks: list[Any] = []
    if "minItems" in schema:
        checks.append(v.min_len(schema["minItems"]))
    if "maxItems" in schema:
        checks.append(v.max_len(schema["maxItems"]))
    if "minimum" in schema:
        checks.append(v.ge(schema["minimum"]))
    if "maximum" in schema:
        checks.append(v.le(schema["maximum"]))
    if "pattern" in schema:
        checks.append(v.matches_re(schema["pattern"]))
    if "minLength" in schema:
        checks.append(v.min_len(schema["minLength"]))
    if "maxLength" in schema:
        checks.append(v.max_len(schema["maxLength"]))
    if "items" in schema:
        checks.append(v.deep_iterable(v.and_(*_validators(schema["items"]))))
    return checks


_TEXT = re.compile(TEXT_PATTERN)


def is_plain_text(value: str, max_length: int) -> bool:
    """At most `max_length` characters, none of them a control character."""
    if len(value) > max_length:
        return False
    if value.isprintable():  # the common case, at C speed: no control character, no surrogate
        return True
    return _TEXT.fullmatch(value) is not None and not SURROGATE.search(value)


_NAME = re.compile(NAME_PATTERN)
_ID = re.compile(ID_PATTERN)


def check_name(value: str, field: str) -> None:
    """Refuse names that would make awkward Redis keys (braces, spaces, empty)."""
    if not _NAME.fullmatch(value):
        raise InvalidCommand(f"{field} must be 1-200 characters of letters, digits, '.', '_', ':' or '-'")


def check_id(value: str, field: str) -> None:
    """Refuse an id that is not 1-256 printable ASCII characters (`ID_PATTERN`)."""
    if not _ID.fullmatch(value):
        raise InvalidCommand(f"{field} must be 1 to 256 printable ASCII characters")


def check_client(client: ClientInfo) -> None:
    """Refuse a client name or version that is too long or holds control characters."""
    if not is_plain_text(client.name, MAX_CLIENT_NAME):
        raise InvalidCommand(
            f"client.name must be at most {MAX_CLIENT_NAME} characters, no control characters"
        )
    if not is_plain_text(client.version, MAX_CLIENT_VERSION):
        raise InvalidCommand(
            f"client.version must be at most {MAX_CLIENT_VERSION} characters, no control characters"
        )
    if not 1 <= client.feature_level <= MAX_COUNTER:
        raise InvalidCommand(f"client.featureLevel must be between 1 and {MAX_COUNTER}")


def check_counter(value: int, field: str) -> None:
    """Refuse an epoch or version outside JSON's safe integers."""
    if not -1 <= value <= MAX_COUNTER:
        raise InvalidCommand(f"{field} must be at most {MAX_COUNTER}")


class ShardState(enum.Enum):
    """Lifecycle of one shard key in a stream layout."""

    ACTIVE = "ACTIVE"  # producers route to it, consumers read it
    DRAINING = "DRAINING"  # no new appends; consumers read until drained
    RETIRED = "RETIRED"  # drained and sealed; never read again


class HeartbeatStatus(enum.Enum):
    """The `status` of a heartbeat response (PROTOCOL section 3)."""

    OK = "OK"
    REVOKE_PENDING = "REVOKE_PENDING"
    SYNC_METADATA = "SYNC_METADATA"
    FENCED = "FENCED"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"


class MemberState(enum.Enum):
    """Where a member stands in its own reconciliation (derived, never stored)."""

    STABLE = "STABLE"  # reconciled to the assignment epoch, nothing pending
    UNREVOKED = "UNREVOKED"  # must stop reading some shards and ack them
    UNRELEASED = "UNRELEASED"  # waits for shards another member still holds


class FenceReason(enum.Enum):
    """Why a member was removed from the group without leaving."""

    LEASE_EXPIRED = "LEASE_EXPIRED"
    REVOKE_TIMEOUT = "REVOKE_TIMEOUT"
    STALE_EPOCH = "STALE_EPOCH"
    REMOVED = "REMOVED"
    #: A static member's id was taken over by a new process (a new incarnation): the old one
    #: must stop for good, never rejoin (Kafka's FENCED_INSTANCE_ID). From feature level 4.
    REPLACED = "REPLACED"


class ReleaseReason(enum.Enum):
    """Why a shard stopped being installed to a member."""

    REVOKE_ACKED = "REVOKE_ACKED"
    LEFT = "LEFT"
    FENCED = "FENCED"


class StartFrom(enum.Enum):
    """Where a new consumer group starts reading a shard."""

    EARLIEST = "earliest"
    LATEST = "latest"


class ReshardMode(enum.Enum):
    """How a shard-count change treats producers (PROTOCOL section 5)."""

    ONLINE = "online"
    QUIESCE = "quiesce"


class MigrationPhase(enum.Enum):
    """Where a resharding (`Migration`) is; PROTOCOL section 5, docs/operations.md.

    Quiesce mode runs PAUSING, QUIESCED, SWITCHING, then DRAINING (scale-in); online
    mode starts at SWITCHING. DONE and ABORTED are final.
    """

    #: Producers are paused; waits until every live producer reports `quiesced` (or expires).
    PAUSING = "PAUSING"
    #: Producers are quiet; waits until every group has consumed and acknowledged everything
    #: on every readable shard (Redis evidence), i.e. everything appended before the pause.
    QUIESCED = "QUIESCED"
    #: The layout has changed (producers resumed); waits until every live producer routes
    #: with it.
    SWITCHING = "SWITCHING"
    #: Scale-in: the removed shards drain; waits until every DRAINING shard is RETIRED.
    DRAINING = "DRAINING"
    DONE = "DONE"
    ABORTED = "ABORTED"

    @property
    def final(self) -> bool:
        return self in (MigrationPhase.DONE, MigrationPhase.ABORTED)

    @property
    def switched(self) -> bool:
        """The layout has changed: the migration can no longer be aborted."""
        return self in (MigrationPhase.SWITCHING, MigrationPhase.DRAINING, MigrationPhase.DONE)


@attrs.frozen
class MigrationBounds:
    """How long the phases that keep producers paused may last before the migration stops
    (stalls) for an operator to resume or abort it."""

    pausing_ms: int = 30_000
    quiesced_ms: int = 300_000

    def of(self, phase: MigrationPhase) -> int | None:
        """The bound of `phase` (None: unbounded)."""
        if phase is MigrationPhase.PAUSING:
            return self.pausing_ms
        if phase is MigrationPhase.QUIESCED:
            return self.quiesced_ms
        return None


@attrs.frozen
class PhaseStarted:
    """A phase a migration entered, and when."""

    phase: MigrationPhase
    at_ms: int


@attrs.frozen
class Stall:
    """Why a migration stopped: the phase that ran out of time, when, and what it waited for."""

    phase: MigrationPhase
    at_ms: int
    reason: str


@attrs.frozen
class Migration:
    """One resharding of a stream (the last one stays, in DONE or ABORTED, until the next).

    `paused_producers`: the migration paused the stream's producers itself (quiesce mode
    on a stream that was not paused), so it resumes them when it switches or aborts.
    """

    migration_id: int
    mode: ReshardMode
    from_count: int
    to_count: int
    from_version: int
    started_at_ms: int
    phases: tuple[PhaseStarted, ...]
    bounds: MigrationBounds = MigrationBounds()
    deadline_ms: int | None = None
    stalled: Stall | None = None
    paused_producers: bool = False
    #: The migration this one replaced while the other was still draining.
    supersedes: int | None = None
    outcome: str = ""

    @property
    def phase(self) -> MigrationPhase:
        return self.phases[-1].phase

    @property
    def running(self) -> bool:
        return not self.phase.final


@attrs.frozen
class Shard:
    """One physical stream key of a logical stream."""

    index: int
    key: str
    state: ShardState = ShardState.ACTIVE

    @property
    def readable(self) -> bool:
        """Consumers read ACTIVE and DRAINING shards; RETIRED ones are gone."""
        return self.state is not ShardState.RETIRED


@attrs.frozen
class Layout:
    """The routing metadata of a stream at one `metadata_version`.

    Immutable: what is derived from its shards is computed once (a group asks for its
    indexes on every heartbeat)."""

    metadata_version: int
    shards: tuple[Shard, ...]
    routing: str = DEFAULT_ROUTING

    @functools.cached_property
    def active(self) -> tuple[Shard, ...]:
        """Shards producers route to, in routing order (ascending index)."""
        return tuple(s for s in self.shards if s.state is ShardState.ACTIVE)

    @functools.cached_property
    def readable_indexes(self) -> frozenset[int]:
        """Indexes of the shards a consumer group must have assigned."""
        return frozenset(s.index for s in self.shards if s.readable)

    @functools.cached_property
    def active_indexes(self) -> frozenset[int]:
        """Indexes of the ACTIVE shards: the work the assignor balances."""
        return frozenset(s.index for s in self.shards if s.state is ShardState.ACTIVE)

    @functools.cached_property
    def draining(self) -> tuple[Shard, ...]:
        """Shards that take no new appends and are read until drained."""
        return tuple(s for s in self.shards if s.state is ShardState.DRAINING)


EMPTY_LAYOUT = Layout(metadata_version=0, shards=())


@attrs.frozen
class Timing:
    """Control-plane timing a group runs with (coordinator defaults)."""

    heartbeat_interval_ms: int = 3_000
    lease_ttl_ms: int = 10_000
    revoke_timeout_ms: int = 60_000
    #: A new target assignment is computed at most this often; epoch bumps in
    #: between are folded into the next computation (0 = at once).
    assignment_interval_ms: int = 0


#: The longest a static member's shards may wait for it (`GroupConfig.static_hold_ms`).
MAX_STATIC_HOLD_MS = 3_600_000


@attrs.frozen
class StartAt:
    """Where a new group starts on each shard, finer than `StartFrom` (feature level 7): at a
    time (`time_ms`: entries at or after it are delivered), or at given positions (`ids`: shard
    index -> the last-delivered id; shards not named start as `startFrom` says)."""

    time_ms: int | None = attrs.field(default=None, metadata={"omit_if_default": True})
    ids: Mapping[str, str] | None = attrs.field(default=None, metadata={"omit_if_default": True})


@attrs.frozen
class GroupConfig:
    """Per-group settings changed only through the Admin API."""

    max_concurrency: int = 1
    start_from: StartFrom = StartFrom.EARLIEST
    #: How long a static member's shards stay targeted to it after it stopped (its graceful
    #: leave or its lease end), waiting for it to come back (None: one lease). From feature
    #: level 4; left out of the JSON while unset, so lower levels write what they always did.
    static_hold_ms: int | None = attrs.field(default=None, metadata={"omit_if_default": True})
    #: Where the group starts, finer than `start_from` (feature level 7; left out while unset).
    start_at: StartAt | None = attrs.field(default=None, metadata={"omit_if_default": True})


@attrs.frozen
class ClientInfo:
    """Name and version of the client library a member or producer runs.

    The limits are checked when a heartbeat is decided (`check_client`), not on
    construction, so a journal written before them still replays.
    """

    name: str = wire_field("unknown", enforce=False, maxLength=MAX_CLIENT_NAME, pattern=TEXT_PATTERN)
    version: str = wire_field("unknown", enforce=False, maxLength=MAX_CLIENT_VERSION, pattern=TEXT_PATTERN)
    #: The highest feature level the client supports (`rsc.events.versions`); a client that
    #: does not say (every 0.1.0 client) supports level 1 only.
    feature_level: int = wire_field(1, enforce=False, minimum=1, maximum=MAX_COUNTER)


@attrs.frozen
class DrainCheck:
    """Redis-level evidence about one DRAINING shard, read in one script on its own node:
    `sealed` (producers' appends are refused) and `drained` (in every consumer group on the
    key nothing is pending and nothing is left to deliver after its last-delivered id, each of
    the stream's groups being there; or the key holds nothing at all)."""

    sealed: bool
    drained: bool


@attrs.frozen
class DrainProgress:
    """A member's report on one DRAINING shard it owns."""

    shard: int = wire_field(minimum=0, maximum=16_383)
    pending: int = wire_field(minimum=0, maximum=MAX_REDIS_COUNT)
    lag: int | None = wire_field(None, minimum=0, maximum=MAX_REDIS_COUNT, nullable=True)


@attrs.frozen
class Member:
    """A live member of a group as the coordinator knows it.

    `assigned` and `revoking` together are the shards installed to the member
    (the current assignment): no other live member has any of them installed.
    Its lease is liveness, not history: it is kept beside the state, in the
    lease table of whoever drives the group (`rsc.events.liveness.Leases`).
    """

    member_id: str
    incarnation: str
    member_epoch: int
    previous_epoch: int
    assigned: frozenset[int] = frozenset()
    revoking: frozenset[int] = frozenset()
    revoking_since_ms: int | None = None
    revoke_deadline_ms: int | None = None
    client: ClientInfo = ClientInfo()
    joined_at_ms: int = 0
    #: Leaving gracefully: no longer in the target; it hands its shards over, then leaves.
    #: (A static member leaving keeps its target: it revokes everything, and its shards are
    #: held for it once it has left.)
    leaving: bool = False
    #: A static member (a stable instance identity, feature level 4): its shards are held for
    #: it when it stops, and a new incarnation of its id takes it over instead of being refused.
    static: bool = attrs.field(default=False, metadata={"omit_if_default": True})
    #: Its epoch was last moved by a target that kept its shards (feature level 8), which it
    #: may not have heard of yet: a heartbeat with any epoch from `previous_epoch` (the one it
    #: surely knows) to `member_epoch` is its own, while it reports only what it holds.
    quiet: bool = attrs.field(default=False, metadata={"omit_if_default": True})

    @property
    def installed(self) -> frozenset[int]:
        """Every shard this member holds: readable ones and ones being revoked."""
        return self.assigned | self.revoking


@attrs.frozen
class Producer:
    """A registered producer of a stream (PROTOCOL section 5).

    `acked_version` is the layout version it routes with; `quiesced` says it
    has stopped publishing and flushed (asked for while the stream is paused).
    Its lease is liveness, not history: it is kept beside the state, in the
    lease table of whoever drives the stream (`rsc.events.liveness.Leases`).
    (Checkpoints written before that hold a `leaseDeadlineMs`: it is ignored.)
    """

    producer_id: str
    acked_version: int
    quiesced: bool
    lease_ttl_ms: int
    registered_at_ms: int
    client: ClientInfo = ClientInfo()
    #: The epoch its process appends with (feature level 6; 0: none).
    epoch: int = attrs.field(default=0, metadata={"omit_if_default": True})


@attrs.frozen
class PauseState:
    """Why and since when producers of a stream are paused."""

    reason: str
    since_ms: int


@attrs.frozen
class Hold:
    """What a member that stopped was last targeted, kept for it until `until_ms`.

    Static (`static`): the shards stay targeted to its id and are installed to nobody else
    until it comes back (any incarnation) or the hold ends. Otherwise a memory only: the
    shards moved at once, and the assignor gives them back to the id if it rejoins before
    `until_ms` and balance allows (sticky across rejoins). `incarnation` is the one that
    stopped: a different one coming back supersedes it for good.
    """

    incarnation: str
    shards: frozenset[int]
    until_ms: int
    static: bool


@attrs.frozen
class FencedMember:
    """A tombstone: a member removed without leaving, so it is told FENCED."""

    member_id: str
    incarnation: str
    reason: FenceReason
    fenced_at_ms: int


def owners_of(members: Mapping[str, Member]) -> dict[int, str]:
    """Return the current assignment as shard -> member with it installed."""
    return {shard: m.member_id for m in members.values() for shard in m.installed}
