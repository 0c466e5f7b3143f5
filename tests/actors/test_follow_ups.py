"""A release and the install it allows, decided in one batch and written in one write
(`Actor.follow_ups`, `rsc.http.heartbeats.held.GroupChanges.follow_ups`), on fakes under trio's
autojump clock: the held heartbeat's answer comes with the release's write; a conflict drops
the follow-up and it is decided on its own; a failed write answers it as it stood."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import attrs
import trio
import trio.testing

from rsc.actors.deployment import Deployment
from rsc.actors.errors import Redecide, StoreUnavailable
from rsc.actors.registry import Registry
from rsc.actors.store import MemoryStore
from rsc.events import longpoll
from rsc.events.events import GroupConfigured
from rsc.events.model import GroupConfig, HeartbeatStatus
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatResponse
from rsc.http.heartbeats.held import DeploymentHold
from tests.actorkit import Member, registry_on

Clock = trio.testing.MockClock


async def handoff(registry: Registry) -> tuple[Member, Member]:
    """a holds every shard and has been told to revoke some; b waits for them."""
    a = Member(registry, "orders", "billing", "a")
    b = Member(registry, "orders", "billing", "b")
    await a.heartbeat()
    await a.heartbeat()
    assert (await b.heartbeat()).status is HeartbeatStatus.REVOKE_PENDING
    await a.heartbeat(ack=False)
    assert a.machine.revoking == b.machine.pending != frozenset()
    return a, b


async def held(
    registry: Registry, holds: DeploymentHold, b: Member, answers: list[HeartbeatResponse]
) -> None:
    """b's long poll, decided and held as `rsc.http` holds it; its answer appended to `answers`."""
    now_ms = registry.clock.now_ms()
    body = attrs.evolve(b.machine.request(now_ms / 1000), wait_ms=5_000)
    command = body.to_command(now_ms)
    version = holds.version("orders", "billing")
    reply = await registry.ask_group("orders", "billing", command)
    response = respond(reply.state, command, reply.events)
    assert longpoll.should_hold(body, response)
    answers.append(await holds.hold(body, command, response, version))


async def release_while_held(
    registry: Registry, holds: DeploymentHold, before_release: Any = None
) -> tuple[frozenset[int], list[HeartbeatResponse], float]:
    """a acknowledges its revoke while b's long poll is held: what a released, b's answer, and
    how long b waited after the release."""
    a, b = await handoff(registry)
    moving = a.machine.revoking
    answers: list[HeartbeatResponse] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held, registry, holds, b, answers)
        await trio.sleep(0.5)
        assert answers == []  # held: nothing was released yet
        if before_release is not None:
            await before_release()
        released_at = trio.current_time()
        with contextlib.suppress(StoreUnavailable):  # the release (its write may fail)
            await a.heartbeat()
    return moving, answers, trio.current_time() - released_at


async def test_the_install_is_written_with_the_release(autojump_clock: Clock) -> None:
    store = MemoryStore()
    async with registry_on(store) as registry:
        holds = DeploymentHold(Deployment(registry))
        actor = await registry.group("orders", "billing")
        writes: list[int] = []

        async def count() -> None:
            writes.append(actor.writes)

        moving, answers, _ = await release_while_held(registry, holds, count)
        assert answers[0].status is HeartbeatStatus.OK
        assert answers[0].assignment.assigned == moving
        assert actor.writes == writes[0] + 1  # one write: the release and the install
        assert actor.state is not None
        assert {actor.state.owners[s] for s in moving} == {"b"}


async def test_without_follow_ups_the_install_takes_a_write_of_its_own(autojump_clock: Clock) -> None:
    """The same handoff with the follow-ups switched off: what the test above rules out."""
    async with registry_on(MemoryStore()) as registry:
        holds = DeploymentHold(Deployment(registry))
        registry.group_follow_ups.clear()
        actor = await registry.group("orders", "billing")
        writes: list[int] = []

        async def count() -> None:
            writes.append(actor.writes)

        moving, answers, _ = await release_while_held(registry, holds, count)
        assert answers[0].assignment.assigned == moving
        assert actor.writes == writes[0] + 2


async def test_a_conflict_drops_the_follow_up_and_it_is_decided_on_its_own(autojump_clock: Clock) -> None:
    store = MemoryStore()
    async with registry_on(store) as registry:
        holds = DeploymentHold(Deployment(registry))
        actor = await registry.group("orders", "billing")
        [follow_ups] = registry.group_follow_ups
        taken: list[Any] = []

        def counted(state: Any, events: Any) -> Any:
            more = follow_ups(state, events)
            taken.extend(slot for _, slot in more)
            return more

        registry.group_follow_ups[:] = [counted]

        async def another_writer() -> None:  # as a second coordinator would: the next write conflicts
            foreign = actor.aggregate.event_to_json(GroupConfigured(GroupConfig(max_concurrency=2)))
            await store.append(actor.aggregate.aggregate_id, actor.revision, [foreign], None)

        moving, answers, _ = await release_while_held(registry, holds, another_writer)
        assert actor.conflicts == 1
        [slot] = taken  # taken into the batch that met the conflict, dropped with it
        assert isinstance(slot.error, Redecide)
        assert answers[0].status is HeartbeatStatus.OK
        assert answers[0].assignment.assigned == moving
        assert actor.state is not None
        assert actor.state.config.max_concurrency == 2


class FailingOnce(MemoryStore):
    """A store whose next append fails as an unreachable Redis does, once armed."""

    armed = False

    async def append(
        self,
        aggregate: Any,
        expected_revision: int,
        events: Sequence[tuple[str, str]],
        checkpoint: Any = None,
    ) -> Any:
        if self.armed:
            self.armed = False
            raise StoreUnavailable("Redis did not answer")
        return await super().append(aggregate, expected_revision, events, checkpoint)


async def test_a_failed_write_answers_the_held_heartbeat_as_it_stood(autojump_clock: Clock) -> None:
    store = FailingOnce()
    async with registry_on(store) as registry:
        holds = DeploymentHold(Deployment(registry))

        async def arm() -> None:
            store.armed = True

        moving, answers, waited = await release_while_held(registry, holds, arm)
        assert answers[0].status is HeartbeatStatus.REVOKE_PENDING  # nothing was written
        assert answers[0].assignment.pending == moving
        assert waited < 1  # answered with the failure, not at the end of its wait
