"""Errors of the persistence and actor layer, grouped by what a caller can do."""

from __future__ import annotations

import logging

import coredis

from rsc.events.errors import CoordinationError
from rsc.redis_errors import is_unavailable


class StoreError(Exception):
    """Base of persistence failures."""


class ConcurrencyConflict(StoreError):
    """The stored revision is not the one the writer expected: reload and retry."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"expected revision {expected}, found {actual}")
        self.expected = expected
        self.actual = actual


class StoreUnavailable(StoreError):
    """Redis could not be reached or timed out: retry later."""


class RedisOutOfMemory(StoreUnavailable):
    """Redis refused a write with `OOM` (used memory above `maxmemory`, with a policy that
    evicts nothing it may evict): retry once memory is freed (retention, a larger Redis).
    Counted in `OOM_REFUSALS` (`/metrics`: `rsc_redis_oom_refusals_total`)."""


class CommandRefused(StoreError):
    """Redis refused a command for a reason asking again will not fix (`code`: `WRONGTYPE`,
    `NOPERM`...): the operator's to fix; `key`, where known, is the key the command named."""

    def __init__(self, message: str, code: str, key: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.key = key


#: Writes Redis refused with `OOM`, in this process (the coordinator's own).
OOM_REFUSALS = [0]


class UnsupportedFeatureLevel(StoreError):
    """The deployment is finalized at a level this release does not know: it must not write."""


class FeatureLevelMoved(StoreError):
    """Another coordinator changed the level meanwhile, or data above the new level exists."""

    def __init__(self, message: str, level: int, written: int) -> None:
        super().__init__(message)
        self.level = level
        self.written = written


class UnsupportedSchema(StoreError):
    """A snapshot or journal entry was written by a newer release, at a feature level this
    release does not know: it cannot be read."""


class NotFinalized(StoreError):
    """An event that the deployment's finalized feature level does not allow (or that no
    level lists) was about to be written: nothing was written. A bug, never a client's fault."""


class TermFenced(StoreError):
    """A newer coordinator term has taken over the aggregate, or this process holds no term.

    The writer must stop: `fence` is the token stored with the aggregate (None
    when this process simply holds no active term), `token` the writer's.
    Nothing was written.
    """

    def __init__(self, message: str, fence: int | None = None, token: int | None = None) -> None:
        super().__init__(message)
        self.fence = fence
        self.token = token


class ActorStopped(Exception):
    """The actor stopped (shutdown or idle) before it could answer: ask again."""


class Redecide(Exception):
    """A command decided as a follow-up of a batch (`Actor.follow_ups`) was dropped with that
    batch (another writer moved the aggregate; the batch is decided again without it): nothing
    of it was written. Ask for it again as an ordinary command."""


#: What a background round of the coordinator (retention, drain checks, consumer pruning) logs
#: and tries again on its next round, for one stream or group: a store that failed, an actor
#: that refused or stopped, and a Redis refusal that reached it untranslated (a state no one
#: foresaw must not end the process, which also coordinates every other stream).
ROUND_FAILURES: tuple[type[BaseException], ...] = (
    CoordinationError,
    StoreError,
    ActorStopped,
    coredis.exceptions.ResponseError,
)


def log_round_failure(log: logging.Logger, context: str, exc: BaseException) -> None:
    """Log a failure a background round tries again next round: at DEBUG for what passes (Redis
    away, a standby, a busy actor), at WARNING for a Redis refusal that will not (`NOPERM`,
    `WRONGTYPE`...: the round keeps failing until an operator acts, and says so each time)."""
    refused = isinstance(exc, CommandRefused) or (
        isinstance(exc, coredis.exceptions.ResponseError) and not is_unavailable(exc)
    )
    log.log(logging.WARNING if refused else logging.DEBUG, "%s: %s", context, exc)
