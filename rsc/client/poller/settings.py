"""The poller's settings and the fixed figures of its Redis retries and wake-ups."""

from __future__ import annotations

import attrs

from rsc.client.coordinator import Backoff

__all__ = [
    "ACK_CHUNK",
    "OUTAGE_OVER_S",
    "POLL_FALLBACK_S",
    "POLL_MAX_S",
    "REDIS_BACKOFF",
    "REFUSAL_RETRY_S",
    "PollerSettings",
]

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
    #: command timeout of the client that sends it (see `wakeup.block_ms`).
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
    #: How long in-flight handlers of a revoked shard may run before they are cancelled. None
    #: (the default): what the group's revoke timeout leaves (the heartbeat answer's
    #: `revokeTimeoutMs` less a heartbeat interval and a second; 60 s assumed when an older
    #: coordinator does not say). A number caps that.
    revoke_timeout_s: float | None = None
    #: Retries of Redis calls that failed (an outage, a refusal) wait up to this long (with jitter).
    redis_backoff: Backoff = REDIS_BACKOFF
