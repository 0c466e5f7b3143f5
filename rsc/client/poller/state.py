"""What the poller's parts share: the `ShardBook`, each shard's queue and acknowledgements
(`ShardHome`), the queue's accounting, the lease, and the wake-ups of the reader and workers.

Every change of a shard's lifecycle goes through the book; the methods here add what a change
means for the shell (log lines, wake-ups of the reader, the workers and the shard's wake-up read).
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from rsc.client.errors import Fenced, RedisCommandFailed
from rsc.client.poller.book import ShardBook, ShardEntry
from rsc.client.poller.health import RedisHealth
from rsc.client.poller.message import Message
from rsc.client.poller.settings import REFUSAL_RETRY_S, PollerSettings

__all__ = ["PollerState", "Shard", "ShardHome", "together"]

log = logging.getLogger("rsc.client.poller")


class Touch(Protocol):
    def touch(self) -> None: ...


class ShardHome:
    """What the shell keeps beside a shard's book entry."""

    def __init__(self) -> None:
        self.queue: collections.deque[Message] = collections.deque()
        #: Handled, to be acknowledged.
        self.acks: list[str] = []
        #: Ids whose acknowledgement is in flight (`Acker.flush`).
        self.acking: set[str] = set()
        #: Ids handled and failed, to be queued again (`Dispatcher.retry_later`).
        self.retrying: set[str] = set()
        #: One acknowledgement call at a time: a revoke waits for the one in flight.
        self.ack_lock = trio.Lock()
        #: After a failed acknowledgement, the next no sooner than this (trio clock).
        self.ack_retry_at = -math.inf
        #: The entry a worker's turn is handling now.
        self.handling: Message | None = None
        #: Set while no worker's turn handles the shard.
        self.idle = trio.Event()
        self.idle.set()
        #: The cancel scope of the turn under way (the lease's end and a loss cancel it).
        self.scope = trio.CancelScope()
        #: The wake-up read watching it (None: none, or no longer read).
        self.watch: Touch | None = None


Shard = ShardEntry[ShardHome]


class PollerState:
    """The state the reader, the wake-ups, the reclaimer, the workers and the acker share."""

    def __init__(
        self, group: str, member_id: str, incarnation: str, settings: PollerSettings, health: RedisHealth
    ) -> None:
        self.group = group
        #: The stream prefix (set by the worker: the destination name of trace spans).
        self.stream = ""
        self.member_id = member_id
        self.incarnation = incarnation
        self.settings = settings
        self.health = health
        self.book: ShardBook[ShardHome] = ShardBook()
        #: Shards with queued entries and no worker's turn on them, in the order they came.
        self.ready: collections.deque[Shard] = collections.deque()
        #: Entries queued in memory, all shards together (at most `prefetch`).
        self.buffered = 0
        #: Until when the member's shards are known to be its own (trio clock; `renewed`).
        self.lease_until = -math.inf
        #: Set to wake the reader (a shard came or was woken, room in the queue, a failed read).
        self.wake = trio.Event()
        #: Set to wake idle workers (None: no worker waits).
        self.work: trio.Event | None = None
        self.idle_workers = 0
        #: The reader waits for room in the queue: the workers wake it when there is.
        self.room_wanted = False
        #: Set when something was handled (the acker sleeps until then).
        self.acks_waiting = trio.Event()
        self._lease_renewed = trio.Event()

    # --- the lease ------------------------------------------------------------

    def renew(self, until: float) -> None:
        """The member's shards are its own until `until`; a turn under way may run until then."""
        self.lease_until = until
        for shard in self.book:
            if shard.in_turn:
                shard.home.scope.deadline = until
        if self.lease_valid():
            self._lease_renewed.set()
            self._lease_renewed = trio.Event()

    def lease_valid(self) -> bool:
        return trio.current_time() < self.lease_until

    async def until_lease_valid(self) -> None:
        while not self.lease_valid():
            await self._lease_renewed.wait()

    # --- the queue ------------------------------------------------------------

    def enqueue(self, shard: Shard, messages: Sequence[Message]) -> None:
        """Queue entries read from `shard`, unless it stopped meanwhile: then they stay pending in
        Redis for the next owner (an entry read after a revoke began is never handled here)."""
        if not messages or not self.book.holds(shard):
            return
        self.book.received(shard, messages[-1].id)  # reads, claims and reclaims come in id order
        shard.home.queue.extend(messages)
        self.buffered += len(messages)
        if not shard.in_turn and shard not in self.ready:
            self.ready.append(shard)
        self.poke()

    def drop_queue(self, shard: Shard) -> None:
        self.buffered -= len(shard.home.queue)
        shard.home.queue.clear()
        if shard in self.ready:
            self.ready.remove(shard)
        self.freed()

    def freed(self) -> None:
        """Entries left the queue: wake a reader that waits for room for a batch."""
        if self.room_wanted and self.room() >= min(self.settings.batch, self.settings.prefetch):
            self.room_wanted = False
            self.wake.set()

    def room(self) -> int:
        return self.settings.prefetch - self.buffered

    def held(self, shard: Shard) -> set[str]:
        """The ids of `shard` this member holds itself: queued, being handled, to be retried
        later or acknowledged."""
        home = shard.home
        held = {m.id for m in home.queue} | set(home.acks) | home.acking | home.retrying
        if home.handling is not None:
            held.add(home.handling.id)
        return held

    def poke(self) -> None:
        """Wake the reader and every idle worker."""
        self.wake.set()
        if self.work is not None:
            self.work.set()
            self.work = None

    async def let_workers_start(self) -> None:
        """Let idle workers take what was just queued before this task sends its next command
        (preparing one takes a few hundred microseconds of CPU: the handler would wait)."""
        for _ in range(4):  # trio runs the tasks ready at once in random order
            if not self.ready or not self.idle_workers:
                return
            await trio.lowlevel.checkpoint()

    # --- outcomes of reads ----------------------------------------------------

    def fine(self, shard: Shard) -> None:
        """A read or claim of the shard succeeded."""
        if self.book.fine(shard, trio.current_time()):
            log.info("%s: shard %s is read again", self.member_id, shard.index)

    def read_failed(self, shard: Shard, delay: float) -> None:
        """The shard is read again (by the reader) no sooner than `delay` from now."""
        self.book.read_failed(shard, trio.current_time(), delay)
        self.wake.set()  # the reader sets its timer by it
        if shard.home.watch is not None:
            shard.home.watch.touch()  # the others of its bundle can be watched meanwhile

    def refused(self, shard: Shard, error: RedisCommandFailed) -> None:
        """A fenced script refused this shard (`Fenced`: it is not ours), or a command failed there."""
        if isinstance(error, Fenced):
            self.fenced(shard, error)
        elif error.code == "NOGROUP":
            self.stalled(shard, f"its consumer group or key is gone ({error})")
        else:
            self.read_failed(shard, self.health.wait_after(error))

    def fenced(self, shard: Shard, exc: Fenced) -> None:
        """A fenced script refused the shard: its owner token is gone or names another member.

        The scripts refuse every read and acknowledgement meanwhile, so nothing is done on a
        shard that is not ours; but only the coordinator knows whose it is. It moved (or this
        member is fenced): the next heartbeat says so and the member stops it. The token was
        lost or rolled back by Redis (a restart without persistence, an older copy): the
        coordinator writes it again. Either way the shard stays until the member is told, is
        reported (`stalled_shards`) and tried again; dropping it here, unknown to the member,
        left it reported as owned and read by nobody for good."""
        if self.book.holds(shard):  # else revoked meanwhile
            self.stalled(shard, str(exc))

    def stalled(self, shard: Shard, why: str) -> None:
        """The shard cannot be read for want of what only the coordinator makes (its owner token,
        consumer group or key: Redis lost them). Keep it, tell the coordinator (`stalled_shards`)
        and try again soon; never recreate them here."""
        if self.book.troubled(shard, why):
            log.warning(
                "%s: shard %s cannot be read: %s; telling the coordinator, which recreates what is "
                "missing if the shard is still this member's (Redis lost data), or takes it away "
                "(another member or process has it now)",
                self.member_id,
                shard.index,
                why,
            )
        self.read_failed(shard, REFUSAL_RETRY_S)


async def together(calls: Sequence[tuple[Any, ...]]) -> None:
    """Each `(function, *args)` of `calls`, concurrently: their Redis commands share round trips."""
    if len(calls) == 1:
        await calls[0][0](*calls[0][1:])
        return
    async with trio.open_nursery() as nursery:
        for function, *args in calls:
            nursery.start_soon(function, *args)
