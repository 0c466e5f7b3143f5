"""An in-process coordinator for member-runtime tests under trio's autojump clock.

It implements the member's transport (`heartbeat(request) -> response`) with
the real pure core (`rsc.events.group`) and the real response rendering
(`rsc.events.respond.respond`), with trio's clock as time and ticks every 100 ms.
It can be partitioned from a member (requests hang, as a lost network does).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from rsc.client.errors import CoordinatorRejected
from rsc.events import group
from rsc.events.commands import CreateGroup, GroupCommand, Heartbeat, Tick
from rsc.events.errors import CoordinationError
from rsc.events.events import GroupEvent
from rsc.events.liveness import Leases
from rsc.events.model import DrainProgress, Layout, Shard, Timing
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.http.heartbeats.held import GroupChanges

TIMING = Timing(heartbeat_interval_ms=1_000, lease_ttl_ms=5_000, revoke_timeout_ms=10_000)


def now_ms() -> int:
    return int(trio.current_time() * 1000)


class LocalCoordinator:
    def __init__(self, shards: int = 6, timing: Timing = TIMING) -> None:
        layout = Layout(1, tuple(Shard(i, f"s:{{s:{i}}}") for i in range(shards)))
        self.state, self.events = group.execute(None, CreateGroup("s", "g", layout, timing))
        self.events = list(self.events)
        self.leases = Leases()  # the lease table, kept beside the state as an actor keeps it
        self.partitioned: set[str] = set()
        self.requests = 0
        #: Hold long-poll heartbeats (`waitMs`) as the HTTP coordinator does.
        self.long_poll = True
        self.holds = GroupChanges(now_ms)

    def run(self, command: GroupCommand) -> list[GroupEvent]:
        self.state, events = group.execute(self.state, command)
        self.leases.apply(events)
        self.events.extend(events)
        self.holds.observe(None, self.state, events)
        return events

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        self.requests += 1
        if request.member_id in self.partitioned:
            await trio.sleep_forever()
        version = self.holds.version("s", "g")
        command = request.to_command(now_ms())
        response = self.decide(command)
        if self.long_poll:
            response = await self.holds.hold(request, command, response, version, self.decide_async)
        await trio.sleep(0.005)  # a round trip
        return response

    def decide(self, command: Heartbeat) -> HeartbeatResponse:
        try:
            events = self.run(command)
        except CoordinationError as exc:
            raise CoordinatorRejected(400, exc.code, exc.message) from exc
        return respond(self.state, command, events)

    async def decide_async(self, command: Heartbeat) -> HeartbeatResponse:
        """A recheck of a held heartbeat (a refusal ends the hold, as in the HTTP coordinator)."""
        events = self.run(command)  # (before reading the state it leads to)
        return respond(self.state, command, events)

    async def ticks(self) -> None:
        while True:
            await trio.sleep(0.1)
            self.run(Tick(now_ms(), self.leases))


class Recorder:
    """A ShardLifecycle that records what it was told, with trio times."""

    def __init__(self, name: str, log: list[tuple[float, str, str, frozenset[int]]]) -> None:
        self.name = name
        self.log = log
        self.reading: set[int] = set()
        self.workers: list[int] = []
        self.revoke_delay = 0.0
        self.valid_until = float("-inf")

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        self.reading |= shards
        self.log.append((trio.current_time(), self.name, "assigned", shards))

    async def revoke(self, shards: frozenset[int], within_s: float) -> None:
        await trio.sleep(self.revoke_delay)
        self.reading -= shards
        self.log.append((trio.current_time(), self.name, "revoke", shards))

    async def lost(self, shards: frozenset[int]) -> None:
        self.reading -= shards
        self.log.append((trio.current_time(), self.name, "lost", shards))

    async def concurrency(self, workers: int) -> None:
        self.workers.append(workers)

    def drain_progress(self) -> Sequence[DrainProgress]:
        return ()

    def renewed(self, until: float) -> None:
        self.valid_until = until
