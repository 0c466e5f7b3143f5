"""The registry: starts an actor on first use, routes commands, stops idle actors.

One actor per aggregate at a time in this process. A group actor is created
on its first member's join: the registry makes sure the stream exists
(creating it with the default shard count unless auto-creation is off),
registers the group with the stream, then creates the group with the
stream's current layout. A layout change in a stream actor is pushed to
every group of the stream; a group actor also pulls the layout when it
starts, so a missed push is caught up.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import attrs
import trio

from rsc.actors.actor import Actor, ActorSettings, Reply
from rsc.actors.aggregates import GroupAggregate, GroupObserver, StreamAggregate
from rsc.actors.clock import Clock
from rsc.actors.effects import Effects
from rsc.actors.errors import ActorStopped, Fenced, StoreError
from rsc.actors.keys import AggregateId
from rsc.actors.store import Store
from rsc.events.commands import (
    AbortMigration,
    AdvanceMigration,
    ApplyLayout,
    ChangeShardCount,
    CreateGroup,
    CreateStream,
    DeleteGroup,
    DeleteStream,
    GroupCommand,
    RegisterGroup,
    ResumeMigration,
    RetireShards,
    StreamCommand,
    UnregisterGroup,
)
from rsc.events.errors import CoordinationError, PreconditionFailed, UnknownGroup, UnknownStream
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.group import GroupState
from rsc.events.model import (
    DrainCheck,
    GroupConfig,
    Layout,
    MigrationBounds,
    MigrationPhase,
    ReshardMode,
    Timing,
    check_name,
)
from rsc.events.stream import StreamState, moving, retirable

log = logging.getLogger("rsc.registry")

GroupActor = Actor[GroupState, GroupCommand, GroupEvent]
StreamActor = Actor[StreamState, StreamCommand, StreamEvent]
ASK_ATTEMPTS = 3


@attrs.frozen
class RegistrySettings:
    timing: Timing = Timing()
    default_shard_count: int = 4
    auto_create_streams: bool = True
    idle_after_s: float = 600.0
    actor: ActorSettings = ActorSettings()
    #: How often the drain evidence of DRAINING shards is read (`watch_drains`).
    drain_check_s: float = 1.0
    #: The bounds of a quiesce-mode migration's phases that keep producers paused.
    migration_bounds: MigrationBounds = MigrationBounds()
    #: How long a retired shard key is kept (None: until the stream is deleted).
    retired_retention_ms: int | None = None
    #: How often departed members' Redis consumers are pruned (`prune_consumers`; 0: never).
    consumer_prune_s: float = 30.0


@attrs.define
class _Entry:
    actor: Any
    ready: trio.Event = attrs.field(factory=trio.Event)
    #: Made with the entry, so that stopping it before its task runs works too.
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    started: bool = False
    error: BaseException | None = None


class _StartedFlag:
    """Wraps a task status to remember that the actor finished starting."""

    def __init__(self, entry: _Entry, inner: Any) -> None:
        self.entry = entry
        self.inner = inner

    def started(self, value: None = None) -> None:
        self.entry.started = True
        self.inner.started(value)


class Registry:
    """Owns every actor of this coordinator process (see `open_registry`)."""

    def __init__(
        self, nursery: trio.Nursery, store: Store, effects: Effects, clock: Clock, settings: RegistrySettings
    ) -> None:
        self.nursery = nursery
        self.store = store
        self.effects = effects
        self.clock = clock
        self.settings = settings
        self.actors: dict[AggregateId, _Entry] = {}
        #: Told of every persisted batch of group events (metrics hook).
        self.group_observers: list[GroupObserver] = []
        #: Creating a group is one at a time: two first uses at once (a member's join and an
        #: admin `PUT`) must not both create it, or the loser's config is silently dropped.
        self._creating_group = trio.Lock()
        #: Counts `stop_all` (a term ended): what was learnt from earlier actors is stale.
        self.generation = 0
        #: Aggregates being created now: a caller that finds one missing meanwhile (a read, an
        #: `If-Match` check) must not stop its actor, or the creation fails half-way.
        self._creating: Counter[AggregateId] = Counter()
        #: Set when the creations of an aggregate in flight have all ended (`_marked_creating`).
        self._created: dict[AggregateId, trio.Event] = {}
        #: The layout of each stream as last seen this term (the drain watcher looks at every
        #: stream once a term, and each layout change lands here), so that a stream no actor
        #: runs for is still known (metrics).
        self.layouts: dict[str, Layout] = {}

    # --- asking ---------------------------------------------------------

    async def ask_group(
        self,
        stream_prefix: str,
        group: str,
        command: GroupCommand,
        create: bool = True,
        expect: int | None = None,
    ) -> Reply[GroupState, GroupEvent]:
        """Send `command` to the group's actor (started, and created if needed and `create`);
        `expect`: only at that revision (`PreconditionFailed`)."""
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.group(stream_prefix, group, create=create)
                return await actor.ask(command, expect)
            except ActorStopped:
                if attempt == ASK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def ask_group_many(
        self, stream_prefix: str, group: str, commands: Sequence[GroupCommand], create: bool = True
    ) -> list[Reply[GroupState, GroupEvent] | CoordinationError]:
        """Send `commands` to the group's actor together (one wake-up for all their answers)."""
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.group(stream_prefix, group, create=create)
                return await actor.ask_many(commands)
            except ActorStopped:
                if attempt == ASK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def ask_stream(
        self,
        stream_prefix: str,
        command: StreamCommand,
        create: bool | None = None,
        expect: int | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.stream(stream_prefix, create=create)
                return await actor.ask(command, expect)
            except ActorStopped:
                if attempt == ASK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # --- actors ---------------------------------------------------------

    async def group(
        self,
        stream_prefix: str,
        group: str,
        config: GroupConfig | None = None,
        create: bool = True,
        only_new: bool = False,
    ) -> GroupActor:
        """The group's actor, started; the group is created on first use (with `config`).

        Without `create`, a group that does not exist (nor its stream) is refused with
        `UnknownGroup` (`UnknownStream`) and no actor is left running for it. With `only_new`,
        a group that exists (or that someone else creates first) is `PreconditionFailed`.
        """
        check_name(stream_prefix, "streamPrefix")
        check_name(group, "consumerGroup")
        aggregate_id = AggregateId(stream_prefix, group)
        actor, fresh = await self._get(
            aggregate_id, lambda: self._actor(GroupAggregate(aggregate_id, self.effects, self._observe_group))
        )
        if actor.state is None or actor.state.deleted:
            if not create:
                self._stop_missing(aggregate_id)
                await self.stream(stream_prefix, create=False)  # UnknownStream first, if so
                raise UnknownGroup(f"group {group!r} of stream {stream_prefix!r} does not exist")
            if not self._current(aggregate_id, actor):  # stopped meanwhile as missing: again
                return await self.group(stream_prefix, group, config, create, only_new)
            with self._marked_creating(aggregate_id):
                async with self._creating_group:
                    if actor.state is None or actor.state.deleted:  # else created meanwhile
                        await self._create_group(actor, stream_prefix, group, config or GroupConfig())
                    elif only_new:
                        raise PreconditionFailed(
                            f"group {group!r} of {stream_prefix!r} was created meanwhile"
                        )
        elif only_new:
            raise PreconditionFailed(f"group {group!r} of {stream_prefix!r} exists")
        elif fresh:
            await self._pull_layout(actor, stream_prefix, group)
        return actor  # type: ignore[no-any-return]

    async def stream(
        self,
        stream_prefix: str,
        create: bool | None = None,
        shard_count: int | None = None,
        only_new: bool = False,
    ) -> StreamActor:
        """The stream's actor, started; created (with `shard_count`, else the default) if allowed.

        `create` overrides the configured auto-creation; raises `UnknownStream`. With `only_new`,
        a stream that exists (or that someone else creates first) is `PreconditionFailed`.
        """
        check_name(stream_prefix, "streamPrefix")
        aggregate_id = AggregateId(stream_prefix)
        actor, _ = await self._get(
            aggregate_id,
            lambda: self._actor(
                StreamAggregate(
                    aggregate_id, self.effects, self._on_layout, self.settings.retired_retention_ms
                )
            ),
        )
        if actor.state is None or actor.state.deleted:
            if not (self.settings.auto_create_streams if create is None else create):
                self._stop_missing(aggregate_id)  # nothing to keep in memory for a name that does not exist
                raise UnknownStream(f"stream {stream_prefix!r} does not exist")
            if not self._current(aggregate_id, actor):  # stopped meanwhile as missing: again
                return await self.stream(stream_prefix, create, shard_count, only_new)
            count = self.settings.default_shard_count if shard_count is None else shard_count
            seen = actor.revision
            with self._marked_creating(aggregate_id):
                topology = await self.effects.topology()
                # Only over what was seen missing: a stream created meanwhile is not created twice.
                reply = await actor.ask(
                    CreateStream(stream_prefix, count, self.clock.now_ms(), topology),
                    seen if only_new else None,
                )
            if only_new and not reply.events:  # it existed by then: someone else created it
                raise PreconditionFailed(f"stream {stream_prefix!r} was created meanwhile")
            if create is None and reply.events:  # a first heartbeat named it: say so (a typo?)
                log.info(
                    "created stream %r with %d shard(s) for the first heartbeat naming it "
                    "(auto_create_streams; false refuses unknown streams)",
                    stream_prefix,
                    count,
                )
        elif only_new:
            raise PreconditionFailed(f"stream {stream_prefix!r} exists")
        if actor.state is not None and not actor.state.deleted and self._current(aggregate_id, actor):
            self.layouts[stream_prefix] = actor.state.layout  # (not from an actor a term stopped)
        return actor  # type: ignore[no-any-return]

    async def _create_group(
        self, actor: GroupActor, stream_prefix: str, group: str, config: GroupConfig
    ) -> None:
        stream = await self.stream(stream_prefix)
        reply = await stream.ask(RegisterGroup(group, config.start_from))
        layout = reply.state.layout
        command = CreateGroup(stream_prefix, group, layout, self.settings.timing, config, self.clock.now_ms())
        await actor.ask(command)

    async def _pull_layout(self, actor: GroupActor, stream_prefix: str, group: str) -> None:
        """A group actor starting over an existing group: make sure the stream knows it, then catch up."""
        stream = await self.stream(stream_prefix)
        if actor.state is not None:
            await stream.ask(RegisterGroup(group, actor.state.config.start_from))
        if stream.state is not None:
            await actor.ask(ApplyLayout(stream.state.layout, self.clock.now_ms()))

    # --- deleting -------------------------------------------------------

    async def delete_group(self, stream_prefix: str, group: str, expect: int | None = None) -> None:
        """Delete a group without live members (`NotEmpty` otherwise) and its Redis consumer groups.

        The group records its deletion first, then the stream forgets it. A
        member joining meanwhile creates the group afresh, and the stream
        learns it again.
        """
        try:
            await self.ask_group(
                stream_prefix, group, DeleteGroup(self.clock.now_ms()), create=False, expect=expect
            )
        except UnknownGroup:
            # Deleted already, but the stream may still list it: a delete that stopped between
            # its two writes (a failed write, a term that ended) is finished here.
            stream = await self.stream(stream_prefix, create=False)
            if stream.state is None or group not in stream.state.groups:
                raise
        await self.ask_stream(stream_prefix, UnregisterGroup(group), create=False)
        entry = self.actors.get(AggregateId(stream_prefix, group))
        state = entry.actor.state if entry is not None and entry.started else None
        if state is not None and not state.deleted:  # re-created by a join meanwhile
            await self.ask_stream(stream_prefix, RegisterGroup(group, state.config.start_from))

    async def change_shard_count(
        self,
        stream_prefix: str,
        shard_count: int,
        mode: ReshardMode = ReshardMode.ONLINE,
        migrations: bool = False,
        expect: int | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        """Reshard (or store `mode`); new shards are named to spread over the cluster's
        primaries as they are now. `migrations`: the feature level journals migrations."""
        topology = await self.effects.topology()
        bounds = self.settings.migration_bounds
        command = ChangeShardCount(shard_count, mode, self.clock.now_ms(), topology, bounds, migrations)
        return await self.ask_stream(stream_prefix, command, create=False, expect=expect)

    async def resume_migration(
        self, stream_prefix: str, expect: int | None = None
    ) -> Reply[StreamState, StreamEvent]:
        """Resume a stalled migration (`NoMigration` if none is stalled)."""
        command = ResumeMigration(self.clock.now_ms(), await self.effects.topology())
        return await self.ask_stream(stream_prefix, command, create=False, expect=expect)

    async def abort_migration(
        self, stream_prefix: str, reason: str, expect: int | None = None
    ) -> Reply[StreamState, StreamEvent]:
        """Abort a migration that has not changed the layout yet; producers resume."""
        command = AbortMigration(self.clock.now_ms(), reason)
        return await self.ask_stream(stream_prefix, command, create=False, expect=expect)

    async def delete_stream(self, stream_prefix: str, expect: int | None = None) -> None:
        """Delete a stream without groups or live producers (`NotEmpty` otherwise) and its shard keys."""
        reply = await self.ask_stream(
            stream_prefix, DeleteStream(self.clock.now_ms()), create=False, expect=expect
        )
        if not reply.events:  # deleted by another request meanwhile: not this one's 204
            raise UnknownStream(f"stream {stream_prefix!r} does not exist")
        self.layouts.pop(stream_prefix, None)

    def _observe_group(
        self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]
    ) -> None:
        for observer in self.group_observers:
            try:
                observer(before, after, events)
            except Exception:
                log.exception("group observer %r failed", observer)

    def _actor(self, aggregate: Any) -> Actor[Any, Any, Any]:
        return Actor(aggregate, self.store, self.clock, self.settings.actor)

    async def _get(
        self, aggregate_id: AggregateId, make: Callable[[], Actor[Any, Any, Any]]
    ) -> tuple[Any, bool]:
        entry = self.actors.get(aggregate_id)
        if entry is not None:
            await entry.ready.wait()
            if entry.error is None and self.actors.get(aggregate_id) is entry:
                return entry.actor, False
            return await self._get(aggregate_id, make)
        entry = _Entry(make())
        self.actors[aggregate_id] = entry
        try:
            await self.nursery.start(self._run, aggregate_id, entry)
        except BaseException as exc:
            entry.error = exc
            if self.actors.get(aggregate_id) is entry:
                del self.actors[aggregate_id]
            raise
        finally:
            entry.ready.set()
        return entry.actor, True

    async def _run(self, aggregate_id: AggregateId, entry: _Entry, *, task_status: Any) -> None:
        try:
            await self._run_until_stopped(aggregate_id, entry, task_status)
        except Exception:
            if not entry.started:
                raise
            log.exception("actor %s crashed; it restarts on next use", aggregate_id)
        finally:
            if self.actors.get(aggregate_id) is entry:
                del self.actors[aggregate_id]

    @staticmethod
    async def _run_until_stopped(aggregate_id: AggregateId, entry: _Entry, task_status: Any) -> None:
        with entry.scope:
            await entry.actor.run(task_status=_StartedFlag(entry, task_status))
        if not entry.started:
            raise ActorStopped(f"{aggregate_id} was stopped while starting")

    def _current(self, aggregate_id: AggregateId, actor: Any) -> bool:
        entry = self.actors.get(aggregate_id)
        return entry is not None and entry.actor is actor

    @contextlib.contextmanager
    def _marked_creating(self, aggregate_id: AggregateId) -> Iterator[None]:
        self._creating[aggregate_id] += 1
        self._created.setdefault(aggregate_id, trio.Event())
        try:
            yield
        finally:
            self._creating[aggregate_id] -= 1
            if not self._creating[aggregate_id]:
                del self._creating[aggregate_id]
                self._created.pop(aggregate_id).set()

    def _stop_missing(self, aggregate_id: AggregateId) -> None:
        """Stop the actor of an aggregate found not to exist, unless someone is creating it."""
        if not self._creating[aggregate_id]:
            self.stop(aggregate_id)

    def stop(self, aggregate_id: AggregateId) -> None:
        """Stop one actor; it is forgotten at once, so the next use starts (and recovers) a new one."""
        entry = self.actors.pop(aggregate_id, None)
        if entry is not None:
            entry.scope.cancel()

    def stop_all(self) -> None:
        """Stop every actor now, also those still starting (a coordinator term ended).

        They are forgotten at once: whatever asks next gets a new actor, which
        loads the aggregate afresh. Commands waiting in the old ones are
        answered with `ActorStopped`.
        """
        entries = list(self.actors.values())
        self.actors.clear()
        self.generation += 1
        self.layouts.clear()
        for entry in entries:
            entry.scope.cancel()
        if entries:
            log.info("stopped %d actor(s)", len(entries))

    async def reap_idle(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Stop actors nobody asked anything for `idle_after_s`, forever."""
        task_status.started()
        period = self.settings.idle_after_s / 4
        if math.isinf(period):
            return
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for aggregate_id, entry in list(self.actors.items()):
                if entry.started and now - entry.actor.last_used >= self.settings.idle_after_s:
                    log.info("stopping idle actor %s", aggregate_id)
                    self.stop(aggregate_id)

    async def prune_consumers(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Delete the Redis consumers that members which left or were fenced leave behind, forever.

        Each member reads under its member id as consumer name, so every restart under a new id
        (a new pod IP, a new pid) would leave names behind on every shard it read. Every
        `consumer_prune_s`, for each running group actor, each readable shard's consumers that
        are not live members and have nothing pending are deleted in one script; one with
        entries pending stays until the shard's new owner has claimed them (its reclaimer).
        Only running actors are looked at: an idle group has nobody new to prune after.
        """
        task_status.started()
        if self.settings.consumer_prune_s <= 0:
            return
        while True:
            await trio.sleep(self.settings.consumer_prune_s)
            for aggregate_id, entry in list(self.actors.items()):
                state = entry.actor.state if entry.started and entry.error is None else None
                if not isinstance(state, GroupState) or state.deleted:
                    continue
                keys = [s.key for s in state.layout.shards if s.readable]
                try:
                    gone = await self.effects.prune_consumers(keys, state.group, state.members)
                except StoreError as exc:
                    log.debug("pruning consumers of %s: %s", aggregate_id, exc)
                    continue
                if gone:
                    log.info("pruned %d departed consumer(s) of %s", gone, aggregate_id)

    async def watch_drains(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Retire DRAINING shards once Redis says they are sealed and drained, and move
        migrations on that wait for Redis (QUIESCED), forever.

        Every `drain_check_s`, each stream with DRAINING shards has their evidence read on
        their own nodes (`Effects.drain_evidence`), and those the core accepts
        (`stream.retirable`: sealed, drained, every live producer on the current layout) are
        retired. No member's word is needed, so shards retire with no member at all (the
        all-expired path), and never while an entry is left in them. A migration in QUIESCED
        gets the evidence of every readable shard (`AdvanceMigration`): it switches the layout
        once every group has consumed and acknowledged everything.
        """
        task_status.started()
        # Streams known to drain or migrate (None: not looked at yet, so the first round looks
        # at all). Others are looked at only while their actor runs anyway (a scale-in goes
        # through it), so this loop keeps no idle actor alive.
        busy: set[str] | None = None
        seen: set[str] = set()  # the streams of the last round (a new one is looked at)
        generation = self.generation
        while True:
            await trio.sleep(self.settings.drain_check_s)
            if generation != self.generation:  # a new term: look at every stream again
                generation, busy = self.generation, None
            try:
                prefixes = await self.stream_prefixes()
            except StoreError:
                continue
            for gone in set(self.layouts) - set(prefixes):  # deleted (even by a failed answer)
                self.layouts.pop(gone, None)
            still: set[str] = set()
            standby = False
            for prefix in prefixes:
                try:
                    load = busy is None or prefix in busy or prefix not in seen
                    if await self._drive(prefix, load=load):
                        still.add(prefix)
                except Fenced:
                    # A standby (found on a stream it had not looked at): streams are created,
                    # scaled in and migrated by the active coordinator meanwhile, so once this
                    # one is active, it looks at every one of them.
                    standby = True
                    break
                except UnknownStream:
                    continue  # gone meanwhile: nothing drains there
                except (CoordinationError, StoreError, ActorStopped) as exc:
                    still.add(prefix)  # look again next round
                    log.debug("drain check of %s: %s", prefix, exc)
            busy = None if standby else still
            seen = set(prefixes)

    async def _drive(self, stream_prefix: str, load: bool) -> bool:
        """Retire what may be retired and move a QUIESCED migration on; whether the stream
        needs looking at again. Its actor is started for it only with `load` (else only one
        running already is looked at)."""
        generation = self.generation  # what is learnt after a term ended is not recorded
        entry = self.actors.get(AggregateId(stream_prefix))
        if entry is not None and entry.started and entry.error is None:
            actor = entry.actor
        elif load:
            actor = await self.stream(stream_prefix, create=False)
        else:
            return False
        state = actor.state
        if state is None or state.deleted:
            self.layouts.pop(stream_prefix, None)
            return False
        if generation == self.generation:
            self.layouts[stream_prefix] = state.layout
        draining = False
        if state.layout.draining:
            draining = await self._retire_drained(stream_prefix, state)
            state = actor.state
        m = state.migration
        if moving(state) and m is not None and m.phase is MigrationPhase.QUIESCED:
            read_at = self.clock.now_ms()
            index_of = {s.key: s.index for s in state.layout.shards if s.readable}
            found = await self.effects.drain_evidence(index_of)
            evidence = {index_of[k]: DrainCheck(e.sealed, e.drained(state.groups)) for k, e in found.items()}
            topology = await self.effects.topology() if m.to_count > state.shard_count else None
            advance = AdvanceMigration(self.clock.now_ms(), evidence, topology, m.migration_id, read_at)
            await self.ask_stream(stream_prefix, advance)
        # A stalled migration is looked at too: its actor stays up, its state in the metrics.
        after = actor.state
        if after is not None and not after.deleted and generation == self.generation:
            self.layouts[stream_prefix] = after.layout
        running = after is not None and not after.deleted and after.migration is not None
        return draining or (running and after.migration.running)

    async def _retire_drained(self, stream_prefix: str, state: StreamState) -> bool:
        """Retire what may be retired; whether DRAINING shards remain."""
        index_of = {s.key: s.index for s in state.layout.draining}
        found = await self.effects.drain_evidence(index_of)
        evidence = {index_of[key]: DrainCheck(e.sealed, e.drained(state.groups)) for key, e in found.items()}
        ready = retirable(state, evidence)
        if ready:
            log.info("retiring drained shards %s of %s", sorted(ready), stream_prefix)
            await self.ask_stream(stream_prefix, RetireShards(ready, self.clock.now_ms(), evidence))
        return ready != frozenset(s.index for s in state.layout.draining)

    async def stream_prefixes(self) -> list[str]:
        """Every stream the coordinator has created, sorted."""
        return sorted(await self.effects.streams())

    # --- stream -> groups -------------------------------------------------

    def _on_layout(self, stream_prefix: str, layout: Layout, groups: Sequence[str]) -> None:
        self.layouts[stream_prefix] = layout
        self.nursery.start_soon(self._push_layout, stream_prefix, layout, tuple(groups))

    async def _push_layout(self, stream_prefix: str, layout: Layout, groups: Sequence[str]) -> None:
        for group in groups:
            try:
                await self._apply_layout(stream_prefix, group, layout)
            except (UnknownGroup, UnknownStream):
                continue  # deleted meanwhile: it stays deleted
            except (CoordinationError, StoreError, ActorStopped) as exc:
                log.warning(
                    "layout v%s did not reach %s/%s: %s", layout.metadata_version, stream_prefix, group, exc
                )

    async def _apply_layout(self, stream_prefix: str, group: str, layout: Layout) -> None:
        """Give `layout` to an existing group; never creates one. A group being created now (its
        creation carries the layout read before this one) gets it once its creation ends."""
        try:
            await self.ask_group(stream_prefix, group, ApplyLayout(layout, self.clock.now_ms()), create=False)
        except (UnknownGroup, UnknownStream):
            created = self._created.get(AggregateId(stream_prefix, group))
            if created is None:
                raise
            await created.wait()
            await self.ask_group(stream_prefix, group, ApplyLayout(layout, self.clock.now_ms()), create=False)


@contextlib.asynccontextmanager
async def open_registry(
    store: Store, effects: Effects, clock: Clock, settings: RegistrySettings = RegistrySettings()
) -> AsyncIterator[Registry]:
    """Run a registry (and its idle reaper) until the block exits; then stop every actor."""
    async with trio.open_nursery() as nursery:
        registry = Registry(nursery, store, effects, clock, settings)
        await nursery.start(registry.reap_idle)
        await nursery.start(registry.watch_drains)
        await nursery.start(registry.prune_consumers)
        try:
            yield registry
        finally:
            nursery.cancel_scope.cancel()
