"""`POST /v1/heartbeat` and `POST /v1/heartbeats` answered below Quart, as ASGI middleware in
front of Quart's own `asgi_app` (`rsc.http.app.CoordinatorApp.front`).

Heartbeats are the coordinator's most frequent requests, and Quart's machinery around a route
(a request object and context, a task for the body, hooks, a `Response`) cost about as much
CPU as a single heartbeat's own work. Here the request is read and answered straight from
ASGI messages, with everything the route path does, in the same order and words:

* the request id (`X-Request-Id`, the caller's if valid), echoed on every answer;
* authorization of the member role before the body is read (its refusals counted, a wrong
  admin password throttled, as before), then the standby gate (a standby answers 503
  `STANDBY`, or `UNAVAILABLE` when Redis is unreachable, in place of any answer), which is
  asked again when any answer leaves (`rsc.http.standby`);
* the body limits (413 `BODY_TOO_LARGE` by `Content-Length` or as it arrives, 408 after the
  body timeout) and strict JSON (`rsc.http.json_io.parse_json`), timed with the answer;
* authorization on the body's stream, rate limits and quotas (`HeartbeatAnswers`, the same
  object the Quart routes call);
* every refusal answered by `rsc.http.answers`, as Quart's error handlers answer it;
* a long poll given up when its client disconnects (Quart watched for that on every request;
  only a held answer waits long enough for it to matter).

Any other method or path goes to Quart unchanged (so `GET /v1/heartbeat` is still a 405 with
`Allow`, and the routes stay in the OpenAPI document).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from rsc.actors.deployment import Leadership
from rsc.events.auth import Action
from rsc.http import exchange
from rsc.http.answers import ErrorAnswer, error_answer, http_error_answer
from rsc.http.authenticate import Gate
from rsc.http.heartbeats.routes import HeartbeatAnswers
from rsc.http.json_io import dump_json, parse_json
from rsc.http.standby import standby_answer

#: ASGI's scope, receive and send (hypercorn's typed dicts, read as plain mappings here).
Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
#: A request body (read and parsed JSON by the function given) to its answer (plain JSON),
#: refusals raised.
AnswerOf = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]

PATH = "/v1/heartbeat"
BATCH_PATH = "/v1/heartbeats"
#: Where `rsc.http.app.create_app` keeps the middleware (the standby gate gives it leadership).
EXTENSION = "rsc.fast_heartbeat"
_JSON = (b"content-type", b"application/json")


class _Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


#: No answer: the client went away.
_GONE = object()


def _holds(payload: Any) -> bool:
    """Whether a heartbeat (or any item of a batch) asks for a long poll."""
    if not isinstance(payload, dict):
        return False
    items = payload.get("heartbeats")
    if isinstance(items, list):
        return any(isinstance(item, dict) and item.get("waitMs") for item in items)
    return bool(payload.get("waitMs"))


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (the body was read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class HeartbeatFastPath:
    """The middleware (see the module); `inner` is Quart's own `asgi_app`."""

    def __init__(self, inner: ASGIApp, answers: HeartbeatAnswers, gate: Gate, config: Any) -> None:
        self.inner = inner
        self.answers = answers
        self.gate = gate
        #: Quart's config: `MAX_CONTENT_LENGTH` and `BODY_TIMEOUT`, read per request (the server
        #: sets them when it starts).
        self.config = config
        #: The term this process acts in (`rsc.http.standby.add_standby_gate` sets it); None: always.
        self.leadership: Leadership | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ours = scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
        path = scope["path"] if ours else None
        if path == PATH:
            await self._answer(scope, receive, send, path, self.answers.single)
        elif path == BATCH_PATH:
            await self._answer(scope, receive, send, path, self.answers.batch)
        else:
            await self.inner(scope, receive, send)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, path: str, answer_of: AnswerOf
    ) -> None:
        authorization = given_id = ""
        length: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:  # the first of each, as Quart's `headers.get`
            if name == b"authorization" and not authorization:
                authorization = value.decode("latin-1")
            elif name == b"x-request-id" and not given_id:
                given_id = value.decode("latin-1")
            elif name == b"content-length" and length is None:
                length = value
            elif name == b"transfer-encoding":
                chunked = True  # (then a Content-Length means nothing)
        client = scope.get("client")
        current = exchange.begin(authorization, client[0] if client else "<local>", exchange.id_for(given_id))
        refused: ErrorAnswer | None = None
        try:  # the role, before the body is read, and before the standby gate (as Quart's hooks ran)
            self.gate.check(Action.MEMBER_HEARTBEAT)
        except Exception as error:
            refused = error_answer(error, "POST", path)
        leadership = self.leadership
        if leadership is not None and not leadership.active:
            await _send_error(send, current, standby_answer(leadership, path))
            return
        if refused is not None:
            await _send_error(send, current, refused)
            return
        answer, refused = await self._work(receive, None if chunked else length, path, answer_of)
        if leadership is not None and not leadership.active:  # the term ended while answering
            await _send_error(send, current, standby_answer(leadership, path))
        elif refused is not None:
            await _send_error(send, current, refused)
        elif answer is not _GONE:
            await _send(send, current, 200, dump_json(answer), ())

    async def _work(
        self, receive: Receive, length: bytes | None, path: str, answer_of: AnswerOf
    ) -> tuple[Any, ErrorAnswer | None]:
        """The answer (or `_GONE`: the client went away) or the refusal. A long poll is given up
        when its client disconnects, as Quart gave up a request whose client went away."""
        answer: Any = _GONE
        async with trio.open_nursery() as watching:

            async def read() -> Any:
                payload = parse_json(await self._body(receive, length))
                if _holds(payload):
                    watching.start_soon(_cancel_on_disconnect, receive, watching.cancel_scope)
                return payload

            try:
                answer = await answer_of(read)
            except _Disconnected:
                return _GONE, None
            except HTTPException as error:
                return None, http_error_answer(error)
            except Exception as error:
                return None, error_answer(error, "POST", path)
            finally:
                watching.cancel_scope.cancel()  # (the watcher, if any)
        return answer, None  # (still `_GONE` if the client went away and the work was cancelled)

    async def _body(self, receive: Receive, length: bytes | None) -> bytes:
        """The request body; `RequestEntityTooLarge`, `RequestTimeout` or `_Disconnected`."""
        limit = self.config["MAX_CONTENT_LENGTH"]
        if limit is not None and length is not None and length.isdigit() and int(length) > limit:
            raise RequestEntityTooLarge()
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self.config["BODY_TIMEOUT"] or float("inf")) as waited:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                if limit is not None and size > limit:
                    raise RequestEntityTooLarge()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if waited.cancelled_caught:
            raise RequestTimeout()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send_error(send: Send, current: exchange.Exchange, answer: ErrorAnswer) -> None:
    body = dump_json(answer.body())
    headers = tuple(
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers
    )
    await _send(send, current, answer.status, body, headers)


async def _send(
    send: Send, current: exchange.Exchange, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...]
) -> None:
    headers = [
        _JSON,
        (b"content-length", str(len(body)).encode()),
        *extra,
        (b"x-request-id", current.request_id.encode("latin-1")),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
