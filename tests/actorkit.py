"""Helpers for actor tests: a registry on fakes or on real Redis, and member moves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import attrs

from rsc.actors.actor import ActorSettings
from rsc.actors.clock import TrioClock
from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.effects.port import Effects
from rsc.actors.registry import Registry, RegistrySettings, open_registry
from rsc.actors.store import MemoryStore, Store
from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import ClientInfo, Timing
from rsc.events.respond import respond
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatResponse

CLIENT = ClientInfo("actorkit", "1", MAX_FEATURE_LEVEL)  # the shipped member machine: reports stalls
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
    """A well-behaved member: the shipped member machine, driven straight against a registry."""

    registry: Registry
    stream: str
    group: str
    member_id: str
    incarnation: str = "inc-1"
    machine: MemberMachine = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start over as a fresh process would (epoch 0, nothing held)."""
        settings = MemberSettings(long_poll=False)  # no HTTP here to hold an answer
        self.machine = MemberMachine(
            self.stream, self.group, self.member_id, self.incarnation, CLIENT, settings
        )

    @property
    def owned(self) -> frozenset[int]:
        return self.machine.owned

    @property
    def epoch(self) -> int:
        return self.machine.epoch

    async def heartbeat(self, ack: bool = True) -> HeartbeatResponse:
        """One heartbeat; `ack`: revokes asked for earlier have finished and are acknowledged."""
        machine = self.machine
        now_ms = self.registry.clock.now_ms()
        if ack:
            machine.revoked(machine.revoking)
        request = machine.request(now_ms / 1000)
        command = request.to_command(now_ms)
        reply = await self.registry.ask_group(
            self.stream,
            self.group,
            command,
            seen_version=request.metadata_version if request.member_epoch > 0 else 0,  # as rsc.http
        )
        response = respond(reply.state, command, reply.events)
        machine.receive(request, response, now_ms / 1000)
        return response

    async def leave(self) -> HeartbeatResponse:
        """A graceful leave (then start over). Nobody else heartbeats here to become ready for
        its shards, so after one `leaving` heartbeat it revokes the rest as a member does when
        the handover takes too long, and sends the leave (epoch -1)."""
        machine = self.machine
        machine.stop()
        response = await self.heartbeat()
        machine.revoked(machine.revoking)
        later = self.registry.clock.now_ms() / 1000 + machine.leave_handoff_s
        machine.silent(later)
        machine.revoked(machine.revoking)
        while not machine.left:
            response = await self.heartbeat()
        self.forget()
        return response
