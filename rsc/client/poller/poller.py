"""The `Poller`: a `ShardLifecycle` that wires the reader, the wake-ups, the reclaimer, the
workers and the acker around one `ShardBook` (see the package doc for what it promises)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import trio

from rsc.client.poller.acker import Acker
from rsc.client.poller.dispatch import Dispatcher
from rsc.client.poller.health import RedisHealth
from rsc.client.poller.message import Handler
from rsc.client.poller.reader import Reader
from rsc.client.poller.reclaim import Reclaimer
from rsc.client.poller.scripts import MemberScripts
from rsc.client.poller.settings import PollerSettings
from rsc.client.poller.state import PollerState, Shard, ShardHome
from rsc.client.poller.wakeup import Wakeups
from rsc.events.model import DrainProgress, Layout, ShardState
from rsc.resp import Endpoint, Multiplexed

__all__ = ["Poller"]

DEFAULT_SETTINGS = PollerSettings()


class Poller:
    """Reads the shards a member owns and hands their entries to `handler` (see the package doc).

    `wake_client` is the Redis client of the blocking wake-up reads: give one of its own (`App`
    does), whose command timeout exceeds `wake_block_s`, so that blocked connections never hold
    up the others; by default `redis` (the block is then capped below its command timeout).
    `lean`: the lean connection its scripts go on (`rsc.resp.open_lean` of `redis`; an `App`
    shares one among its pollers); by default the poller opens its own while it runs, where
    there can be one.
    """

    def __init__(
        self,
        redis: Any,
        group: str,
        member_id: str,
        incarnation: str,
        handler: Handler,
        settings: PollerSettings = DEFAULT_SETTINGS,
        health: RedisHealth | None = None,
        wake_client: Any = None,
        lean: Multiplexed | None = None,
        stream: str = "",
    ) -> None:
        #: The lean connection given (shared), or where to open one of its own (None: coredis).
        self._given_lean = lean
        self._endpoint = Endpoint.of(redis)
        self.group = group
        self.member_id = member_id
        self.incarnation = incarnation
        self.settings = settings
        self.state = PollerState(
            group, member_id, incarnation, settings, health or RedisHealth(member_id, settings.redis_backoff)
        )
        #: The stream prefix it reads (the destination name of its trace spans).
        self.state.stream = stream
        self.scripts = MemberScripts(redis, group, member_id, incarnation)
        self.wakeups = Wakeups(self.state, redis, redis if wake_client is None else wake_client, self.scripts)
        self.reader = Reader(self.state, self.scripts, self.wakeups)
        self.reclaimer = Reclaimer(self.state, self.scripts, redis)
        self.dispatcher = Dispatcher(self.state, self.scripts, handler)
        self.acker = Acker(self.state, self.scripts)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read, handle and acknowledge until cancelled (the scripts on a lean connection of
        the poller's own where there can be one: `rsc.client.poller.scripts`)."""
        async with contextlib.AsyncExitStack() as stack:
            lean = self._given_lean
            if lean is None and self._endpoint is not None:
                lean = await stack.enter_async_context(Multiplexed.open(self._endpoint))
            self.scripts.lean = lean
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.reader.run)
                    nursery.start_soon(self.acker.run)
                    nursery.start_soon(self.reclaimer.run)
                    self.wakeups.start(nursery)
                    self.dispatcher.start(nursery)
                    task_status.started()
            finally:
                self.scripts.lean = None

    # --- ShardLifecycle -------------------------------------------------

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        """Start reading these shards (their backlog first)."""
        by_index = {s.index: s for s in layout.shards}
        book = self.state.book
        for index in shards:
            old = book.get(index)
            if old is not None:  # never expected: the member revokes first
                self._stop(old)
            spec = by_index[index]
            shard = book.assign(
                index,
                spec.key,
                self.wakeups.bundle_of(spec.key),
                ShardHome(),
                trio.current_time(),
                draining=spec.state is ShardState.DRAINING,
            )
            self.wakeups.attach(shard)
        self.state.poke()

    async def revoke(self, shards: frozenset[int], within_s: float) -> None:
        """Stop reading first, start nothing more, let the handler in flight finish (within
        `within_s`, what the group's revoke timeout leaves, and `revoke_timeout_s` if set),
        flush the acknowledgements, forget the shards."""
        book = self.state.book
        gone = [shard for i in shards if (shard := book.get(i)) is not None]
        for shard in gone:
            self._stop(shard)  # its wake-up read ends now
        limit = (
            within_s
            if self.settings.revoke_timeout_s is None
            else min(within_s, self.settings.revoke_timeout_s)
        )
        deadline = trio.current_time() + limit
        with trio.move_on_at(deadline):
            for shard in gone:
                await shard.home.idle.wait()
        for shard in gone:
            shard.home.scope.cancel()  # only if it overran the revoke timeout
            # A handler that ignores the cancellation (a thread, a shield) still holds the
            # shard: the revoke is not acknowledged before it ends, however long that takes
            # (past the group's revoke timeout the coordinator fences this member).
            await shard.home.idle.wait()
            with trio.move_on_at(max(deadline, trio.current_time() + 1.0)):
                while book.get(shard.index) is shard and not await self.acker.flush([shard]):
                    await trio.sleep(self.state.health.delay())
            if book.get(shard.index) is shard:
                book.forget(shard)

    async def lost(self, shards: frozenset[int]) -> None:
        """Stop at once: cancel in-flight handlers; pending acks are dropped (someone else owns it)."""
        book = self.state.book
        for index in shards:
            shard = book.get(index)
            if shard is not None:
                book.forget(shard)
                self._stop(shard)
                shard.home.scope.cancel()
                shard.home.acks.clear()

    async def concurrency(self, workers: int) -> None:
        """Run `workers` handler tasks from now on."""
        self.dispatcher.resize(workers)

    def stalled_shards(self) -> frozenset[int]:
        """Shards it holds but cannot read: their owner token, consumer group or key is gone
        (Redis lost data). Reported in each heartbeat; the coordinator recreates what is
        missing, and the reads, tried again meanwhile, go on by themselves."""
        return self.state.book.troubles()

    def drain_progress(self) -> Sequence[DrainProgress]:
        """Pending count and lag of each DRAINING shard this member reads (refreshed by the reclaimer)."""
        return tuple(self.reclaimer.drain.values())

    def renewed(self, until: float) -> None:
        """The member's shards are its own until `until`: handler calls may start before it,
        and a call still running then is cancelled."""
        self.state.renew(until)

    def _stop(self, shard: Shard) -> None:
        self.state.book.stop(shard)
        self.wakeups.detach(shard)
        self.state.drop_queue(shard)

    # --- figures ------------------------------------------------------------

    @property
    def shards(self) -> dict[int, Shard]:
        """The shards it holds now (revoked ones until their acknowledgements are flushed)."""
        return {shard.index: shard for shard in self.state.book}

    @property
    def buffered(self) -> int:
        """Entries read and queued in memory, not yet handled (at most `prefetch`)."""
        return self.state.buffered

    @property
    def workers(self) -> int:
        return self.dispatcher.wanted

    @property
    def lease_until(self) -> float:
        return self.state.lease_until

    @property
    def health(self) -> RedisHealth:
        return self.state.health

    @property
    def handled(self) -> int:
        return self.dispatcher.handled

    @property
    def failed(self) -> int:
        return self.dispatcher.failed

    @property
    def retried(self) -> int:
        return self.dispatcher.retried

    @property
    def dead_lettered(self) -> int:
        return self.dispatcher.dead_lettered

    @property
    def cut_by_lease(self) -> int:
        return self.dispatcher.cut_by_lease

    @property
    def stalls(self) -> int:
        return self.reclaimer.stalls

    @property
    def lag(self) -> dict[int, tuple[int, int | None]]:
        return self.reclaimer.lag

    @property
    def measure_lag(self) -> bool:
        return self.reclaimer.measure_lag

    @measure_lag.setter
    def measure_lag(self, on: bool) -> None:
        self.reclaimer.measure_lag = on

    @property
    def observe_handler(self) -> Callable[[float], None] | None:
        return self.dispatcher.observe_handler

    @observe_handler.setter
    def observe_handler(self, observe: Callable[[float], None] | None) -> None:
        self.dispatcher.observe_handler = observe
