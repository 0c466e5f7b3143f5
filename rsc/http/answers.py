"""What an exception raised while answering a request is answered with, on any path.

Quart's error handlers (`rsc.http.app`) and the heartbeat fast path below Quart
(`rsc.http.heartbeats.fast_path`) both answer through `error_answer`, so that a refusal has the same
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

from rsc.actors.deployment import REDIS_OUTAGE, store_failed
from rsc.actors.errors import (
    OOM_REFUSALS,
    ActorStopped,
    CommandRefused,
    NotFinalized,
    RedisOutOfMemory,
    StoreError,
    UnsupportedFeatureLevel,
    UnsupportedSchema,
)
from rsc.events.errors import CoordinationError, http_status
from rsc.events.rates import retry_after_header
from rsc.events.wire import (
    CAP_SUFFIX,
    DEAD_LETTER_SUFFIX,
    OWNERS_SUFFIX,
    PRODUCER_SUFFIX,
    SEAL_SUFFIX,
    TRIMMED_SUFFIX,
)
from rsc.http import exchange
from rsc.http.authenticate import Refused
from rsc.http.errors import ApiError
from rsc.http.json_io import error_body, error_response
from rsc.http.metrics import refusal_details
from rsc.redis_errors import PIPELINE_ERROR, REDIS_FAILURES, error_code, is_unavailable, redis_leaf

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
    while isinstance(error, ExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]  # one failure that a trio nursery wrapped: answered as itself
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
        if isinstance(error, CommandRefused):
            return _refused(error.code, error.key, error)
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
    if (refusal := redis_answer(error)) is not None:
        return refusal
    request_id = exchange.request_id()
    log.exception("unhandled error, request id %s, on %s %r", request_id, method, path)
    return ErrorAnswer(500, "INTERNAL", f"internal error; request id {request_id} is in the server log")


#: What each part of rsc's keyspace is, by the end of the key's name (the roles a refusal names).
_KEY_ROLES = (
    (":journal", "an aggregate's journal"),
    (":snapshot", "an aggregate's snapshot"),
    (":checkpoints", "an aggregate's checkpoints"),
    ("{coordinator}", "the coordinators' own record"),
    (OWNERS_SUFFIX, "a shard's owner tokens"),
    (SEAL_SUFFIX, "a shard's seal"),
    (CAP_SUFFIX, "a shard's retention cap"),
    (TRIMMED_SUFFIX, "a shard's retention counts"),
    (PRODUCER_SUFFIX, "a producer's dedupe record"),
    (DEAD_LETTER_SUFFIX, "a shard's dead-letter stream"),
)


def key_role(key: str) -> str:
    """What the key named `key` is to rsc (a shard key unless its name says otherwise)."""
    return next((role for part, role in _KEY_ROLES if part in key), "a shard key")


def redis_answer(error: BaseException) -> ErrorAnswer | None:
    """The typed answer to a failure a Redis call raised (coredis, also inside trio's exception
    groups); None for anything else. Redis unavailable: 503 `UNAVAILABLE`; refused with `OOM`:
    503 `REDIS_OUT_OF_MEMORY`; any other refusal (`NOPERM`: the coordinator's Redis user may not
    run it; `WRONGTYPE`: something else wrote a key of rsc's) is the operator's to fix: 500
    `REDIS_REFUSED` naming the code and, where the reply names it, the key and its role (never a
    bare `INTERNAL`). Logged; raises nothing."""
    leaf = redis_leaf(error) if isinstance(error, BaseExceptionGroup) else error
    if leaf is None or not isinstance(leaf, REDIS_FAILURES):
        return None
    if is_unavailable(leaf):
        REDIS_OUTAGE.failed(f"Redis unavailable: {leaf!r}")
        return ErrorAnswer(503, "UNAVAILABLE", "the coordinator's Redis is unavailable; retry")
    code = error_code(leaf) or "ERR"
    if code == "OOM":
        OOM_REFUSALS[0] += 1
        log.warning("Redis refused a write with OOM: %s", leaf)
        message = "the coordinator's Redis is out of memory (OOM): retry once memory is freed"
        return ErrorAnswer(503, "REDIS_OUT_OF_MEMORY", message, {"redisCode": code})
    return _refused(code, refused_key(leaf), leaf)


def _refused(code: str, key: str | None, refusal: BaseException) -> ErrorAnswer:
    """500 `REDIS_REFUSED`: Redis refused with `code` (on `key`, where known). Logged."""
    details: dict[str, str] = {"redisCode": code}
    where = ""
    if key:
        details["key"] = key
        details["keyRole"] = key_role(key)
        where = f" on {details['keyRole']} ({key})"
    log.error("Redis refused a command%s with %s: %s", where, code, refusal)
    hint = {
        "NOPERM": "the coordinator's Redis user lacks a permission (ACL) it needs",
        "WRONGTYPE": "a key rsc owns holds a value of another type (something else wrote it)",
    }.get(code, "Redis refused the command")
    return ErrorAnswer(500, "REDIS_REFUSED", f"{hint}: {code}{where}", details)


_SCRIPT_CALLS = frozenset({"EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL", "FCALL_RO"})
_CONTAINERS = frozenset({"XINFO", "XGROUP", "OBJECT", "MEMORY"})  # a subcommand, then the key


def refused_key(refusal: BaseException) -> str | None:
    """The key a refused command named, where the refusal says: a `key: ...` note added where it
    was called, or the command coredis quotes when it failed inside a pipeline (its first key:
    after the script and key count of `EVALSHA`/`EVAL`/`FCALL`, after the subcommand of `XINFO`,
    `XGROUP`...). None when nothing says."""
    for note in getattr(refusal, "__notes__", ()):
        if isinstance(note, str) and note.startswith("key: "):
            return note.removeprefix("key: ")
    text = str(refusal)
    if PIPELINE_ERROR not in text or "(" not in text:
        return None
    words = text.split("(", 1)[1].partition(PIPELINE_ERROR)[0].rstrip(")").split()
    command = words[0].upper() if words else ""
    at = 3 if command in _SCRIPT_CALLS else 2 if command in _CONTAINERS else 1
    if len(words) <= at:
        return None
    word = words[at]
    return word[2:-1] if word[:2] in ("b'", 'b"') and len(word) > 3 else word


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
