"""Opening a Redis connection from a URL under trio (coredis): standalone or cluster, detected.

Shared by the coordinator (`rsc.actors`) and the embedded client (`rsc.client`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlparse

import coredis

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"

#: A coredis client; a cluster client offers the same commands.
RedisClient = Any

UNAVAILABLE = (coredis.exceptions.ConnectionError, TimeoutError, OSError)


class RedisUnreachable(ConnectionError):
    """Nothing answered at the Redis URL."""


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, UNAVAILABLE)


@contextlib.asynccontextmanager
async def open_redis(url: str = DEFAULT_REDIS_URL) -> AsyncIterator[RedisClient]:
    """Connect to `url`; if that node runs in cluster mode, yield a cluster client instead.

    Raises `RedisUnreachable` when nothing answers.
    """
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or 6379
    auth: dict[str, Any] = {"username": parsed.username, "password": parsed.password}
    try:
        async with coredis.Redis(host=host, port=port, decode_responses=True, **auth) as probe:
            info = await probe.info("cluster")
    except UNAVAILABLE as exc:
        raise RedisUnreachable(f"cannot reach Redis at {host}:{port}: {exc}") from exc
    except BaseExceptionGroup as group:
        if group.split(is_unavailable)[1] is not None:
            raise
        raise RedisUnreachable(f"cannot reach Redis at {host}:{port}: {group.exceptions[0]}") from group
    client: Any
    if info.get("cluster_enabled") in (1, "1"):
        client = coredis.RedisCluster(host=host, port=port, decode_responses=True, **auth)
    else:
        db = int(parsed.path.lstrip("/") or 0)
        client = coredis.Redis(host=host, port=port, db=db, decode_responses=True, **auth)
    try:
        async with client:
            yield client
    finally:
        _close_cluster_layout_streams(client)


def _close_cluster_layout_streams(client: Any) -> None:
    """Close the error channel coredis' cluster layout leaves open (coredis 6.x).

    Without this every cluster client emits ResourceWarnings when collected.
    """
    layout = getattr(getattr(client, "connection_pool", None), "cluster_layout", None)
    for stream in getattr(layout, "_error_stream", ()):
        stream.close()
