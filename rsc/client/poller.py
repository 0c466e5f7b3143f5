"""The built-in poller: a `ShardLifecycle` that reads a member's shards and runs a handler.

* Exclusive: a handler call for a shard starts only while the member holds the
  shard *and* its lease is known to be valid at that instant (`renewed`: the send
  time of the last successful heartbeat plus the lease, minus the safety margin,
  on the monotonic clock). It is checked before every handler call, and a call
  still running when the lease ends is cancelled (its entry stays pending and is
  handled again). After a pause longer than the lease (SIGSTOP, a blocked event
  loop), nothing queued runs until a heartbeat has confirmed the assignment.
* Ordered through handoffs: a revoke first stops reading the shard, drops its
  queue and starts nothing more of it; the handler in flight finishes (up to
  `revoke_timeout_s`), its acknowledgement is flushed, and only then is the revoke
  acknowledged. Entries read but not handled stay pending in Redis, where the next
  owner claims them first, in id order, before reading new ones.
* Survives Redis outages: every Redis call goes through `rsc.client.redis_calls`;
  the reader, acker and reclaimer back off with jitter and retry, acknowledgements
  are kept until Redis takes them, and an outage is logged once when it starts and
  once when it ends.

* Fair: owned shards are read round robin, `batch` entries at a time, and at
  most `prefetch` entries wait in memory, so a busy shard never starves the
  others.
* Woken, not polling: a shard whose fenced read caught up is not read again until
  a plain `XREAD BLOCK` (a signal only: no side effect, no pending entry), on a
  client of its own, sees an entry past the last id that read returned (so no
  entry appended meanwhile is missed); the next fenced read is pipelined right
  behind it on that connection, so Redis runs it as soon as the XREAD returns.
  One blocked read per member on a standalone Redis, one per hash slot on a
  cluster; revokes, losses and stops end it at once. An idle member sends one
  XREAD (and the read behind it) per blocked read and `wake_block_s`, and the
  reclaimer's script per shard and `reclaim_every_s`. It polls only where Redis
  refuses XREAD (`POLL_FALLBACK_S`). The shards of a group (all on a
  standalone Redis, one slot's on a cluster) are read, and acknowledged, in
  one call.
* `max_concurrency` workers (from the coordinator, resized live) run the
  handler; entries of one shard are handled in order, one at a time.
* Fenced: every read, claim and acknowledgement goes through a script that
  first checks the shard's owner token (PROTOCOL section 4); a fenced member
  cannot acknowledge what a new owner has claimed. A refusal means the shard
  is no longer this member's: it is dropped at once.
* At-least-once: an entry is acknowledged only after the handler returned.
  A failed entry stays pending in Redis and is handled again `retry_after_ms`
  later; after `max_deliveries` deliveries it is moved to the dead-letter
  stream `<shard key>:dlq` (same hash slot) and acknowledged, atomically.
* Takeover: a newly assigned shard first claims what earlier owners read but
  never acknowledged (XAUTOCLAIM), then reads new entries; from time to time
  entries left idle (`reclaim_idle_ms`) under *other* consumer names are
  claimed too (never this consumer's own: they may still wait in its queue).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import coredis
import trio

from rsc.client.coordinator import Backoff
from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.redis_calls import redis_call
from rsc.connect import reply_code
from rsc.events.model import DrainProgress, Layout, ShardState
from rsc.events.slots import key_slot
from rsc.events.wire import dead_letter_key, owner_key
from rsc.outage import OutageLog

log = logging.getLogger("rsc.client.poller")

_CHECK = """
local token = redis.call('HGET', KEYS[2], ARGV[1])
if not token then return redis.error_reply('FENCED no owner') end
local t = cjson.decode(token)
if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
  return redis.error_reply('FENCED owned by another member')
end
"""
# The scripts that read and acknowledge take several shards at once (one round trip for all the
# shards of a member on a standalone Redis; on a cluster, those of one hash slot), each checked
# against its own owner token: one reply per shard, whose refusal ('FENCED ...', or the error of
# a command that failed there) concerns that shard only.
_PER_SHARD = """
local function refused(owners)
  local token = redis.call('HGET', owners, ARGV[1])
  if not token then return 'FENCED no owner' end
  local t = cjson.decode(token)
  if t['memberId'] ~= ARGV[2] or t['incarnation'] ~= ARGV[3] then
    return 'FENCED owned by another member'
  end
  return false
end
local function failure(e)
  return type(e) == 'table' and e.err or tostring(e)
end
"""
# KEYS: shard, owners, shard, owners...; ARGV: group, member, incarnation, consumer, then per
# shard: count, highest id received, known tail ('' if none). Returns per shard {refusal or '',
# entries, tail}; a shard whose last entry is still its known tail is not read at all (nothing
# was appended since a read caught up: the read sent behind a wake-up read that timed out).
# Idempotent: entries a read delivered but whose reply was lost (a timeout, a dropped connection)
# are pending under this consumer past the highest id it received: they come first (from its
# own history), so nothing stays pending unseen. Normally that history is empty.
# `tail` is the id of the stream's last entry ('0-0' when it has none) when the read caught up
# (fewer than `count` new entries: every entry up to `tail` has been delivered to the group),
# else ''. A wake-up XREAD blocks from `tail`: read in the same atomic script as the entries,
# so nothing appended after the read can slip past it.
READ = (
    _PER_SHARD
    + """
local function read_shard(key, count, from)
  local function read(id)
    return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[4], 'COUNT', count, 'STREAMS', key, id)
  end
  while true do
    local unseen = read(from)
    if not unseen or not unseen[1] or #unseen[1][2] == 0 then break end
    local live = {}
    for _, e in ipairs(unseen[1][2]) do
      -- an entry deleted since (XDEL, trimming) has no fields: nothing to hand out
      if e[2] then live[#live + 1] = e else redis.call('XACK', key, ARGV[1], e[1]) end
      from = e[1]
    end
    if #live > 0 then return {'', live, ''} end
  end
  local new = read('>')
  local entries = new and new[1] and new[1][2] or {}
  if #entries < count then
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    return {'', entries, last[1] and last[1][1] or '0-0'}
  end
  return {'', entries, ''}
end
local out = {}
for i = 1, #KEYS / 2 do
  local known = ARGV[3 * i + 4]
  local ok, reply = pcall(function()
    if known ~= '' then
      local last = redis.call('XREVRANGE', KEYS[2 * i - 1], '+', '-', 'COUNT', 1)
      if (last[1] and last[1][1] or '0-0') == known then return {'', {}, known} end
    end
    local why = refused(KEYS[2 * i])
    if why then return {why, {}, ''} end
    return read_shard(KEYS[2 * i - 1], tonumber(ARGV[3 * i + 2]), ARGV[3 * i + 3])
  end)
  out[i] = ok and reply or {failure(reply), {}, ''}
end
return out
"""
)
# Claims never count as deliveries (JUSTID): an entry that waited in a queue and was never handed
# to a handler is not one delivery closer to the dead-letter stream. `START` counts, when a
# handler actually starts on a redelivered entry.
_ENTRIES = """
local function entries(ids)
  local out = {}
  for _, id in ipairs(ids) do
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e > 0 then
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
      out[#out + 1] = {id, e[1][2], p[1] and p[1][4] or 1}
    end
  end
  return out
end
"""
# KEYS: shard, owners; ARGV: group, member, incarnation, consumer, min idle ms, count, cursor
CLAIM = (
    _CHECK
    + _ENTRIES
    + """
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[4], ARGV[5], ARGV[7], 'COUNT', ARGV[6], 'JUSTID')
return {r[1], entries(r[2])}
"""
)
# Entries idle for `min idle ms`, under other consumer names (a member gone) and under this
# consumer's own (claimed to it by a call whose reply was lost, e.g. a reclaim's: below what it
# has read, no read brings them back); the caller drops those it holds itself (queued, being
# handled, retried later, to acknowledge). Claiming its own resets their idle time.
# KEYS: shard, owners; ARGV: group, member, incarnation, consumer, min idle ms, count
# The owner token is checked once there is something to claim: a round with nothing idle (an
# idle member's every round) costs one command besides the script.
RECLAIM = (
    _ENTRIES
    + """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[5], '-', '+', ARGV[6])
local ids = {}
for _, p in ipairs(pending) do ids[#ids + 1] = p[1] end
if #ids == 0 then return {} end
"""
    + _CHECK
    + """
local args = {KEYS[1], ARGV[1], ARGV[4], ARGV[5]}
for _, id in ipairs(ids) do args[#args + 1] = id end
args[#args + 1] = 'JUSTID'
return entries(redis.call('XCLAIM', unpack(args)))
"""
)
# A handler starts on a redelivered entry: count the delivery (XCLAIM to itself increments it).
# Returns the delivery count, or 0 when the entry is no longer pending here.
# KEYS: shard, owners; ARGV: group, member, incarnation, consumer, id
START = (
    _CHECK
    + """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[5], ARGV[5], 1)
if #p == 0 or p[1][2] ~= ARGV[4] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[4], 0, ARGV[5], 'RETRYCOUNT', p[1][4] + 1, 'JUSTID')
return p[1][4] + 1
"""
)
# KEYS: shard, owners, shard, owners...; ARGV: group, member, incarnation, then per shard the
# number of its ids, then the ids. Returns per shard the number acknowledged, or its refusal.
ACK = (
    _PER_SHARD
    + """
local out = {}
local at = 4 + #KEYS / 2
for i = 1, #KEYS / 2 do
  local n = tonumber(ARGV[3 + i])
  local first = at
  at = at + n
  local ok, reply = pcall(function()
    local why = refused(KEYS[2 * i])
    if why then return why end
    return redis.call('XACK', KEYS[2 * i - 1], ARGV[1], unpack(ARGV, first, first + n - 1))
  end)
  out[i] = ok and reply or failure(reply)
end
return out
"""
)
# KEYS: shard, owners, dead letters; ARGV: group, member, incarnation, id, deliveries, field/value...
# Idempotent: an entry no longer pending (a retry after a lost reply) is not dead-lettered twice.
DEAD = (
    _CHECK
    + """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[4], ARGV[4], 1) == 0 then return 0 end
redis.call('XADD', KEYS[3], '*', 'rscSourceId', ARGV[4], 'rscDeliveries', ARGV[5], unpack(ARGV, 6))
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[4])
"""
)


__all__ = ["Fenced", "Handler", "Message", "Poller", "PollerSettings", "RedisHealth"]


@attrs.define
class Message:
    shard: int
    key: str
    id: str
    fields: Mapping[str, str]
    #: How many times a handler has started on it, this time included (at most one more when
    #: a process stopped between reading and handling it); > `max_deliveries`: dead-lettered.
    deliveries: int = 1
    #: The member that read it (`<pod ip>/<listener>/<index>` under `rsc worker`).
    member_id: str = ""
    #: Handed out before (a retry, or pending under an earlier owner): maybe already handled.
    redelivered: bool = False


Handler = Callable[[Message], Awaitable[None]]


#: Retries of failed Redis calls: exponential from 50 ms to 2 s, with jitter.
REDIS_BACKOFF = Backoff(base_s=0.05, cap_s=2.0)
#: A command Redis refused (`NOGROUP`, `NOPERM`...) is tried again no sooner than this.
REFUSAL_RETRY_S = 0.5
#: An outage is over once no Redis call failed for this long (longer than the backoff's cap).
OUTAGE_OVER_S = 3.0
#: Acknowledgements per XACK call (a script cannot unpack many thousands of arguments).
ACK_CHUNK = 1_000
#: After Redis refused a wake-up read (no XREAD permission, a proxy without blocking commands),
#: the shards it names are polled for this long before blocking is tried again.
POLL_FALLBACK_S = 60.0
#: The longest pause between two polls of the fallback (from `idle_sleep_s`, doubling).
POLL_MAX_S = 0.2


@attrs.frozen
class PollerSettings:
    batch: int = 100
    prefetch: int = 1_000
    #: Entries one worker handles from a shard before moving on to the next ready shard.
    turn: int = 20
    #: How long one wake-up read (XREAD BLOCK) waits in Redis before it is sent again: an idle
    #: member costs one command per this many seconds per blocked connection. Capped below the
    #: command timeout of the client that sends it (see `_block_ms`).
    wake_block_s: float = 10.0
    #: Only where blocking cannot serve (Redis refused XREAD): the first pause of the polling
    #: fallback, doubling up to 0.2 s.
    idle_sleep_s: float = 0.05
    #: A failed entry is handled again this much later (it stays pending meanwhile).
    retry_after_ms: int = 1_000
    max_deliveries: int = 5
    #: How often to claim entries idle for `reclaim_idle_ms` under other consumer names.
    reclaim_every_s: float = 5.0
    reclaim_idle_ms: int = 30_000
    #: A shard it owns whose key holds entries past what it last read, unread for this long
    #: (about a member lease) while nothing else explains it, is a stall: logged, counted,
    #: reported to the coordinator (which re-checks its key, consumer group and owner token)
    #: and read again. Checked every `reclaim_every_s`.
    stall_after_s: float = 10.0
    ack_every_s: float = 0.005
    revoke_timeout_s: float = 30.0
    #: Retries of Redis calls that failed (an outage, a refusal) wait up to this long (with jitter).
    redis_backoff: Backoff = REDIS_BACKOFF


class _Shard:
    def __init__(self, index: int, key: str) -> None:
        self.index = index
        self.key = key
        self.queue: collections.deque[Message] = collections.deque()
        self.busy = False
        self.claimed_backlog = False
        self.claim_cursor = "0-0"
        #: The highest entry id read or claimed (the ids after it that are pending here are unseen).
        self.last_read = "0-0"
        self.draining = False
        self.acks: list[str] = []
        #: One acknowledgement call at a time: a revoke waits for the one in flight.
        self.ack_lock = trio.Lock()
        #: After a failed read, the shard is read again no sooner than this (trio clock).
        self.retry_at = -math.inf
        self.handling: Message | None = None
        self.idle = trio.Event()
        self.idle.set()
        self.scope = trio.CancelScope()
        #: A revoke began or the shard was lost: nothing more is read, queued or started.
        self.stopping = False
        #: None: to be read (new entries may wait). Else the stream's last id when a fenced read
        #: caught up: nothing to read until a wake-up read sees an entry past it.
        self.tail: str | None = None
        self.watch: _Watch | None = None
        #: Shards of one group are read (and acknowledged) together: all on a standalone Redis,
        #: those of one hash slot on a cluster.
        self.group = 0
        #: Why it cannot be read now (its owner token, consumer group or key is gone: Redis lost
        #: data), reported to the coordinator until a read succeeds; None: fine.
        self.trouble: str | None = None
        #: Ids whose acknowledgement is in flight (`_flush`).
        self.acking: set[str] = set()
        #: Ids handled and failed, to be queued again (`_retry_later`).
        self.retrying: set[str] = set()
        #: When a read or claim of it last succeeded (trio clock).
        self.read_at = trio.current_time()
        #: Since when the stall check has seen entries past its tail while it waited to be
        #: woken (None: not seen, or read since).
        self.behind_since: float | None = None


class _Watch:
    """The wake-up of a group of shards that one XREAD may name: all of a member's shards on a
    standalone Redis, those of one hash slot on a cluster (a command's keys share a slot).

    It blocks only once no shard of the group is waiting to be read (so the shards it names
    are all it needs to watch), naming each shard with its `tail`.
    """

    def __init__(self, group: int) -> None:
        self.group = group
        self.shards: dict[int, _Shard] = {}
        self.changed = trio.Event()
        #: The XREAD in flight (None: none) and the shards it names.
        self.blocking: trio.CancelScope | None = None
        self.blocked_on: frozenset[int] = frozenset()
        self.scope = trio.CancelScope()
        #: Polling instead of blocking until then (trio clock): Redis refused XREAD.
        self.poll_until = -math.inf
        self.poll_sleep = 0.0

    def touch(self) -> None:
        """Something changed (a shard caught up, failed, came or went): look again."""
        self.changed.set()
        self.changed = trio.Event()


class _Slot:
    """One handler worker; a retired one ends between two handler calls."""

    def __init__(self) -> None:
        self.retired = False


class RedisHealth:
    """Redis outages as pollers see them: one log line when one starts, one when it ends
    (`rsc.outage.OutageLog`: with how long it lasted and how many failures were not logged).

    The pollers of one process share one (`App` does), so an outage is one line, not one
    per member.
    """

    def __init__(self, name: str, backoff: Backoff = REDIS_BACKOFF) -> None:
        self.name = name
        self.backoff = backoff
        self.failures = 0
        self.outage = OutageLog(log, f"{name}: Redis", settle_s=OUTAGE_OVER_S, clock=trio.current_time)
        self._refused: dict[str, float] = {}
        self._rng = random.Random()

    @property
    def since(self) -> float | None:
        """When the outage under way began, or None."""
        return self.outage.since

    @property
    def outages(self) -> int:
        return self.outage.outages

    def failed(self, exc: Exception) -> float:
        """Note a failed Redis call; returns how long to wait before the next try."""
        self.failures += 1
        if isinstance(exc, RedisUnavailable):
            self.outage.failed(exc)
        else:  # a refusal, maybe of one shard only: logged once per distinct message and minute
            now = trio.current_time()
            if self._refused.get(str(exc), -math.inf) < now - 60:
                if len(self._refused) > 100:
                    self._refused.clear()
                self._refused[str(exc)] = now
                log.error("%s: Redis refused a command, retrying: %s", self.name, exc)
            return max(REFUSAL_RETRY_S, self.delay())
        return self.delay()

    def delay(self) -> float:
        """How long to wait before trying again (exponential, with jitter)."""
        return self.backoff.delay(min(self.failures, 16), self._rng)

    def ok(self) -> None:
        """A Redis call succeeded. An outage ends when none failed for `OUTAGE_OVER_S` (in a
        partial one, say one cluster node down, calls to the others go on succeeding)."""
        self.outage.ok()
        if self.outage.since is None:
            self.failures = 0


class Poller:
    """Reads the shards a member owns and hands their entries to `handler` (see the module doc)."""

    def __init__(
        self,
        redis: Any,
        group: str,
        member_id: str,
        incarnation: str,
        handler: Handler,
        settings: PollerSettings = PollerSettings(),
        health: RedisHealth | None = None,
        wakeups: Any = None,
    ) -> None:
        self.redis = redis
        #: The client of the blocking wake-up reads: give one of its own (`App` does), whose
        #: command timeout exceeds `wake_block_s`, so that blocked connections never hold up
        #: the others; by default `redis` (the block is then capped below its command timeout).
        self.wakeups = redis if wakeups is None else wakeups
        self.wake_block_ms = _block_ms(self.wakeups, settings.wake_block_s)
        self._clustered = isinstance(self.wakeups, coredis.RedisCluster)
        self._watches: dict[int, _Watch] = {}
        #: The reader waits for room in the queue: the workers wake it when there is.
        self._room_wanted = False
        self._rotation = 0
        self._idle_workers = 0
        self._acks_waiting = trio.Event()
        self._polling_logged = -math.inf
        self.group = group
        self.member_id = member_id
        self.incarnation = incarnation
        self.handler = handler
        self.settings = settings
        self.shards: dict[int, _Shard] = {}
        self.ready: collections.deque[_Shard] = collections.deque()
        self.workers = 1
        self.buffered = 0
        self.handled = 0
        self.failed = 0
        #: Handler calls for entries delivered before (a retry after a failure, or a crash).
        self.retried = 0
        self.dead_lettered = 0
        #: Measure every owned shard's pending and lag each `reclaim_every_s` (the worker's
        #: metrics ask for it; otherwise only DRAINING shards are measured, for drain reports).
        self.measure_lag = False
        #: Shard index -> (pending, lag) of this member's group, as last measured.
        self.lag: dict[int, tuple[int, int | None]] = {}
        #: Told how long each handler call took, in seconds (the worker's metrics).
        self.observe_handler: Callable[[float], None] | None = None
        #: Handler calls cancelled because the lease ended while they ran.
        self.cut_by_lease = 0
        #: Stalls found by the stall check (`stall_after_s`).
        self.stalls = 0
        #: Until when the member's shards are known to be its own (trio clock; see `renewed`).
        self.lease_until = -math.inf
        self.health = health or RedisHealth(member_id, settings.redis_backoff)
        self._wake = trio.Event()
        self._work: trio.Event | None = None
        self._lease_renewed = trio.Event()
        self._drain: dict[int, DrainProgress] = {}
        self._read = redis.register_script(READ)
        self._claim = redis.register_script(CLAIM)
        self._reclaim = redis.register_script(RECLAIM)
        self._ack = redis.register_script(ACK)
        self._dead = redis.register_script(DEAD)
        self._start = redis.register_script(START)
        self._nursery: trio.Nursery | None = None
        self._worker_slots: list[_Slot] = []

    # --- running ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._reader)
            nursery.start_soon(self._acker)
            nursery.start_soon(self._reclaimer)
            for watch in self._watches.values():  # assigned before it ran
                nursery.start_soon(self._watch, watch)
            self._resize(self.workers)
            task_status.started()

    # --- ShardLifecycle -------------------------------------------------

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        by_index = {s.index: s for s in layout.shards}
        for index in shards:
            shard = _Shard(index, by_index[index].key)
            shard.draining = by_index[index].state is ShardState.DRAINING
            self.shards[index] = shard
            self._attach(shard)
        self._poke()

    async def revoke(self, shards: frozenset[int]) -> None:
        """Stop reading first, start nothing more, let the handler in flight finish (bounded),
        flush the acknowledgements, forget the shards."""
        gone = [self.shards[i] for i in shards if i in self.shards]
        for shard in gone:
            shard.stopping = True
            self._detach(shard)  # its wake-up read ends now
            self._drop_queue(shard)
        deadline = trio.current_time() + self.settings.revoke_timeout_s
        with trio.move_on_at(deadline):
            for shard in gone:
                await shard.idle.wait()
        for shard in gone:
            shard.scope.cancel()  # only if it overran the revoke timeout
            # A handler that ignores the cancellation (a thread, a shield) still holds the
            # shard: the revoke is not acknowledged before it ends, however long that takes
            # (past the group's revoke timeout the coordinator fences this member).
            await shard.idle.wait()
            with trio.move_on_at(max(deadline, trio.current_time() + 1.0)):
                while self.shards.get(shard.index) is shard and not await self._flush([shard]):
                    await trio.sleep(self.health.delay())
            if self.shards.get(shard.index) is shard:
                del self.shards[shard.index]

    async def lost(self, shards: frozenset[int]) -> None:
        """Stop at once: cancel in-flight handlers; pending acks are dropped (someone else owns it)."""
        for index in shards:
            shard = self.shards.pop(index, None)
            if shard is not None:
                shard.stopping = True
                self._detach(shard)
                self._drop_queue(shard)
                shard.scope.cancel()
                shard.acks.clear()

    async def concurrency(self, workers: int) -> None:
        self._resize(workers)

    def stalled_shards(self) -> frozenset[int]:
        """Shards it holds but cannot read: their owner token, consumer group or key is gone
        (Redis lost data). Reported in each heartbeat; the coordinator recreates what is
        missing, and the reads, tried again meanwhile, go on by themselves."""
        return frozenset(s.index for s in self.shards.values() if s.trouble is not None and not s.stopping)

    def drain_progress(self) -> Sequence[DrainProgress]:
        """Pending count and lag of each DRAINING shard this member reads (refreshed by the reclaimer)."""
        return tuple(self._drain.values())

    def renewed(self, until: float) -> None:
        """The member's shards are its own until `until`: handler calls may start before it,
        and a call still running then is cancelled."""
        self.lease_until = until
        for shard in self.shards.values():
            if shard.busy:
                shard.scope.deadline = until
        if self._lease_valid():
            self._lease_renewed.set()
            self._lease_renewed = trio.Event()

    def _lease_valid(self) -> bool:
        return trio.current_time() < self.lease_until

    async def _until_lease_valid(self) -> None:
        while not self._lease_valid():
            await self._lease_renewed.wait()

    # --- reading ----------------------------------------------------------

    async def _reader(self) -> None:
        """Reads the shards that may have entries (`tail` None: assigned, woken, or not caught
        up), round robin, `batch` at a time, all at once (one round trip); when none may, waits
        to be woken (see `_watch`)."""
        while True:
            await self._until_lease_valid()
            room = self.settings.prefetch - self.buffered
            now = trio.current_time()
            reads: list[tuple[_Shard, int]] = []
            shards = list(self.shards.values())
            self._rotation = (self._rotation + 1) % max(1, len(shards))  # the first served varies
            for shard in shards[self._rotation :] + shards[: self._rotation]:
                if room <= 0:
                    break
                if _to_read(shard, now):
                    reads.append((shard, min(room, self.settings.batch)))
                    room -= reads[-1][1]
            if not reads:
                await self._idle()
                continue
            # Shards taken over claim their backlog first, one by one; the others of a group
            # are read together, in one call.
            calls: list[tuple[Any, ...]] = [
                (self._claim_backlog, s, n) for s, n in reads if not s.claimed_backlog
            ]
            groups: dict[int, list[tuple[_Shard, int]]] = {}
            for shard, count in reads:
                if shard.claimed_backlog:
                    groups.setdefault(shard.group, []).append((shard, count))
            calls += [(self._read_group, group) for group in groups.values()]
            await _together(calls)
            await self._let_workers_start()
            await self._probe()

    async def _idle(self) -> None:
        """Nothing to read now: wait for a poke (a wake-up read saw entries, a shard came, room
        in the queue, a lease) or for the next retry of a failed read."""
        retry = math.inf
        if self.buffered >= self.settings.prefetch:
            self._room_wanted = True  # the workers wake it (`_freed`)
        else:
            now = trio.current_time()
            retry = min(
                (s.retry_at for s in self.shards.values() if s.tail is None and s.retry_at > now),
                default=math.inf,
            )
        with trio.move_on_at(retry):
            await self._wake.wait()
        self._wake = trio.Event()

    async def _claim_backlog(self, shard: _Shard, count: int) -> None:
        """What earlier owners read but never acknowledged, `count` at a time, before new entries."""
        if shard.stopping:  # revoked or lost since the round began: nothing more is read
            return
        try:
            messages, cursor = await self._claim_entries(shard, 0, count, shard.claim_cursor)
        except Fenced as exc:
            await self._fenced(shard, exc)
            return
        except (RedisUnavailable, RedisCommandFailed) as exc:
            self._read_failed(shard, self.health.failed(exc))
            return
        self.health.ok()
        self._fine(shard)
        shard.claim_cursor = cursor
        shard.claimed_backlog = cursor == "0-0"
        self._enqueue(shard, messages)

    async def _read_group(self, reads: list[tuple[_Shard, int]]) -> None:
        """New entries of several shards of one group, in one fenced read (`READ`)."""
        reads = [(shard, count) for shard, count in reads if not shard.stopping]
        if not reads:
            return
        keys, args = self._read_arguments(reads)
        try:
            with redis_call(f"reading {', '.join(shard.key for shard, _ in reads)}"):
                reply = await self._read(keys=keys, args=args)
        except (RedisUnavailable, RedisCommandFailed) as exc:
            delay = self.health.failed(exc)
            for shard, _ in reads:
                self._read_failed(shard, delay)
            return
        self.health.ok()
        await self._take(reads, reply)

    def _read_arguments(
        self, reads: list[tuple[_Shard, int]], known_tails: bool = False
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of `READ` (with the shards' tails when `known_tails`)."""
        keys = [key for shard, _ in reads for key in (shard.key, owner_key(shard.key))]
        per_shard = [
            x
            for shard, count in reads
            for x in (count, shard.last_read, (shard.tail or "") if known_tails else "")
        ]
        return keys, [self.group, self.member_id, self.incarnation, self.member_id, *per_shard]

    async def _take(self, reads: list[tuple[_Shard, int]], reply: Any) -> None:
        """What a `READ` of these shards returned: entries queued, tails noted, refusals."""
        for (shard, _), (refusal, entries, tail) in zip(reads, reply, strict=True):
            if refusal:
                await self._refused(shard, str(refusal))
                continue
            self._fine(shard)
            messages = [
                Message(shard.index, shard.key, e[0], _pairs(e[1]), 1, self.member_id) for e in entries or []
            ]
            self._enqueue(shard, messages)
            if messages and shard.watch is not None:
                shard.watch.poll_sleep = self.settings.idle_sleep_s
            if tail:
                self._caught_up(shard, str(tail))
            elif shard.tail is not None and shard.watch is not None:  # more to read: the reader goes on
                shard.tail = None
                self._poke()
                shard.watch.touch()

    def _read_failed(self, shard: _Shard, delay: float) -> None:
        """The shard is read again (by the reader) no sooner than `delay` from now."""
        shard.tail = None
        shard.retry_at = trio.current_time() + delay
        self._wake.set()  # the reader sets its timer by it
        if shard.watch is not None:
            shard.watch.touch()  # the others of its group can be watched meanwhile

    async def _refused(self, shard: _Shard, refusal: str) -> None:
        """A fenced script refused this shard (`FENCED`: it is not ours), or a command failed there."""
        code = reply_code(refusal)
        if code == "FENCED":
            await self._fenced(shard, Fenced(refusal, code))
        elif code == "NOGROUP":
            self._stalled(shard, f"its consumer group or key is gone ({refusal})")
        else:
            self._read_failed(
                shard, self.health.failed(RedisCommandFailed(f"shard {shard.key}: {refusal}", code))
            )

    def _stalled(self, shard: _Shard, why: str) -> None:
        """The shard cannot be read for want of what only the coordinator makes (its owner token,
        consumer group or key: Redis lost them). Keep it, tell the coordinator (`stalled_shards`)
        and try again soon; never recreate them here."""
        if shard.trouble is None:
            log.warning(
                "%s: shard %s cannot be read: %s; telling the coordinator, which recreates what is "
                "missing if the shard is still this member's (Redis lost data), or takes it away "
                "(another member or process has it now)",
                self.member_id,
                shard.index,
                why,
            )
        shard.trouble = why
        self._read_failed(shard, REFUSAL_RETRY_S)

    def _fine(self, shard: _Shard) -> None:
        """A read or claim of the shard succeeded."""
        shard.read_at = trio.current_time()
        shard.behind_since = None
        if shard.trouble is not None:
            log.info("%s: shard %s is read again", self.member_id, shard.index)
            shard.trouble = None

    # --- waking -------------------------------------------------------------
    #
    # A fenced read is a script, and a script cannot block. So once a shard's read caught up,
    # the shard is not read again until a plain XREAD BLOCK (no side effect, no pending entry:
    # only a signal) sees an entry past the tail that read returned, on a connection of its own.
    # Entries appended after the read are past its tail, whenever the XREAD starts: none is
    # missed. Polling remains only where Redis refuses XREAD (`POLL_FALLBACK_S`).

    def _attach(self, shard: _Shard) -> None:
        shard.group = group = key_slot(shard.key) if self._clustered else 0
        watch = self._watches.get(group)
        if watch is None:
            watch = self._watches[group] = _Watch(group)
            if self._nursery is not None:
                self._nursery.start_soon(self._watch, watch)
        watch.shards[shard.index] = shard
        shard.watch = watch
        watch.touch()

    def _detach(self, shard: _Shard) -> None:
        """The shard is no longer read: a wake-up read naming it ends at once."""
        watch, shard.watch = shard.watch, None
        if watch is None or watch.shards.get(shard.index) is not shard:
            return
        del watch.shards[shard.index]
        if watch.blocking is not None and shard.index in watch.blocked_on:
            watch.blocking.cancel()
        if not watch.shards:
            watch.scope.cancel()
            if self._watches.get(watch.group) is watch:
                del self._watches[watch.group]
        watch.touch()

    def _caught_up(self, shard: _Shard, tail: str) -> None:
        if shard.stopping or self.shards.get(shard.index) is not shard or shard.watch is None:
            return
        shard.tail = tail
        watch = shard.watch
        if watch.blocking is not None and shard.index not in watch.blocked_on:
            watch.blocking.cancel()  # block again, naming this one too (rare: see `_quiet`)
        watch.touch()

    def _woken(self, watch: _Watch, keys: Any) -> None:
        """Entries wait past the tails of these shards' keys: read them."""
        woken = False
        for shard in list(watch.shards.values()):
            if shard.key in keys and shard.tail is not None:
                shard.tail = None
                woken = True
        if woken:
            self._poke()
            watch.touch()

    async def _watch(self, watch: _Watch) -> None:
        with watch.scope:
            while True:
                tails = await self._quiet(watch)
                if trio.current_time() < watch.poll_until:  # Redis refused XREAD: poll
                    polled = {watch.shards[i].key for i in tails}
                    await trio.sleep(watch.poll_sleep)
                    watch.poll_sleep = min(max(2 * watch.poll_sleep, 0.001), POLL_MAX_S)
                    self._woken(watch, polled)
                    continue
                keys = {watch.shards[i].key: tail for i, tail in tails.items()}
                # During an outage, a shorter block: it returns to say that Redis answers again.
                block_ms = self.wake_block_ms
                if self.health.since is not None:
                    block_ms = min(block_ms, int(OUTAGE_OVER_S * 1000) + 100)
                reads = self._read_behind(watch, tails)
                watch.blocked_on = frozenset(tails)
                woken = read = None
                try:
                    with trio.CancelScope() as watch.blocking:
                        woken, read = await self._block(keys, block_ms, reads)
                        self.health.ok()
                except (RedisUnavailable, RedisCommandFailed) as exc:
                    await self._wake_failed(watch, exc, set(keys))
                finally:
                    watch.blocking = None
                    watch.blocked_on = frozenset()
                if read is not None:
                    await self._take(reads, read)
                    await self._let_workers_start()
                elif woken:
                    self._woken(watch, woken)

    def _read_behind(self, watch: _Watch, tails: dict[int, str]) -> list[tuple[_Shard, int]]:
        """The fenced read to send right behind a wake-up read, on its connection: Redis runs
        it as soon as the XREAD returns, which saves a round trip. None without a valid lease
        or room in the queue (the reader reads the shards then, once woken)."""
        room = self.settings.prefetch - self.buffered
        if not self._lease_valid() or room <= 0:
            return []
        count = min(self.settings.batch, max(1, room // len(tails)))
        return [(watch.shards[i], count) for i in tails]

    async def _block(
        self, streams: dict[str, str], block_ms: int, reads: list[tuple[_Shard, int]]
    ) -> tuple[Any, Any]:
        """XREAD BLOCK on `streams` (the keys with entries past their tails; nothing after
        `block_ms`), and `READ` of `reads` right behind it (its reply; None if it failed)."""
        with redis_call(f"XREAD BLOCK {', '.join(streams)}"):
            if not reads:
                return await self.wakeups.xread(streams, count=1, block=block_ms), None
            keys, args = self._read_arguments(reads, known_tails=True)
            async with self.wakeups.pipeline(transaction=False, raise_on_error=False) as pipe:
                pipe.xread(streams, count=1, block=block_ms)
                pipe.evalsha(self._read.sha, keys=keys, args=args)
            woken, read = pipe.results or (None, None)
            if isinstance(woken, BaseException):
                raise woken
        # A failed read (NOSCRIPT after a restart...): the reader reads them, with the script.
        return woken, None if isinstance(read, BaseException) else read

    async def _quiet(self, watch: _Watch) -> dict[int, str]:
        """Wait until no shard of the group is to be read now and one has caught up; their tails.

        While the reader reads some shards of the group, the others are checked after each of
        its rounds instead (`_probe`), so a wake-up read rarely has to start again to name a
        shard that caught up while it blocked (only one whose failed read is retried later).
        """
        while True:
            now = trio.current_time()
            tails = {i: s.tail for i, s in watch.shards.items() if s.tail is not None and not s.stopping}
            if tails and not any(_to_read(s, now) for s in watch.shards.values()):
                return tails
            await watch.changed.wait()

    async def _wake_failed(
        self, watch: _Watch, exc: RedisUnavailable | RedisCommandFailed, keys: set[str]
    ) -> None:
        """A wake-up read failed. Unavailable: back off, then read the shards again (their
        reads back off too while Redis is away). Refused: poll them for `POLL_FALLBACK_S`."""
        if isinstance(exc, RedisCommandFailed) and exc.code != "UNBLOCKED":  # UNBLOCKED: a failover
            now = trio.current_time()
            if now - self._polling_logged >= POLL_FALLBACK_S:
                self._polling_logged = now
                log.warning("%s: Redis refused XREAD, polling instead for a while: %s", self.member_id, exc)
            watch.poll_until = now + POLL_FALLBACK_S
            watch.poll_sleep = self.settings.idle_sleep_s
        else:
            await trio.sleep(self.health.failed(exc))
        self._woken(watch, keys)

    async def _probe(self) -> None:
        """After a round of reads: in each group that is not blocked because some of its shards
        are still to be read, check the caught-up ones for new entries (one plain XREAD)."""
        for watch in list(self._watches.values()):
            if watch.blocking is not None:
                continue
            now = trio.current_time()
            shards = list(watch.shards.values())
            if not any(_to_read(s, now) for s in shards):
                continue
            keys = {s.key: s.tail for s in shards if s.tail is not None and not s.stopping}
            if not keys:
                continue
            try:
                with redis_call(f"XREAD {', '.join(keys)}"):
                    reply = await self.redis.xread(keys, count=1)
            except (RedisUnavailable, RedisCommandFailed) as exc:
                self.health.failed(exc)
                reply = keys  # cannot tell: read them all
            self._woken(watch, reply or {})

    async def _claim_entries(
        self, shard: _Shard, min_idle_ms: int, count: int, cursor: str = "0-0"
    ) -> tuple[list[Message], str]:
        """Claim pending entries idle at least `min_idle_ms`, from `cursor`; and the next cursor."""
        reply = await self._call(self._claim, shard, [self.member_id, min_idle_ms, count, cursor])
        next_cursor, entries = str(reply[0]), reply[1] or []
        # Deleted entries come back empty (XAUTOCLAIM drops them from the PEL).
        return [self._message(shard, e) for e in entries if e[1] is not None], next_cursor

    async def _reclaimer(self) -> None:
        """Entries left idle under other consumer names come back here; drain progress is refreshed."""
        while True:
            await trio.sleep(self.settings.reclaim_every_s)
            try:
                await self._measure_drain()
                await self._check_stalls()
            except (RedisUnavailable, RedisCommandFailed) as exc:
                self.health.failed(exc)
            try:
                for shard in list(self.shards.values()):
                    if not shard.claimed_backlog or shard.stopping:
                        continue
                    try:
                        reply = await self._call(
                            self._reclaim, shard, [self.member_id, self.settings.reclaim_idle_ms, 100]
                        )
                    except Fenced as exc:
                        await self._fenced(shard, exc)
                        continue
                    held = self._held(shard)
                    self._enqueue(
                        shard,
                        [
                            self._message(shard, e)
                            for e in reply or []
                            if e[1] is not None and str(e[0]) not in held
                        ],
                    )
            except (RedisUnavailable, RedisCommandFailed) as exc:
                self.health.failed(exc)  # the next round is the retry

    def _held(self, shard: _Shard) -> set[str]:
        """The ids of `shard` this member holds itself: queued, being handled, to be retried
        later or acknowledged."""
        held = {m.id for m in shard.queue} | set(shard.acks) | shard.acking | shard.retrying
        if shard.handling is not None:
            held.add(shard.handling.id)
        return held

    async def _check_stalls(self) -> None:
        """The net under any stall of the reading path (a wake-up missed, a read never sent):
        a shard it owns, with entries waiting past what it read and no read for
        `stall_after_s`, is logged, counted, reported (`stalled_shards`: the coordinator
        re-checks its key, consumer group and owner token) and read again. Shards waiting for
        a wake-up are checked only once no read of them succeeded for `stall_after_s`, with
        one XREAD (no block) per group of shards: an idle member costs one command per
        `reclaim_every_s` (per hash slot on a cluster)."""
        now = trio.current_time()
        late = now - self.settings.stall_after_s
        if not self._lease_valid() or self.health.since is not None:
            return  # not reading on purpose: no lease, or Redis is away (an outage, reported)
        if self.settings.prefetch - self.buffered < min(self.settings.batch, self.settings.prefetch):
            return  # the reader waits for room in the queue (slow handlers): no stall of its own
        for watch in list(self._watches.values()):
            waiting = {
                s.key: s
                for s in watch.shards.values()
                if s.tail is not None and not s.stopping and s.trouble is None and s.read_at < late
            }
            if waiting:
                with redis_call(f"XREAD {', '.join(waiting)}"):
                    reply = await self.redis.xread({k: s.tail for k, s in waiting.items()}, count=1)
                behind = set(reply or {})
                for key, shard in waiting.items():
                    if key not in behind or shard.tail is None:
                        shard.behind_since = None
                    elif shard.behind_since is None:
                        shard.behind_since = now  # may be an append a wake-up is taking now
                    elif shard.behind_since <= late:
                        self._stall(
                            shard, f"entries past {shard.tail} unread for {now - shard.behind_since:.0f} s"
                        )
        if self.buffered:
            return  # the reader may wait for room in the queue: slow handlers are no stall
        for shard in list(self.shards.values()):
            to_read = shard.tail is None and not shard.stopping and shard.trouble is None
            if to_read and not shard.busy and max(shard.read_at, shard.retry_at) < late:
                self._stall(shard, f"to be read and not read for {now - shard.read_at:.0f} s")

    def _stall(self, shard: _Shard, why: str) -> None:
        log.warning(
            "%s: shard %s stalled: %s; reading it again and asking the coordinator to check its "
            "key, consumer group and owner token",
            self.member_id,
            shard.index,
            why,
        )
        self.stalls += 1
        shard.trouble = f"stalled: {why}"  # reported until a read succeeds (`_fine`)
        shard.behind_since = None
        shard.tail = None
        shard.retry_at = -math.inf
        self._poke()
        if shard.watch is not None:
            shard.watch.touch()

    async def _measure_drain(self) -> None:
        """XINFO GROUPS of the DRAINING shards (drain reports), and of every owned shard when
        `measure_lag` (the worker's lag metrics)."""
        progress: dict[int, DrainProgress] = {}
        figures: dict[int, tuple[int, int | None]] = {}
        for shard in list(self.shards.values()):
            if not (shard.draining or self.measure_lag):
                continue
            with redis_call(f"XINFO GROUPS {shard.key}"):
                groups = await self.redis.xinfo_groups(shard.key)
            for info in groups:
                if info.get("name") == self.group:
                    lag = info.get("lag")
                    pending = int(info.get("pending", 0))  # read, not yet acknowledged
                    figures[shard.index] = (pending, None if lag is None else int(lag))
                    if shard.draining:
                        progress[shard.index] = DrainProgress(shard.index, *figures[shard.index])
        self._drain = progress
        self.lag = figures

    def _enqueue(self, shard: _Shard, messages: list[Message]) -> None:
        """Queue entries read from `shard`, unless it stopped meanwhile: then they stay pending in
        Redis for the next owner (an entry read after a revoke began is never handled here)."""
        if not messages or shard.stopping or self.shards.get(shard.index) is not shard:
            return
        highest = messages[-1].id  # reads, claims and reclaims come in id order
        if _id_order(highest) > _id_order(shard.last_read):
            shard.last_read = highest
        shard.queue.extend(messages)
        self.buffered += len(messages)
        if not shard.busy and shard not in self.ready:
            self.ready.append(shard)
        self._poke()

    def _drop_queue(self, shard: _Shard) -> None:
        self.buffered -= len(shard.queue)
        shard.queue.clear()
        if shard in self.ready:
            self.ready.remove(shard)
        self._freed()

    def _freed(self) -> None:
        """Entries left the queue: wake a reader that waits for room for a batch."""
        if self._room_wanted and self.settings.prefetch - self.buffered >= min(
            self.settings.batch, self.settings.prefetch
        ):
            self._room_wanted = False
            self._wake.set()

    async def _fenced(self, shard: _Shard, exc: Fenced) -> None:
        """A fenced script refused the shard: its owner token is gone or names another member.

        The scripts refuse every read and acknowledgement meanwhile, so nothing is done on a
        shard that is not ours; but only the coordinator knows whose it is. It moved (or this
        member is fenced): the next heartbeat says so and the member stops it. The token was
        lost or rolled back by Redis (a restart without persistence, an older copy): the
        coordinator writes it again. Either way the shard stays until the member is told, is
        reported (`stalled_shards`) and tried again; dropping it here, unknown to the member,
        left it reported as owned and read by nobody for good."""
        if self.shards.get(shard.index) is shard and not shard.stopping:  # else revoked meanwhile
            self._stalled(shard, str(exc))

    # --- handling -------------------------------------------------------

    def _resize(self, workers: int) -> None:
        """Start workers, or retire some: a retired worker ends between two handler calls."""
        self.workers = max(1, workers)
        if self._nursery is None:
            return
        while len(self._worker_slots) < self.workers:
            slot = _Slot()
            self._worker_slots.append(slot)
            self._nursery.start_soon(self._worker, slot)
        while len(self._worker_slots) > self.workers:
            self._worker_slots.pop().retired = True
        self._poke()

    async def _worker(self, slot: _Slot) -> None:
        while not slot.retired:
            if not self.ready:
                if self._work is None:
                    self._work = trio.Event()
                self._idle_workers += 1
                try:
                    await self._work.wait()
                finally:
                    self._idle_workers -= 1
                continue
            if not self._lease_valid():  # after a pause: nothing runs until a heartbeat confirms
                await self._until_lease_valid()
                continue
            await self._turn(slot, self.ready.popleft())

    async def _turn(self, slot: _Slot, shard: _Shard) -> None:
        """Up to `turn` entries of `shard`, in order; then the shard waits for a worker again.

        `lost` cancels the turn's scope, and so does the end of the lease: the handler in
        flight stops at once.
        """
        shard.busy = True
        shard.idle = trio.Event()
        now = trio.current_time
        pause = 0.0
        try:
            with trio.CancelScope(deadline=self.lease_until) as shard.scope:
                for _ in range(self.settings.turn):
                    # The exclusive-handling rule, per entry: still held (a revoke or a loss sets
                    # `stopping` first) and the lease valid now.
                    if not shard.queue or shard.stopping or slot.retired or now() >= self.lease_until:
                        break
                    message = shard.queue.popleft()
                    self.buffered -= 1
                    self._freed()
                    shard.handling = message
                    try:
                        await self._handle(shard, message)
                    except Fenced as exc:
                        await self._fenced(shard, exc)
                        break
                    except (RedisUnavailable, RedisCommandFailed) as exc:
                        pause = self.health.failed(exc)  # it goes first again, later
                        break
                    shard.handling = None
            if shard.scope.cancelled_caught and not shard.stopping:
                self.cut_by_lease += 1
            if pause:
                await trio.sleep(pause)
            else:
                await trio.lowlevel.checkpoint()  # let the reader and the acker run between turns
        finally:
            if shard.handling is not None and not shard.stopping:
                # Cut short (the lease ended, Redis failed, the poller stops): it is still
                # pending in Redis; it goes first again if the shard stays ours.
                shard.queue.appendleft(attrs.evolve(shard.handling, redelivered=True))
                self.buffered += 1
            shard.busy = False
            shard.handling = None
            shard.idle.set()
            if shard.queue and not shard.stopping and self.shards.get(shard.index) is shard:
                self.ready.append(shard)
                self._poke()

    async def _handle(self, shard: _Shard, message: Message) -> None:
        if message.redelivered:
            # Count this delivery in Redis before the handler starts (a crash in the handler
            # then counts too); the count decides about the dead-letter stream.
            reply = await self._call(self._start, shard, [self.member_id, message.id])
            if not reply:
                return  # no longer pending here (acknowledged, or claimed by another consumer)
            message = attrs.evolve(message, deliveries=int(reply))
        if message.deliveries > self.settings.max_deliveries:
            await self._dead_letter(shard, message)
            return
        if message.deliveries > 1:
            self.retried += 1
        started = time.perf_counter()
        try:
            await self.handler(message)
        except Exception as exc:
            self.failed += 1
            # One line per failure; the traceback at DEBUG (a poison entry fails max_deliveries times).
            log.warning(
                "%s: handler failed on %s %s (delivery %d of %d): %s: %s",
                self.member_id,
                message.key,
                message.id,
                message.deliveries,
                self.settings.max_deliveries,
                type(exc).__name__,
                exc,
            )
            log.debug("the handler's traceback", exc_info=True)
            self._retry_later(shard, message, message.deliveries + 1)  # it stays pending meanwhile
            return
        finally:
            if self.observe_handler is not None:
                self.observe_handler(time.perf_counter() - started)
        self.handled += 1
        shard.acks.append(message.id)
        self._acks_waiting.set()

    def _retry_later(
        self, shard: _Shard, message: Message, deliveries: int, after_s: float | None = None
    ) -> None:
        async def retry() -> None:
            try:
                await trio.sleep(self.settings.retry_after_ms / 1000 if after_s is None else after_s)
            finally:
                shard.retrying.discard(message.id)
            self._enqueue(shard, [attrs.evolve(message, deliveries=deliveries, redelivered=True)])

        if self._nursery is not None:
            shard.retrying.add(message.id)
            self._nursery.start_soon(retry)

    async def _dead_letter(self, shard: _Shard, message: Message) -> None:
        flat = [x for pair in message.fields.items() for x in pair]
        try:
            with redis_call(f"dead-lettering {message.key} {message.id}"):
                await self._dead(
                    keys=[shard.key, owner_key(shard.key), dead_letter_key(shard.key)],
                    args=[
                        self.group,
                        self.member_id,
                        self.incarnation,
                        message.id,
                        message.deliveries,
                        *flat,
                    ],
                )
        except Fenced as exc:
            await self._fenced(shard, exc)
        except (RedisUnavailable, RedisCommandFailed) as exc:
            self._retry_later(shard, message, message.deliveries, self.health.failed(exc))
        else:
            self.health.ok()
            self.dead_lettered += 1
            log.warning(
                "%s: dead-lettered %s %s after %d failed deliveries (max_deliveries %d) to %s",
                self.member_id,
                message.key,
                message.id,
                message.deliveries - 1,
                self.settings.max_deliveries,
                dead_letter_key(shard.key),
            )

    # --- acknowledging --------------------------------------------------

    async def _acker(self) -> None:
        """Acknowledges what was handled every `ack_every_s` (one call per group), and sleeps
        while nothing was."""
        while True:
            if not any(shard.acks for shard in self.shards.values()):
                await self._acks_waiting.wait()
                self._acks_waiting = trio.Event()
            await trio.sleep(self.settings.ack_every_s)
            now = trio.current_time()
            groups: dict[int, list[_Shard]] = {}
            for shard in list(self.shards.values()):
                if shard.acks and not shard.ack_lock.locked() and now >= shard.retry_at:
                    groups.setdefault(shard.group, []).append(shard)
            await _together([(self._flush, group) for group in groups.values()])

    async def _flush(self, shards: list[_Shard]) -> bool:
        """Acknowledge what these shards (of one group) handled, the call in flight first; False
        when Redis did not take it all (what it did not take is kept and sent again)."""
        async with contextlib.AsyncExitStack() as locks:
            for shard in shards:
                await locks.enter_async_context(shard.ack_lock)
            taken = True
            shards = list(shards)
            while True:
                for shard in shards:
                    shard.acking.clear()  # the call in flight before this one has ended
                chunk: list[tuple[_Shard, list[str]]] = []
                room = ACK_CHUNK
                for shard in shards:
                    if shard.acks and room > 0:
                        ids, shard.acks = shard.acks[:room], shard.acks[room:]
                        chunk.append((shard, ids))
                        room -= len(ids)
                if not chunk:
                    break
                for shard, ids in chunk:
                    shard.acking.update(ids)
                try:
                    replies = await self._acknowledge(chunk)
                except (RedisUnavailable, RedisCommandFailed) as exc:
                    delay = self.health.failed(exc)
                    for shard, ids in chunk:
                        shard.acks[:0] = ids  # XACK is idempotent: sent again once Redis answers
                        shard.retry_at = trio.current_time() + delay
                    return False
                except BaseException:
                    for shard, ids in chunk:
                        shard.acks[:0] = ids  # cancelled mid-call: not lost
                    raise
                for (shard, ids), reply in zip(chunk, replies, strict=True):
                    if isinstance(reply, int):
                        continue
                    shards.remove(shard)
                    code = reply_code(str(reply))
                    if code == "FENCED":
                        # Kept: acknowledged once the coordinator writes our token again, or
                        # dropped with the shard when the member is told it is not ours.
                        shard.acks[:0] = ids
                        await self._fenced(shard, Fenced(f"acknowledging: {reply}", code))
                        taken = False
                    else:
                        shard.acks[:0] = ids
                        failed = RedisCommandFailed(f"acknowledging on {shard.key}: {reply}", code)
                        shard.retry_at = trio.current_time() + self.health.failed(failed)
                        taken = False
            if taken:
                self.health.ok()
            return taken

    async def _acknowledge(self, chunk: list[tuple[_Shard, list[str]]]) -> list[Any]:
        """One fenced XACK per shard, in one call (`ACK`): per shard, a count or a refusal."""
        keys = [key for shard, _ in chunk for key in (shard.key, owner_key(shard.key))]
        counts = [len(ids) for _, ids in chunk]
        every_id = [entry for _, ids in chunk for entry in ids]
        with redis_call(f"acknowledging on {', '.join(shard.key for shard, _ in chunk)}"):
            replies = await self._ack(
                keys=keys, args=[self.group, self.member_id, self.incarnation, *counts, *every_id]
            )
        return list(replies)

    # --- plumbing ---------------------------------------------------------

    async def _call(self, script: Any, shard: _Shard, args: list[Any]) -> Any:
        with redis_call(f"shard {shard.key}"):
            return await script(
                keys=[shard.key, owner_key(shard.key)],
                args=[self.group, self.member_id, self.incarnation, *args],
            )

    def _message(self, shard: _Shard, entry: Any) -> Message:
        """A claimed entry (a redelivery: its count goes up when a handler starts on it)."""
        return Message(
            shard.index, shard.key, entry[0], _pairs(entry[1]), int(entry[2]), self.member_id, True
        )

    async def _let_workers_start(self) -> None:
        """Let idle workers take what was just queued before this task sends its next command
        (preparing one takes a few hundred microseconds of CPU: the handler would wait)."""
        for _ in range(4):  # trio runs the tasks ready at once in random order
            if not self.ready or not self._idle_workers:
                return
            await trio.lowlevel.checkpoint()

    def _poke(self) -> None:
        self._wake.set()
        if self._work is not None:
            self._work.set()  # wakes every idle worker
            self._work = None


async def _together(calls: Sequence[tuple[Any, ...]]) -> None:
    """Each `(function, *args)` of `calls`, concurrently: their Redis commands share round trips."""
    if len(calls) == 1:
        await calls[0][0](*calls[0][1:])
        return
    async with trio.open_nursery() as nursery:
        for function, *args in calls:
            nursery.start_soon(function, *args)


def _block_ms(client: Any, wanted_s: float) -> int:
    """How long a wake-up read on `client` may block: `wanted_s`, but short of its command
    timeout by half of it, or by 5 s (a longer block would time out as if Redis did not answer)."""
    pool = getattr(client, "connection_pool", None)
    timeout = getattr(pool, "connection_kwargs", {}).get("stream_timeout")
    if timeout:
        wanted_s = min(wanted_s, timeout - min(timeout / 2, 5.0))
    return max(1, int(wanted_s * 1000))


def _to_read(shard: _Shard, now: float) -> bool:
    """The shard may have entries and can be read now (no failed read waits for its retry)."""
    return shard.tail is None and not shard.stopping and now >= shard.retry_at


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    if flat and isinstance(flat[0], str):  # decoded replies (the usual case): pair them as they are
        it = iter(flat)
        return dict(zip(it, it, strict=False))
    items = list(flat or [])
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items), 2)}
