"""The coordinator's HTTP/1.1 server: hypercorn's protocol layer under a connection handler of our own.

`serve_http` takes the place of `hypercorn.trio.serve`. It reuses hypercorn's h11
protocol, ASGI streams and lifespan, and replaces its trio connection handler
(`hypercorn.trio.tcp_server.TCPServer`) and accept loop, which in hypercorn 0.17 and
0.18 let one peer take the whole server down and left connections open:

* `TCPServer._close` half-closes with `send_eof()` outside `send_lock`. trio's
  `SocketStream.send_eof` holds the stream's send conflict detector across a
  checkpoint, so a response being sent at that moment (a 400 for a body cut short,
  the application's 413 or 408) fails with `trio.BusyResourceError`. Nothing catches
  it: it leaves `TCPServer.run` (which catches `OSError` only) into the server's
  nursery, and the process exits. A request announcing a body over the limit, sending
  one byte and half-closing triggers it within a few tries.
* Hypercorn runs connection bookkeeping in the application's task: after the last
  response byte it tells the application `http.disconnect`, and only then restarts
  the keep-alive timer (`nursery.start`) or closes the connection. quart-trio
  cancels its own task group on `http.disconnect`, so those later steps are
  cancelled: the keep-alive timer never runs after the first request (idle
  keep-alive connections stay open for ever), and a connection that should close
  after an early answer (413 without reading the body) stays open with the unread
  body queued as the "next request".
* An `Expect: 100-continue` request gets `100 Continue` before the application had a
  chance to refuse its body; there is no limit on concurrent connections.

Here instead: every write to the socket, including the half-close, happens under
one lock; closing is done by a task of the connection itself (never by the task
that asked for it); the keep-alive timer is a deadline on a scope the connection
owns; a request whose Content-Length exceeds `max_body_bytes` is answered 413 at the
protocol level (no `100 Continue`, the application never runs); any final response
sent before the request body was read carries `Connection: close` and the
connection is closed after it, lingering briefly so that the peer reads the answer
instead of a reset; connections beyond `max_connections` are answered 503; accept
errors from a full file table back off and retry; and whatever one connection
raises is logged once and closes that connection only.

Only HTTP/1.1 is served (h2c upgrades and HTTP/2 prior knowledge are ignored, TLS
offers only http/1.1 by ALPN). Relies on hypercorn internals; pyproject pins
`hypercorn<0.19` until a newer release is checked.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, parse_socket_addr, raise_shutdown, repr_socket_addr, wrap_app

from rsc.config import Settings
from rsc.http.h11_protocol import RscH11Protocol, error_json

log = logging.getLogger("rsc.http.server")

MAX_RECV = 2**16
#: After our last byte and half-close, how long the peer's remaining bytes are read and
#: discarded before the socket is closed: closing with unread input sends a TCP reset,
#: which can make the peer lose the answer it has not read yet.
LINGER_S = 2.0
#: Once a connection's socket is closed, how long what the application still runs for
#: it may take before it is cancelled.
CLOSE_GRACE_S = 5.0
#: A connection over `max_connections`: how long its request head is awaited before the
#: 503 (clients read an answer more reliably after sending), and how many such refusals
#: may be in progress at once (beyond that a connection is closed without an answer).
REFUSE_HEAD_S = 1.0
MAX_REFUSING = 64
#: Back-off of the accept loop while the process is out of file descriptors or memory.
ACCEPT_BACKOFF_S = (0.01, 1.0)
#: Descriptors kept for Redis connections, logs and the like besides client connections.
FD_RESERVE = 128

_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
#: The application's request id format (rsc.http.app): echoed when valid, else a new one.

Stream = trio.SocketStream | trio.SSLStream[trio.SocketStream]


@attrs.frozen
class Limits:
    """What one client may take from the server."""

    #: A request announcing a larger body is answered 413 before anything of it is read.
    max_body_bytes: int = 1_048_576
    #: How long a connection may sit without a request in progress: before its first
    #: request (TLS handshake included), between requests, and while a request head arrives.
    keep_alive_timeout_s: float = 5.0
    #: How long a request body may take to arrive (then 408), and how long one write of a
    #: response may stall on a peer that does not read (then the connection is dropped).
    body_timeout_s: float = 60.0
    #: Connections served at once; more are answered 503 and closed.
    max_connections: int = 1_000

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            keep_alive_timeout_s=settings.keep_alive_timeout_ms / 1000,
            body_timeout_s=settings.body_timeout_ms / 1000,
            max_connections=settings.max_connections,
        )


def hypercorn_config(bind: str, limits: Limits) -> HypercornConfig:
    """The hypercorn configuration `serve_http` expects (TLS files may be added to it)."""
    config = HypercornConfig()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = limits.keep_alive_timeout_s
    config.ssl_handshake_timeout = limits.keep_alive_timeout_s
    config.alpn_protocols = ["http/1.1"]
    return config


async def serve_http(
    app: Any,
    config: HypercornConfig,
    limits: Limits,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI `app` on `config.bind` until `shutdown_trigger` returns; report the URLs.

    Like `hypercorn.trio.serve` (lifespan, graceful shutdown within
    `config.graceful_timeout`), with the connection handling described in the module
    docstring. A Quart `app` also gets the body limit and timeout in its config.
    """
    if hasattr(app, "config"):
        app.config["MAX_CONTENT_LENGTH"] = limits.max_body_bytes
        app.config["BODY_TIMEOUT"] = limits.body_timeout_s
    config.set_statsd_logger_class(StatsdLogger)
    ensure_fd_headroom(limits.max_connections)
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            ssl_context = config.create_ssl_context()
            listeners: list[trio.abc.Listener[Any]] = []
            urls = []
            for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
                sock.listen(config.backlog)
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                secure = ssl_context is not None and sock in sockets.secure_sockets
                if secure:
                    assert ssl_context is not None
                    listeners.append(trio.SSLListener(listener, ssl_context, https_compatible=True))
                else:
                    listeners.append(listener)
                url = f"{'https' if secure else 'http'}://{repr_socket_addr(sock.family, sock.getsockname())}"
                urls.append(url)
                await config.log.info(f"Running on {url}")
            server = _Server(asgi, config, context, ConnectionState(lifespan_state.copy()), limits)
            task_status.started(urls)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    for each in listeners:
                        nursery.start_soon(server.accept_loop, each, server_nursery)
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def ensure_fd_headroom(max_connections: int) -> None:
    """Raise the soft open-file limit to fit `max_connections` (up to the hard limit), or warn."""
    try:
        import resource  # noqa: PLC0415  (Unix only)
    except ImportError:  # pragma: no cover
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("raised the open-file limit from %d to %d for max_connections", soft, target)
            soft = target
    if soft < wanted:
        log.warning(
            "the open-file limit (%d) is below max_connections (%d) + %d: at the limit, new "
            "connections wait in the listen backlog until others close (raise `ulimit -n`)",
            soft,
            max_connections,
            FD_RESERVE,
        )


class _Server:
    """Accepts connections and runs each, within the limits, never letting one end the server."""

    def __init__(
        self,
        app: AppWrapper,
        config: HypercornConfig,
        context: WorkerContext,
        state: ConnectionState,
        limits: Limits,
    ) -> None:
        self.app, self.config, self.context, self.state, self.limits = app, config, context, state, limits
        self.open = 0
        self.refusing = 0

    async def accept_loop(self, listener: trio.abc.Listener[Any], handlers: trio.Nursery) -> None:
        """trio.serve_listeners, with a quiet back-off while out of file descriptors or memory."""
        backoff = ACCEPT_BACKOFF_S[0]
        failing = False
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    if not failing:
                        log.warning(
                            "accept failed: %s (%s); retrying with back-off, new connections wait "
                            "in the listen backlog",
                            errno.errorcode.get(exc.errno or 0, exc.errno),
                            os.strerror(exc.errno or 0),
                        )
                    failing = True
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, ACCEPT_BACKOFF_S[1])
                    continue
                if failing:
                    log.warning("accepting connections again")
                    failing, backoff = False, ACCEPT_BACKOFF_S[0]
                handlers.start_soon(self.handle, stream)

    async def handle(self, stream: Stream) -> None:
        """Run one connection; whatever it raises is logged once and ends only this connection."""
        try:
            if self.open >= self.limits.max_connections:
                await self._refuse(stream)
                return
            self.open += 1
            try:
                await _Connection(self.app, self.config, self.context, self.state, stream, self.limits).run()
            finally:
                self.open -= 1
        except BaseException as exc:  # the last resort: nothing one peer does may end the server
            failure, rest = _split(exc)
            if failure is not None:
                _report(failure, stream)
            if rest is exc:
                raise
            if rest is not None:
                raise rest from None
        finally:
            await trio.aclose_forcefully(stream)

    async def _refuse(self, stream: Stream) -> None:
        """503 and close, for a connection over `max_connections` (after reading its request head)."""
        if self.refusing >= MAX_REFUSING:
            return  # closed without an answer by the caller
        self.refusing += 1
        try:
            with trio.move_on_after(REFUSE_HEAD_S):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 16_384:
                    data = await stream.receive_some(MAX_RECV)
                    if not data:
                        break
                    head += data
            body = error_json("UNAVAILABLE", "the coordinator has too many open connections; retry", None)
            answer = _response_bytes(503, b"Service Unavailable", body, [(b"retry-after", b"1")])
            with trio.move_on_after(REFUSE_HEAD_S):
                await stream.send_all(answer)
                await _linger(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.refusing -= 1


class _Connection:
    """One client connection: hypercorn's h11 protocol over a socket this object reads, writes and closes.

    Three tasks besides the application's: the reader (feeds received bytes to h11),
    the idle watchdog (closes the connection `keep_alive_timeout_s` after it became idle),
    and the closer (on the first request to close: cancels the reader, half-closes after
    the bytes already queued, reads and discards what the peer still sends for up to
    `LINGER_S`, closes the socket).
    """

    def __init__(
        self,
        app: AppWrapper,
        config: HypercornConfig,
        context: WorkerContext,
        state: ConnectionState,
        stream: Stream,
        limits: Limits,
    ) -> None:
        self.app, self.config, self.context, self.state = app, config, context, state
        self.stream = stream
        self.limits = limits
        self.send_lock = trio.Lock()
        self.protocol: RscH11Protocol
        self._close_requested = trio.Event()
        self._closed = trio.Event()
        self._reader_scope = trio.CancelScope()
        self._reader_done = trio.Event()
        self._watch_scope = trio.CancelScope()
        self._idle_scope = trio.CancelScope(deadline=trio.current_time() + limits.keep_alive_timeout_s)

    @property
    def _transport(self) -> trio.SocketStream:
        stream = self.stream
        return stream.transport_stream if isinstance(stream, trio.SSLStream) else stream

    async def run(self) -> None:
        secure = isinstance(self.stream, trio.SSLStream)
        if isinstance(self.stream, trio.SSLStream):
            with trio.move_on_after(self.limits.keep_alive_timeout_s) as handshake:
                try:
                    await self.stream.do_handshake()
                except trio.BrokenResourceError:
                    return
            if handshake.cancelled_caught:
                return
        sock = self._transport.socket
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
        except OSError:
            return  # already gone
        async with TaskGroup() as task_group:
            self.protocol = RscH11Protocol(
                self.app,
                self.config,
                self.context,
                task_group,
                ConnectionState(self.state.copy()),
                secure,
                client,
                server,
                self.protocol_send,
                max_body_bytes=self.limits.max_body_bytes,
            )
            task_group.spawn(self._closer)
            task_group.spawn(self._watch_idle)
            await self._read()
            await self._closed.wait()
            nursery = task_group._nursery
            assert nursery is not None
            nursery.cancel_scope.deadline = trio.current_time() + CLOSE_GRACE_S

    async def protocol_send(self, event: Event) -> None:
        """What hypercorn's protocol sends: bytes, a request to close, idle or busy."""
        if isinstance(event, RawData):
            failed = False
            async with self.send_lock:
                # Shielded so that a cancelled application task never leaves half a response
                # on the wire; the deadline drops a peer that stopped reading.
                deadline = trio.current_time() + self.limits.body_timeout_s
                with trio.CancelScope(shield=True, deadline=deadline) as scope:
                    try:
                        await self.stream.send_all(event.data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        failed = True
                failed = failed or scope.cancelled_caught
            if failed:
                self._close_requested.set()
                await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            self._close_requested.set()
            await self.protocol.handle(Closed())
        elif isinstance(event, Updated):
            idle = event.idle and not self._close_requested.is_set()
            self._idle_scope.deadline = (
                trio.current_time() + self.limits.keep_alive_timeout_s if idle else math.inf
            )

    async def _read(self) -> None:
        with self._reader_scope:
            while True:
                try:
                    with trio.fail_after(self.config.read_timeout or math.inf):
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                await self.protocol.handle(RawData(bytes(data)))
                if not data:
                    break
        self._reader_done.set()
        self._close_requested.set()
        with trio.move_on_after(LINGER_S):
            await self.protocol.handle(Closed())

    async def _watch_idle(self) -> None:
        with self._watch_scope:
            with self._idle_scope:
                await self.context.terminated.wait()  # shutting down: idle connections close now
                if self._idle_scope.deadline == math.inf:
                    await trio.sleep_forever()  # busy: hypercorn closes after this response
            self._close_requested.set()

    async def _closer(self) -> None:
        await self._close_requested.wait()
        try:
            self._reader_scope.cancel()
            with trio.move_on_after(LINGER_S):
                await self._reader_done.wait()
            if self._reader_done.is_set():  # no TLS operation can be under way on the socket now
                with trio.move_on_after(LINGER_S):
                    async with self.send_lock:  # after the bytes already queued (and with no other writer)
                        await self._transport.send_eof()
                    await _drain(self._transport)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._watch_scope.cancel()
            await trio.aclose_forcefully(self.stream)
            self._closed.set()


def _response_bytes(status: int, reason: bytes, body: bytes, extra: list[tuple[bytes, bytes]]) -> bytes:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    head = b"HTTP/1.1 %d %s\r\n" % (status, reason) + b"".join(b"%s: %s\r\n" % h for h in headers)
    return head + b"\r\n" + body


async def _linger(stream: Stream) -> None:
    """Half-close and read what the peer still sends, so that it reads our answer, not a reset."""
    transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    await transport.send_eof()
    with trio.move_on_after(LINGER_S):
        await _drain(transport)


async def _drain(stream: trio.SocketStream) -> None:
    while await stream.receive_some(MAX_RECV):
        pass


def _split(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """(the errors, what must propagate: cancellation, KeyboardInterrupt...)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(Exception)
    if isinstance(exc, Exception):
        return exc, None
    return None, exc


def _report(failure: BaseException, stream: Stream) -> None:
    peer = "?"
    with contextlib.suppress(OSError, AttributeError):
        transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        peer = repr_socket_addr(transport.socket.family, transport.socket.getpeername())
    leaves = _leaves(failure)
    if all(isinstance(e, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)) for e in leaves):
        log.debug("connection from %s ended: %r", peer, failure)
        return
    log.error("connection from %s failed and was closed; the server goes on", peer, exc_info=failure)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
