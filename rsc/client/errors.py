"""The client's own exceptions: every transport or protocol failure maps to one of these, once."""

from __future__ import annotations

from typing import Any


class RscError(Exception):
    """Base of every error `rsc.client` raises."""


class CoordinatorUnavailable(RscError):
    """The coordinator could not be reached, or answered 5xx, even after retries."""


#: Refusals a producer that has not registered yet gives up on at once: its credential is
#: wrong or does not cover the stream (other refusals, such as an unknown stream, may pass).
REFUSED_FOR_GOOD = frozenset({401, 403})


class CoordinatorRejected(RscError):
    """The coordinator refused the request (4xx): `code` is the protocol's error code."""

    def __init__(
        self, status: int, code: str, message: str, request_id: str = "", details: Any = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details
