"""The reader: reads the shards the book selects, round robin, through fenced scripts."""

from __future__ import annotations

import math
from typing import Any

import trio

from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.poller.book import ReadState
from rsc.client.poller.scripts import MemberScripts
from rsc.client.poller.state import PollerState, Shard, together
from rsc.client.poller.wakeup import Wakeups

__all__ = ["Reader"]


class Reader:
    """Reads the shards that may have entries (CLAIMING or READING in the book), round robin,
    `batch` at a time, all of a bundle at once (one round trip); when none may, waits to be
    woken (a wake-up read saw entries, a shard came, room in the queue, a lease, a retry due)."""

    def __init__(self, state: PollerState, scripts: MemberScripts, wakeups: Wakeups) -> None:
        self.state = state
        self.scripts = scripts
        self.wakeups = wakeups

    async def run(self) -> None:
        state = self.state
        while True:
            await state.until_lease_valid()
            reads = state.book.to_read(trio.current_time(), state.room(), state.settings.batch)
            if not reads:
                await self._idle()
                continue
            # Shards taken over claim their backlog first, one by one; the others of a bundle
            # are read together, in one call.
            calls: list[tuple[Any, ...]] = [
                (self._claim_backlog, s, n) for s, n in reads if s.state is ReadState.CLAIMING
            ]
            bundles: dict[int, list[tuple[Shard, int]]] = {}
            for shard, count in reads:
                if shard.state is not ReadState.CLAIMING:
                    bundles.setdefault(shard.bundle, []).append((shard, count))
            calls += [(self._read_bundle, bundle) for bundle in bundles.values()]
            await together(calls)
            await state.let_workers_start()
            await self.wakeups.probe()

    async def _idle(self) -> None:
        """Nothing to read now: wait for a poke or for the next retry of a failed read."""
        state = self.state
        retry = math.inf
        if state.buffered >= state.settings.prefetch:
            state.room_wanted = True  # the workers wake it (`PollerState.freed`)
        else:
            retry = state.book.next_retry(trio.current_time())
        with trio.move_on_at(retry):
            await state.wake.wait()
        state.wake = trio.Event()

    async def _claim_backlog(self, shard: Shard, count: int) -> None:
        """What earlier owners read but never acknowledged, `count` at a time, before new entries;
        the call that finds the backlog done reads the first new entries too (one round trip
        from a handoff to the new owner's first entries, not two)."""
        state = self.state
        if shard.stopped:  # revoked or lost since the round began: nothing more is read
            return
        try:
            messages, cursor, read = await self.scripts.claim_then_read(shard, count, shard.claim_cursor)
        except Fenced as exc:
            state.fenced(shard, exc)
            return
        except (RedisUnavailable, RedisCommandFailed) as exc:
            state.read_failed(shard, state.health.wait_after(exc))
            return
        state.health.ok()
        state.fine(shard)
        state.book.claimed(shard, cursor)
        state.enqueue(shard, messages)
        if read is not None:  # READING now: as any read of it
            self.wakeups.take([(shard, count)], [read])

    async def _read_bundle(self, reads: list[tuple[Shard, int]]) -> None:
        """New entries of several shards of one bundle, in one fenced read."""
        state = self.state
        reads = [(shard, count) for shard, count in reads if not shard.stopped]
        if not reads:
            return
        try:
            results = await self.scripts.read(reads)
        except (RedisUnavailable, RedisCommandFailed) as exc:
            delay = state.health.wait_after(exc)
            for shard, _ in reads:
                state.read_failed(shard, delay)
            return
        state.health.ok()
        self.wakeups.take(reads, results)
