"""The client's own exceptions: every transport or protocol failure maps to one of these, once."""

from __future__ import annotations

from typing import Any


class RscError(Exception):
    """Base of every error `rsc.client` raises."""


class CoordinatorUnavailable(RscError):
    """The coordinator could not be reached, or answered 5xx, even after retries."""


#: Refusals a producer that has not registered yet gives up on at once: its credential is
#: wrong or does not cover the stream (other refusals, such as an unknown stream, may pass).
REFUSED_FOR_GOOD = frozenset({401, 403})


class CoordinatorRejected(RscError):
    """The coordinator refused the request (4xx): `code` is the protocol's error code."""

    def __init__(
        self, status: int, code: str, message: str, request_id: str = "", details: Any = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details


class MemberReplaced(RscError):
    """A newer process joined with this member's static id and took it over (the coordinator
    answered FENCED, reason REPLACED): this member has dropped every shard and stopped for good.
    Two processes were started with one instance id (`RSC_INSTANCE_ID`), or this one was
    paused so long that it was restarted elsewhere."""


class CoordinatorUnintelligible(CoordinatorUnavailable):
    """The coordinator answered, but not in a form this client can read (not JSON, or a field
    it does not understand): a newer or broken coordinator. Counted as a failed request."""


class RedisUnavailable(RscError):
    """Redis could not answer now (connection lost or refused, a timeout, loading after a
    restart, a failover in progress): worth retrying after a pause."""


class RedisCommandFailed(RscError):
    """Redis refused a command (`code` is the Redis error code, e.g. `NOGROUP`, `NOPERM`)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Fenced(RedisCommandFailed):
    """The shard's owner token names someone else: this member must not touch the shard."""
