"""Creating a stream or group its first use found missing: quotas, rebuilds, registration.

A stream is created with the default shard count (or the one asked for), within the caller's
quota (`rsc.actors.quota_gate`), or rebuilt when Redis lost it (`rsc.actors.corrections`). A
group is created one at a time: the registry makes sure its stream exists, registers the group
with the stream, then creates the group with the stream's current layout.

The registry decides whether to create (auto-creation, `create`, a loss) and keeps the actor
meanwhile; this module does the creating. Imports `rsc.events` and the actor modules below
the registry; the registry hands itself in as `Streams` (no import back).
"""

from __future__ import annotations

import logging
from typing import Protocol

import attrs
import trio

from rsc.actors.aggregates import GroupActor, StreamActor
from rsc.actors.clock import Clock
from rsc.actors.corrections import LossCorrections
from rsc.actors.effects.port import Effects
from rsc.actors.quota_gate import QuotaGate
from rsc.actors.store import Store
from rsc.events.admin_rules import creation_retention
from rsc.events.commands import CreateGroup, CreateStream, RegisterGroup
from rsc.events.errors import PreconditionFailed
from rsc.events.model import GroupConfig, StartFrom, Timing
from rsc.events.quotas import Quota

log = logging.getLogger("rsc.registry")


class Streams(Protocol):
    """What creating groups needs of the registry (`rsc.actors.registry.Registry`)."""

    async def stream(
        self,
        stream_prefix: str,
        create: bool | None = None,
        shard_count: int | None = None,
        only_new: bool = False,
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> StreamActor: ...


class Creation:
    """Creates the streams and groups the registry found missing (see the module)."""

    def __init__(
        self,
        streams: Streams,
        store: Store,
        effects: Effects,
        clock: Clock,
        corrections: LossCorrections,
        timing: Timing,
        default_shard_count: int,
    ) -> None:
        self.streams = streams
        self.store = store
        self.effects = effects
        self.clock = clock
        self.corrections = corrections
        self.timing = timing
        self.default_shard_count = default_shard_count
        self.quota_gate = QuotaGate(effects)
        #: Groups are created one at a time per stream: two first uses at once (a member's join
        #: and an admin `PUT`) must not both create one, or the loser's config is silently
        #: dropped, and two groups must not both pass the `groups_per_stream` quota. Groups of
        #: different streams are created side by side (a batch naming 100 new streams).
        self._creating_group: dict[str, trio.Lock] = {}

    async def create_stream(
        self,
        actor: StreamActor,
        stream_prefix: str,
        create: bool | None,
        shard_count: int | None,
        only_new: bool,
        seen_version: int,
        quota: Quota | None,
        lost: bool,
    ) -> None:
        """Create the missing stream of `actor` (with `shard_count`, else the default), or
        rebuild it if `lost` (above `seen_version`); see `Registry.stream` for the arguments.

        A stream created or rebuilt for a caller with a `quota` counts against it. Raises
        `QuotaExceeded` (nothing created), `PreconditionFailed` (`only_new`, and someone else
        created it first), `StoreError`, `ActorStopped`."""
        count = self.default_shard_count if shard_count is None else shard_count
        seen = actor.revision
        # A rebuild counts too: the version a client reports is no proof that Redis lost
        # anything, so a made-up one must not create streams past the quotas.
        counted = quota

        def missing() -> bool:
            return actor.state is None or actor.state.deleted

        async with self.quota_gate.admitted(counted, stream_prefix, count, missing):
            topology = await self.effects.topology()
            if lost:
                self.store.features.history_found = True  # a record made now starts at 1
            # read (made, the first time: after the line above) before deciding: the first stream
            # of a new deployment gets its level's default retention, a rebuilt one the baseline's
            level = (await self.store.features.current()).level
            retention = creation_retention(level)
            command = CreateStream(stream_prefix, count, self.clock.now_ms(), topology, retention=retention)
            if lost:
                command = await self.corrections.rebuild(command, seen_version, level)
            # Only over what was seen missing: a stream created meanwhile is not created twice.
            reply = await actor.ask(command, seen if only_new else None)
            if counted is not None and reply.events:
                await self.quota_gate.created(counted, stream_prefix)
        if lost and reply.events:
            found_keys = bool(command.found_keys)
            self.corrections.stream_rebuilt(stream_prefix, seen_version, reply.state.layout, found_keys)
        if only_new and not reply.events:  # it existed by then: someone else created it
            raise PreconditionFailed(f"stream {stream_prefix!r} was created meanwhile")
        if create is None and reply.events and not lost:  # a first heartbeat named it: say so
            log.info(
                "created stream %r with %d shard(s) for the first heartbeat naming it "
                "(auto_create_streams; false refuses unknown streams)",
                stream_prefix,
                count,
            )

    async def create_group(
        self,
        actor: GroupActor,
        stream_prefix: str,
        group: str,
        config: GroupConfig,
        only_new: bool,
        seen_version: int,
        quota: Quota | None,
        lost: bool,
    ) -> None:
        """Create the missing group of `actor` (one at a time per stream), on its stream's current
        layout, the stream created first if need be; `lost`: it is recreated after a loss (see
        `Registry.group` for the arguments). A group created meanwhile is left as it is.

        Raises `QuotaExceeded` (`groups_per_stream`, or its stream's creation),
        `UnknownStream`, `PreconditionFailed` (`only_new`, and someone else created it first),
        `StoreError`, `ActorStopped`."""
        lock = self._creating_group.setdefault(stream_prefix, trio.Lock())
        try:
            async with lock:
                await self._create_group(
                    actor, stream_prefix, group, config, only_new, seen_version, quota, lost
                )
        finally:
            if not lock.statistics().tasks_waiting and not lock.locked():
                self._creating_group.pop(stream_prefix, None)  # nothing kept once created

    async def _create_group(
        self,
        actor: GroupActor,
        stream_prefix: str,
        group: str,
        config: GroupConfig,
        only_new: bool,
        seen_version: int,
        quota: Quota | None,
        lost: bool,
    ) -> None:
        if actor.state is None or actor.state.deleted:  # else created meanwhile
            stream = await self.streams.stream(stream_prefix, seen_version=seen_version, quota=quota)
            self.quota_gate.admit_group(quota, stream_prefix, stream.state)
            if stream_prefix in self.corrections.rebuilt:  # all its keys hold was appended since the loss
                config = attrs.evolve(config, start_from=StartFrom.EARLIEST)
            reply = await stream.ask(RegisterGroup(group, config.start_from))
            layout = reply.state.layout
            now_ms = self.clock.now_ms()
            command = CreateGroup(stream_prefix, group, layout, self.timing, config, now_ms, rebuilt=lost)
            await actor.ask(command)
            if lost:
                self.corrections.group_recreated(stream_prefix, group, seen_version)
        elif only_new:
            raise PreconditionFailed(f"group {group!r} of {stream_prefix!r} was created meanwhile")
