"""Opening the coordinator's Redis connection (standalone or cluster, detected)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlparse

import coredis

from rsc.actors.errors import StoreUnavailable

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"

#: The client type the actors use; a cluster client offers the same commands.
RedisClient = Any


_UNAVAILABLE = (coredis.exceptions.ConnectionError, TimeoutError, OSError)


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, _UNAVAILABLE)


@contextlib.contextmanager
def redis_errors(context: str) -> Iterator[None]:
    """Translate connection failures (bare, or in coredis' exception groups) into `StoreUnavailable`."""
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"{context}: {exc}") from exc
    except BaseExceptionGroup as group:
        _, rest = group.split(_unavailable)
        if rest is not None:
            raise
        raise StoreUnavailable(f"{context}: {group.exceptions[0]}") from group


@contextlib.asynccontextmanager
async def open_redis(url: str = DEFAULT_REDIS_URL) -> AsyncIterator[RedisClient]:
    """Connect to `url`; if that node runs in cluster mode, yield a cluster client instead.

    Raises `StoreUnavailable` when nothing answers.
    """
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or 6379
    auth: dict[str, Any] = {"username": parsed.username, "password": parsed.password}
    with redis_errors(f"cannot reach Redis at {host}:{port}"):
        async with coredis.Redis(host=host, port=port, decode_responses=True, **auth) as probe:
            info = await probe.info("cluster")
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
