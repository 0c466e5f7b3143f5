"""Opening a Redis connection from a URL under trio (coredis): standalone or cluster, detected.

Shared by the coordinator (`rsc.actors`) and the embedded client (`rsc.client`).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import coredis
import trio

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"

#: A coredis client; a cluster client offers the same commands.
RedisClient = Any

#: Failures of a Redis that cannot answer now but may soon: connection lost or refused, a
#: timeout, loading its data after a restart, read-only or down during a failover.
UNAVAILABLE = (
    coredis.exceptions.ConnectionError,  # BusyLoadingError (LOADING) and ProtocolError too
    coredis.exceptions.ReadOnlyError,
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
    coredis.exceptions.ClusterError,
    TimeoutError,
    OSError,
    trio.BrokenResourceError,
)
#: The same, for the refusals coredis has no class for: the Redis error code (the first word).
TRANSIENT_CODES = frozenset({"LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "READONLY"})


class RedisUnreachable(ConnectionError):
    """Nothing answered at the Redis URL."""


class RedisRefused(ConnectionError):
    """Redis answered but refused us (wrong password or user, no permission): retrying will not help."""


REFUSED = (coredis.exceptions.AuthenticationError, coredis.exceptions.AuthorizationError)
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def redacted(url: str) -> str:
    """`url` without its password (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host_and_port = parts.netloc.rpartition("@")[2]  # as written: even a port out of range
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host_and_port}"))


def client_options(
    url: str,
    *,
    connect_timeout_s: float | None = None,
    command_timeout_s: float | None = None,
    max_connections: int | None = None,
) -> dict[str, Any]:
    """coredis keyword arguments for `url`: credentials, TLS (`rediss://`), timeouts, pool size.

    TLS options follow redis-py's URL form: `rediss://host:port?ssl_ca_certs=/ca.pem`
    (also `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs=none|optional|required`,
    `ssl_check_hostname=false`).
    """
    parsed = urlsplit(url)
    if parsed.scheme not in ("redis", "rediss"):
        raise ValueError(f"a Redis URL starts with redis:// or rediss://, not {parsed.scheme}://")
    options: dict[str, Any] = {
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 6379,
        "username": unquote(parsed.username) if parsed.username else None,
        "password": unquote(parsed.password) if parsed.password else None,
        "decode_responses": True,
    }
    if connect_timeout_s is not None:
        options["connect_timeout"] = connect_timeout_s
    if command_timeout_s is not None:
        options["stream_timeout"] = command_timeout_s
    if max_connections is not None:
        options["max_connections"] = max_connections
    if parsed.scheme == "rediss":
        query = dict(parse_qsl(parsed.query))
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
        if "ssl_certfile" in query:
            context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
        if query.get("ssl_check_hostname", "true").lower() in ("false", "0", "no"):
            context.check_hostname = False
        reqs = query.get("ssl_cert_reqs", "required").lower()
        if reqs not in _CERT_REQS:
            raise ValueError("ssl_cert_reqs must be none, optional or required")
        if _CERT_REQS[reqs] != ssl.CERT_REQUIRED:
            context.check_hostname = False
        context.verify_mode = _CERT_REQS[reqs]
        options["ssl_context"] = context
    return options


def error_code(exc: BaseException) -> str | None:
    """The Redis error code of a refusal (the first word of the reply: `NOGROUP`, `FENCED`), else None.

    coredis strips the code from the refusals it has a class for (`LOADING`, `NOGROUP`...);
    those are told apart by their class.
    """
    return reply_code(exc) if isinstance(exc, coredis.exceptions.ResponseError) else None


def reply_code(refusal: BaseException) -> str | None:
    """The first word of a Redis error reply when it is a code (`BUSY`, `FENCED`), for any
    client library's refusal (coredis or redis-py)."""
    code = str(refusal).split(" ", 1)[0]
    return code if code.isupper() else None


def is_unavailable(exc: BaseException) -> bool:
    """A failure of a Redis that may answer if asked again later (see `UNAVAILABLE`)."""
    return isinstance(exc, UNAVAILABLE) or error_code(exc) in TRANSIENT_CODES


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


@contextlib.asynccontextmanager
async def open_redis(
    url: str = DEFAULT_REDIS_URL,
    *,
    connect_timeout_s: float | None = None,
    command_timeout_s: float | None = None,
    max_connections: int | None = None,
) -> AsyncIterator[RedisClient]:
    """Connect to `url`; if that node runs in cluster mode, yield a cluster client instead.

    Raises `RedisUnreachable` when nothing answers and `RedisRefused` when Redis
    refuses the credentials. With `command_timeout_s`, a command that gets no answer
    in time fails with `TimeoutError` (a blocking read must block for less). Blocking
    commands hold a connection each: `max_connections` (per node on a cluster) bounds them.
    """
    try:
        options = client_options(
            url,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            max_connections=max_connections,
        )
    except (ValueError, OSError) as exc:
        raise RedisRefused(f"unusable Redis URL {redacted(url)}: {exc}") from exc
    where = f"{options['host']}:{options['port']}"
    try:
        async with coredis.Redis(**options) as probe:
            info = await probe.info("cluster")
    except REFUSED as exc:
        raise RedisRefused(f"Redis at {where} refused the connection: {exc}") from exc
    except UNAVAILABLE as exc:
        raise RedisUnreachable(f"cannot reach Redis at {where}: {exc}") from exc
    except BaseExceptionGroup as group:
        refused, _ = group.split(REFUSED)
        if refused is not None:
            raise RedisRefused(f"Redis at {where} refused the connection: {first_leaf(refused)}") from group
        if group.split(is_unavailable)[1] is not None:
            raise
        raise RedisUnreachable(f"cannot reach Redis at {where}: {group.exceptions[0]}") from group
    client: Any
    if info.get("cluster_enabled") in (1, "1"):
        if max_connections is not None:
            options["max_connections_per_node"] = True  # the limit is per node, as for one Redis
        client = coredis.RedisCluster(**options)
    else:
        db_text = urlsplit(url).path.lstrip("/") or "0"
        if not db_text.isdigit():
            raise RedisRefused(f"unusable Redis URL {redacted(url)}: the database must be a number")
        client = coredis.Redis(db=int(db_text), **options)
    try:
        async with client:
            await _first_command(client, where)
            yield client
    finally:
        _close_cluster_layout_streams(client)


async def _first_command(client: Any, where: str) -> None:
    """One PING, so that what Redis refuses (a database out of range) is refused here, clearly."""
    try:
        await client.ping()
    except coredis.exceptions.ResponseError as exc:
        raise RedisRefused(f"Redis at {where} refused the connection: {exc}") from exc
    except BaseExceptionGroup as group:
        refused, _ = group.split(coredis.exceptions.ResponseError)
        if refused is None:
            raise
        raise RedisRefused(f"Redis at {where} refused the connection: {first_leaf(refused)}") from group


def first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception in `group` that is not itself a group (trio nests them)."""
    first = group.exceptions[0]
    return first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _close_cluster_layout_streams(client: Any) -> None:
    """Close the error channel coredis' cluster layout leaves open (coredis 6.x).

    Without this every cluster client emits ResourceWarnings when collected.
    """
    layout = getattr(getattr(client, "connection_pool", None), "cluster_layout", None)
    for stream in getattr(layout, "_error_stream", ()):
        stream.close()
