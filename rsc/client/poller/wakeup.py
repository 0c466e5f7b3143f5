"""Waking, not polling: the wake-up reads of caught-up shards, and what a fenced read returned.

A fenced read is a script, and a script cannot block. So once a shard's read caught up, the
shard is not read again until a plain XREAD BLOCK (no side effect, no pending entry: only a
signal) sees an entry past the tail that read returned, on a connection of its own. Entries
appended after the read are past its tail, whenever the XREAD starts: none is missed. The next
fenced read is pipelined right behind the XREAD on that connection, so Redis runs it as soon as
the XREAD returns. One blocked read per bundle (all of a member's shards on a standalone Redis,
one hash slot's on a cluster); revokes, losses and stops end it at once. Polling remains only
where Redis refuses XREAD (`POLL_FALLBACK_S`).

On a standalone Redis reached over TCP (`rsc.resp.Endpoint.of`), each watch blocks on a lean
connection of its own (`rsc.resp.Connection`: hiredis packs and parses, nothing else between
the watch and the socket) rather than on a coredis pipeline: a member woken for every entry of
a trickle pays a wake-up per entry, and coredis' machinery around a pipeline cost more CPU than
the rest of the entry's way together. A connection that failed or was cancelled half read is
closed, never reused; the next wake-up read opens another. Elsewhere (a cluster, a Sentinel's
primary, no hiredis) the wake client's pipeline serves, as before.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import coredis
import trio

from rsc.client.errors import RedisCommandFailed, RedisUnavailable
from rsc.client.poller.book import ReadState
from rsc.client.poller.scripts import MemberScripts, ShardRead
from rsc.client.poller.settings import OUTAGE_OVER_S, POLL_FALLBACK_S, POLL_MAX_S
from rsc.client.poller.state import PollerState, Shard
from rsc.client.redis_calls import redis_call
from rsc.events.slots import key_slot
from rsc.redis_errors import says_demoted
from rsc.resp import Connection, Endpoint, pack, refusal

__all__ = ["Wakeups", "Watch", "block_ms"]

log = logging.getLogger("rsc.client.poller")


class Watch:
    """The wake-up of a bundle of shards that one XREAD may name: all of a member's shards on a
    standalone Redis, those of one hash slot on a cluster (a command's keys share a slot).

    It blocks only once no shard of the bundle is waiting to be read (so the shards it names
    are all it needs to watch), naming each shard with its `tail`.
    """

    def __init__(self, bundle: int) -> None:
        self.bundle = bundle
        self.shards: dict[int, Shard] = {}
        self.changed = trio.Event()
        #: The XREAD in flight (None: none) and the shards it names.
        self.blocking: trio.CancelScope | None = None
        self.blocked_on: frozenset[int] = frozenset()
        self.scope = trio.CancelScope()
        #: Polling instead of blocking until then (trio clock): Redis refused XREAD.
        self.poll_until = -math.inf
        self.poll_sleep = 0.0
        #: Its lean connection (`Wakeups.endpoint`), while one is open.
        self.connection: Connection | None = None

    def touch(self) -> None:
        """Something changed (a shard caught up, failed, came or went): look again."""
        self.changed.set()
        self.changed = trio.Event()


class Wakeups:
    """The watches of one poller: one task per bundle with caught-up shards."""

    def __init__(self, state: PollerState, redis: Any, client: Any, scripts: MemberScripts) -> None:
        self.state = state
        self.redis = redis
        #: The client of the blocking wake-up reads (a Redis client of its own, see `Poller`).
        self.wake_client = client
        self.scripts = scripts
        self.block_ms = block_ms(client, state.settings.wake_block_s)
        self.clustered = isinstance(client, coredis.RedisCluster)
        #: Where the watches' lean connections go (None: the wake client's pipelines serve).
        self.endpoint = Endpoint.of(client)
        self.watches: dict[int, Watch] = {}
        self._polling_logged = -math.inf
        self._nursery: trio.Nursery | None = None

    def bundle_of(self, key: str) -> int:
        """The bundle of a shard key: its hash slot on a cluster, else 0."""
        return key_slot(key) if self.clustered else 0

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        for watch in self.watches.values():  # assigned before it ran
            nursery.start_soon(self.watch, watch)

    def attach(self, shard: Shard) -> None:
        watch = self.watches.get(shard.bundle)
        if watch is None:
            watch = self.watches[shard.bundle] = Watch(shard.bundle)
            if self._nursery is not None:
                self._nursery.start_soon(self.watch, watch)
        watch.shards[shard.index] = shard
        shard.home.watch = watch
        watch.touch()

    def detach(self, shard: Shard) -> None:
        """The shard is no longer read: a wake-up read naming it ends at once."""
        watch, shard.home.watch = shard.home.watch, None
        if not isinstance(watch, Watch) or watch.shards.get(shard.index) is not shard:
            return
        del watch.shards[shard.index]
        if watch.blocking is not None and shard.index in watch.blocked_on:
            watch.blocking.cancel()
        if not watch.shards:
            watch.scope.cancel()
            if self.watches.get(watch.bundle) is watch:
                del self.watches[watch.bundle]
        watch.touch()

    def take(self, reads: Sequence[tuple[Shard, int]], results: Sequence[ShardRead]) -> None:
        """What a fenced read of these shards returned: entries queued, tails noted, refusals."""
        state = self.state
        for (shard, _), result in zip(reads, results, strict=True):
            if result.refused is not None:
                state.refused(shard, result.refused)
                continue
            state.fine(shard)
            state.enqueue(shard, result.messages)
            watch = shard.home.watch
            if result.messages and isinstance(watch, Watch):
                watch.poll_sleep = state.settings.idle_sleep_s
            if result.tail is not None:
                self._caught_up(shard, result.tail)
            elif state.book.read(shard, None) and watch is not None:  # more to read: the reader goes on
                state.poke()
                watch.touch()

    def _caught_up(self, shard: Shard, tail: str) -> None:
        watch = shard.home.watch
        if not self.state.book.holds(shard) or not isinstance(watch, Watch):
            return
        self.state.book.read(shard, tail)
        if watch.blocking is not None and shard.index not in watch.blocked_on:
            watch.blocking.cancel()  # block again, naming this one too (rare: see `_quiet`)
        watch.touch()

    def woken(self, watch: Watch, keys: Any) -> None:
        """Entries wait past the tails of these shards' keys: read them."""
        woken = False
        for shard in list(watch.shards.values()):
            if shard.key in keys and self.state.book.woken(shard):
                woken = True
        if woken:
            self.state.poke()
            watch.touch()

    async def watch(self, watch: Watch) -> None:
        """The wake-up reads of one bundle, for as long as it has shards."""
        try:
            await self._watch(watch)
        finally:
            await self._close(watch)

    async def _watch(self, watch: Watch) -> None:
        state = self.state
        with watch.scope:
            while True:
                tails = await self._quiet(watch)
                if trio.current_time() < watch.poll_until:  # Redis refused XREAD: poll
                    polled = {watch.shards[i].key for i in tails}
                    await trio.sleep(watch.poll_sleep)
                    watch.poll_sleep = min(max(2 * watch.poll_sleep, 0.001), POLL_MAX_S)
                    self.woken(watch, polled)
                    continue
                keys = {watch.shards[i].key: tail for i, tail in tails.items()}
                # During an outage, a shorter block: it returns to say that Redis answers again.
                block = self.block_ms
                if state.health.since is not None:
                    block = min(block, int(OUTAGE_OVER_S * 1000) + 100)
                reads = self._read_behind(watch, tails)
                watch.blocked_on = frozenset(tails)
                woken = read = None
                try:
                    with trio.CancelScope() as watch.blocking:
                        if self.endpoint is not None:
                            woken, read = await self._block_lean(watch, keys, block, reads)
                        else:
                            woken, read = await self._block(keys, block, reads)
                        state.health.ok()
                except (RedisUnavailable, RedisCommandFailed) as exc:
                    await self._wake_failed(watch, exc, set(keys))
                finally:
                    watch.blocking = None
                    watch.blocked_on = frozenset()
                if read is not None:
                    self.take(reads, self.scripts.read_results(reads, read))
                    await state.let_workers_start()
                elif woken:
                    self.woken(watch, woken)

    def _read_behind(self, watch: Watch, tails: dict[int, str]) -> list[tuple[Shard, int]]:
        """The fenced read to send right behind a wake-up read, on its connection: Redis runs
        it as soon as the XREAD returns, which saves a round trip. None without a valid lease
        or room in the queue (the reader reads the shards then, once woken)."""
        room = self.state.room()
        if not self.state.lease_valid() or room <= 0:
            return []
        count = min(self.state.settings.batch, max(1, room // len(tails)))
        return [(watch.shards[i], count) for i in tails]

    async def _block(
        self, streams: dict[str, str], block: int, reads: list[tuple[Shard, int]]
    ) -> tuple[Any, Any]:
        """XREAD BLOCK on `streams` (the keys with entries past their tails; nothing after
        `block` ms), and `read` of `reads` right behind it (its reply; None if it failed)."""
        with redis_call(f"XREAD BLOCK {', '.join(streams)}"):
            if not reads:
                return await self.wake_client.xread(streams, count=1, block=block), None
            keys, args = self.scripts.read_arguments(reads, known_tails=True)
            async with self.wake_client.pipeline(transaction=False, raise_on_error=False) as pipe:
                pipe.xread(streams, count=1, block=block)
                pipe.evalsha(self.scripts.read_sha, keys=keys, args=args)
            woken, read = pipe.results or (None, None)
            if isinstance(woken, BaseException):
                raise woken
        # A failed read (NOSCRIPT after a restart...): the reader reads them, with the script.
        return woken, None if isinstance(read, BaseException) else read

    async def _block_lean(
        self, watch: Watch, streams: dict[str, str], block: int, reads: list[tuple[Shard, int]]
    ) -> tuple[Any, Any]:
        """`_block` on the watch's lean connection: the XREAD and the read behind it in one
        write; the keys the XREAD saw entries of (None: it timed out), and the read's reply."""
        assert self.endpoint is not None
        commands: list[tuple[Any, ...]] = [
            ("XREAD", "COUNT", 1, "BLOCK", block, "STREAMS", *streams, *streams.values())
        ]
        if reads:
            keys, args = self.scripts.read_arguments(reads, known_tails=True)
            commands.append(("EVALSHA", self.scripts.read_sha, len(keys), *keys, *args))
        with redis_call(f"XREAD BLOCK {', '.join(streams)}"):
            connection = watch.connection
            try:
                if connection is None:
                    connection = watch.connection = await Connection.open(self.endpoint)
                await connection.send(pack(commands))
                replies = await connection.replies(len(commands), self.endpoint.command_timeout)
            except BaseException:
                await self._close(watch)  # failed or cancelled half read: never reused
                raise
            woken = refusal(replies[0])
            read = refusal(replies[1]) if reads else None
            if says_demoted(woken) or says_demoted(read):
                # The Redis at this address turned replica (a failover behind a virtual IP):
                # the next wake-up read connects again, to whatever the address reaches now.
                await self._close(watch)
            if isinstance(woken, Exception):
                raise woken
        # A failed read (NOSCRIPT after a restart...): the reader reads them, with the script.
        return (None if woken is None else {entry[0] for entry in woken}), (
            None if isinstance(read, Exception) else read
        )

    async def _close(self, watch: Watch) -> None:
        connection, watch.connection = watch.connection, None
        if connection is not None:
            await trio.aclose_forcefully(connection.stream)

    async def _quiet(self, watch: Watch) -> dict[int, str]:
        """Wait until no shard of the bundle is to be read now and one has caught up; their tails.

        While the reader reads some shards of the bundle, the others are checked after each of
        its rounds instead (`probe`), so a wake-up read rarely has to start again to name a
        shard that caught up while it blocked (only one whose failed read is retried later).
        """
        while True:
            now = trio.current_time()
            tails = {i: s.tail for i, s in watch.shards.items() if s.tail is not None}
            if tails and not any(self.state.book.readable(s, now) for s in watch.shards.values()):
                return tails
            await watch.changed.wait()

    async def _wake_failed(
        self, watch: Watch, exc: RedisUnavailable | RedisCommandFailed, keys: set[str]
    ) -> None:
        """A wake-up read failed. Unavailable: back off, then read the shards again (their
        reads back off too while Redis is away). Refused: poll them for `POLL_FALLBACK_S`."""
        if isinstance(exc, RedisCommandFailed) and exc.code != "UNBLOCKED":  # UNBLOCKED: a failover
            now = trio.current_time()
            if now - self._polling_logged >= POLL_FALLBACK_S:
                self._polling_logged = now
                log.warning(
                    "%s: Redis refused XREAD, polling instead for a while: %s", self.state.member_id, exc
                )
            watch.poll_until = now + POLL_FALLBACK_S
            watch.poll_sleep = self.state.settings.idle_sleep_s
        else:
            await trio.sleep(self.state.health.wait_after(exc))
        self.woken(watch, keys)

    async def probe(self) -> None:
        """After a round of reads: in each bundle that is not blocked because some of its shards
        are still to be read, check the caught-up ones for new entries (one plain XREAD)."""
        for watch in list(self.watches.values()):
            if watch.blocking is not None:
                continue
            now = trio.current_time()
            shards = list(watch.shards.values())
            if not any(self.state.book.readable(s, now) for s in shards):
                continue
            keys = {s.key: s.tail for s in shards if s.state is ReadState.CAUGHT_UP}
            if not keys:
                continue
            try:
                with redis_call(f"XREAD {', '.join(keys)}"):
                    reply = await self.redis.xread(keys, count=1)
            except (RedisUnavailable, RedisCommandFailed) as exc:
                self.state.health.wait_after(exc)
                reply = keys  # cannot tell: read them all
            self.woken(watch, reply or {})


def block_ms(client: Any, wanted_s: float) -> int:
    """How long a wake-up read on `client` may block: `wanted_s`, but short of its command
    timeout by half of it, or by 5 s (a longer block would time out as if Redis did not answer)."""
    pool = getattr(client, "connection_pool", None)
    timeout = getattr(pool, "connection_kwargs", {}).get("stream_timeout")
    if timeout:
        wanted_s = min(wanted_s, timeout - min(timeout / 2, 5.0))
    return max(1, int(wanted_s * 1000))
