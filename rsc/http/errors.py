"""The one error the HTTP layer answers with its own JSON body (`{error, message, requestId, details}`)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as JSON with `status`; `retry_after_s` becomes a `Retry-After` header."""

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.retry_after_s = retry_after_s
