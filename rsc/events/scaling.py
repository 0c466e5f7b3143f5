"""How many members a group wants (KEDA's view of it, `GET .../groups/{g}/scale`), as a pure rule.

Each readable shard is work for one member while it has entries not yet delivered to the group
(lag) or delivered and not acknowledged (pending); an idle shard is no work, and a member beyond
the shard count gets nothing, so the wanted members never exceed the shards. A shard whose lag
Redis cannot tell (`None`: after trims or resets on Redis 7.0) counts as busy, and the group's
lag is then unknown (`None`, never 0), so that an autoscaler never takes a busy group to zero.
A paused group wants no more members than it has.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class ShardWork:
    """One readable shard as the group stands on it: entries not delivered yet (None: Redis
    cannot tell), entries delivered and not acknowledged."""

    lag: int | None
    pending: int


@attrs.frozen
class Scale:
    """The answer of `GET /v1/streams/{p}/groups/{g}/scale` (these names: KEDA's metrics-api
    scaler reads them by `valueLocation`)."""

    lag: int | None
    pending: int
    shards: int
    members: int
    desired_members: int
    desired_replicas: int
    members_per_replica: int
    paused: bool


def scale(works: Sequence[ShardWork], members: int, paused: bool, members_per_replica: int = 1) -> Scale:
    """What the group wants, from each readable shard's work (see the module)."""
    unknown = any(w.lag is None for w in works)
    lag = None if unknown else sum(w.lag or 0 for w in works)
    busy = sum(1 for w in works if w.lag is None or w.lag > 0 or w.pending > 0)
    desired = min(busy, len(works))
    if paused:
        desired = min(desired, members)
    replicas = -(-desired // members_per_replica)  # ceiling
    return Scale(
        lag,
        sum(w.pending for w in works),
        len(works),
        members,
        desired,
        replicas,
        members_per_replica,
        paused,
    )
