"""Layouts from a stream to its groups: pushed on every change, pulled when a group starts.

A layout change in a stream actor is pushed to every group of the stream, in the background
(`LayoutPush.on_layout`, the stream aggregate's hook); a group actor starting over an existing
group pulls the stream's layout (`LayoutPush.pull`), so a missed push is caught up. A push
never creates a group: a deleted one stays deleted, and one being created now gets the layout
once its creation ends.

Imports `rsc.events` and the actor modules below the registry; the registry hands itself in
as `Actors` (no import back).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import trio

from rsc.actors.actor import Reply
from rsc.actors.aggregates import GroupActor, StreamActor
from rsc.actors.clock import Clock
from rsc.actors.errors import ActorStopped, StoreError
from rsc.actors.keys import AggregateId
from rsc.events.commands import ApplyLayout, GroupCommand, RegisterGroup
from rsc.events.errors import CoordinationError, UnknownGroup, UnknownStream
from rsc.events.events import GroupEvent
from rsc.events.group import GroupState
from rsc.events.model import Layout

log = logging.getLogger("rsc.registry")


class Actors(Protocol):
    """What pushing layouts needs of the registry (`rsc.actors.registry.Registry`)."""

    nursery: trio.Nursery
    clock: Clock
    #: The layout of each stream as last seen this term.
    layouts: dict[str, Layout]

    async def ask_group(
        self, stream_prefix: str, group: str, command: GroupCommand, create: bool = True
    ) -> Reply[GroupState, GroupEvent]: ...

    async def stream(self, stream_prefix: str) -> StreamActor: ...

    def creation_ended(self, aggregate_id: AggregateId) -> trio.Event | None: ...


class LayoutPush:
    """Keeps every group of a stream on the stream's layout."""

    def __init__(self, actors: Actors) -> None:
        self.actors = actors

    def on_layout(self, stream_prefix: str, layout: Layout, groups: Sequence[str]) -> None:
        """The stream's layout changed (persisted): remember it and push it to each of `groups`
        in the background. Raises nothing; a group the push does not reach is logged (it pulls
        the layout when its actor starts again)."""
        self.actors.layouts[stream_prefix] = layout
        self.actors.nursery.start_soon(self._push, stream_prefix, layout, tuple(groups))

    async def pull(self, actor: GroupActor, stream_prefix: str, group: str) -> None:
        """A group actor starting over an existing group: make sure the stream knows it, then catch up.

        Raises what `Registry.stream` and `Actor.ask` raise (`UnknownStream`, `QuotaExceeded`,
        `StoreError`, `ActorStopped`, a `CoordinationError` of the commands)."""
        stream = await self.actors.stream(stream_prefix)
        if actor.state is not None:
            await stream.ask(RegisterGroup(group, actor.state.config.start_from))
        if stream.state is not None:
            await actor.ask(ApplyLayout(stream.state.layout, self.actors.clock.now_ms()))

    async def _push(self, stream_prefix: str, layout: Layout, groups: Sequence[str]) -> None:
        for group in groups:
            try:
                await self._apply(stream_prefix, group, layout)
            except (UnknownGroup, UnknownStream):
                continue  # deleted meanwhile: it stays deleted
            except (CoordinationError, StoreError, ActorStopped) as exc:
                log.warning(
                    "layout v%s did not reach %s/%s: %s", layout.metadata_version, stream_prefix, group, exc
                )

    async def _apply(self, stream_prefix: str, group: str, layout: Layout) -> None:
        """Give `layout` to an existing group; never creates one. A group being created now (its
        creation carries the layout read before this one) gets it once its creation ends."""
        actors = self.actors
        try:
            await actors.ask_group(
                stream_prefix, group, ApplyLayout(layout, actors.clock.now_ms()), create=False
            )
        except (UnknownGroup, UnknownStream):
            created = actors.creation_ended(AggregateId(stream_prefix, group))
            if created is None:
                raise
            await created.wait()
            await actors.ask_group(
                stream_prefix, group, ApplyLayout(layout, actors.clock.now_ms()), create=False
            )
