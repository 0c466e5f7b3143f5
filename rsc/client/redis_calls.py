"""The one boundary every Redis call of the client library goes through (`redis_call`).

What a coredis call raises, bare or inside the exception groups coredis raises
under trio, leaves as one of three `rsc.client.errors`:

* `Fenced`: a fenced script refused (error code `FENCED`): the shard is not this member's;
* `RedisUnavailable`: Redis could not answer now (`rsc.redis_errors.is_unavailable`): retry later;
* `RedisCommandFailed`: Redis refused the command for another reason (its error code kept).

Cancellations and anything that is not a Redis failure travel on untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.redis_errors import REDIS_FAILURES, error_code, is_unavailable, redis_leaf


@contextlib.contextmanager
def redis_call(context: str) -> Iterator[None]:
    """Map the Redis failures of the block (see the module doc); `context` says what was tried.

    Raises `Fenced` when a fenced script refused (`FENCED`); `RedisUnavailable` when Redis could
    not answer (`rsc.redis_errors.is_unavailable`); `RedisCommandFailed` when it refused the command.
    Anything else (a cancellation, a group holding more than Redis failures) leaves untouched."""
    try:
        yield
    except BaseException as exc:
        leaf = redis_leaf(exc)
        if leaf is None or not (isinstance(leaf, REDIS_FAILURES) or is_unavailable(leaf)):
            raise
        if is_unavailable(leaf):
            raise RedisUnavailable(f"{context}: {describe(leaf)}") from exc
        code = error_code(leaf)
        if code == "FENCED":
            raise Fenced(str(leaf), code) from exc
        raise RedisCommandFailed(f"{context}: {describe(leaf)}", code) from exc


def describe(exc: BaseException) -> str:
    """A failure in words, never empty (some connection errors carry no message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
