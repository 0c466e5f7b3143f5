"""Errors of the persistence and actor layer, grouped by what a caller can do."""

from __future__ import annotations


class StoreError(Exception):
    """Base of persistence failures."""


class ConcurrencyConflict(StoreError):
    """The stored revision is not the one the writer expected: reload and retry."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"expected revision {expected}, found {actual}")
        self.expected = expected
        self.actual = actual


class StoreUnavailable(StoreError):
    """Redis could not be reached or timed out: retry later."""


class UnsupportedSchema(StoreError):
    """A snapshot was written by a metadata schema this server cannot read."""


class ActorStopped(Exception):
    """The actor stopped (shutdown or idle) before it could answer: ask again."""
