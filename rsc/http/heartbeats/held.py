"""Holding heartbeat answers while a member's shards are pending (`rsc.events.longpoll`).

`GroupChanges` keeps, per group, a version that every persisted batch that
may concern a held heartbeat bumps (`longpoll.change_of`), the last few such
changes, and the heartbeats held now. A held heartbeat is woken only by a
change that concerns it (`longpoll.concerns`: one of its pending shards was
released, its target changed, ...), and is then decided again through the
group's actor as a recheck (so its lease is renewed and its shards installed
by the only writer), and answered once the answer says something new, or when
its wait is over. A change between a heartbeat's first decision and the start
of its wait is found in the recent changes, by version, so it is not missed.

A release and the install it allows are decided in one batch: while the group's actor
decides a batch, `follow_ups` looks at its events (before they are written) and adds the
recheck of each held heartbeat they concern to the same batch, so that the install is written
with the release, in the same write, and answered when it is: one write (and its owner-token
update) less between a shard's release and its next owner's answer. A recheck the batch
dropped (`Redecide`: a conflict with another writer) is decided on its own, as any other.

At most `limit` heartbeats are held at once (the rest are answered at once:
their members heartbeat at the interval, as without a long poll), and
`release_all` answers every held heartbeat at once (on shutdown).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from rsc.actors.deployment import Answer, Deployment, Reply
from rsc.actors.deployment import HeldAnswer as Pending
from rsc.actors.errors import ActorStopped, Redecide, StoreError
from rsc.events import longpoll
from rsc.events.commands import Heartbeat
from rsc.events.errors import CoordinationError
from rsc.events.events import GroupEvent
from rsc.events.group import GroupState
from rsc.events.respond import respond
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

log = logging.getLogger("rsc.http.heartbeats.held")
#: Changes remembered per group, to catch one between a first decision and its wait.
RECENT = 64


@attrs.define(eq=False)
class _Waiter:
    member_id: str
    pending: frozenset[int]
    #: The heartbeat held and its latest answer (what a recheck is made of); None: only woken.
    command: Heartbeat | None = None
    latest: HeartbeatResponse | None = None
    woken: trio.Event = attrs.field(factory=trio.Event)
    #: The recheck decided with the change that concerned it, and its slot (`follow_ups`).
    recheck: Heartbeat | None = None
    decided: Pending | None = None
    #: The group's change version when its recheck was answered (its batch observed, no later).
    decided_version: int | None = None

    def answered(self, version: Callable[[], int]) -> Callable[[bool], None]:
        """What its recheck's slot tells when it is answered: the version then, and wake it."""

        def done(resolved: bool) -> None:
            if resolved:
                self.decided_version = version()
            self.woken.set()

        return done


@attrs.define
class _Group:
    version: int = 0
    recent: deque[tuple[int, longpoll.Change]] = attrs.field(factory=lambda: deque(maxlen=RECENT))
    waiters: set[_Waiter] = attrs.field(factory=set)

    def current_version(self) -> int:
        return self.version

    def changed_since(self, version: int, member_id: str, pending: frozenset[int]) -> bool:
        if version < self.version - len(self.recent):
            return True  # older than what is remembered: decide again to be sure
        return any(v > version and longpoll.concerns(c, member_id, pending) for v, c in self.recent)


Decide = Callable[[Heartbeat], Awaitable[HeartbeatResponse]]


class GroupChanges:
    """Wakes the held heartbeats a group's changes concern."""

    def __init__(self, now_ms: Callable[[], int], limit: int = 256) -> None:
        self.now_ms = now_ms
        self.limit = limit
        self.held = 0
        self.closed = False
        self._groups: dict[tuple[str, str], _Group] = {}

    def version(self, stream_prefix: str, group: str) -> int:
        """The group's change version now (take it before deciding a heartbeat to hold)."""
        state = self._groups.get((stream_prefix, group))
        return state.version if state is not None else 0

    def observe(self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]) -> None:
        """A group observer (`Deployment.observe_groups`): told of every persisted batch."""
        change = longpoll.change_of(events)
        if change is None:
            return
        state = self._groups.setdefault((after.stream_prefix, after.group), _Group())
        state.version += 1
        state.recent.append((state.version, change))
        for waiter in state.waiters:
            if longpoll.concerns(change, waiter.member_id, waiter.pending):
                waiter.woken.set()

    def follow_ups(self, after: GroupState, events: Sequence[GroupEvent]) -> list[tuple[Heartbeat, Answer]]:
        """The rechecks of the held heartbeats `events` (decided, not yet written) concern, to
        decide in the same batch (`Actor.follow_ups`): each waiter is taken out of the waiting
        set and woken when its recheck is answered."""
        state = self._groups.get((after.stream_prefix, after.group))
        if state is None or not state.waiters or self.closed:
            return []
        change = longpoll.change_of(events)
        if change is None:
            return []
        more: list[tuple[Heartbeat, Answer]] = []
        for waiter in list(state.waiters):
            if waiter.command is None or waiter.latest is None or waiter.decided is not None:
                continue
            if longpoll.concerns(change, waiter.member_id, waiter.pending):
                recheck = longpoll.again(waiter.command, waiter.latest, self.now_ms())
                state.waiters.discard(waiter)  # (only once its recheck is made: nothing raises after)
                waiter.recheck = recheck
                waiter.decided = Pending(on_done=waiter.answered(state.current_version))
                more.append((recheck, waiter.decided))
        return more

    def release_all(self) -> None:
        """Answer every held heartbeat now, and hold none from here on (shutting down)."""
        self.closed = True
        for state in self._groups.values():
            for waiter in state.waiters:
                waiter.woken.set()

    async def hold(
        self,
        body: HeartbeatRequest,
        command: Heartbeat,
        response: HeartbeatResponse,
        version: int,
        decide: Decide,
    ) -> HeartbeatResponse:
        """`response` to `command` (sent as `body`), or a later answer if it is worth holding.

        `version` is the group's change version taken before `command` was decided;
        `decide` decides a recheck heartbeat and renders its answer.
        """
        if self.closed or self.held >= self.limit or not longpoll.should_hold(body, response):
            return response
        key = (body.stream_prefix, body.consumer_group)
        state = self._groups.setdefault(key, _Group())
        first = latest = response
        deadline = trio.current_time() + longpoll.hold_ms(body, response) / 1000
        self.held += 1
        try:
            while True:
                waiter = _Waiter(body.member_id, latest.assignment.pending, command, latest)
                if state.changed_since(version, waiter.member_id, waiter.pending) or self.closed:
                    waiter.woken.set()
                    waiter.command = None  # woken already: decided below, not in a batch
                state.waiters.add(waiter)
                try:
                    with trio.move_on_at(deadline):
                        await waiter.woken.wait()
                finally:
                    state.waiters.discard(waiter)
                decided = waiter.decided
                if decided is not None:  # taken into a batch: its answer comes with the batch's
                    await decided.settled()
                version = state.version
                if decided is not None and waiter.decided_version is not None:
                    version = waiter.decided_version  # (a later batch may be observed by now)
                try:
                    # Dropped with its batch (a conflict), or its actor stopped: asked again.
                    if decided is not None and not isinstance(decided.error, (Redecide, ActorStopped)):
                        assert waiter.recheck is not None
                        command = waiter.recheck
                        if decided.error is not None:
                            raise decided.error
                        reply: Reply[GroupState, GroupEvent] = decided.value
                        latest = respond(reply.state, command, reply.events)
                    else:
                        command = longpoll.again(command, latest, self.now_ms())
                        latest = await decide(command)
                except (CoordinationError, StoreError, ActorStopped) as exc:
                    log.debug("%s: held heartbeat answered as it stood: %s", body.member_id, exc)
                    return latest  # true when it was decided; the member heartbeats again
                if longpoll.worth_answering(first, latest) or trio.current_time() >= deadline or self.closed:
                    return latest
        finally:
            self.held -= 1


class DeploymentHold:
    """`GroupChanges` bound to a deployment: its observer, clock and group actors."""

    def __init__(self, deployment: Deployment, limit: int = 256) -> None:
        self.deployment = deployment
        self.changes = GroupChanges(deployment.now_ms, limit)
        deployment.observe_groups(self.changes.observe)
        deployment.follow_up_groups(self.changes.follow_ups)

    def version(self, stream_prefix: str, group: str) -> int:
        return self.changes.version(stream_prefix, group)

    async def hold(
        self, body: HeartbeatRequest, command: Heartbeat, response: HeartbeatResponse, version: int
    ) -> HeartbeatResponse:
        async def decide(again: Heartbeat) -> HeartbeatResponse:
            reply = await self.deployment.ask_group(
                body.stream_prefix, body.consumer_group, again, create=False
            )
            return respond(reply.state, again, reply.events)

        return await self.changes.hold(body, command, response, version, decide)


#: 0.2.0's name of `DeploymentHold`.
RegistryHold = DeploymentHold
