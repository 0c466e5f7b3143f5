"""Opening a Redis connection from a URL under trio (coredis): standalone or cluster, detected,
or the primary that Redis Sentinel names.

Shared by the coordinator (`rsc.actors`) and the embedded client (`rsc.client`). The URL forms:

    redis://[[user]:password@]host[:port][/db]
    rediss://...?ssl_ca_certs=/ca.pem                      (TLS; see `client_options`)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]
    rediss+sentinel://...                                  (TLS to the data nodes, same options as rediss://)

With a sentinel URL the client follows a promotion without a restart: each new connection asks
the sentinels where the primary is and checks its ROLE, and a READONLY answer (the node was
demoted under an open connection) drops every connection of the pool (`_FollowingPool`).
`rsc.sync_connect.sync_redis(url)` gives a redis-py client for the same URLs, for the
synchronous producer.
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import attrs
import coredis
from coredis.connection import BaseConnection, SentinelManagedConnection, TCPLocation
from coredis.pool import SentinelConnectionPool
from coredis.retry import ConstantRetryPolicy

from rsc.redis_errors import (
    UNAVAILABLE,
    first_leaf,
    is_unavailable,
    redis_leaf,
    says_demoted,
)

if TYPE_CHECKING:
    pass

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"

#: A coredis client; a cluster client offers the same commands.
RedisClient = Any


class RedisUnreachable(ConnectionError):
    """Nothing answered at the Redis URL."""


class RedisRefused(ConnectionError):
    """Redis answered but refused us (wrong password or user, no permission): retrying will not help."""


REFUSED = (coredis.exceptions.AuthenticationError, coredis.exceptions.AuthorizationError)
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
#: The query options of `rediss://` (and `rediss+sentinel://`).
TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}
)

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
SENTINEL_FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]"
#: How long a sentinel may take to accept a connection or answer, when the caller gives no timeout:
#: one that hangs must not keep the client from asking the next.
SENTINEL_TIMEOUT_S = 2.0
#: What coredis' standalone client retries by default (a lost connection, twice), for the sentinel's.
_RETRIES = ConstantRetryPolicy((coredis.exceptions.ConnectionError, TimeoutError), retries=2, delay=0.01)

_SECRET_OPTION = re.compile(r"(?<=[?&]sentinel_password=)[^&#]*")
_USERINFO = re.compile(r"(?<=://)([^/?#@]*?):[^/?#]*@")


def redacted(url: str) -> str:
    """`url` without its passwords (the user's and a `sentinel_password=`), for logs and messages."""
    url = _SECRET_OPTION.sub("***", url)
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (an unclosed [): hide whatever stands before an @
        return _USERINFO.sub(r"\1:***@", url)
    if parts.password is None:
        return url
    host_and_port = parts.netloc.rpartition("@")[2]  # as written: even a port out of range
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host_and_port}"))


def is_sentinel_url(url: str) -> bool:
    """Whether `url` names a primary through Redis Sentinel (`redis+sentinel://`, `rediss+sentinel://`)."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@attrs.frozen
class SentinelTarget:
    """What a sentinel URL names: the sentinels, the service they monitor, and how to talk to its
    primary (credentials, database, TLS). The password of the sentinels themselves is separate."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    #: `rediss+sentinel://`: TLS to the data nodes (the sentinels are asked without it).
    tls: bool = False
    #: The `ssl_*` options, as given.
    tls_options: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        """The sentinels, as `host:port,host:port`."""
        return ",".join(address(host, port) for host, port in self.sentinels)


def address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read `redis+sentinel://[[user]:password@]h1:p1[,h2:p2...]/service[/db][?sentinel_password=...]`.

    The user and password are the data nodes' (as in redis://); a port left out is 26379;
    `rediss+sentinel://` takes the `ssl_*` options of rediss://. Raises ValueError saying what
    is wrong (never with a password in it).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError("a sentinel URL starts with redis+sentinel:// or rediss+sentinel://")
    tls = scheme.lower() == "rediss+sentinel"
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not hosts:
        raise ValueError(f"no sentinel host: expected {SENTINEL_FORM}")
    sentinels = tuple(_sentinel_address(text) for text in hosts.split(","))
    segments = path.split("/") if slash else []
    if not segments or not segments[0]:
        raise ValueError(f"no service name (the name the sentinels monitor): expected {SENTINEL_FORM}")
    if len(segments) > 2:
        raise ValueError(f"expected /service[/db] after the sentinels, not /{path}")
    db_text = segments[1] if len(segments) == 2 else ""
    if db_text and not (db_text.isdigit() and int(db_text) < 16_384):
        raise ValueError(f"the database must be a number, not {db_text!r}")
    user, colon, secret = userinfo.partition(":")
    target = SentinelTarget(
        sentinels=sentinels,
        service=unquote(segments[0]),
        db=int(db_text or "0"),
        username=unquote(user) if at and user else None,
        password=unquote(secret) if at and colon and secret else None,
        tls=tls,
    )
    sentinel_password: str | None = None
    tls_options: list[tuple[str, str]] = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name == "sentinel_password":
            sentinel_password = value or None
        elif name in TLS_OPTIONS:
            if not tls:
                raise ValueError(f"{name} is a TLS option: use rediss+sentinel://")
            if name == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
                raise ValueError("ssl_cert_reqs must be none, optional or required")
            tls_options.append((name, value))
        else:
            raise ValueError(
                f"unknown option {name}= (a sentinel URL takes sentinel_password= and, "
                "with rediss+sentinel://, the ssl_* options of rediss://)"
            )
    return attrs.evolve(target, sentinel_password=sentinel_password, tls_options=tuple(tls_options))


def _sentinel_address(text: str) -> tuple[str, int]:
    """`host[:port]` or `[v6]:port` of one sentinel."""
    if not text:
        raise ValueError(f"an empty sentinel address (a comma too many): expected {SENTINEL_FORM}")
    if text.startswith("["):
        host, closed, after = text[1:].partition("]")
        if not closed or (after and not after.startswith(":")):
            raise ValueError(f"sentinel address {text!r}: expected [ipv6]:port")
        port_text = after[1:]
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"sentinel address {text!r}: no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not (port_text.isdigit() and 0 < int(port_text) < 65_536):
        raise ValueError(f"sentinel address {text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


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

    Raises `ValueError` for another scheme, a malformed URL (a port out of range...) or a bad
    `ssl_cert_reqs`;
    `OSError` (`FileNotFoundError`, `ssl.SSLError`) when a TLS file cannot be loaded.
    """
    parsed = urlsplit(url)
    if parsed.scheme not in ("redis", "rediss"):
        raise ValueError(
            f"a Redis URL starts with redis://, rediss:// or (Sentinel) redis+sentinel://, "
            f"not {parsed.scheme}://"
        )
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
        options["ssl_context"] = tls_context(dict(parse_qsl(parsed.query)))
    return options


def tls_context(query: dict[str, str]) -> ssl.SSLContext:
    """The TLS context the `ssl_*` options of a rediss:// URL ask for.

    Raises `ValueError` for a bad `ssl_cert_reqs`; `OSError` (`FileNotFoundError`,
    `ssl.SSLError`) when the CA, certificate or key file cannot be loaded."""
    context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
    if "ssl_certfile" in query:
        context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
    if not tls_check_hostname(query):
        context.check_hostname = False
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ValueError("ssl_cert_reqs must be none, optional or required")
    if _CERT_REQS[reqs] != ssl.CERT_REQUIRED:
        context.check_hostname = False
    context.verify_mode = _CERT_REQS[reqs]
    return context


def tls_check_hostname(query: dict[str, str]) -> bool:
    """Whether the `ssl_*` options leave the host name checked (the default)."""
    return query.get("ssl_check_hostname", "true").lower() not in ("false", "0", "no")


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
    `RedisRefused` also for a URL that cannot work (its password never in the message). A
    refusal (a database out of range) or failure of the first PING after the probe, and the
    block's own exceptions, come out inside an exception group (coredis' task groups).

    A sentinel URL (`redis+sentinel://...`, see the module doc) yields a client of the primary
    the sentinels name, with the same timeouts and `max_connections`; it follows a promotion
    without a restart. `RedisUnreachable` then means that no sentinel answers or none knows
    the service, or that the primary it names does not answer; `RedisRefused`, that a
    sentinel refuses its password (`?sentinel_password=`) or is none, or the primary refuses.
    """
    if is_sentinel_url(url):
        async with _open_sentinel(
            url,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            max_connections=max_connections,
        ) as primary:
            yield primary
        return
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


@contextlib.asynccontextmanager
async def _open_sentinel(
    url: str,
    *,
    connect_timeout_s: float | None,
    command_timeout_s: float | None,
    max_connections: int | None,
) -> AsyncIterator[RedisClient]:
    """`open_redis` for a sentinel URL: ask the sentinels, then yield a client of the primary."""
    try:
        target = parse_sentinel_url(url)
        context = tls_context(dict(target.tls_options)) if target.tls else None
    except (ValueError, OSError) as exc:
        raise RedisRefused(f"unusable Redis URL {redacted(url)}: {exc}") from exc
    timeouts: dict[str, Any] = {}
    if connect_timeout_s is not None:
        timeouts["connect_timeout"] = connect_timeout_s
    if command_timeout_s is not None:
        timeouts["stream_timeout"] = command_timeout_s
    node: dict[str, Any] = {
        **timeouts,
        "username": target.username,
        "password": target.password,
        "db": target.db,
    }
    if context is not None:
        node["ssl_context"] = context
    if max_connections is not None:
        node["max_connections"] = max_connections

    def sentinels() -> coredis.Sentinel[Any]:
        return coredis.Sentinel(
            [TCPLocation(host, port) for host, port in target.sentinels],
            sentinel_kwargs={
                "connect_timeout": connect_timeout_s or SENTINEL_TIMEOUT_S,
                "stream_timeout": command_timeout_s or SENTINEL_TIMEOUT_S,
                "password": target.sentinel_password,
            },
            decode_responses=True,
            retry_policy=_RETRIES,
        )

    # First a probe, so that what cannot work is one clear error here (not inside the task
    # groups of coredis' context managers, which wrap it in exception groups), then the client.
    try:
        async with sentinels() as probe:
            where = f"the primary of {target.service!r} at {await _ask_sentinels(probe, target)}"
            async with probe.primary_for(target.service, **node) as primary:
                try:
                    await primary.ping()
                except BaseException as exc:
                    leaf = redis_leaf(exc)
                    if leaf is not None and is_unavailable(leaf):
                        raise RedisUnreachable(f"cannot reach {where}: {leaf}") from exc
                    if isinstance(leaf, coredis.exceptions.ResponseError):
                        raise RedisRefused(f"{where} refused the connection: {leaf}") from exc
                    raise
    except BaseExceptionGroup as group:
        ours, _ = group.split((RedisUnreachable, RedisRefused))
        if ours is None:
            raise
        raise first_leaf(ours) from group
    async with sentinels() as sentinel:
        client = sentinel.primary_for(target.service, connection_pool_class=_FollowingPool, **node)
        async with client:
            yield client


async def _ask_sentinels(sentinel: coredis.Sentinel[Any], target: SentinelTarget) -> str:
    """Where the sentinels say the primary of `target.service` is, asking each in turn.

    `RedisRefused` when a sentinel refuses the password (or is no sentinel), `RedisUnreachable`
    when none answers or none knows the service.
    """
    unreachable: list[str] = []
    knows_not: list[str] = []
    for (host, port), node in zip(target.sentinels, sentinel.sentinels, strict=True):
        at = address(host, port)
        try:
            answer = await node.sentinel_get_master_addr_by_name(target.service)
        except BaseException as exc:
            leaf = redis_leaf(exc)
            if isinstance(leaf, REFUSED):
                hint = "" if target.sentinel_password else " (a sentinel's own password: ?sentinel_password=)"
                raise RedisRefused(f"the sentinel at {at} refused the connection: {leaf}{hint}") from exc
            if leaf is not None and is_unavailable(leaf):
                unreachable.append(f"{at}: {leaf or type(leaf).__name__}")
                continue
            if isinstance(leaf, coredis.exceptions.ResponseError):
                raise RedisRefused(f"{at} does not answer as a sentinel: {leaf}") from exc
            raise
        if answer:
            return address(str(answer[0]), int(answer[1]))
        knows_not.append(at)
    if knows_not:
        raise RedisUnreachable(
            f"no sentinel knows the service {target.service!r} (asked {', '.join(knows_not)}"
            + (f"; no answer from {'; '.join(unreachable)})" if unreachable else ")")
        )
    raise RedisUnreachable(f"no sentinel answers at {target.where}: {'; '.join(unreachable)}")


class _FollowingPool(SentinelConnectionPool):
    """The sentinel-managed pool of a primary that also follows a demotion under open connections.

    coredis (6.x) asks the sentinels only when it opens a connection: it then checks the
    node's ROLE (`StalePrimaryError` when it is no primary) and drops the pool's connections
    when the sentinels name another node. An open connection to a node demoted under it
    (REPLICAOF without the sentinels' CLIENT KILL) would answer READONLY to every write for
    good: here the first READONLY, or a blocked read unblocked because the node turned replica,
    drops every connection of the pool, so that the next command asks the sentinels again.
    The command that met it fails with `ReadOnlyError` (transient: `is_unavailable`), commands
    in flight on the dropped connections with `ConnectionError` (coredis retries those).
    """

    async def _construct_connection(self) -> SentinelManagedConnection:
        connection = await super()._construct_connection()
        _watch_demotion(connection, self.disconnect)
        return connection


def _watch_demotion(connection: BaseConnection, demoted: Callable[[], None]) -> None:
    """Call `demoted` when a reply on `connection` says its node is no longer the primary.

    Every reply reaches its request through `consume` (one call per command of a batch), so
    the requests the connection creates are wrapped there, pipelines and transactions included.
    """
    create_request = connection.create_request
    create_request_batch = connection.create_request_batch

    def watch(request: Any) -> None:
        consume = request.consume

        def consume_and_watch(response: Any) -> None:
            consume(response)
            if says_demoted(response):
                demoted()

        request.consume = consume_and_watch

    def watched_request(*args: Any, **kwargs: Any) -> Any:
        request = create_request(*args, **kwargs)
        watch(request)
        return request

    def watched_batch(*args: Any, **kwargs: Any) -> Any:
        batch = create_request_batch(*args, **kwargs)
        watch(batch)
        return batch

    connection.create_request = watched_request  # type: ignore[method-assign]
    connection.create_request_batch = watched_batch  # type: ignore[method-assign]


def _close_cluster_layout_streams(client: Any) -> None:
    """Close the error channel coredis' cluster layout leaves open (coredis 6.x).

    Without this every cluster client emits ResourceWarnings when collected.
    """
    layout = getattr(getattr(client, "connection_pool", None), "cluster_layout", None)
    for stream in getattr(layout, "_error_stream", ()):
        stream.close()
