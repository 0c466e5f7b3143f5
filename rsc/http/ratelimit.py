"""Rate limits at the HTTP edge: token buckets (`rsc.events.rates`) per party and per caller.

* **Per member id and per producer id** (with its stream and group, and the credential that
  speaks for it: never per address alone, since behind a proxy every caller shares one):
  `rate_limit_party_per_interval` heartbeats per heartbeat interval, bursts of
  `rate_limit_party_burst`. A member at its interval sends one per interval plus a few on
  assignment changes, so it never meets this limit; a 429 tells it to retry after at most a
  tenth of the interval, well within its lease. A leave is never limited.
* **Protocol work is not charged to the member's own limit**
  (`rsc.events.heartbeat_rules.member_charge`), so no member is refused for doing what the
  protocol asks however fast a storm moves shards: a heartbeat acknowledging revokes it has
  not acknowledged before at its epoch is free (a small memo per member key remembers what
  it acknowledged last); the first join (epoch 0) of an incarnation is charged to its
  **member id's join limit** instead, without the incarnation (a rejoin of a known
  incarnation, after a fence, is charged to its own limit as before): a tenth of the party
  limit (a join per interval by default, bursts of a tenth of the party burst), so a process
  crash-looping through joins under new incarnations is limited. Echoing the same
  `revokedShards`, or looping with nothing new, is charged as before; every heartbeat,
  protocol work too, is still charged to its caller's limit below.
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

from rsc.events import heartbeat_rules
from rsc.events.auth import Credential
from rsc.events.rates import TokenBuckets
from rsc.events.wire import HeartbeatRequest
from rsc.http.errors import ApiError

#: What was refused, by kind (party, heartbeats, views, admin-writes), in this process.
RATE_LIMITED: collections.Counter[str] = collections.Counter()
PARTY, JOINS, HEARTBEATS = "party", "joins", "heartbeats"
VIEWS, ADMIN_WRITES = "views", "admin-writes"
KINDS = (PARTY, JOINS, HEARTBEATS, VIEWS, ADMIN_WRITES)
#: The most member keys whose last acknowledgement is remembered (least recently used go:
#: a member forgotten has its next acknowledgement free once more, nothing worse).
MAX_ACKNOWLEDGED = 100_000


class RateLimited(ApiError):
    def __init__(self, kind: str, wait_s: float) -> None:
        what = {
            PARTY: "this member or producer sends heartbeats faster than its limit",
            JOINS: "this member id joins faster than its limit",
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
            JOINS: _buckets(party_per_interval / 10 / interval_s, party_burst and max(1, party_burst // 10)),
            HEARTBEATS: _buckets(heartbeats_per_s, 2 * heartbeats_per_s),
            VIEWS: _buckets(views_per_s, 2 * views_per_s),
            ADMIN_WRITES: _buckets(admin_writes_per_s, 2 * admin_writes_per_s),
        }
        #: Each member key seen (an incarnation joined), with its last acknowledgement
        #: (`heartbeat_rules.acknowledges_news`), the least recently seen first.
        self._acknowledged: collections.OrderedDict[str, heartbeat_rules.Acknowledged | None] = (
            collections.OrderedDict()
        )

    def wait(self, kind: str, key: str, cost: float = 1.0) -> float | None:
        """None when `key` may go on (the tokens are taken), else the seconds to wait."""
        buckets = self.buckets[kind]
        if buckets is None or cost <= 0:
            return None
        wait = buckets.take(key, trio.current_time(), cost)
        if wait is not None:
            RATE_LIMITED[kind] += 1
        return wait

    def check_member(self, caller: Credential | None, body: HeartbeatRequest, suffix: str) -> None:
        """Charge a member's heartbeat to its own limits (see the module): `suffix` is its
        `member_key_suffix`. Raise `RateLimited` when it must wait."""
        key = heartbeat_rules.keyed_by(caller, suffix)
        known = key in self._acknowledged
        last = self._acknowledged.pop(key, None)
        charge = heartbeat_rules.member_charge(body, known, last)
        if body.member_epoch != heartbeat_rules.LEAVE_EPOCH:  # (a leave: nothing to remember)
            self._acknowledged[key] = heartbeat_rules.acknowledges_news(body, last) or last
            if len(self._acknowledged) > MAX_ACKNOWLEDGED:
                self._acknowledged.popitem(last=False)
        if charge == heartbeat_rules.CHARGE_JOIN:
            self.check(JOINS, heartbeat_rules.keyed_by(caller, heartbeat_rules.join_key_suffix(suffix)))
        elif charge == heartbeat_rules.CHARGE_PARTY:
            self.check(PARTY, key)

    def check(self, kind: str, key: str, cost: float = 1.0) -> None:
        """Raise `RateLimited` when `key` must wait."""
        wait = self.wait(kind, key, cost)
        if wait is not None:
            raise RateLimited(kind, wait)


def _buckets(rate: float, burst: float) -> TokenBuckets | None:
    """The buckets of a limit, or None when its rate or its burst is 0 (switched off)."""
    return TokenBuckets(rate, max(1.0, burst)) if rate > 0 and burst > 0 else None
