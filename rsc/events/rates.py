"""Rate limits: token buckets by key, time as an input (pure, no clock).

Each key (a member id, a producer id, a credential, an anonymous address) has a bucket of
`burst` tokens that refills at `rate` tokens a second; a request takes `cost` tokens or is
refused with the seconds until it could be taken (`Retry-After`). The table is bounded: past
`max_keys` the least recently used buckets go (a full bucket forgotten is the same as a new
one, so forgetting never refuses anyone).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import attrs


@attrs.define
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """One bucket per key (see the module)."""

    def __init__(self, rate: float, burst: float, max_keys: int = 100_000) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limit needs a positive rate and a burst of at least 1")
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, key: str, now: float, cost: float = 1.0) -> float | None:
        """Take `cost` tokens from `key`'s bucket at time `now` (seconds): None when allowed,
        else the seconds until `cost` tokens will be there (nothing is taken then). A cost
        above the burst is allowed from a full bucket (it empties it), so no request is
        refused for ever."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = _Bucket(self.burst, now)
        else:
            bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.updated) * self.rate)
            bucket.updated = now
        self._buckets[key] = bucket
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        need = min(cost, self.burst)
        if bucket.tokens >= need:
            bucket.tokens -= cost
            return None
        return (need - bucket.tokens) / self.rate


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, at least 1 (RFC 9110 10.2.3)."""
    return str(max(1, math.ceil(seconds)))
