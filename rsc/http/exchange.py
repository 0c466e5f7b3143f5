"""The facts of the request being answered, wherever it is answered: through Quart's routes or
on the heartbeat fast path below Quart (`rsc.http.heartbeats.fast_path`).

One `Exchange` per request, in a context variable that the first thing to see the request sets
(Quart's first `before_request` hook, or the fast path): the `Authorization` header, the peer's
address as Quart names it (`<local>` for a Unix socket), the request id, and what
authentication found (so that a request is authenticated once). Authorization, rate limits and
error bodies read it here, so they work the same on both paths.

Each request runs in a trio task of its own, and a task's context variables are its own: an
exchange never leaks into another request.
"""

from __future__ import annotations

import enum
import itertools
import re
import secrets
from contextvars import ContextVar

from rsc.events.auth import Credential


class Unset(enum.Enum):
    """`Exchange.principal` before authentication ran (a type of its own: None is an answer)."""

    UNSET = "unset"


UNSET = Unset.UNSET


class Exchange:
    """What the layers above the framework need to know of one request."""

    __slots__ = ("authorization", "error_code", "principal", "remote_addr", "request_id")

    def __init__(self, authorization: str, remote_addr: str | None, request_id: str) -> None:
        #: The `Authorization` header ("" if none).
        self.authorization = authorization
        #: The peer's address (`<local>` for a Unix socket; None if unknown).
        self.remote_addr = remote_addr
        #: The id echoed in `X-Request-Id` and in every error body.
        self.request_id = request_id
        #: The authenticated caller (`rsc.events.auth.Credential` or None), or `UNSET`.
        self.principal: Credential | Unset | None = UNSET
        #: The code of a `CoordinationError` answered (the audit tells quota refusals by it).
        self.error_code: str | None = None


_current: ContextVar[Exchange] = ContextVar("rsc.http.exchange")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: Request ids this process makes: a random prefix per process and a counter (as unique as a
#: uuid4 per process and start, without a system call for randomness on every request).
_REQUEST_ID_PREFIX = secrets.token_hex(8)
_request_numbers = itertools.count(1)


def id_for(given: str) -> str:
    """The id of a request whose `X-Request-Id` header is `given`: that, if it is a valid id
    (1-128 of `A-Za-z0-9._:-`), else a new one. Raises nothing."""
    return given if _REQUEST_ID.fullmatch(given) else f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


def begin(authorization: str, remote_addr: str | None, request_id: str) -> Exchange:
    """Start answering a request: its exchange becomes `current()` in this task. Raises nothing."""
    exchange = Exchange(authorization, remote_addr, request_id)
    _current.set(exchange)
    return exchange


def current() -> Exchange:
    """The exchange of the request being answered.

    Raises `LookupError` outside a request (a bug: only request handling asks)."""
    return _current.get()


def request_id() -> str:
    """The current request's id, "" outside a request (or before its id was assigned)."""
    exchange = _current.get(None)
    return exchange.request_id if exchange is not None else ""


def note_error_code(code: str) -> None:
    """Remember the code of the `CoordinationError` the current request is answered with (no-op
    outside a request). Raises nothing."""
    exchange = _current.get(None)
    if exchange is not None:
        exchange.error_code = code
