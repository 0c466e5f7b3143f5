"""One way to run Lua scripts, for the coordinator and the clients alike.

Every script call is sent as `EVALSHA` without asking first whether Redis holds the script
(coredis asks, with `SCRIPT EXISTS`, before every pipeline that holds one: a round trip more
each time). Only the calls Redis answers `NOSCRIPT` (it restarted, failed over, or its
scripts were flushed) have their scripts loaded and are sent again; the others' replies
stand, so a script that is not idempotent (a producer's append) is never run twice.

How calls are sent and scripts loaded is the caller's (the lean RESP connection, a coredis
pipeline, redis-py): `reloading` takes both as functions. `reloading_sync` is its twin for
redis-py's blocking client (the synchronous producer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from rsc.redis_errors import reply_code

__all__ = ["LOAD_ROUNDS", "reloading", "reloading_sync", "unknown_script"]

Call = TypeVar("Call")

#: How many times the calls answered `NOSCRIPT` have their scripts loaded and are sent again.
LOAD_ROUNDS = 3


def unknown_script(reply: object) -> bool:
    """Whether `reply` is Redis' `NOSCRIPT` refusal (coredis and redis-py strip the code from
    this one: their `NoScriptError`; an error reply with the code otherwise)."""
    if not isinstance(reply, BaseException):
        return False
    return "NoScript" in type(reply).__name__ or reply_code(reply) == "NOSCRIPT"


async def reloading(
    calls: Sequence[Call],
    send: Callable[[Sequence[Call]], Awaitable[Sequence[object]]],
    load: Callable[[Sequence[Call]], Awaitable[object]],
) -> list[object]:
    """The replies of `calls` (one each, in order; an error reply as its exception, returned):
    `send(calls)`, then, for the calls answered `NOSCRIPT` only, `load(those)` (their scripts
    loaded) and `send(those)` again, up to `LOAD_ROUNDS` times (a failover between the load and
    the call runs it on a Redis that was not told the script: `NOSCRIPT` again). A `NOSCRIPT`
    still there after that is returned as it is, and is a transient failure
    (`rsc.redis_errors.TRANSIENT_CODES`). Raises what `send` and `load` raise."""
    replies = list(await send(calls))
    for _ in range(LOAD_ROUNDS):
        unknown = [i for i, reply in enumerate(replies) if unknown_script(reply)]
        if not unknown:
            break
        again = [calls[i] for i in unknown]
        await load(again)
        for i, reply in zip(unknown, await send(again), strict=True):
            replies[i] = reply
    return replies


def reloading_sync(
    calls: Sequence[Call],
    send: Callable[[Sequence[Call]], Sequence[object]],
    load: Callable[[Sequence[Call]], object],
) -> list[object]:
    """`reloading` for a blocking client."""
    replies = list(send(calls))
    for _ in range(LOAD_ROUNDS):
        unknown = [i for i, reply in enumerate(replies) if unknown_script(reply)]
        if not unknown:
            break
        again = [calls[i] for i in unknown]
        load(again)
        for i, reply in zip(unknown, send(again), strict=True):
            replies[i] = reply
    return replies
