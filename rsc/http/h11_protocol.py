"""rsc's HTTP/1.1 protocol: hypercorn's, refusing oversized bodies up front, closing after
early answers, and sending a response's head with what follows in one write.

Split from `rsc.http.server` (the connection handler that drives it). Relies on hypercorn
internals, as the server does (pyproject pins `hypercorn<0.19`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from typing import Any

import h11
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.typing import H11SendableEvent

log = logging.getLogger("rsc.http.server")
#: An `X-Request-Id` a client may choose (else one is made).
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RscH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, refusing oversized bodies up front and closing after early answers."""

    def __init__(self, *args: Any, max_body_bytes: int) -> None:
        super().__init__(*args)
        self.max_body_bytes = max_body_bytes
        #: A second response was asked for after a response's body had begun: the connection
        #: is closing, and nothing more of this exchange is sent.
        self._cut = False
        #: The bytes of a final response's head, held to go out in one write with what follows
        #: (its body, or the end of the message): one system call and one send per answer
        #: instead of two.
        self._head: bytes | None = None

    async def _check_protocol(self, event: h11.Request) -> None:
        """HTTP/1.1 only: an h2c Upgrade is ignored (RFC 9110 allows it), as is HTTP/2 prior knowledge."""

    async def _create_stream(self, request: h11.Request) -> None:
        length = _content_length(request)
        if length is not None and length > self.max_body_bytes:
            await self._refuse_body(request, length)
        else:
            await super()._create_stream(request)

    async def stream_send(self, event: StreamEvent) -> None:
        if self._cut and isinstance(event, (Response, Body, EndBody)):
            return
        if isinstance(event, Response) and self.connection.our_state is h11.SEND_BODY:
            # hypercorn's 500 for an application that failed (or was cancelled) after its
            # response had begun: a second response cannot follow on this connection. The
            # first one is cut short (no end of message: the client sees it incomplete) and the
            # connection closes, instead of h11 raising and an ERROR traceback being logged.
            self._cut = True
            log.debug("a response failed after its body began; closing the connection")
            await self.send(Closed())
            return
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and self.connection.their_state is h11.SEND_BODY
        ):
            # Answered before the request body was read: what follows on the connection is
            # that body, not a request, so the connection closes after this response.
            event = dataclasses.replace(event, headers=_with_close(event.headers))
        await self.stream_send_flushed(event)

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if isinstance(event, h11.Response):
            self._head = (self._head or b"") + (data or b"")
            return
        if self._head is not None:
            data, self._head = self._head + (data or b""), None
        if data:
            await self.send(RawData(data=data))

    async def stream_send_flushed(self, event: StreamEvent) -> None:
        """`stream_send`, then a held head out (a stream that closed without a body)."""
        await super().stream_send(event)
        if self._head is not None and not isinstance(event, Response):
            head, self._head = self._head, None
            await self.send(RawData(data=head))

    async def _refuse_body(self, request: h11.Request, length: int) -> None:
        """413 without reading the body (and so without `100 Continue`), then close."""
        given = dict(request.headers).get(b"x-request-id", b"").decode("latin1")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        message = f"the body ({length} bytes) exceeds max_body_bytes ({self.max_body_bytes})"
        body = error_json("BODY_TOO_LARGE", message, request_id)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(
            h11.Response(status_code=413, headers=headers, reason=b"Content Too Large")
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())
        await self.send(Closed())


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 has checked that it is a number
    return None


def _with_close(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    for name, value in headers:
        if name.lower() == b"connection" and b"close" in value.lower():
            return headers
    return [*headers, (b"connection", b"close")]


def error_json(code: str, message: str, request_id: str | None) -> bytes:
    body = {"error": code, "message": message, "requestId": request_id or uuid.uuid4().hex, "details": None}
    return json.dumps(body, separators=(",", ":")).encode()
