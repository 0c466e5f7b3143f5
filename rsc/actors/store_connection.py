"""The coordinator's Redis connection: `rsc.connect.open_redis`, failures as `StoreUnavailable`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from rsc import connect
from rsc.actors.errors import StoreUnavailable
from rsc.connect import DEFAULT_REDIS_URL, RedisClient, is_unavailable, redis_leaf

__all__ = ["DEFAULT_REDIS_URL", "RedisClient", "open_redis", "redis_errors"]


@contextlib.contextmanager
def redis_errors(context: str) -> Iterator[None]:
    """Translate failures of an unavailable Redis (`rsc.connect.is_unavailable`: bare, or in
    coredis' exception groups) into `StoreUnavailable`."""
    try:
        yield
    except BaseException as exc:
        leaf = redis_leaf(exc)
        if leaf is None or not is_unavailable(leaf):
            raise
        raise StoreUnavailable(f"{context}: {leaf}") from exc


@contextlib.asynccontextmanager
async def open_redis(
    url: str = DEFAULT_REDIS_URL,
    *,
    connect_timeout_s: float | None = None,
    command_timeout_s: float | None = None,
) -> AsyncIterator[RedisClient]:
    """Connect to `url` (standalone or cluster, detected); raises `StoreUnavailable` when nothing answers.

    The coordinator gives both timeouts, so that a hung Redis fails its commands
    (503 to callers) instead of hanging them; `connect.RedisRefused` (wrong password)
    is raised as it is: retrying will not help.
    """
    async with contextlib.AsyncExitStack() as stack:
        try:
            client = await stack.enter_async_context(
                connect.open_redis(
                    url, connect_timeout_s=connect_timeout_s, command_timeout_s=command_timeout_s
                )
            )
        except connect.RedisUnreachable as exc:
            raise StoreUnavailable(str(exc)) from exc
        yield client
