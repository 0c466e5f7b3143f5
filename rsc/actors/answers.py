"""The answer slots of an actor's commands: what a caller waits on until its command was
decided and written (`rsc.actors.actor`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias

import trio

__all__ = ["NO_ANSWER", "Answer", "FollowUps", "Many", "NoAnswer", "Pending", "Slot"]


class Pending:
    """A one-shot answer slot (the only one: every caller waits on one); `expect`: the revision
    the aggregate must be at when the command is decided (an HTTP `If-Match`), else it is
    refused with `PreconditionFailed`; `on_done`: told once it is answered (True: resolved,
    False: failed), before any waiter wakes."""

    def __init__(self, expect: int | None = None, on_done: Callable[[bool], None] | None = None) -> None:
        self.expect = expect
        self._on_done = on_done
        self._done = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def resolve(self, value: Any) -> None:
        if not self._done.is_set():
            self._value = value
            self._finish(True)

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._finish(False)

    def _finish(self, resolved: bool) -> None:
        if self._on_done is not None:
            self._on_done(resolved)
        self._done.set()

    @property
    def value(self) -> Any:
        """What it was resolved with (None while unanswered or failed)."""
        return self._value

    @property
    def error(self) -> BaseException | None:
        """What it failed with (None while unanswered or resolved)."""
        return self._error

    async def settled(self) -> None:
        """Return once it is answered, whichever way (never raises its error)."""
        await self._done.wait()

    async def wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Answer(Protocol):
    """A command's answer slot: its `Reply`, or the error that refused or failed it."""

    def resolve(self, value: Any) -> None: ...

    def fail(self, error: BaseException) -> None: ...


#: Commands a decided batch calls for, given the state it left and its events (those not yet
#: shown): decided next in the same batch, each answered in its slot (`Actor.follow_ups`).
FollowUps: TypeAlias = Callable[[Any, Sequence[Any]], Sequence[tuple[Any, Answer]]]

_UNSET: Any = object()


class NoAnswer:
    """The answer slot of what the actor sends itself: nobody waits for it."""

    def resolve(self, value: Any) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass


NO_ANSWER = NoAnswer()


class Many:
    """The answers to several commands sent together: one wake-up when all are in."""

    def __init__(self, count: int) -> None:
        self.results: list[Any] = [_UNSET] * count
        self.remaining = count
        self.done = trio.Event()
        if count == 0:
            self.done.set()

    def put(self, index: int, value: Any) -> None:
        if self.results[index] is _UNSET:
            self.results[index] = value
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()


class Slot:
    """One command's answer slot in a `Many`."""

    __slots__ = ("index", "many")

    def __init__(self, many: Many, index: int) -> None:
        self.many = many
        self.index = index

    def resolve(self, value: Any) -> None:
        self.many.put(self.index, value)

    def fail(self, error: BaseException) -> None:
        self.many.put(self.index, error)
