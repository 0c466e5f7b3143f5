"""Holding heartbeat answers while a member's shards are pending (`rsc.events.longpoll`).

`GroupChanges` wakes held heartbeats of a group whenever a persisted batch of
that group releases shards or changes the target; each held heartbeat is then
decided again through the group's actor (so its lease is renewed and its
shards installed by the only writer) and answered once the answer says
something new, or when its wait is over.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from rsc.actors.errors import ActorStopped, StoreError
from rsc.actors.registry import Registry
from rsc.events import longpoll
from rsc.events.commands import Heartbeat
from rsc.events.errors import CoordinationError
from rsc.events.events import GroupEvent
from rsc.events.group import GroupState
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

log = logging.getLogger("rsc.http.longpoll")


class GroupChanges:
    """One `trio.Event` per group with held heartbeats, set (and replaced) when it changes."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._events: dict[tuple[str, str], trio.Event] = {}
        self.held = 0
        registry.group_observers.append(self.observe)

    def event(self, stream_prefix: str, group: str) -> trio.Event:
        """The event the next change of this group sets (take it before deciding)."""
        key = (stream_prefix, group)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = trio.Event()
        return event

    def observe(self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]) -> None:
        if longpoll.wakes(events):
            event = self._events.pop((after.stream_prefix, after.group), None)
            if event is not None:
                event.set()

    async def hold(
        self,
        body: HeartbeatRequest,
        command: Heartbeat,
        response: HeartbeatResponse,
        changed: trio.Event,
    ) -> HeartbeatResponse:
        """`response`, or a later answer to the same heartbeat if it was worth holding."""

        async def decide(again: Heartbeat) -> HeartbeatResponse:
            reply = await self.registry.ask_group(
                body.stream_prefix, body.consumer_group, again, create=False
            )
            return respond(reply.state, again, reply.events)

        self.held += 1
        try:
            return await hold(
                body,
                command,
                response,
                changed,
                lambda: self.event(body.stream_prefix, body.consumer_group),
                decide,
                self.registry.clock.now_ms,
            )
        finally:
            self.held -= 1


async def hold(
    body: HeartbeatRequest,
    command: Heartbeat,
    response: HeartbeatResponse,
    changed: trio.Event,
    next_change: Callable[[], trio.Event],
    decide: Callable[[Heartbeat], Awaitable[HeartbeatResponse]],
    now_ms: Callable[[], int],
) -> HeartbeatResponse:
    """Hold `response` to `command` (sent as `body`) while `rsc.events.longpoll` says so.

    `changed` is the group's change event taken before `command` was decided, so that a
    release between that decision and this wait is not missed; `next_change()` gives the
    event of the next change; `decide` decides a heartbeat again and renders its answer.
    """
    if not longpoll.should_hold(body, response):
        return response
    first = latest = response
    deadline = trio.current_time() + longpoll.hold_ms(body, response) / 1000
    while True:
        with trio.move_on_at(deadline):
            await changed.wait()
        changed = next_change()
        command = longpoll.again(command, latest, now_ms())
        try:
            latest = await decide(command)
        except (CoordinationError, StoreError, ActorStopped) as exc:
            log.debug("%s: held heartbeat answered early: %s", body.member_id, exc)
            return latest  # true when it was decided; the member heartbeats again
        if longpoll.worth_answering(body, first, latest) or trio.current_time() >= deadline:
            return latest
