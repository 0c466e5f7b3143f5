"""The trio producer's append scripts, written on its own lean connection to a standalone Redis.

Why not coredis for this one command: coredis checks and packs every argument in Python (a
batch of 1,000 messages is about 4,000 arguments: 7 us a message, measured in
docs/performance.md), and its connection queues a whole pipeline before writing it. Here
hiredis packs each shard's `SEALED_APPEND` call in C and it is written as soon as it is packed,
so Redis runs the first shard's scripts while the next is packed; hiredis parses the replies.
coredis keeps everything else (layout heartbeats are HTTP; the script load, every other
command), and the whole publish on a cluster, behind Sentinel, over a Unix socket, with a
credential provider, or when hiredis is missing: `AppendWriter.for_client` answers None and the
producer pipelines through coredis as before. Same script, same replies, same errors.

A connection is opened as coredis opens it, from the client's own settings: TCP (TLS with its
`ssl_context`), `AUTH` with its username and password, `SELECT` of its database; the
client's connect and command (`stream_timeout`) timeouts apply. A connection that failed in
any way is closed, never reused half read. Failures leave as the coredis exceptions the rest
of the client maps (`rsc.client.redis_calls.redis_call`): `ConnectionError` when Redis could
not answer, `ResponseError` (its code kept) when it refused the handshake.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import coredis
import trio
from coredis.connection import TCPLocation
from coredis.pool import ConnectionPool

hiredis: Any  # (its stubs type `pack_command` as taking one argument)
try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency; a build without it still runs
    hiredis = None

__all__ = ["AppendWriter", "Endpoint"]

#: How much a read asks the socket for at once.
_READ_SIZE = 256 * 1024


@attrs.frozen
class Endpoint:
    """Where and how to connect, as the coredis client connects."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl_context: ssl.SSLContext | None = None
    connect_timeout: float | None = None
    command_timeout: float | None = None

    @classmethod
    def of(cls, client: Any) -> Endpoint | None:
        """The endpoint of a standalone `coredis.Redis` on TCP with plain credentials, else None."""
        if hiredis is None or type(client) is not coredis.Redis:
            return None
        pool = client.connection_pool
        if type(pool) is not ConnectionPool:  # a Sentinel's pool follows the primary: coredis does
            return None
        location = getattr(pool, "location", None)
        settings = getattr(pool, "connection_kwargs", None)
        if not isinstance(location, TCPLocation) or not isinstance(settings, dict):
            return None
        if settings.get("credential_provider") is not None or settings.get("noreply"):
            return None
        return cls(
            host=location.host,
            port=location.port,
            db=settings.get("db") or 0,
            username=settings.get("username"),
            password=settings.get("password"),
            ssl_context=settings.get("ssl_context"),
            connect_timeout=settings.get("connect_timeout"),
            command_timeout=settings.get("stream_timeout"),
        )


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else trio.current_time() + timeout


class _Connection:
    """One connection: commands written as packed, replies read in order."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = hiredis.Reader(encoding="utf-8")

    @classmethod
    async def open(cls, endpoint: Endpoint) -> _Connection:
        with trio.move_on_at(_deadline(endpoint.connect_timeout)):
            stream: trio.abc.Stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
            try:
                if endpoint.ssl_context is not None:
                    stream = trio.SSLStream(stream, endpoint.ssl_context, server_hostname=endpoint.host)
                    await stream.do_handshake()
                connection = cls(stream)
                await connection.handshake(endpoint)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return connection
        raise coredis.exceptions.ConnectionError(f"connecting to {endpoint.host}:{endpoint.port} timed out")

    async def handshake(self, endpoint: Endpoint) -> None:
        """`AUTH` and `SELECT` as the client's settings ask; a refusal raises `ResponseError`."""
        commands: list[tuple[str | int, ...]] = []
        if endpoint.password is not None:
            credentials = (
                (endpoint.username, endpoint.password) if endpoint.username else (endpoint.password,)
            )
            commands.append(("AUTH", *credentials))
        if endpoint.db:
            commands.append(("SELECT", endpoint.db))
        for command in commands:
            await self.send(hiredis.pack_command(command))
        refused = [
            r for r in await self.replies(len(commands), endpoint.command_timeout) if isinstance(r, Exception)
        ]
        if refused:
            raise coredis.exceptions.ResponseError(str(refused[0]))

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise coredis.exceptions.ConnectionError(f"connection lost while sending: {exc}") from exc

    async def replies(self, count: int, timeout: float | None) -> list[Any]:
        """The next `count` replies; an error reply as an exception instance (not raised)."""
        out: list[Any] = []
        if not count:
            return out
        gets = self.reader.gets
        with trio.move_on_at(_deadline(timeout)) as scope:
            while True:
                reply = gets()
                while reply is not False:
                    out.append(reply)
                    if len(out) == count:
                        return out
                    reply = gets()
                try:
                    data = await self.stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise coredis.exceptions.ConnectionError(f"connection lost while reading: {exc}") from exc
                if not data:
                    raise coredis.exceptions.ConnectionError("connection closed by Redis")
                try:
                    self.reader.feed(data)
                except hiredis.ProtocolError as exc:
                    raise coredis.exceptions.ConnectionError(f"unreadable reply: {exc}") from exc
        assert scope.cancelled_caught
        raise coredis.exceptions.ConnectionError(f"no reply within {timeout} s")


class AppendWriter:
    """Sends batches of packed commands, each batch on one connection of its own pool."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[_Connection] = []
        #: Whether a call's connection is kept for the next (between `keep` and `aclose`);
        #: otherwise it is closed when the call ends, so nothing is left open to leak.
        self._keeping = False

    @classmethod
    def for_client(cls, client: Any) -> AppendWriter | None:
        """A writer to the Redis `client` talks to, or None where it does not apply (see the
        module doc): the caller then sends through `client`."""
        endpoint = Endpoint.of(client)
        return None if endpoint is None else cls(endpoint)

    async def call(
        self, commands: Iterable[Callable[[], tuple[str | bytes | int | float, ...]]]
    ) -> list[Any]:
        """Run the commands the callables of `commands` build, in order: one reply each, in
        order (an error reply as its exception).

        Each command is built, packed and written before the next is built. Raises
        `coredis.exceptions.ConnectionError` when Redis cannot be reached or stops answering (the
        connection is then closed), and
        `coredis.exceptions.ResponseError` when it refuses the connection's handshake."""
        connection = self._idle.pop() if self._idle else await _Connection.open(self.endpoint)
        try:
            pack, sent = hiredis.pack_command, 0
            for command in commands:
                await connection.send(pack(command()))
                sent += 1
            replies = await connection.replies(sent, self.endpoint.command_timeout)
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        if self._keeping:
            self._idle.append(connection)
        else:
            await trio.aclose_forcefully(connection.stream)
        return replies

    def keep(self) -> None:
        """Keep connections open between calls, until `aclose` (the owner must call it)."""
        self._keeping = True

    async def aclose(self) -> None:
        """Close the idle connections and stop keeping them (a call in flight closes its own
        when it ends); a call after this one still works, on a connection of its own closed
        when it ends. Closes even in a cancelled scope."""
        self._keeping = False
        idle, self._idle = self._idle, []
        for connection in idle:
            await trio.aclose_forcefully(connection.stream)
