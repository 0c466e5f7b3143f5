"""Running a command's trio part against Redis, with the mistakes an operator makes (Redis
not answering, refusing the credential, a URL it cannot use) as one line, not a traceback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import trio

from rsc.actors.errors import StoreUnavailable
from rsc.connect import RedisRefused, RedisUnreachable
from rsc.redis_errors import first_leaf

T = TypeVar("T")

#: What a command meets when Redis does not answer, refuses it or cannot be used at that URL.
REDIS_MISTAKES = (StoreUnavailable, RedisUnreachable, RedisRefused)


def run_on_redis(
    main: Callable[[], Awaitable[T]], error: type[click.ClickException] = click.ClickException
) -> T:
    """`trio.run(main)`, with Redis not answering, refusing us or an unusable URL (raised
    alone or inside nurseries) as one line (`error`), never a traceback."""
    try:
        return trio.run(main)
    except REDIS_MISTAKES as exc:
        raise error(str(exc)) from exc
    except BaseExceptionGroup as group:
        fatal, rest = group.split(REDIS_MISTAKES)
        others = rest.split(trio.Cancelled)[1] if rest is not None else None
        if fatal is None or others is not None:  # something else went wrong too: shown whole
            raise
        raise error(str(first_leaf(fatal))) from group
