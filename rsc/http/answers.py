"""What an exception raised while answering a request is answered with, on any path.

Quart's error handlers (`rsc.http.app`) and the heartbeat fast path below Quart
(`rsc.http.fast_heartbeat`) both answer through `error_answer`, so that a refusal has the same
status, code, words and headers whichever path took the request: 4xx for what the client sent,
503 when Redis is unavailable or an aggregate restarts, 500 only for a bug (logged, without
internals in the answer).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
from quart import Response
from werkzeug.exceptions import HTTPException

from rsc.actors.errors import ActorStopped, NotFinalized, RedisOutOfMemory, StoreError, UnsupportedSchema
from rsc.actors.features import UnsupportedFeatureLevel
from rsc.actors.health import store_failed
from rsc.events.errors import CoordinationError, http_status
from rsc.events.rates import retry_after_header
from rsc.http import exchange
from rsc.http.authenticate import Refused
from rsc.http.errors import ApiError
from rsc.http.json_io import error_body, error_response
from rsc.http.metrics import refusal_details

log = logging.getLogger("rsc.http")

#: The challenge a 401 to a member, producer or view caller carries (RFC 9110).
BEARER_CHALLENGE = 'Bearer realm="rsc"'


@attrs.frozen
class ErrorAnswer:
    """A JSON error answer: `{error, message, requestId, details}` with `status` and `headers`."""

    status: int
    code: str
    message: str
    details: Any = None
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> dict[str, Any]:
        """The JSON error body (the current request's id). Raises nothing."""
        return error_body(self.code, self.message, self.details)


def error_answer(error: Exception, method: str = "", path: str = "") -> ErrorAnswer:
    """The answer to `error`, raised while answering `method path`. Raises nothing.

    Anything but the errors named in the module is a bug: it is logged with its traceback (call
    this inside the `except` block) and answered 500 naming only the request id."""
    if isinstance(error, ApiError):
        headers: list[tuple[str, str]] = []
        if error.status == 401 and isinstance(error, Refused):
            headers.append(("WWW-Authenticate", BEARER_CHALLENGE))
        if error.retry_after_s is not None:
            headers.append(("Retry-After", retry_after_header(error.retry_after_s)))
        return ErrorAnswer(error.status, error.code, error.message, error.details, tuple(headers))
    if isinstance(error, CoordinationError):
        exchange.note_error_code(error.code)  # (the audit tells a quota refusal from throttling by it)
        return ErrorAnswer(http_status(error.code), error.code, error.message, refusal_details(error))
    if isinstance(error, StoreError):
        if isinstance(error, UnsupportedSchema | UnsupportedFeatureLevel):
            # Written by a newer release: this coordinator must not act on it (an operator's
            # problem: run a release that supports it). Clients retry elsewhere or later.
            log.error("%s", error)
            return ErrorAnswer(503, "UNSUPPORTED_VERSION", str(error))
        if isinstance(error, NotFinalized):
            log.error("bug: %s", error)
            return ErrorAnswer(500, "INTERNAL", "internal error: an event the feature level forbids")
        store_failed(log, error, f"store unavailable: {error}")
        if isinstance(error, RedisOutOfMemory):
            message = "the coordinator's Redis is out of memory (OOM): retry once memory is freed"
            return ErrorAnswer(503, "REDIS_OUT_OF_MEMORY", message)
        return ErrorAnswer(503, "UNAVAILABLE", "the coordinator's Redis is unavailable; retry")
    if isinstance(error, ActorStopped):
        return ErrorAnswer(503, "UNAVAILABLE", "the aggregate is restarting; retry")
    request_id = exchange.request_id()
    log.exception("unhandled error, request id %s, on %s %r", request_id, method, path)
    return ErrorAnswer(500, "INTERNAL", f"internal error; request id {request_id} is in the server log")


def http_error_answer(error: HTTPException) -> ErrorAnswer:
    """The answer to a werkzeug `HTTPException` (no route, a method not allowed, a body too
    large or too slow). Raises nothing."""
    status = error.code or 500
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "BODY_TOO_LARGE"}.get(status, "HTTP_ERROR")
    allowed = getattr(error, "valid_methods", None)
    headers = (("Allow", ", ".join(sorted(allowed))),) if status == 405 and allowed else ()  # RFC 9110
    return ErrorAnswer(status, code, error.description or error.name, None, headers)


def answer_response(answer: ErrorAnswer) -> Response:
    """`answer` as a Quart response. Raises nothing."""
    response = error_response(answer.status, answer.code, answer.message, answer.details)
    for name, value in answer.headers:
        response.headers[name] = value
    return response
