"""The workers: `max_concurrency` tasks run the handler, one turn of a shard at a time, under
the exclusive-handling rule; failed entries are retried later, then dead-lettered."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from rsc import tracing
from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.poller.message import Handler, Message
from rsc.client.poller.scripts import MemberScripts
from rsc.client.poller.state import PollerState, Shard
from rsc.events.wire import dead_letter_key

__all__ = ["Dispatcher", "Worker"]

log = logging.getLogger("rsc.client.poller")


class Worker:
    """One handler task; a retired one ends between two handler calls."""

    def __init__(self) -> None:
        self.retired = False


class Dispatcher:
    """Runs the handler on queued entries: entries of one shard in order, one at a time."""

    def __init__(self, state: PollerState, scripts: MemberScripts, handler: Handler) -> None:
        self.state = state
        self.scripts = scripts
        self.handler = handler
        self.workers: list[Worker] = []
        #: How many workers there should be (resized live by the coordinator's answer).
        self.wanted = 1
        self.handled = 0
        self.failed = 0
        #: Handler calls for entries delivered before (a retry after a failure, or a crash).
        self.retried = 0
        self.dead_lettered = 0
        #: Handler calls cancelled because the lease ended while they ran.
        self.cut_by_lease = 0
        #: Told how long each handler call took, in seconds (the worker's metrics).
        self.observe_handler: Callable[[float], None] | None = None
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.resize(self.wanted)

    def resize(self, workers: int) -> None:
        """Start workers, or retire some: a retired worker ends between two handler calls."""
        self.wanted = max(1, workers)
        if self._nursery is None:
            return
        while len(self.workers) < self.wanted:
            worker = Worker()
            self.workers.append(worker)
            self._nursery.start_soon(self._work, worker)
        while len(self.workers) > self.wanted:
            self.workers.pop().retired = True
        self.state.poke()

    async def _work(self, worker: Worker) -> None:
        state = self.state
        while not worker.retired:
            if not state.ready:
                if state.work is None:
                    state.work = trio.Event()
                state.idle_workers += 1
                try:
                    await state.work.wait()
                finally:
                    state.idle_workers -= 1
                continue
            if not state.lease_valid():  # after a pause: nothing runs until a heartbeat confirms
                await state.until_lease_valid()
                continue
            shard = state.ready.popleft()
            if not shard.stopped:
                await self._turn(worker, shard)

    async def _turn(self, worker: Worker, shard: Shard) -> None:
        """Up to `turn` entries of `shard`, in order; then the shard waits for a worker again.

        A loss cancels the turn's scope, and so does the end of the lease: the handler in
        flight stops at once.
        """
        state, book, home = self.state, self.state.book, shard.home
        book.begin_turn(shard)
        home.idle = trio.Event()
        pause = 0.0
        try:
            with trio.CancelScope(deadline=state.lease_until) as home.scope:
                for _ in range(state.settings.turn):
                    # The exclusive-handling rule, per entry: still held (a revoke or a loss
                    # stops it first) and the lease valid now.
                    if not home.queue or worker.retired:
                        break
                    if not book.may_handle(shard, trio.current_time(), state.lease_until):
                        break
                    message = home.queue.popleft()
                    state.buffered -= 1
                    state.freed()
                    home.handling = message
                    try:
                        await self._handle(shard, message)
                    except Fenced as exc:
                        state.fenced(shard, exc)
                        break
                    except (RedisUnavailable, RedisCommandFailed) as exc:
                        pause = state.health.wait_after(exc)  # it goes first again, later
                        break
                    home.handling = None
            if home.scope.cancelled_caught and not shard.stopped:
                self.cut_by_lease += 1
            if pause:
                await trio.sleep(pause)
            else:
                await trio.lowlevel.checkpoint()  # let the reader and the acker run between turns
        finally:
            if home.handling is not None and not shard.stopped:
                # Cut short (the lease ended, Redis failed, the poller stops): it is still
                # pending in Redis; it goes first again if the shard stays ours.
                home.queue.appendleft(attrs.evolve(home.handling, redelivered=True))
                state.buffered += 1
            book.end_turn(shard)
            home.handling = None
            home.idle.set()
            if home.queue and book.holds(shard):
                state.ready.append(shard)
                state.poke()

    async def _handle(self, shard: Shard, message: Message) -> None:
        state = self.state
        if message.redelivered:
            # Count this delivery in Redis before the handler starts (a crash in the handler
            # then counts too); the count decides about the dead-letter stream.
            deliveries = await self.scripts.start(shard, message.id)
            if not deliveries:
                return  # no longer pending here (acknowledged, or claimed by another consumer)
            message = attrs.evolve(message, deliveries=deliveries)
        fields, carrier = tracing.split(message.fields)  # the publisher's trace context, if any
        if carrier:  # kept beside the fields: a retry of this message carries it too
            message = attrs.evolve(message, fields=fields, trace=carrier)
        carrier = dict(message.trace)
        where = (state.stream, state.group, message.shard, message.id, message.deliveries, carrier)
        if message.deliveries > state.settings.max_deliveries:
            with tracing.settle_span(*where, "dead_letter"):  # (its trace fields go with it)
                await self._dead_letter(shard, attrs.evolve(message, fields=tracing.joined(fields, carrier)))
            return
        if message.deliveries > 1:
            self.retried += 1
        started = time.perf_counter()
        try:
            with tracing.process_span(*where):
                await self.handler(message)
        except Exception as exc:
            self.failed += 1
            # One line per failure; the traceback at DEBUG (a poison entry fails max_deliveries times).
            log.warning(
                "%s: handler failed on %s %s (delivery %d of %d): %s: %s",
                state.member_id,
                message.key,
                message.id,
                message.deliveries,
                state.settings.max_deliveries,
                type(exc).__name__,
                exc,
            )
            log.debug("the handler's traceback", exc_info=True)
            self.retry_later(shard, message, message.deliveries + 1)  # it stays pending meanwhile
            return
        finally:
            if self.observe_handler is not None:
                self.observe_handler(time.perf_counter() - started)
        self.handled += 1
        shard.home.acks.append(message.id)
        state.acks_waiting.set()

    def retry_later(
        self, shard: Shard, message: Message, deliveries: int, after_s: float | None = None
    ) -> None:
        """Queue `message` again after `after_s` (default `retry_after_ms`); it stays pending
        in Redis meanwhile."""
        state = self.state

        async def retry() -> None:
            try:
                await trio.sleep(state.settings.retry_after_ms / 1000 if after_s is None else after_s)
            finally:
                shard.home.retrying.discard(message.id)
            state.enqueue(shard, [attrs.evolve(message, deliveries=deliveries, redelivered=True)])

        if self._nursery is not None:
            shard.home.retrying.add(message.id)
            self._nursery.start_soon(retry)

    async def _dead_letter(self, shard: Shard, message: Message) -> None:
        state = self.state
        try:
            await self.scripts.dead_letter(shard, message)
        except Fenced as exc:
            state.fenced(shard, exc)
        except (RedisUnavailable, RedisCommandFailed) as exc:
            self.retry_later(shard, message, message.deliveries, state.health.wait_after(exc))
        else:
            state.health.ok()
            self.dead_lettered += 1
            log.warning(
                "%s: dead-lettered %s %s after %d failed deliveries (max_deliveries %d) to %s",
                state.member_id,
                message.key,
                message.id,
                message.deliveries - 1,
                state.settings.max_deliveries,
                dead_letter_key(shard.key),
            )
