"""The built-in poller: a `ShardLifecycle` that reads a member's shards and runs a handler.

* Exclusive: a handler call for a shard starts only while the member holds the
  shard *and* its lease is known to be valid at that instant (`renewed`: the send
  time of the last successful heartbeat plus the lease, minus the safety margin,
  on the monotonic clock). It is checked before every handler call, and a call
  still running when the lease ends is cancelled (its entry stays pending and is
  handled again). After a pause longer than the lease (SIGSTOP, a blocked event
  loop), nothing queued runs until a heartbeat has confirmed the assignment.
* Ordered through handoffs: a revoke first stops reading the shard, drops its
  queue and starts nothing more of it; the handler in flight finishes (up to what the
  group's revoke timeout leaves, `revoke_timeout_s` if lower), its acknowledgement is
  flushed, and only then is the revoke acknowledged. Entries read but not handled stay
  pending in Redis, where the next owner claims them first, in id order, before reading
  new ones.
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

One module per job: `book` (the per-shard lifecycle as a pure machine: states, transitions,
read selection, exclusivity), `scripts` (the fenced Lua scripts of `rsc/lua/member/`, typed
results), `state` (what the parts share), `reader`, `wakeup`, `reclaim`, `dispatch` (the
workers), `acker`, `health` (Redis outages, back-off), `settings`, `message`; `poller` wires
them into the `Poller`.
"""

from rsc.client.poller.health import RedisHealth
from rsc.client.poller.message import Handler, Message
from rsc.client.poller.poller import Poller
from rsc.client.poller.settings import PollerSettings

__all__ = ["Handler", "Message", "Poller", "PollerSettings", "RedisHealth"]
