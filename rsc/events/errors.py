"""The core's errors: each is a request the protocol refuses, with a stable code.

The HTTP layer maps every one of these to a 4xx with `error: code`.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The HTTP status of each error code the core refuses with (docs/protocol.md, "On the wire");
#: any other code is 400. An item of a batch (`POST /v1/heartbeats`) names its status in the
#: item, and a client of an older coordinator that does not reads it from here.
HTTP_STATUS: Mapping[str, int] = {
    "QUOTA_EXCEEDED": 429,  # without Retry-After: a slot frees when something is deleted or leaves
    "INVALID_REQUEST": 400,
    "UNSUPPORTED_PROTOCOL_VERSION": 400,
    "NOT_FOUND": 404,
    "UNKNOWN_STREAM": 404,
    "UNKNOWN_GROUP": 404,
    "INCARNATION_MISMATCH": 409,
    "NOT_EMPTY": 409,
    "DELETED": 409,
    "MIGRATION_IN_PROGRESS": 409,
    "NO_MIGRATION": 409,
    "IMMUTABLE_FIELD": 409,
    "FEATURE_LEVEL_REQUIRED": 409,
    "FEATURE_LEVEL_NOT_SUPPORTED": 409,
    "PRODUCER_FENCED": 409,
    "UNSUPPORTED_FEATURE_LEVEL": 400,
    "PRECONDITION_FAILED": 412,
}


def http_status(code: str) -> int:
    """The HTTP status a refusal with error `code` is answered with (400 unless listed)."""
    return HTTP_STATUS.get(code, 400)


class CoordinationError(Exception):
    """Base of every refusal by the pure core."""

    code = "COORDINATION_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        #: Structured facts for the answer's `details` (None: none).
        self.details: dict[str, object] | None = None


class InvalidCommand(CoordinationError):
    """A field is out of range or inconsistent."""

    code = "INVALID_REQUEST"


class IncarnationMismatch(CoordinationError):
    """A live member id was driven by another incarnation (PROTOCOL section 8)."""

    code = "INCARNATION_MISMATCH"


class UnsupportedProtocolVersion(CoordinationError):
    """The request's `protocolVersion` is outside the supported range."""

    code = "UNSUPPORTED_PROTOCOL_VERSION"


class AggregateNotFound(CoordinationError):
    """The command needs an aggregate that was never created."""

    code = "NOT_FOUND"


class CorruptHistory(CoordinationError):
    """An event cannot apply to the state it follows: the journal is damaged."""

    code = "CORRUPT_HISTORY"


class UnknownStream(AggregateNotFound):
    """A stream the coordinator has never seen, with auto-creation switched off."""

    code = "UNKNOWN_STREAM"


class UnknownGroup(AggregateNotFound):
    """A heartbeat names a group that does not exist, and its caller may not create it."""

    code = "UNKNOWN_GROUP"


class NotEmpty(CoordinationError):
    """A delete refused: the group has live members, or the stream has groups or producers."""

    code = "NOT_EMPTY"


class Deleted(AggregateNotFound):
    """The aggregate was deleted (it is created afresh on next use, where that is allowed)."""

    code = "DELETED"


class StaleRecheck(CoordinationError):
    """A held heartbeat decided again (`Heartbeat.recheck`) no longer speaks for the member:
    it left, was fenced, or a newer heartbeat moved its epoch on. The held answer stands."""

    code = "STALE_RECHECK"


class MigrationConflict(CoordinationError):
    """A resharding, or a migration action, that the running migration does not allow now."""

    code = "MIGRATION_IN_PROGRESS"


class NoMigration(CoordinationError):
    """A migration action (resume, abort) with no migration it applies to."""

    code = "NO_MIGRATION"


class PreconditionFailed(CoordinationError):
    """A write conditioned on a revision (`If-Match`) found the aggregate at another."""

    code = "PRECONDITION_FAILED"


class QuotaExceeded(CoordinationError):
    """Creating or joining would go past a quota (`rsc.events.quotas`); nothing was created.

    `details` name the quota and its limit (never the use of a resource the caller may not see)."""

    code = "QUOTA_EXCEEDED"

    def __init__(self, message: str, quota: str, limit: int) -> None:
        super().__init__(message)
        self.quota = quota
        self.details = {"quota": quota, "limit": limit}


class UnknownShard(AggregateNotFound):
    """A shard index the stream's layout does not have."""


class ImmutableField(CoordinationError):
    """A change of a field that applies only when its aggregate is created (a group's
    `startFrom`); `details` name the field and its stored value."""

    code = "IMMUTABLE_FIELD"

    def __init__(self, message: str, field: str, stored: object) -> None:
        super().__init__(message)
        self.details = {"field": field, "stored": stored}


class FeatureLevelRequired(CoordinationError):
    """A change the deployment's finalized feature level does not allow yet; `details`: the
    level it needs and the finalized one."""

    code = "FEATURE_LEVEL_REQUIRED"

    def __init__(self, message: str, required: int, finalized: int) -> None:
        super().__init__(message)
        self.details = {"required": required, "finalized": finalized}


class ProducerFenced(CoordinationError):
    """A producer heartbeat of an epoch older than the one its id holds now: another process
    registered the id since (feature level 6). The older process must stop, not register
    again; `details.epoch`: the current one."""

    code = "PRODUCER_FENCED"

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.details = {"epoch": epoch}


class UnknownFeatureLevel(CoordinationError):
    """A feature level to finalize that this release does not know; `details.supported`: the
    range it knows."""

    code = "UNSUPPORTED_FEATURE_LEVEL"

    def __init__(self, message: str, lowest: int, highest: int) -> None:
        super().__init__(message)
        self.details = {"supported": [lowest, highest]}


class FeatureLevelNotSupported(CoordinationError):
    """Raising the finalized feature level waits for parties that do not support it;
    `details.blockers`: each of them (as the wire shows a party)."""

    code = "FEATURE_LEVEL_NOT_SUPPORTED"

    def __init__(self, message: str, blockers: list[object]) -> None:
        super().__init__(message)
        self.details = {"blockers": blockers}
