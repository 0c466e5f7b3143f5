"""Helpers for actor tests: a registry on fakes or on real Redis, and member moves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import attrs

from rsc.actors.actor import ActorSettings
from rsc.actors.clock import TrioClock
from rsc.actors.effects import Effects, MemoryEffects
from rsc.actors.registry import Registry, RegistrySettings, open_registry
from rsc.actors.store import MemoryStore, Store
from rsc.events.commands import Heartbeat
from rsc.events.model import Timing
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatResponse

TIMING = Timing(heartbeat_interval_ms=1_000, lease_ttl_ms=5_000, revoke_timeout_ms=10_000)
SETTINGS = RegistrySettings(
    timing=TIMING,
    default_shard_count=6,
    idle_after_s=float("inf"),
    actor=ActorSettings(tick_interval_s=0.5, checkpoint_every=10),
)


@contextlib.asynccontextmanager
async def registry_on(
    store: Store | None = None,
    effects: Effects | None = None,
    settings: RegistrySettings = SETTINGS,
) -> AsyncIterator[Registry]:
    async with open_registry(
        store or MemoryStore(), effects or MemoryEffects(), TrioClock(), settings
    ) as registry:
        yield registry


@attrs.define
class Member:
    """A well-behaved member: remembers its epoch and reads what it is given."""

    registry: Registry
    stream: str
    group: str
    member_id: str
    incarnation: str = "inc-1"
    epoch: int = 0
    owned: frozenset[int] = frozenset()
    to_ack: frozenset[int] = frozenset()

    async def heartbeat(self, ack: bool = True, epoch: int | None = None) -> HeartbeatResponse:
        acking = self.to_ack if ack else frozenset()
        command = Heartbeat(
            member_id=self.member_id,
            incarnation=self.incarnation,
            member_epoch=self.epoch if epoch is None else epoch,
            now_ms=self.registry.clock.now_ms(),
            metadata_version=0,
            owned=self.owned - acking,
            revoked=acking,
        )
        reply = await self.registry.ask_group(self.stream, self.group, command)
        response = respond(reply.state, command, reply.events)
        if response.member_epoch in (0, -1) and response.status.value in ("FENCED", "UNKNOWN_MEMBER"):
            self.epoch, self.owned, self.to_ack = 0, frozenset(), frozenset()
        elif command.member_epoch != -1:
            self.epoch = response.member_epoch
            self.owned = response.assignment.assigned | (self.owned & response.assignment.revoke)
            self.to_ack = response.assignment.revoke
        return response

    async def leave(self) -> HeartbeatResponse:
        self.owned = self.to_ack = frozenset()
        response = await self.heartbeat(epoch=-1)
        self.epoch = 0
        return response
