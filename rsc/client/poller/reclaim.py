"""The reclaimer: entries left idle under other consumer names come back, stalls are found,
and the pending count and lag of DRAINING (or every) owned shard are measured."""

from __future__ import annotations

import logging
from typing import Any

import trio

from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.poller.book import ReadState
from rsc.client.poller.scripts import MemberScripts
from rsc.client.poller.state import PollerState, Shard
from rsc.client.redis_calls import redis_call
from rsc.events.model import DrainProgress

__all__ = ["Reclaimer"]

log = logging.getLogger("rsc.client.poller")

#: Entries one reclaim call claims at most, per shard and round.
RECLAIM_COUNT = 100


class Reclaimer:
    """Every `reclaim_every_s`: drain progress and lag, the stall check, and reclaims."""

    def __init__(self, state: PollerState, scripts: MemberScripts, redis: Any) -> None:
        self.state = state
        self.scripts = scripts
        self.redis = redis
        #: Stalls found by the stall check (`stall_after_s`).
        self.stalls = 0
        #: Measure every owned shard's pending and lag (the worker's metrics ask for it;
        #: otherwise only DRAINING shards are measured, for drain reports).
        self.measure_lag = False
        #: Shard index -> (pending, lag) of this member's group, as last measured.
        self.lag: dict[int, tuple[int, int | None]] = {}
        #: The DRAINING shards' progress, as last measured.
        self.drain: dict[int, DrainProgress] = {}

    async def run(self) -> None:
        state = self.state
        while True:
            await trio.sleep(state.settings.reclaim_every_s)
            try:
                await self.measure()
                await self.check_stalls()
            except (RedisUnavailable, RedisCommandFailed) as exc:
                state.health.wait_after(exc)
            try:
                for shard in state.book:
                    if shard.state is ReadState.CLAIMING or shard.stopped:
                        continue
                    try:
                        messages = await self.scripts.reclaim(
                            shard, state.settings.reclaim_idle_ms, RECLAIM_COUNT
                        )
                    except Fenced as exc:
                        state.fenced(shard, exc)
                        continue
                    held = state.held(shard)
                    state.enqueue(shard, [m for m in messages if m.id not in held])
            except (RedisUnavailable, RedisCommandFailed) as exc:
                state.health.wait_after(exc)  # the next round is the retry

    async def check_stalls(self) -> None:
        """The net under any stall of the reading path (a wake-up missed, a read never sent):
        a shard it owns, with entries waiting past what it read and no read for
        `stall_after_s`, is logged, counted, reported (`stalled_shards`: the coordinator
        re-checks its key, consumer group and owner token) and read again. Shards waiting for
        a wake-up are checked only once no read of them succeeded for `stall_after_s`, with
        one XREAD (no block) per bundle: an idle member costs one command per
        `reclaim_every_s` (per hash slot on a cluster).

        Raises `RedisUnavailable` or `RedisCommandFailed` when an XREAD failed."""
        state, book = self.state, self.state.book
        now = trio.current_time()
        late = now - state.settings.stall_after_s
        if not state.lease_valid() or state.health.since is not None:
            return  # not reading on purpose: no lease, or Redis is away (an outage, reported)
        if state.room() < min(state.settings.batch, state.settings.prefetch):
            return  # the reader waits for room in the queue (slow handlers): no stall of its own
        bundles: dict[int, list[Shard]] = {}
        for shard in book:
            bundles.setdefault(shard.bundle, []).append(shard)
        for shards in bundles.values():
            waiting = {
                s.key: s
                for s in shards
                if s.state is ReadState.CAUGHT_UP and s.trouble is None and s.read_at < late
            }
            if waiting:
                with redis_call(f"XREAD {', '.join(waiting)}"):
                    reply = await self.redis.xread({k: s.tail for k, s in waiting.items()}, count=1)
                behind = set(reply or {})
                for key, shard in waiting.items():
                    if key not in behind or shard.state is not ReadState.CAUGHT_UP:
                        book.behind(shard, None)
                    elif shard.behind_since is None:
                        book.behind(shard, now)  # may be an append a wake-up is taking now
                    elif shard.behind_since <= late:
                        self.stall(
                            shard, f"entries past {shard.tail} unread for {now - shard.behind_since:.0f} s"
                        )
        if state.buffered:
            return  # the reader may wait for room in the queue: slow handlers are no stall
        for shard in book:
            to_read = shard.state in (ReadState.CLAIMING, ReadState.READING) and shard.trouble is None
            if to_read and not shard.in_turn and max(shard.read_at, shard.retry_at) < late:
                self.stall(shard, f"to be read and not read for {now - shard.read_at:.0f} s")

    def stall(self, shard: Shard, why: str) -> None:
        log.warning(
            "%s: shard %s stalled: %s; reading it again and asking the coordinator to check its "
            "key, consumer group and owner token",
            self.state.member_id,
            shard.index,
            why,
        )
        self.stalls += 1
        self.state.book.stalled(shard, why)  # reported until a read succeeds
        self.state.poke()
        if shard.home.watch is not None:
            shard.home.watch.touch()

    async def measure(self) -> None:
        """XINFO GROUPS of the DRAINING shards (drain reports), and of every owned shard when
        `measure_lag` (the worker's lag metrics). Raises `RedisUnavailable` or
        `RedisCommandFailed`."""
        progress: dict[int, DrainProgress] = {}
        figures: dict[int, tuple[int, int | None]] = {}
        for shard in self.state.book:
            if not (shard.draining or self.measure_lag):
                continue
            with redis_call(f"XINFO GROUPS {shard.key}"):
                groups = await self.redis.xinfo_groups(shard.key)
            for info in groups:
                if info.get("name") == self.state.group:
                    lag = info.get("lag")
                    pending = int(info.get("pending", 0))  # read, not yet acknowledged
                    figures[shard.index] = (pending, None if lag is None else int(lag))
                    if shard.draining:
                        progress[shard.index] = DrainProgress(shard.index, *figures[shard.index])
        self.drain = progress
        self.lag = figures
