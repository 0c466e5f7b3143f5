"""`ShardLifecycle`: what an application implements to be told which shards it may read.

The member runtime calls it; every call is awaited before the runtime tells
the coordinator anything that depends on it:

* `assigned(shards, layout)`: the shards are installed to this member: start reading them.
* `revoke(shards)`: stop reading them; return only when it is safe for another
  member to take over (in-flight work finished or abandoned). The runtime
  acknowledges the revoke after this returns.
* `lost(shards)`: the member was fenced (or fenced itself): stop at once,
  without acknowledging anything; another member may already own them.
* `concurrency(workers)`: the group's `maxConcurrency` changed (Admin API).
* `drain_progress()`: for DRAINING shards this member owns, pending count and lag.
* `renewed(until)`: what this member holds is known to be its own until `until` (trio
  clock: the send time of the last successful heartbeat plus the lease, minus the safety
  margin); `-inf` once it was fenced or left. Start no work after `until` unless it is
  renewed: after a pause (SIGSTOP, a blocked event loop) the shards may have moved.
* `stalled_shards()` (optional; none when absent): shards it owns but cannot read because
  their key, consumer group or owner token is gone (Redis lost data). The runtime reports
  them in each heartbeat and the coordinator recreates what is missing; the lifecycle keeps
  them and retries, it never recreates them itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rsc.events.model import DrainProgress, Layout


class ShardLifecycle(Protocol):
    """What the member runtime calls (see the module doc). Whatever a method raises is not
    caught: it leaves `Member.beat`, and ends `Member.run` (and `App.run`) with it."""

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None: ...

    async def revoke(self, shards: frozenset[int], within_s: float) -> None: ...

    async def lost(self, shards: frozenset[int]) -> None: ...

    async def concurrency(self, workers: int) -> None: ...

    def drain_progress(self) -> Sequence[DrainProgress]: ...

    def renewed(self, until: float) -> None: ...


class NoLifecycle:
    """A lifecycle that does nothing (a member that only holds shards: useful in tests and demos)."""

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        return None

    async def revoke(self, shards: frozenset[int], within_s: float) -> None:
        return None

    async def lost(self, shards: frozenset[int]) -> None:
        return None

    async def concurrency(self, workers: int) -> None:
        return None

    def drain_progress(self) -> Sequence[DrainProgress]:
        return ()

    def stalled_shards(self) -> frozenset[int]:
        return frozenset()

    def renewed(self, until: float) -> None:
        return None
