"""Rate limits at the HTTP edge: token buckets (`rsc.events.rates`) per party and per caller.

* **Per member id and per producer id** (with its stream and group, and the credential that
  speaks for it: never per address alone, since behind a proxy every caller shares one):
  `rate_limit_party_per_interval` heartbeats per heartbeat interval, bursts of
  `rate_limit_party_burst`. A member at its interval sends one per interval plus a few on
  assignment changes, so it never meets this limit; a 429 tells it to retry after at most a
  tenth of the interval, well within its lease. A leave is never limited.
* **Per caller** (a credential, or an anonymous caller's address: an IPv4 address or an IPv6
  /64): every heartbeat (a batch counts each item) `rate_limit_heartbeats_per_s`, views and
  `/metrics` `rate_limit_views_per_s`, Admin API writes `rate_limit_admin_writes_per_s`
  (by address, before authentication, so a flood of bad logins is bounded too). Bursts are
  twice the rate.

A refusal is 429 `RATE_LIMITED` with `Retry-After` (whole seconds) and `details.retryAfterS`
(the exact wait), counted in `rsc_rate_limited_total{kind}`. 0 switches a limit off.
"""

from __future__ import annotations

import collections

import trio

from rsc.events.rates import TokenBuckets
from rsc.http.errors import ApiError

#: What was refused, by kind (party, heartbeats, views, admin-writes), in this process.
RATE_LIMITED: collections.Counter[str] = collections.Counter()
PARTY, HEARTBEATS, VIEWS, ADMIN_WRITES = "party", "heartbeats", "views", "admin-writes"
KINDS = (PARTY, HEARTBEATS, VIEWS, ADMIN_WRITES)


class RateLimited(ApiError):
    def __init__(self, kind: str, wait_s: float) -> None:
        what = {
            PARTY: "this member or producer sends heartbeats faster than its limit",
            HEARTBEATS: "this caller sends heartbeats faster than its limit",
            VIEWS: "this caller reads views faster than its limit",
            ADMIN_WRITES: "this address sends Admin API writes faster than its limit",
        }[kind]
        super().__init__(
            429,
            "RATE_LIMITED",
            f"{what}; retry in {wait_s:.2f} s",
            {"limit": kind, "retryAfterS": round(wait_s, 3)},
            retry_after_s=wait_s,
        )


class RateLimits:
    """The buckets of one coordinator process (see the module)."""

    def __init__(
        self,
        heartbeat_interval_ms: int,
        party_per_interval: float,
        party_burst: int,
        heartbeats_per_s: float,
        views_per_s: float,
        admin_writes_per_s: float,
    ) -> None:
        interval_s = heartbeat_interval_ms / 1000
        self.buckets: dict[str, TokenBuckets | None] = {
            PARTY: _buckets(party_per_interval / interval_s, party_burst),
            HEARTBEATS: _buckets(heartbeats_per_s, 2 * heartbeats_per_s),
            VIEWS: _buckets(views_per_s, 2 * views_per_s),
            ADMIN_WRITES: _buckets(admin_writes_per_s, 2 * admin_writes_per_s),
        }

    def wait(self, kind: str, key: str, cost: float = 1.0) -> float | None:
        """None when `key` may go on (the tokens are taken), else the seconds to wait."""
        buckets = self.buckets[kind]
        if buckets is None or cost <= 0:
            return None
        wait = buckets.take(key, trio.current_time(), cost)
        if wait is not None:
            RATE_LIMITED[kind] += 1
        return wait

    def check(self, kind: str, key: str, cost: float = 1.0) -> None:
        """Raise `RateLimited` when `key` must wait."""
        wait = self.wait(kind, key, cost)
        if wait is not None:
            raise RateLimited(kind, wait)


def _buckets(rate: float, burst: float) -> TokenBuckets | None:
    """The buckets of a limit, or None when its rate or its burst is 0 (switched off)."""
    return TokenBuckets(rate, max(1.0, burst)) if rate > 0 and burst > 0 else None
