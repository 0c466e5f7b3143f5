"""The HTTP server under hostile or careless peers, over raw sockets (issue 11).

Each test would fail on plain `hypercorn.trio.serve` (0.17/0.18): the server process
died of a `trio.BusyResourceError` on a half-closed over-limit request, a connection
stayed open after an early 413/408, `100 Continue` preceded a 413, idle keep-alive
connections were never closed, and nothing limited concurrent connections.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from rsc.coordinator_process import serve
from rsc.events.auth import credential
from tests.httpkit import FAST, wait_for_output
from tests.redis_servers import free_port

HOST = "127.0.0.1"
LIMIT = 4_096  # max_body_bytes of these tests
POST = b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
OVER = POST + b"Content-Length: 100000\r\n\r\n"
WITHIN = POST + b"Content-Length: 3000\r\n\r\n"
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.asynccontextmanager
async def running(redis_url: str, tls: ssl.SSLContext | None = None, **settings: Any) -> AsyncIterator[int]:
    """`rsc.coordinator_process.serve` on a free port; yields the port. `tls`: how clients reach
    it by HTTPS."""
    config = attrs.evolve(FAST, redis_url=redis_url, max_body_bytes=LIMIT, **settings)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(config, f"{HOST}:0", shutdown=shutdown, task_status=task_status)
        )
        port = int(urls[0].rsplit(":", 1)[1])
        await active(port, tls)
        yield port
        shutdown.set()


async def active(port: int, tls: ssl.SSLContext | None = None) -> None:
    """Wait until the server holds the coordinator lease (a standby answers most requests 503)."""
    with trio.fail_after(10):
        while True:
            async with connect(port, tls) as conn:
                await conn.send(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                if (await conn.response())[0] == 200:
                    return
            await trio.sleep(0.05)


class Conn:
    """A raw client connection with a receive buffer."""

    def __init__(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def half_close(self) -> None:
        """shutdown(SHUT_WR) of the TCP connection (under TLS too, as a client may do)."""
        transport = self.stream.transport_stream if isinstance(self.stream, trio.SSLStream) else self.stream
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await transport.send_eof()

    async def _more(self) -> bool:
        try:
            data = await self.stream.receive_some(65_536)
        except trio.BrokenResourceError:  # reset by the server
            data = b""
        self.buffer += data
        return bool(data)

    async def response(self, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
        """The next response (status, headers, body) by Content-Length; fails on a hang."""
        with trio.fail_after(timeout):
            while b"\r\n\r\n" not in self.buffer:
                assert await self._more(), f"connection closed before a response: {self.buffer!r}"
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            length = int(headers.get("content-length", "0"))
            while len(self.buffer) < length:
                assert await self._more(), "connection closed within a response body"
            body, self.buffer = self.buffer[:length], self.buffer[length:]
            return int(lines[0].split()[1]), headers, body

    async def until_closed(self, timeout: float = 5) -> bytes:
        """Everything up to the server's EOF (or reset); fails if the server keeps it open."""
        with trio.fail_after(timeout):
            while await self._more():
                pass
        return self.buffer


@contextlib.asynccontextmanager
async def connect(port: int, tls: ssl.SSLContext | None = None) -> AsyncIterator[Conn]:
    if tls is None:
        async with await trio.open_tcp_stream(HOST, port) as stream:
            yield Conn(stream)
    else:
        async with await trio.open_ssl_over_tcp_stream(
            HOST, port, ssl_context=tls, https_compatible=True
        ) as secure:
            yield Conn(secure)


async def healthy(port: int, tls: ssl.SSLContext | None = None) -> None:
    async with connect(port, tls) as conn:
        await conn.send(HEALTHZ)
        status, _, body = await conn.response()
    assert (status, body) == (200, b'{"status":"ok"}')


async def announce_send_one_byte_and_half_close(
    port: int, head: bytes, tls: ssl.SSLContext | None = None
) -> bytes:
    """The crash trigger: a body announced, one byte of it, then shutdown(SHUT_WR)."""
    async with connect(port, tls) as conn:
        await conn.send(head + b"{")
        await conn.half_close()
        return await conn.until_closed()


async def test_a_big_body_announced_then_cut_short_gets_413_and_the_server_lives_on(
    standalone_url: str,
) -> None:
    async with running(standalone_url) as port:
        for _ in range(20):
            answer = await announce_send_one_byte_and_half_close(port, OVER)
            assert answer.startswith(b"HTTP/1.1 413 "), answer
            assert b"\r\nconnection: close\r\n" in answer
            assert b'"error":"BODY_TOO_LARGE"' in answer
        await healthy(port)


async def test_200_cut_short_bodies_at_once_over_and_within_the_limit(standalone_url: str) -> None:
    answers: list[bytes] = []

    async def one(port: int, head: bytes) -> None:
        answers.append(await announce_send_one_byte_and_half_close(port, head))

    async with running(standalone_url) as port:
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, port, OVER if i % 2 else WITHIN)
        await healthy(port)
    statuses = sorted({answer[:12] for answer in answers})
    # over the limit: 413 before reading; within: the body ended early, 400 (or closed unanswered)
    assert set(statuses) <= {b"HTTP/1.1 413", b"HTTP/1.1 400", b""}, statuses
    assert sum(a.startswith(b"HTTP/1.1 413 ") for a in answers) == 100


async def test_the_408_of_the_body_timeout_racing_with_the_peer_closing(standalone_url: str) -> None:
    async with running(standalone_url, body_timeout_ms=200) as port:
        async with connect(port) as conn:  # the plain case: 408, Connection: close, closed
            await conn.send(WITHIN + b"{")
            status, headers, _ = await conn.response()
            assert status == 408
            assert headers["connection"] == "close"
            assert await conn.until_closed(timeout=3) == b""

        async def racing(delay: float) -> None:
            async with connect(port) as conn:
                await conn.send(WITHIN + b"{")
                await trio.sleep(delay)  # around the 0.2 s body timeout
                await conn.half_close()
                answer = await conn.until_closed()
                assert answer[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 400", b""), answer

        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(racing, 0.17 + i * 0.0006)
        await healthy(port)


async def test_an_early_413_closes_the_connection_so_the_next_request_cannot_hang(
    standalone_url: str,
) -> None:
    async with running(standalone_url) as port:
        async with connect(port) as conn:  # announced: answered before any of the body is read
            await conn.send(OVER + b"{" * 1000)
            status, headers, body = await conn.response()
            assert (status, headers["connection"]) == (413, "close")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await conn.send(HEALTHZ)  # what an unaware client does next
            assert await conn.until_closed(timeout=3) == b""

        async with connect(port) as conn:  # chunked: the application refuses once past the limit
            chunk = b"x" * (LIMIT + 100)
            await conn.send(
                b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n" % (len(chunk), chunk)
            )
            status, headers, body = await conn.response()
            assert (status, headers["connection"]) == (413, "close"), body
            assert await conn.until_closed(timeout=3) == b""
        await healthy(port)


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"POST /v1/nothing-here HTTP/1.1", 404),
        (b"PATCH /healthz HTTP/1.1", 405),
        (b"POST /v1/heartbeat HTTP/1.1", 401),  # credentials configured, none sent
        (b"POST /v1/admin/streams/x/pause HTTP/1.1", 401),
    ],
)
async def test_a_refusal_before_the_body_is_read_never_poisons_the_connection(
    standalone_url: str, request_line: bytes, status: int
) -> None:
    """The whole body was sent but the answer came before the server read it: the next
    request on the connection is answered, or the connection is closed; never parsed from
    the unread body, never left hanging."""
    body = b'{"x": "' + b"y" * 3000 + b'"}'
    head = request_line + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    credentials = (credential("workers", ["member"], token="member-token-0123456789"),)
    async with running(standalone_url, credentials=credentials, admin_password="pw") as port:
        async with connect(port) as conn:
            await conn.send(head + body)
            assert (await conn.response())[0] == status
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await conn.send(HEALTHZ)
            with trio.fail_after(3):
                while b"\r\n\r\n" not in conn.buffer and await conn._more():
                    pass
            if conn.buffer:
                next_status, _, next_body = await conn.response()
                assert (next_status, next_body) == (200, b'{"status":"ok"}')
        await healthy(port)


def test_an_httpx_client_sending_oversized_bodies_never_hangs(standalone_url: str) -> None:
    """Issue 12's reproduction: two oversized POSTs got 413 and the third hung until the
    client's timeout, on one keep-alive connection."""

    async def scenario() -> None:
        async with running(standalone_url) as port:

            def send() -> list[tuple[int, float]]:
                out = []
                with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=5) as client:
                    for _ in range(4):
                        started = time.monotonic()
                        response = client.post("/v1/heartbeat", content=b"x" * (LIMIT * 4))
                        out.append((response.status_code, time.monotonic() - started))
                    out.append((client.get("/healthz").status_code, 0.0))
                return out

            answers = await trio.to_thread.run_sync(send)
            assert [code for code, _ in answers] == [413, 413, 413, 413, 200]
            assert all(seconds < 2 for _, seconds in answers)

    trio.run(scenario)


async def test_an_over_limit_expect_100_continue_request_gets_413_and_no_100_continue(
    standalone_url: str,
) -> None:
    async with running(standalone_url) as port:
        async with connect(port) as conn:
            await conn.send(OVER.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
            answer = await conn.until_closed(timeout=3)
            assert answer.startswith(b"HTTP/1.1 413 "), answer
            assert b" 100 " not in answer.split(b"\r\n", 1)[0]
            assert answer.count(b"HTTP/1.1") == 1

        async with connect(port) as conn:  # within the limit, the client is still told to go on
            await conn.send(
                b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
            )
            status, _, _ = await conn.response()
            assert status == 100
            await conn.send(b"{}")
            status, _, _ = await conn.response()
            assert status == 400  # the empty heartbeat is invalid, but it was read and answered


async def test_idle_keep_alive_connections_are_closed_after_the_timeout(standalone_url: str) -> None:
    async with running(standalone_url, keep_alive_timeout_ms=300) as port:
        async with connect(port) as conn:  # after a request and its response
            for _ in range(2):
                await conn.send(HEALTHZ)
                status, _, _ = await conn.response()
                assert status == 200
            started = time.monotonic()
            assert await conn.until_closed(timeout=3) == b""
            assert 0.25 < time.monotonic() - started < 2
        async with connect(port) as conn:  # without ever sending a request
            started = time.monotonic()
            assert await conn.until_closed(timeout=3) == b""
            assert 0.25 < time.monotonic() - started < 2
        async with connect(port) as conn:  # a request head that never ends
            await conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            assert await conn.until_closed(timeout=3) == b""


async def test_connections_beyond_max_connections_get_503_and_the_others_are_unharmed(
    standalone_url: str,
) -> None:
    async with (
        running(standalone_url, max_connections=3, keep_alive_timeout_ms=10_000) as port,
        contextlib.AsyncExitStack() as stack,
    ):
        held = [await stack.enter_async_context(connect(port)) for _ in range(3)]
        for conn in held:
            await conn.send(HEALTHZ)
            assert (await conn.response())[0] == 200
        async with connect(port) as extra:
            await extra.send(HEALTHZ)
            status, headers, body = await extra.response()
            assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
            assert b'"error":"UNAVAILABLE"' in body
            assert await extra.until_closed(timeout=3) == b""
        for conn in held:  # the ones within the limit go on as before
            await conn.send(HEALTHZ)
            assert (await conn.response())[0] == 200
        await held[0].stream.aclose()
        with trio.fail_after(3):  # its place is free as soon as the server saw it close
            while True:
                async with connect(port) as conn:
                    await conn.send(HEALTHZ)
                    if (await conn.response())[0] == 200:
                        break
                await trio.sleep(0.05)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "key.pem", "-out", "cert.pem"],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip
    return str(d / "cert.pem"), str(d / "key.pem")


async def test_the_same_over_tls(standalone_url: str, tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    tls = ssl.create_default_context(cafile=cert)
    settings: dict[str, Any] = {"certfile": cert, "keyfile": key, "keep_alive_timeout_ms": 300}
    async with running(standalone_url, tls, **settings) as port:
        answers: list[bytes] = []

        async def one() -> None:
            answers.append(await announce_send_one_byte_and_half_close(port, OVER, tls))

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(one)
        assert all(a.startswith(b"HTTP/1.1 413 ") for a in answers), {a[:20] for a in answers}
        async with connect(port, tls) as conn:  # idle after a response: closed
            await conn.send(HEALTHZ)
            assert (await conn.response())[0] == 200
            assert await conn.until_closed(timeout=3) == b""
        async with connect(port) as conn:  # a TLS handshake that never starts: closed too
            assert await conn.until_closed(timeout=3) == b""
        await healthy(port, tls)


# --- rsc serve as a process --------------------------------------------------------


@contextlib.contextmanager
def rsc_serve(
    redis_url: str, log_path: Path, nofile: int | None = None
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`rsc serve` as a child process (optionally with an open-file limit); stopped by SIGTERM."""
    port = free_port()
    env = {**os.environ, "RSC_REDIS_URL": redis_url, "RSC_KEEP_ALIVE_TIMEOUT_MS": "1000"}
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"{HOST}:{port}"]
    if nofile is not None:  # the limit set in the child itself, then rsc runs as `python -m rsc`
        limit = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))"
        run = f"sys.argv = {command[2:]!r}; runpy.run_module('rsc', run_name='__main__')"
        command = [sys.executable, "-c", f"import resource, runpy, sys; {limit}; {run}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_output(process, log_path, "listening on")
            yield port, process
            assert process.poll() is None, log_path.read_text()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log_path.read_text()
    assert process.returncode == 0, text
    assert "Traceback" not in text, text


def read_to_eof(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while data := sock.recv(65_536):
            chunks.append(data)
    return b"".join(chunks)


def test_the_rsc_serve_process_survives_the_crash_trigger(standalone_url: str, tmp_path: Path) -> None:
    head = OVER.replace(b"100000", b"2000000")  # over the default max_body_bytes
    with rsc_serve(standalone_url, tmp_path / "serve.log") as (port, process):
        sockets = []
        try:
            for _ in range(200):
                sock = socket.create_connection((HOST, port), timeout=5)
                sockets.append(sock)
                sock.sendall(head + b"{")
                sock.shutdown(socket.SHUT_WR)
            answers = [read_to_eof(sock) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        assert all(a.startswith(b"HTTP/1.1 413 ") for a in answers), {a[:20] for a in answers}
        for _ in range(10):
            with socket.create_connection((HOST, port), timeout=5) as sock:
                sock.sendall(head + b"{")
                sock.shutdown(socket.SHUT_WR)
                assert read_to_eof(sock).startswith(b"HTTP/1.1 413 ")
        assert process.poll() is None
        assert httpx.get(f"http://{HOST}:{port}/healthz", timeout=5).status_code == 200


def test_rsc_serve_out_of_file_descriptors_backs_off_and_recovers(
    standalone_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "serve.log"
    with rsc_serve(standalone_url, log_path, nofile=40) as (port, process):
        sockets = []
        try:
            for _ in range(60):  # more than the process may open: accept fails with EMFILE
                sockets.append(socket.create_connection((HOST, port), timeout=5))
            time.sleep(0.5)
            assert process.poll() is None
        finally:
            for sock in sockets:
                sock.close()
        deadline = time.monotonic() + 10
        while True:  # the backlog drains (closed by their peers), and new connections are served
            try:
                if httpx.get(f"http://{HOST}:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
    text = log_path.read_text()
    assert "accept failed: EMFILE" in text, text
    assert text.count("accept failed") < 5, text  # once per episode, not every retry


async def test_a_second_response_after_a_body_began_closes_the_connection_without_raising() -> None:
    """hypercorn answers 500 for an application that fails after its response began (a request
    cancelled mid-answer): h11 cannot send a second response there. The connection is closed and
    the first response left unfinished, instead of an exception and an ERROR traceback."""
    import h11
    from hypercorn.config import Config
    from hypercorn.events import Closed, RawData
    from hypercorn.protocol.events import Body, EndBody, Response

    from rsc.http.h11_protocol import RscH11Protocol

    sent: list[object] = []

    async def send(event: object) -> None:
        sent.append(event)

    from hypercorn.trio.worker_context import WorkerContext

    context = WorkerContext(None)
    protocol = RscH11Protocol(
        None, Config(), context, None, None, False, None, None, send, max_body_bytes=1024
    )
    protocol.connection.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(protocol.connection.next_event(), h11.Request)
    await protocol.stream_send(Response(stream_id=1, status_code=200, headers=[(b"content-length", b"10")]))
    await protocol.stream_send(Body(stream_id=1, data=b"12345"))
    await protocol.stream_send(Response(stream_id=1, status_code=500, headers=[(b"content-length", b"0")]))
    await protocol.stream_send(EndBody(stream_id=1))
    raw = b"".join(e.data for e in sent if isinstance(e, RawData))
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert raw.endswith(b"12345")  # cut short: no 500 after it, nothing more
    assert b" 500 " not in raw
    assert isinstance(sent[-1], Closed)


async def test_a_response_goes_out_in_one_write_head_and_body_together() -> None:
    """The head of a response is held until its body: one write per answer (a body-less one
    goes out whole at its end), the bytes exactly what h11 made of it."""
    import h11
    from hypercorn.config import Config
    from hypercorn.events import RawData
    from hypercorn.protocol.events import Body, EndBody, Response
    from hypercorn.trio.worker_context import WorkerContext

    from rsc.http.h11_protocol import RscH11Protocol

    sent: list[object] = []

    async def send(event: object) -> None:
        sent.append(event)

    protocol = RscH11Protocol(
        None, Config(), WorkerContext(None), None, None, False, None, None, send, max_body_bytes=1024
    )
    protocol.connection.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(protocol.connection.next_event(), h11.Request)
    await protocol.stream_send(Response(stream_id=1, status_code=200, headers=[(b"content-length", b"5")]))
    assert sent == []  # held
    await protocol.stream_send(Body(stream_id=1, data=b"12345"))
    await protocol.stream_send(EndBody(stream_id=1))
    writes = [e.data for e in sent if isinstance(e, RawData)]
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 ")
    assert writes[0].endswith(b"\r\n\r\n12345")
    sent.clear()
    protocol = RscH11Protocol(
        None, Config(), WorkerContext(None), None, None, False, None, None, send, max_body_bytes=1024
    )
    protocol.connection.receive_data(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(protocol.connection.next_event(), h11.Request)
    await protocol.stream_send(Response(stream_id=3, status_code=204, headers=[]))
    await protocol.stream_send(EndBody(stream_id=3))
    writes = [e.data for e in sent if isinstance(e, RawData)]
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 204 ")
