"""A small driver for the pure group aggregate and its lease table, shared by the core tests."""

from __future__ import annotations

import attrs

from rsc.events import group
from rsc.events.commands import ApplyLayout, CreateGroup, GroupCommand, Heartbeat, Tick
from rsc.events.events import GroupEvent
from rsc.events.liveness import Leases
from rsc.events.model import Layout, Shard, Timing
from rsc.events.placement import shard_key
from rsc.events.respond import respond
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatResponse

TIMING = Timing(heartbeat_interval_ms=1_000, lease_ttl_ms=5_000, revoke_timeout_ms=20_000)


def layout(shards: int, version: int = 1) -> Layout:
    return Layout(version, tuple(Shard(i, shard_key("orders", i)) for i in range(shards)))


@attrs.define
class Group:
    """Holds a group's state, its lease table and every event it emitted; time is set by hand."""

    state: group.GroupState
    events: list[GroupEvent]
    now: int = 0
    leases: Leases = attrs.field(factory=Leases)
    #: The deployment's feature level the decisions run at.
    level: int = MAX_FEATURE_LEVEL
    #: Every event with the time it happened at (`now` when its command ran).
    timed: list[tuple[int, GroupEvent]] = attrs.field(factory=list)

    @classmethod
    def create(cls, shards: int = 6, timing: Timing = TIMING) -> Group:
        state, events = group.execute(None, CreateGroup("orders", "billing", layout(shards), timing))
        return cls(state, events)

    def run(self, command: GroupCommand) -> list[GroupEvent]:
        """Execute `command`, then bring the lease table up to date (as an actor does after its write)."""
        events = self.execute(command)
        self.leases.apply(events)
        self.events.extend(events)
        self.timed.extend((self.now, e) for e in events)
        return events

    def execute(self, command: GroupCommand) -> list[GroupEvent]:
        self.state, events = group.execute(self.state, command, self.level, self.leases)
        return events

    def hb(
        self,
        member: str,
        epoch: int,
        owned: set[int] | frozenset[int] = frozenset(),
        revoked: set[int] | frozenset[int] = frozenset(),
        incarnation: str = "inc-1",
        metadata_version: int = 1,
        *,
        static: bool = False,
        leaving: bool = False,
    ) -> HeartbeatResponse:
        command = Heartbeat(
            member_id=member,
            incarnation=incarnation,
            member_epoch=epoch,
            now_ms=self.now,
            metadata_version=metadata_version,
            owned=frozenset(owned),
            revoked=frozenset(revoked),
            static=static,
            leaving=leaving,
        )
        events = self.run(command)
        return respond(self.state, command, events)

    def tick(self, advance_ms: int = 0) -> list[GroupEvent]:
        self.now += advance_ms
        return self.run(Tick(self.now, self.leases))

    def scale(self, shards: int, version: int) -> list[GroupEvent]:
        return self.run(ApplyLayout(layout(shards, version), self.now))

    def names(self, events: list[GroupEvent] | None = None) -> list[str]:
        return [type(e).__name__ for e in (self.events if events is None else events)]
