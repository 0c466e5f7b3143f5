"""Quotas: how much one caller may create, and how big anything may grow (pure values).

Kafka bounds what a principal may do with quotas (request rate, controller mutation rate) and
a group's size with `group.max.size`; rsc bounds what a caller may create so that a client bug
(a random stream name per process, a member id per request) cannot fill Redis:

* `streams`: the streams a caller created that still exist (the admin's and every caller's
  together are bounded by the deployment's own `streams` limit). Counted in Redis per
  credential (anonymous callers share one count), so a restart or failover does not reset it.
* `shards_per_stream`, `groups_per_stream`, `members_per_group` (live members),
  `producers_per_stream` (live producers): per resource, whoever asks.

A caller's limits are the deployment's (`quota_*` settings), lowered by its credential's
`quota` table, or by the `anonymous_quota_*` settings for anonymous callers. Exceeding one is
`QuotaExceeded` (429 `QUOTA_EXCEEDED`, the quota and its limit in `details`), and nothing is
half-created.
"""

from __future__ import annotations

import attrs

#: The quotas, by the names `details.quota`, settings and credential tables use.
STREAMS = "streams"
SHARDS_PER_STREAM = "shards_per_stream"
GROUPS_PER_STREAM = "groups_per_stream"
MEMBERS_PER_GROUP = "members_per_group"
PRODUCERS_PER_STREAM = "producers_per_stream"
NAMES = (STREAMS, SHARDS_PER_STREAM, GROUPS_PER_STREAM, MEMBERS_PER_GROUP, PRODUCERS_PER_STREAM)
#: Whom the streams anonymous callers create are counted against.
ANONYMOUS = "anonymous"


@attrs.frozen
class Limits:
    """What one caller may create (see the module)."""

    streams: int = 100_000
    shards_per_stream: int = 4_096
    groups_per_stream: int = 1_000
    members_per_group: int = 10_000
    producers_per_stream: int = 10_000

    def lowered(self, by: Limits | dict[str, int] | None) -> Limits:
        """These limits, each lowered to `by`'s where that is lower."""
        if by is None:
            return self
        other = attrs.asdict(by) if isinstance(by, Limits) else by
        return Limits(**{k: min(v, other.get(k, v)) for k, v in attrs.asdict(self).items()})


#: The deployment's limits when nothing configures them.
DEFAULT_LIMITS = Limits()
#: Anonymous callers (no credential configured, loopback): far below production's limits, yet
#: enough for the demo, the tests and the benchmarks.
ANONYMOUS_LIMITS = Limits(
    streams=10_000,
    shards_per_stream=1_024,
    groups_per_stream=100,
    members_per_group=2_000,
    producers_per_stream=1_000,
)


@attrs.frozen
class Quota:
    """The limits of one request's caller, and whom its stream creations count against."""

    owner: str
    limits: Limits
    #: The deployment's own limit on streams (every caller's together).
    total_streams: int
