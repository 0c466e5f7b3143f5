"""What a failed Redis call was, told apart once for the whole of rsc (coordinator and
clients): Redis could not answer (`is_unavailable`: retry later), or refused the command, by
its error code (`error_code`: the first word Redis sent, which coredis takes off the refusals
it has a class for); the leaf of the exception groups coredis raises under trio
(`redis_leaf`); a Redis that turned replica (`says_demoted`). `rsc.connect` re-exports them."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import coredis
import trio
from coredis.parser import Parser

__all__ = [
    "PIPELINE_ERROR",
    "REDIS_FAILURES",
    "TRANSIENT_CODES",
    "UNAVAILABLE",
    "error_code",
    "first_leaf",
    "is_unavailable",
    "redis_leaf",
    "reply_code",
    "says_demoted",
]

#: Failures of a Redis that cannot answer now but may soon: connection lost or refused, a
#: timeout, loading its data after a restart, read-only or down during a failover.
UNAVAILABLE = (
    coredis.exceptions.ConnectionError,  # BusyLoadingError (LOADING) and ProtocolError too
    coredis.exceptions.ReadOnlyError,
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
    coredis.exceptions.ClusterError,
    coredis.exceptions.PrimaryNotFoundError,  # no sentinel answers, or none names a primary (yet)
    coredis.exceptions.StalePrimaryError,  # the node a sentinel named is no longer the primary
    TimeoutError,
    OSError,
    trio.BrokenResourceError,
)
#: The same, by the Redis error code (the first word), for the refusals coredis has no class for,
#: and `NOSCRIPT` as it reaches a caller: every script call loads its script and is sent again
#: when told `NOSCRIPT` (`rsc.scripts.reloading`), so one that still comes back was loaded on
#: one Redis and run on another (a failover between the two, seen in a coordinator's retention
#: round behind Sentinel): the next try runs on the new primary.
TRANSIENT_CODES = frozenset(
    {"LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "NOSCRIPT"}
)


def error_code(exc: BaseException) -> str | None:
    """The Redis error code of a refusal (the first word of the reply: `NOGROUP`, `FENCED`), else None.

    coredis strips the code from the refusals it has a class for (`LOADING`, `NOGROUP`,
    `UNBLOCKED`...): for those it is told by the class (`_CLASS_CODES`), as Redis sent it.
    """
    code = _CLASS_CODES.get(type(exc))
    if code is not None:
        return code
    if not isinstance(exc, coredis.exceptions.ResponseError):
        return None
    # A plain `ResponseError` whose text starts with no code lost the generic `ERR` to the
    # parser (`ERR no such key` reads "no such key"): Redis starts every refusal with a code.
    return reply_code(exc) or ("ERR" if type(exc) is coredis.exceptions.ResponseError else None)


#: The code of each refusal coredis's parser gives a class of its own (and strips from its
#: text), and `ERR`'s refusals (`unknown command`...), but for "max number of clients reached"
#: (a `ConnectionError`: Redis did not take the connection).
_CLASS_CODES: dict[type, str] = {
    kind: code
    for code, entry in Parser.EXCEPTION_CLASSES.items()
    for kind in (entry.values() if isinstance(entry, dict) else (entry,))
    if not (isinstance(entry, dict) and issubclass(kind, coredis.exceptions.ConnectionError))
}


def _redis_py_code(refusal: BaseException) -> str | None:
    """The code redis-py's parser stripped from a refusal it gave a class of its own
    (`OutOfMemoryError`: `OOM`, `NoScriptError`: `NOSCRIPT`...), told by the class; None for
    anything else. redis-py is optional (`rsc[sync]`): looked at only once it is loaded."""
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is None or not isinstance(refusal, exceptions.RedisError):
        return None
    return _redis_py_codes().get(type(refusal))


@functools.cache
def _redis_py_codes() -> dict[type, str]:
    """redis-py's refusal classes and the code each stands for (the first, for a class that
    stands for several); empty for a redis-py that keeps its parser elsewhere."""
    try:
        from redis._parsers.base import BaseParser  # noqa: PLC0415  (only once redis-py is loaded)
    except ImportError:
        return {}
    codes: dict[type, str] = {}
    for code, kind in BaseParser.EXCEPTION_CLASSES.items():
        if isinstance(kind, type):
            codes.setdefault(kind, code)
    return codes


def reply_code(refusal: BaseException | str) -> str | None:
    """The code of a Redis error reply: its first word when that is a code (`BUSY`, `FENCED`,
    `NOGROUP`), for any client library's refusal (coredis or redis-py), or for the text of a
    refusal a script returns per shard (`'FENCED no owner'`, the `err` of a failed call). The
    one place where a Redis refusal is classified: by its code, never by the rest of the text.
    (coredis words a refusal inside a pipeline as "Command # n (...) of pipeline caused error:
    <reply>": the reply is read from after that.)"""
    if isinstance(refusal, BaseException) and (code := _redis_py_code(refusal)) is not None:
        return code
    text = str(refusal)
    _, wrapped, reply = text.partition(PIPELINE_ERROR)
    code = (reply if wrapped else text).split(" ", 1)[0]
    return code if code.isupper() else None


#: How coredis introduces the reply of a command that failed inside a pipeline.
PIPELINE_ERROR = " of pipeline caused error: "


def is_unavailable(exc: BaseException) -> bool:
    """A failure of a Redis that may answer if asked again later (see `UNAVAILABLE`)."""
    return isinstance(exc, UNAVAILABLE) or error_code(exc) in TRANSIENT_CODES or _node_reply_unmerged(exc)


def _node_reply_unmerged(exc: BaseException) -> bool:
    """coredis (6.9) merges the replies of a command sent to every node of a cluster (the
    `SCRIPT EXISTS` before a pipeline's scripts) by iterating each reply, and fails with a
    `TypeError` inside its own code when one node's reply is the connection error it met: that
    node did not answer. Told by where it was raised (in coredis), never by its words."""
    if not isinstance(exc, TypeError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.sep}coredis{os.sep}" in tb.tb_frame.f_code.co_filename


#: Whatever a failed Redis call raises: Redis refused the command, or could not answer.
REDIS_FAILURES = (coredis.exceptions.RedisError, *UNAVAILABLE)


def redis_leaf(exc: BaseException) -> BaseException | None:
    """What went wrong in a Redis call: `exc` itself, or the first leaf of the exception
    groups coredis raises under trio. None for a group that holds anything but Redis
    failures (a cancellation, a bug): that must travel on untouched."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    if exc.split(REDIS_FAILURES)[1] is not None:
        return None
    return first_leaf(exc)


def says_demoted(response: object) -> bool:
    """READONLY, or UNBLOCKED (by its reply class, never its words): a blocked command that the
    instance ended when it turned replica. `CLIENT UNBLOCK ... ERROR` also answers UNBLOCKED; the
    sentinels are then asked again for nothing worse than one reconnection."""
    return isinstance(response, (coredis.exceptions.ReadOnlyError, coredis.exceptions.UnblockedError))


def first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception in `group` that is not itself a group (trio nests them)."""
    first = group.exceptions[0]
    return first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
