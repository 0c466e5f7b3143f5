"""Lean RESP connections to a standalone Redis over trio: hiredis packs commands and parses
replies, and nothing else stands between a caller and the socket.

Why not coredis for these: coredis costs 0.15-0.25 ms of CPU around every command under trio
(its pool's deadlines, its retry wrapper, its telemetry; measured in docs/performance.md), about
half of what the coordinator spends creating a stream, against some 20 us here. Two users:

* `Connection`, one connection used by one task at a time: the trio producer's append scripts
  (`rsc.client.append_writer`), written as soon as each is packed.
* `Multiplexed`, one connection shared by every task of the coordinator for its own commands
  (journal appends and loads, the effects' scripts, the stream catalog): each caller's
  commands are written as they come, the commands of several callers in one write while
  another write is under way, and the replies are matched to the callers in order (as
  StackExchange.Redis, ioredis or redis-rs' multiplexed connection do). Never for blocking
  commands: they would hold up everyone's replies.

Both connect as coredis does, from a `coredis.Redis` client's own settings (`Endpoint.of`):
TCP (TLS with its `ssl_context`), its username and password, its database, its connect and
command (`stream_timeout`) timeouts. Where that is not possible (a cluster, a Sentinel's
primary, a Unix socket, a credential provider, no hiredis) `Endpoint.of` answers None and the
caller keeps coredis. Failures leave as the coredis exceptions the rest of rsc classifies
(`rsc.redis_errors.is_unavailable`): `ConnectionError` when Redis could not be reached or stopped
answering, `TimeoutError` when a reply did not come within the command timeout (the
connection is then closed: a connection is never reused half read), and an error reply as the
coredis class for its code (`NoScriptError`, `ReadOnlyError`, `ResponseError`...).
"""

from __future__ import annotations

import collections
import contextlib
import math
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import coredis
import trio
from coredis.connection import TCPLocation
from coredis.parser import Parser
from coredis.pool import ConnectionPool

from rsc.scripts import reloading

hiredis: Any  # (its stubs type `pack_command` as taking one argument)
try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency; a build without it still runs
    hiredis = None

__all__ = [
    "Command",
    "Connection",
    "Endpoint",
    "Multiplexed",
    "ScriptCall",
    "eval_scripts",
    "open_lean",
    "refusal",
]

#: How much a read asks the socket for at once.
_READ_SIZE = 256 * 1024
#: One command: its name and arguments.
Command = Sequence[str | bytes | int | float]
#: One script call: a script registered with a coredis client (`register_script`: its `sha`
#: and `script`), its keys, its arguments.
ScriptCall = tuple[Any, Sequence[str], Sequence[Any]]
_PARSER = Parser()


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


def deadline(timeout: float | None) -> float:
    """The trio deadline `timeout` seconds from now (none: never)."""
    return math.inf if timeout is None else trio.current_time() + timeout


def refusal(reply: Any) -> Any:
    """A reply as coredis gives it: an error reply (hiredis' `ReplyError`) as the coredis
    exception for its code, anything else as it is."""
    if isinstance(reply, hiredis.ReplyError):
        return _PARSER.parse_error(str(reply))
    return reply


def pack(commands: Sequence[Command]) -> bytes:
    """`commands` in RESP, as Redis reads them."""
    return b"".join(hiredis.pack_command(tuple(command)) for command in commands)


class Connection:
    """One connection: commands written as packed, replies read in order (RESP2, or RESP3
    with `resp3`, as coredis speaks)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = hiredis.Reader(encoding="utf-8")

    @classmethod
    async def open(cls, endpoint: Endpoint, *, resp3: bool = False) -> Connection:
        """Connect and run the handshake within the connect timeout. Raises `ConnectionError`
        (nothing answered in time, the connection failed, or Redis turned it away: too many
        clients), the coredis class of a refusal of the handshake
        (`AuthenticationFailureError`, `ResponseError`)."""
        where = f"{endpoint.host}:{endpoint.port}"
        with trio.move_on_at(deadline(endpoint.connect_timeout)):
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
            except OSError as exc:
                raise coredis.exceptions.ConnectionError(f"cannot connect to {where}: {_why(exc)}") from exc
            try:
                if endpoint.ssl_context is not None:
                    stream = trio.SSLStream(stream, endpoint.ssl_context, server_hostname=endpoint.host)
                    await stream.do_handshake()
                connection = cls(stream)
                await connection.handshake(endpoint, resp3=resp3)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return connection
        raise coredis.exceptions.ConnectionError(f"connecting to {where} timed out")

    async def handshake(self, endpoint: Endpoint, *, resp3: bool = False) -> None:
        """`AUTH` (or `HELLO 3 AUTH`) and `SELECT` as the client's settings ask; a refusal
        raises its coredis class (`ConnectionError` for "max number of clients reached")."""
        commands: list[tuple[str | int, ...]] = []
        credentials: tuple[str, ...] = ()
        if endpoint.password is not None:
            credentials = (endpoint.username or "default", endpoint.password)
        if resp3:
            commands.append(("HELLO", 3, *(("AUTH", *credentials) if credentials else ())))
        elif credentials:
            commands.append(("AUTH", *(credentials if endpoint.username else credentials[1:])))
        if endpoint.db:
            commands.append(("SELECT", endpoint.db))
        if not commands:
            return
        await self.send(pack(commands))
        for reply in await self.replies(len(commands), endpoint.command_timeout):
            refused = refusal(reply)
            if isinstance(refused, coredis.exceptions.ConnectionError):  # (too many clients)
                raise refused
            if isinstance(reply, Exception):  # (its code in the text: `rsc.redis_errors.error_code`)
                raise coredis.exceptions.ResponseError(str(reply))

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise coredis.exceptions.ConnectionError(f"connection lost while sending: {exc}") from exc

    async def receive(self) -> None:
        """Read what Redis sent next into the reader. Raises `ConnectionError`."""
        try:
            data = await self.stream.receive_some(_READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise coredis.exceptions.ConnectionError(f"connection lost while reading: {exc}") from exc
        if not data:
            raise coredis.exceptions.ConnectionError("connection closed by Redis")
        self.reader.feed(data)

    def next_reply(self, *, raw: bool = False) -> Any:
        """The next whole reply read (False while there is none yet), an error reply as the
        coredis exception for its code (as hiredis' `ReplyError` with `raw`), a reply that is
        not UTF-8 as a `ResponseError` (not raised: the reader has passed it, and the
        connection stays in step). Raises `ConnectionError` when what Redis sent is not RESP:
        nothing after it can be trusted."""
        try:
            reply = self.reader.gets()
        except UnicodeDecodeError as exc:
            return coredis.exceptions.ResponseError(f"a reply that is not UTF-8 text: {exc}")
        except hiredis.ProtocolError as exc:
            raise coredis.exceptions.ConnectionError(f"an unreadable reply: {exc}") from exc
        return reply if raw else refusal(reply)

    async def replies(self, count: int, timeout: float | None) -> list[Any]:
        """The next `count` replies as hiredis parses them (an error reply as its `ReplyError`,
        not raised: `refusal` makes it coredis'); see `next_reply`."""
        out: list[Any] = []
        if not count:
            return out
        with trio.move_on_at(deadline(timeout)) as scope:
            while True:
                reply = self.next_reply(raw=True)
                while reply is not False:
                    out.append(reply)
                    if len(out) == count:
                        return out
                    reply = self.next_reply(raw=True)
                await self.receive()
        assert scope.cancelled_caught
        raise TimeoutError(f"no reply within {timeout} s")


def _why(exc: OSError) -> str:
    """What failed in a connection attempt: trio's "all attempts to connect ... failed" says
    what the first attempt met (`Connection refused`)."""
    causes = getattr(exc.__cause__, "exceptions", ())
    first = causes[0] if causes else exc
    return getattr(first, "strerror", None) or str(first)


class _Waiting:
    """One caller's commands in flight: how many replies it waits for, and what came."""

    __slots__ = ("count", "done", "error", "replies")

    def __init__(self, count: int) -> None:
        self.count = count
        self.replies: list[Any] = []
        self.done = trio.Event()
        self.error: BaseException | None = None


class _Line:
    """One open connection of a `Multiplexed`, its callers in the order their commands went."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.waiting: collections.deque[_Waiting] = collections.deque()
        #: What the callers queued and the writer has not sent yet.
        self.outbox: list[bytes] = []
        #: Set when there is something to send (or the line broke): wakes the writer.
        self.wake = trio.Event()
        #: Why this connection is no longer used (None while it is).
        self.broken: BaseException | None = None


class Multiplexed:
    """One connection shared by many tasks (see the module doc); `Multiplexed.open(endpoint)`.

    Per connection, one writer task sends what the callers queued (all that queued meanwhile
    in one write), and one reader task hands the replies to the callers in order. A connection
    that fails, sends what is not RESP, or does not answer in time is closed, every caller
    waiting on it fails (`ConnectionError`, `TimeoutError`), and the next call opens a new
    one; callers that queued behind an attempt to connect that failed fail with it rather
    than try again each in turn. A `READONLY` reply (the address now leads to a replica, as
    behind a virtual IP after a failover) closes the connection too, after it reached its
    caller. A caller cancelled while it waits leaves its commands to run (they may already be
    on their way): their replies are read and dropped, so the callers after it get theirs."""

    def __init__(self, endpoint: Endpoint, nursery: trio.Nursery) -> None:
        self.endpoint = endpoint
        self._nursery = nursery
        self._line: _Line | None = None
        self._opening = trio.Lock()
        #: Attempts to connect so far, and why the last one failed (None: it did not).
        self._attempts = 0
        self._failure: BaseException | None = None
        self._closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, endpoint: Endpoint) -> AsyncIterator[Multiplexed]:
        """A multiplexed connection to `endpoint`, opened at the first call, closed on exit."""
        async with trio.open_nursery() as nursery:
            multiplexed = cls(endpoint, nursery)
            try:
                yield multiplexed
            finally:
                multiplexed._closed = True
                line = multiplexed._line
                if line is not None:
                    multiplexed._break(line, coredis.exceptions.ConnectionError("closed"))
                    # (here, not only in `_break`: when the owner was cancelled, the nursery
                    # is too and starts nothing; this closes even under cancellation)
                    await trio.aclose_forcefully(line.connection.stream)
                nursery.cancel_scope.cancel()

    async def call(self, commands: Sequence[Command]) -> list[Any]:
        """Run `commands` in order, one round trip; their replies in order, an error reply as
        its coredis exception (not raised). Raises `ConnectionError`, `TimeoutError`, or the
        refusal of the connection's handshake."""
        if not commands:
            return []
        data = pack(commands)
        line = await self._open_line()
        waiting = _Waiting(len(commands))
        line.waiting.append(waiting)  # (in the order of the bytes: nothing awaited in between)
        line.outbox.append(data)
        line.wake.set()
        with trio.move_on_at(deadline(self.endpoint.command_timeout)):
            await waiting.done.wait()
        if not waiting.done.is_set():
            self._break(line, TimeoutError(f"no reply from Redis within {self.endpoint.command_timeout} s"))
        if waiting.error is not None:  # (a fresh one for each caller: they share the cause)
            raise _fresh(waiting.error)
        if any(isinstance(reply, coredis.exceptions.ReadOnlyError) for reply in waiting.replies):
            self._break(line, coredis.exceptions.ConnectionError("Redis at this address is now a replica"))
        return waiting.replies

    async def _open_line(self) -> _Line:
        line = self._line
        if line is not None and line.broken is None:
            return line
        attempts = self._attempts
        async with self._opening:
            if self._closed:
                raise coredis.exceptions.ConnectionError("the connection was closed")
            line = self._line
            if line is not None and line.broken is None:
                return line
            if self._attempts != attempts and self._failure is not None:
                raise _fresh(self._failure)  # (an attempt made while this caller waited failed)
            self._attempts += 1
            try:
                connection = await Connection.open(self.endpoint, resp3=True)
            except Exception as exc:
                self._failure = exc
                raise
            self._failure = None
            if self._closed:  # (closed while connecting)
                await trio.aclose_forcefully(connection.stream)
                raise coredis.exceptions.ConnectionError("the connection was closed")
            line = self._line = _Line(connection)
            self._nursery.start_soon(self._read, line)
            self._nursery.start_soon(self._write, line)
            return line

    async def _write(self, line: _Line) -> None:
        """Send what the line's callers queued, as they queue it, until the line breaks. Each
        write is bounded by the command timeout."""
        connection = line.connection
        try:
            while line.broken is None:
                if not line.outbox:
                    line.wake = trio.Event()
                    await line.wake.wait()
                    continue
                data = b"".join(line.outbox)
                line.outbox.clear()
                with trio.move_on_at(deadline(self.endpoint.command_timeout)):
                    await connection.send(data)
                    continue
                self._break(line, TimeoutError("writing to Redis timed out"))
        except Exception as exc:
            self._break(line, _lost(exc))

    async def _read(self, line: _Line) -> None:
        """The line's replies, to its callers in order, until it breaks."""
        connection = line.connection
        waiting = line.waiting
        try:
            while line.broken is None:
                reply = connection.next_reply()
                while reply is not False:
                    if not waiting:  # pragma: no cover - Redis answers what it is asked
                        self._break(line, coredis.exceptions.ConnectionError("a reply nobody asked for"))
                        return
                    first = waiting[0]
                    first.replies.append(reply)
                    if len(first.replies) == first.count:
                        waiting.popleft()
                        first.done.set()
                    reply = connection.next_reply()
                await connection.receive()
        except Exception as exc:
            self._break(line, _lost(exc))

    def _break(self, line: _Line, why: BaseException) -> None:
        """Stop using `line`: fail its callers with `why`, and close it."""
        if line.broken is not None:
            return
        line.broken = why
        while line.waiting:
            waiting = line.waiting.popleft()
            waiting.error = why
            waiting.done.set()
        line.outbox.clear()
        line.wake.set()
        if not self._nursery.cancel_scope.cancel_called:
            self._nursery.start_soon(trio.aclose_forcefully, line.connection.stream)


async def eval_scripts(lean: Multiplexed, calls: Sequence[ScriptCall]) -> list[Any]:
    """Each call (a registered script, with its `sha` and `script` text; its keys; its args) as
    `EVALSHA` on `lean`, all in one round trip, the calls Redis answers `NOSCRIPT` loaded and
    sent again (`rsc.scripts.reloading`).

    The replies in order, an error reply as its coredis class (returned, not raised); raises a
    failed load, and what a connection that cannot answer raises."""

    async def send(each: Sequence[ScriptCall]) -> list[Any]:
        return await lean.call(
            [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in each]
        )

    async def load(each: Sequence[ScriptCall]) -> None:
        scripts = {script.sha: script.script for script, _, _ in each}
        for reply in await lean.call([("SCRIPT", "LOAD", text) for text in scripts.values()]):
            if isinstance(reply, Exception):
                raise reply

    return await reloading(calls, send, load)


def _lost(exc: Exception) -> Exception:
    """Why a line broke, as its callers see it: a coredis `ConnectionError` (or the
    `TimeoutError`) as it is, anything else (a bug, a reply hiredis cannot read) as a
    `ConnectionError` that says what it was."""
    if isinstance(exc, coredis.exceptions.ConnectionError | TimeoutError):
        return exc
    lost = coredis.exceptions.ConnectionError(f"connection dropped after {type(exc).__name__}: {exc}")
    lost.__cause__ = exc
    return lost


def _fresh(exc: BaseException) -> BaseException:
    """A new exception like `exc`, for one more caller (each raise gets its own traceback),
    caused by `exc`."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:  # pragma: no cover - an exception class that cannot be built from its args
        return exc
    copy.__cause__ = exc.__cause__
    return copy


@contextlib.asynccontextmanager
async def open_lean(client: Any) -> AsyncIterator[Multiplexed | None]:
    """A multiplexed lean connection to the Redis the coredis `client` talks to, with its
    settings; None where there cannot be one (a cluster, a Sentinel: see `Endpoint.of`), and
    then coredis does everything."""
    endpoint = Endpoint.of(client)
    if endpoint is None:
        yield None
        return
    async with Multiplexed.open(endpoint) as lean:
        yield lean
