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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rsc.events.model import DrainProgress, Layout


class ShardLifecycle(Protocol):
    async def assigned(self, shards: frozenset[int], layout: Layout) -> None: ...

    async def revoke(self, shards: frozenset[int]) -> None: ...

    async def lost(self, shards: frozenset[int]) -> None: ...

    async def concurrency(self, workers: int) -> None: ...

    def drain_progress(self) -> Sequence[DrainProgress]: ...


class NoLifecycle:
    """A lifecycle that does nothing (a member that only holds shards: useful in tests and demos)."""

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        return None

    async def revoke(self, shards: frozenset[int]) -> None:
        return None

    async def lost(self, shards: frozenset[int]) -> None:
        return None

    async def concurrency(self, workers: int) -> None:
        return None

    def drain_progress(self) -> Sequence[DrainProgress]:
        return ()
