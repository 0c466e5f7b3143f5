"""The poller's per-shard lifecycle as a pure machine: the `ShardBook` (after h11's `_state.py`).

Each shard a member owns has one `ShardEntry` in the book, in one of four `ReadState`s:

    CLAIMING ──BACKLOG_DONE──> READING <──WOKEN / READ_MORE / READ_FAILED / STALLED──┐
       │                         │                                                   │
       │                         └──CAUGHT_UP──> CAUGHT_UP ──────────────────────────┘
       └── any state ──STOP──> STOPPED (late outcomes of reads in flight are ignored there)

`TRANSITIONS` is the whole table; a step it does not list for a state raises
`ShardBookError` (a bug in the shell, never a Redis or network condition). Besides the state,
an entry holds the read position (`claim_cursor`, `last_read`), the back-off of a failed read
(`retry_at`), why it cannot be read (`trouble`, reported to the coordinator) and whether a
worker's turn is handling it (`in_turn`).

The rules the shell asks the book, rather than deciding itself:

* read selection (`to_read`): the shards to read now, round robin from a rotating start, at
  most `batch` entries each and `room` in all: CLAIMING or READING, and its back-off over;
* exclusivity (`begin_turn`, `may_handle`): one worker's turn per shard at a time, none on a
  STOPPED shard, and no handler call starts once the lease is over;
* identity (`holds`): an entry stopped and replaced by a new assignment of the same index is
  no longer held: outcomes that arrive late for it change nothing.

Pure: no I/O, no clock (time is an argument), no trio. `rsc/client/poller/` drives it;
tests/core/test_shard_book.py checks it with hypothesis.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from typing import Generic, TypeVar

import attrs

__all__ = ["TRANSITIONS", "ReadState", "ShardBook", "ShardBookError", "ShardEntry", "Step"]

Home = TypeVar("Home")


class ReadState(enum.Enum):
    #: Newly owned: claims what earlier owners read and never acknowledged, before new entries.
    CLAIMING = "claiming"
    #: May have new entries: the reader reads it (once `retry_at` is over).
    READING = "reading"
    #: Its last read caught up to `tail`: not read until a wake-up read sees an entry past it.
    CAUGHT_UP = "caught-up"
    #: Revoked or lost: nothing more is read, queued or started.
    STOPPED = "stopped"


class Step(enum.Enum):
    BACKLOG_PART = "backlog-part"  # a claim of the backlog returned; more to claim
    BACKLOG_DONE = "backlog-done"  # the backlog is claimed: read new entries now
    READ_MORE = "read-more"  # a read returned entries and did not catch up
    CAUGHT_UP = "caught-up"  # a read caught up to the stream's last id
    WOKEN = "woken"  # a wake-up read (or a probe) saw entries past the tail
    READ_FAILED = "read-failed"  # a read or claim failed (or was refused): again later
    STALLED = "stalled"  # the stall check found it unread: read it again now
    STOP = "stop"  # revoked or lost


_C, _R, _U, _S = ReadState.CLAIMING, ReadState.READING, ReadState.CAUGHT_UP, ReadState.STOPPED

#: (state, step) -> the next state. Anything else is a `ShardBookError`.
TRANSITIONS: dict[tuple[ReadState, Step], ReadState] = {
    (_C, Step.BACKLOG_PART): _C,
    (_C, Step.BACKLOG_DONE): _R,
    (_C, Step.READ_FAILED): _C,
    (_C, Step.STALLED): _C,
    (_C, Step.STOP): _S,
    (_R, Step.READ_MORE): _R,
    (_R, Step.CAUGHT_UP): _U,
    (_R, Step.WOKEN): _R,
    (_R, Step.READ_FAILED): _R,
    (_R, Step.STALLED): _R,
    (_R, Step.STOP): _S,
    (_U, Step.READ_MORE): _R,
    (_U, Step.CAUGHT_UP): _U,
    (_U, Step.WOKEN): _R,
    (_U, Step.READ_FAILED): _R,
    (_U, Step.STALLED): _R,
    (_U, Step.STOP): _S,
    # Stopped: outcomes of calls that were in flight when it stopped change nothing.
    **{(_S, step): _S for step in Step},
}


class ShardBookError(RuntimeError):
    """A step the table does not allow in the entry's state: a bug in the code driving the book."""


@attrs.define(eq=False)
class ShardEntry(Generic[Home]):
    """One owned shard's lifecycle. Read its fields freely; change them only through the book."""

    index: int
    key: str
    #: The shards read, acknowledged and woken together: all of a member's on a standalone
    #: Redis (0), those of one hash slot on a cluster (the slot).
    bundle: int
    #: What the shell keeps beside it (queues, locks, cancel scopes).
    home: Home
    #: A DRAINING shard of the layout (its pending count and lag are reported while it drains).
    draining: bool = False
    state: ReadState = ReadState.CLAIMING
    #: CAUGHT_UP: the stream's last id when the read caught up (else None).
    tail: str | None = None
    #: The backlog claim's cursor (CLAIMING).
    claim_cursor: str = "0-0"
    #: The highest entry id read or claimed (ids after it that are pending here are unseen).
    last_read: str = "0-0"
    #: After a failed read, read again no sooner than this.
    retry_at: float = -math.inf
    #: Why it cannot be read now (owner token, consumer group or key gone; a stall), reported
    #: to the coordinator until a read succeeds; None: fine.
    trouble: str | None = None
    #: When a read or claim of it last succeeded.
    read_at: float = 0.0
    #: Since when the stall check has seen entries past its tail (None: not seen, or read since).
    behind_since: float | None = None
    #: A worker's turn is handling its entries.
    in_turn: bool = False

    @property
    def stopped(self) -> bool:
        return self.state is ReadState.STOPPED


class ShardBook(Generic[Home]):
    """The per-shard lifecycles of one poller's shards (see the module doc)."""

    def __init__(self) -> None:
        self._entries: dict[int, ShardEntry[Home]] = {}
        self._rotation = 0

    # --- membership ---------------------------------------------------------

    def assign(
        self, index: int, key: str, bundle: int, home: Home, now: float, draining: bool = False
    ) -> ShardEntry[Home]:
        """A shard is now owned: its entry, CLAIMING. One still in the book under that index
        (never expected: the member revokes first) is stopped and replaced."""
        old = self._entries.get(index)
        if old is not None:
            self.step(old, Step.STOP)
        entry = ShardEntry(index, key, bundle, home, draining=draining, read_at=now)
        self._entries[index] = entry
        return entry

    def forget(self, entry: ShardEntry[Home]) -> None:
        """The shard is gone (revoked and flushed, or lost): stopped and out of the book."""
        self.step(entry, Step.STOP)
        if self._entries.get(entry.index) is entry:
            del self._entries[entry.index]

    def holds(self, entry: ShardEntry[Home]) -> bool:
        """The entry is the book's current one for its index and not stopped."""
        return self._entries.get(entry.index) is entry and not entry.stopped

    def get(self, index: int) -> ShardEntry[Home] | None:
        return self._entries.get(index)

    def __iter__(self) -> Iterator[ShardEntry[Home]]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, index: object) -> bool:
        return index in self._entries

    def indexes(self) -> list[int]:
        return list(self._entries)

    # --- transitions --------------------------------------------------------

    def step(self, entry: ShardEntry[Home], step: Step) -> ReadState:
        """Move `entry` by `step` (see `TRANSITIONS`); its new state.

        Raises `ShardBookError` if the table does not allow `step` in its state."""
        try:
            state = TRANSITIONS[entry.state, step]
        except KeyError:
            raise ShardBookError(f"shard {entry.index}: {step.name} in {entry.state.name}") from None
        entry.state = state
        if state is not ReadState.CAUGHT_UP:
            entry.tail = None
        return state

    def stop(self, entry: ShardEntry[Home]) -> None:
        """A revoke began or the shard was lost: nothing more is read, queued or started."""
        self.step(entry, Step.STOP)

    def fine(self, entry: ShardEntry[Home], now: float) -> bool:
        """A read or claim of it succeeded at `now`; True if that ended a trouble."""
        entry.read_at = now
        entry.behind_since = None
        cleared = entry.trouble is not None and not entry.stopped
        if not entry.stopped:
            entry.trouble = None
        return cleared

    def claimed(self, entry: ShardEntry[Home], cursor: str) -> None:
        """A claim of its backlog returned `cursor` (`0-0`: the backlog is done)."""
        if entry.stopped:
            return
        entry.claim_cursor = cursor
        self.step(entry, Step.BACKLOG_DONE if cursor == "0-0" else Step.BACKLOG_PART)

    def received(self, entry: ShardEntry[Home], highest: str) -> None:
        """Entries up to `highest` were read or claimed (ids come in order)."""
        if _id_order(highest) > _id_order(entry.last_read):
            entry.last_read = highest

    def read(self, entry: ShardEntry[Home], tail: str | None) -> bool:
        """A read of it succeeded: caught up to `tail`, or (None) more to read. True if it was
        CAUGHT_UP and is now to be read again (its wake-up read has to look again)."""
        was = entry.state
        if tail is not None:
            self.step(entry, Step.CAUGHT_UP)
            if not entry.stopped:
                entry.tail = tail
            return False
        self.step(entry, Step.READ_MORE)
        return was is ReadState.CAUGHT_UP and entry.state is ReadState.READING

    def woken(self, entry: ShardEntry[Home]) -> bool:
        """Entries wait past its tail; True if it was CAUGHT_UP (and is now to be read)."""
        was = entry.state
        if was is ReadState.CLAIMING:
            return False  # not caught up yet: it is read anyway
        self.step(entry, Step.WOKEN)
        return was is ReadState.CAUGHT_UP

    def read_failed(self, entry: ShardEntry[Home], now: float, delay: float) -> None:
        """A read or claim of it failed: it is read again no sooner than `now + delay`."""
        self.step(entry, Step.READ_FAILED)
        if not entry.stopped:
            entry.retry_at = now + delay

    def troubled(self, entry: ShardEntry[Home], why: str) -> bool:
        """It cannot be read for want of what only the coordinator makes (Redis lost them);
        reported until a read succeeds. True if it had no trouble before."""
        if entry.stopped:
            return False
        first = entry.trouble is None
        entry.trouble = why
        return first

    def stalled(self, entry: ShardEntry[Home], why: str) -> None:
        """The stall check found it unread: reported, and read again now."""
        self.step(entry, Step.STALLED)
        if not entry.stopped:
            entry.trouble = f"stalled: {why}"
            entry.behind_since = None
            entry.retry_at = -math.inf

    def behind(self, entry: ShardEntry[Home], now: float | None) -> None:
        """The stall check saw entries past its tail at `now` (None: it did not)."""
        if now is None:
            entry.behind_since = None
        elif entry.behind_since is None:
            entry.behind_since = now

    # --- rules --------------------------------------------------------------

    @staticmethod
    def readable(entry: ShardEntry[Home], now: float) -> bool:
        """May have entries and can be read now: CLAIMING or READING, its back-off over."""
        return entry.state in (ReadState.CLAIMING, ReadState.READING) and now >= entry.retry_at

    def to_read(self, now: float, room: int, batch: int) -> list[tuple[ShardEntry[Home], int]]:
        """The shards to read now and how many entries of each: round robin from a start that
        moves by one each call (the first served varies), `batch` at most each, `room` in all."""
        entries = list(self._entries.values())
        self._rotation = (self._rotation + 1) % max(1, len(entries))
        reads: list[tuple[ShardEntry[Home], int]] = []
        for entry in entries[self._rotation :] + entries[: self._rotation]:
            if room <= 0:
                break
            if self.readable(entry, now):
                reads.append((entry, min(room, batch)))
                room -= reads[-1][1]
        return reads

    def next_retry(self, now: float) -> float:
        """When the earliest failed read is due again (inf: none waits)."""
        return min(
            (
                e.retry_at
                for e in self._entries.values()
                if e.state in (ReadState.CLAIMING, ReadState.READING) and e.retry_at > now
            ),
            default=math.inf,
        )

    def troubles(self) -> frozenset[int]:
        """The shards it holds but cannot read (reported to the coordinator)."""
        return frozenset(e.index for e in self._entries.values() if e.trouble is not None and not e.stopped)

    def begin_turn(self, entry: ShardEntry[Home]) -> None:
        """A worker takes the shard's entries. Raises `ShardBookError` if another worker has
        them, or the shard is stopped (one turn per shard at a time, none once stopped)."""
        if entry.in_turn or entry.stopped:
            why = "a second turn at once" if entry.in_turn else "a turn after it stopped"
            raise ShardBookError(f"shard {entry.index}: {why}")
        entry.in_turn = True

    def end_turn(self, entry: ShardEntry[Home]) -> None:
        """The worker's turn on the shard ended. Raises `ShardBookError` outside a turn."""
        if not entry.in_turn:
            raise ShardBookError(f"shard {entry.index}: no turn to end")
        entry.in_turn = False

    @staticmethod
    def may_handle(entry: ShardEntry[Home], now: float, lease_until: float) -> bool:
        """The exclusive-handling rule, checked before each handler call: the shard is still
        this member's (not stopped) and the member's lease is valid at `now`."""
        return not entry.stopped and now < lease_until


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
