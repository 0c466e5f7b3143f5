"""The registry: the actors of this process by aggregate, and their lifecycle.

One actor per aggregate at a time: started on first use, asked (again if it stopped
meanwhile), stopped when idle (`reap_idle`) or when a term ends (`stop_all`, remembering what
each held). A use that finds its stream or group missing has it created or rebuilt before the
actor is handed out; a refused name leaves no actor behind. The other jobs, one module each:

- `creation`: creating a missing stream or group (`Registry.creation`), within the caller's
  quota (`quota_gate`);
- `corrections`: after Redis lost data: lost streams rebuilt and reported, running actors
  checked, 0.1.0 members fenced, the partial-loss sweep (`Registry.corrections`);
- `layout_push`: a stream's layout pushed to its groups, pulled by a starting group actor
  (`Registry.layout_push`);
- `drain_watch` (drained shards retired, QUIESCED migrations moved on) and
  `consumer_pruning` (departed members' Redis consumers deleted): timers `open_registry` runs;
- `admin_changes` (deleting groups and streams, resharding, resuming and aborting migrations)
  and `admin_queries` (the feature level's state and finalizing it, live parties, dead
  letters): functions over a registry, the only ones of these that import this module.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import trio

from rsc.actors.actor import Actor, ActorSettings, Reply
from rsc.actors.aggregates import (
    GroupActor,
    GroupAggregate,
    GroupObserver,
    StreamActor,
    StreamAggregate,
)
from rsc.actors.answers import Answer, FollowUps
from rsc.actors.clock import Clock
from rsc.actors.consumer_pruning import prune_consumers
from rsc.actors.corrections import LossCorrections
from rsc.actors.creation import Creation
from rsc.actors.drain_watch import watch_drains
from rsc.actors.effects.port import Effects
from rsc.actors.errors import ActorStopped
from rsc.actors.features import FeatureState
from rsc.actors.keys import AggregateId
from rsc.actors.layout_push import LayoutPush
from rsc.actors.retention import RetentionFigures, TrimRequests, watch_retention
from rsc.actors.store import Store
from rsc.events.commands import GroupCommand, StreamCommand
from rsc.events.errors import (
    CoordinationError,
    PreconditionFailed,
    QuotaExceeded,
    UnknownGroup,
    UnknownStream,
)
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.group import GroupState
from rsc.events.model import MAX_COUNTER, GroupConfig, Layout, MigrationBounds, StartFrom, Timing, check_name
from rsc.events.quotas import Quota
from rsc.events.stream import StreamState

log = logging.getLogger("rsc.registry")

ASK_ATTEMPTS = 3
T = TypeVar("T")


async def _again_if_stopped(ask: Callable[[], Awaitable[T]]) -> T:
    """`ask` (find an aggregate's actor, starting it if need be, and ask it), asked again while
    the actor it found stopped meanwhile (idle, or a term ended), at most `ASK_ATTEMPTS` times
    in all: the one ask-and-retry of the registry. Raises what `ask` raises."""
    for _ in range(ASK_ATTEMPTS - 1):
        with contextlib.suppress(ActorStopped):
            return await ask()
    return await ask()


@attrs.frozen
class RegistrySettings:
    timing: Timing = Timing()
    default_shard_count: int = 4
    auto_create_streams: bool = True
    idle_after_s: float = 600.0
    actor: ActorSettings = ActorSettings()
    #: How often the drain evidence of DRAINING shards is read (`drain_watch`).
    drain_check_s: float = 1.0
    #: The bounds of a quiesce-mode migration's phases that keep producers paused.
    migration_bounds: MigrationBounds = MigrationBounds()
    #: How often streams with a retention policy are trimmed (`retention`; 0: never), and the
    #: most trim calls (one shard key each) a second over every stream (`rsc serve`: 5 s).
    retention_check_s: float = 0.0
    retention_shards_per_s: float = 2_000.0
    #: How long a retired shard key is kept (None: until the stream is deleted).
    retired_retention_ms: int | None = None
    #: How often departed members' Redis consumers are pruned (`consumer_pruning`; 0: never).
    consumer_prune_s: float = 30.0
    #: Partial-loss sweep: this many running actors compare their stored revision (one HGET
    #: each) every `sweep_every_s` (0: never; `rsc serve` sweeps 20 a second).
    sweep_per_round: int = 0
    sweep_every_s: float = 1.0


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
        #: What retention did (`rsc.actors.retention`), for `/metrics`.
        self.retention_figures = RetentionFigures()
        #: Shards producers reported full, trimmed early by the retention schedule.
        self.trim_requests = TrimRequests()
        #: Told of every persisted batch of group events (metrics hook).
        self.group_observers: list[GroupObserver] = []
        #: Asked of every decided batch of group events, before it is written: commands it
        #: calls for, decided in the same batch and write (`Actor.follow_ups`; held heartbeats).
        self.group_follow_ups: list[FollowUps] = []
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
        #: (revision, state) of each aggregate an actor held when a term of this process ended:
        #: a later term writes it back if Redis then holds less (a failover to a lagging
        #: replica ends the term and rolls the store back).
        self.memory: dict[AggregateId, tuple[int, Any]] = {}
        #: Layout changes of stream actors, pushed to their groups (`rsc.actors.layout_push`).
        self.layout_push = LayoutPush(self)
        #: Lost streams and groups rebuilt, actors checked after a loss (`rsc.actors.corrections`).
        self.corrections = LossCorrections(nursery, effects, clock, self.running, settings)
        #: Missing streams and groups created, within quotas (`rsc.actors.creation`).
        self.creation = Creation(
            self, store, effects, clock, self.corrections, settings.timing, settings.default_shard_count
        )

    # --- asking ---------------------------------------------------------

    async def ask_group(
        self,
        stream_prefix: str,
        group: str,
        command: GroupCommand,
        create: bool = True,
        expect: int | None = None,
        seen_version: int = 0,
        rebuild: bool = True,
        quota: Quota | None = None,
    ) -> Reply[GroupState, GroupEvent]:
        """Send `command` to the group's actor (started, and created if needed and `create`);
        `expect`: only at that revision (`PreconditionFailed`); `seen_version`, `quota`: see
        `group`."""

        async def once() -> Reply[GroupState, GroupEvent]:
            actor = await self.group(
                stream_prefix, group, create=create, seen_version=seen_version, rebuild=rebuild, quota=quota
            )
            return await actor.ask(command, expect)

        return await _again_if_stopped(once)

    async def ask_group_many(
        self,
        stream_prefix: str,
        group: str,
        commands: Sequence[GroupCommand],
        create: bool = True,
        seen_version: int = 0,
        rebuild: bool = True,
        quota: Quota | None = None,
    ) -> list[Reply[GroupState, GroupEvent] | CoordinationError]:
        """Send `commands` to the group's actor together (one wake-up for all their answers)."""

        async def once() -> list[Reply[GroupState, GroupEvent] | CoordinationError]:
            actor = await self.group(
                stream_prefix, group, create=create, seen_version=seen_version, rebuild=rebuild, quota=quota
            )
            return await actor.ask_many(commands)

        return await _again_if_stopped(once)

    async def ask_stream(
        self,
        stream_prefix: str,
        command: StreamCommand,
        create: bool | None = None,
        expect: int | None = None,
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        async def once() -> Reply[StreamState, StreamEvent]:
            actor = await self.stream(stream_prefix, create=create, seen_version=seen_version, quota=quota)
            return await actor.ask(command, expect)

        return await _again_if_stopped(once)

    def behind_the_fleet(self, stream_prefix: str) -> None:
        """A party routes by a layout newer than the stored one: have shard keys only that
        lost layout named drained (`LossCorrections.behind_the_fleet`). Raises nothing."""
        self.corrections.behind_the_fleet(stream_prefix, self.known_feature_level(), self.ask_stream)

    # --- actors ---------------------------------------------------------

    async def group(
        self,
        stream_prefix: str,
        group: str,
        config: GroupConfig | None = None,
        create: bool = True,
        only_new: bool = False,
        seen_version: int = 0,
        rebuild: bool = True,
        quota: Quota | None = None,
    ) -> GroupActor:
        """The group's actor, started; the group is created on first use (with `config`).

        Without `create`, a group that does not exist (nor its stream) is refused with
        `UnknownGroup` (`UnknownStream`) and no actor is left running for it. With `only_new`,
        a group that exists (or that someone else creates first) is `PreconditionFailed`.

        `seen_version`: the highest layout version the asking member (one already in the group,
        not a join) has been told (0: none). Such a member speaks of a group that existed; if
        Redis holds nothing of it (not even its deletion), Redis lost it: it is recreated (its
        consumer groups at `0`, never `$`) even without `create`, and the member rejoins. Where
        heartbeats may not create groups (`rebuild` false: `auto_create_groups` off), only a
        group whose stream was lost too (rebuilt this term) is recreated so.
        """
        check_name(stream_prefix, "streamPrefix")
        check_name(group, "consumerGroup")
        aggregate_id = AggregateId(stream_prefix, group)
        actor, fresh = await self._get(
            aggregate_id,
            lambda: self._actor(
                GroupAggregate(
                    aggregate_id, self.effects, self._observe_group, lambda: self.store.features.level
                )
            ),
        )
        lost = actor.state is None and 0 < seen_version < MAX_COUNTER
        if lost and not rebuild:  # heartbeats may not create groups: only with its stream lost too
            with contextlib.suppress(UnknownStream):
                await self.stream(stream_prefix, create=False, seen_version=seen_version)
            lost = stream_prefix in self.corrections.rebuilt
        if lost:
            create = True
            config = attrs.evolve(config or GroupConfig(), start_from=StartFrom.EARLIEST)
        if actor.state is None or actor.state.deleted:
            if not create:
                self._stop_missing(aggregate_id)
                await self.stream(stream_prefix, create=False)  # UnknownStream first, if so
                raise UnknownGroup(f"group {group!r} of stream {stream_prefix!r} does not exist")
            if not self._current(aggregate_id, actor):  # stopped meanwhile as missing: again
                return await self.group(stream_prefix, group, config, create, only_new, quota=quota)
            config = config or GroupConfig()
            try:
                with self._marked_creating(aggregate_id):
                    await self.creation.create_group(
                        actor, stream_prefix, group, config, only_new, seen_version, quota, lost
                    )
            except (QuotaExceeded, UnknownStream):
                self._stop_missing(aggregate_id)  # refused names leave nothing in memory either
                raise
        elif only_new:
            raise PreconditionFailed(f"group {group!r} of {stream_prefix!r} exists")
        elif fresh:
            await self.layout_push.pull(actor, stream_prefix, group)
        return actor  # type: ignore[no-any-return]

    async def stream(
        self,
        stream_prefix: str,
        create: bool | None = None,
        shard_count: int | None = None,
        only_new: bool = False,
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> StreamActor:
        """The stream's actor, started; created (with `shard_count`, else the default) if allowed.

        `create` overrides the configured auto-creation; raises `UnknownStream`. With `only_new`,
        a stream that exists (or that someone else creates first) is `PreconditionFailed`.

        `seen_version`: the highest layout version the asking member (not a join) or producer
        has been told. If Redis holds nothing of the stream (not even its deletion) while a
        party knows a layout, Redis lost it: it is rebuilt (`LossCorrections.rebuild`). Where
        auto-creation is off, only with evidence in Redis: shard keys of that stream
        (`LossCorrections.stream_lost`).

        `quota`: the asking caller's limits; a stream created for it counts against its
        `streams` quota and the deployment's, and its shard count against `shards_per_stream`
        (`QuotaExceeded`, nothing created); a rebuilt one too (a reported version proves nothing).
        """
        check_name(stream_prefix, "streamPrefix")
        aggregate_id = AggregateId(stream_prefix)
        actor, _ = await self._get(
            aggregate_id,
            lambda: self._actor(
                StreamAggregate(
                    aggregate_id, self.effects, self.layout_push.on_layout, self.settings.retired_retention_ms
                )
            ),
        )
        lost = await self.corrections.stream_lost(stream_prefix, actor.state, seen_version, create, only_new)
        if actor.state is None or actor.state.deleted:
            if not lost and not (self.settings.auto_create_streams if create is None else create):
                self._stop_missing(aggregate_id)  # nothing to keep in memory for a name that does not exist
                raise UnknownStream(f"stream {stream_prefix!r} does not exist")
            if not self._current(aggregate_id, actor):  # stopped meanwhile as missing: again
                return await self.stream(stream_prefix, create, shard_count, only_new, seen_version, quota)
            # Marked while it waits its turn too: a look that finds it missing meanwhile must not
            # stop the actor this creation will use.
            try:
                with self._marked_creating(aggregate_id):
                    await self.creation.create_stream(
                        actor, stream_prefix, create, shard_count, only_new, seen_version, quota, lost
                    )
            except QuotaExceeded:
                self._stop_missing(aggregate_id)  # refused names leave nothing in memory either
                raise
        elif only_new:
            raise PreconditionFailed(f"stream {stream_prefix!r} exists")
        if actor.state is not None and not actor.state.deleted and self._current(aggregate_id, actor):
            self.layouts[stream_prefix] = actor.state.layout  # (not from an actor a term stopped)
        return actor  # type: ignore[no-any-return]

    def _observe_group(
        self, before: GroupState | None, after: GroupState, events: Sequence[GroupEvent]
    ) -> None:
        for observer in self.group_observers:
            try:
                observer(before, after, events)
            except Exception:
                log.exception("group observer %r failed", observer)

    def _follow_group(self, state: GroupState, events: Sequence[GroupEvent]) -> list[tuple[Any, Answer]]:
        more: list[tuple[Any, Answer]] = []
        for follow_ups in self.group_follow_ups:
            try:
                more.extend(follow_ups(state, events))
            except Exception:
                log.exception("group follow-ups %r failed", follow_ups)
        return more

    def _actor(self, aggregate: Any) -> Actor[Any, Any, Any]:
        actor: Actor[Any, Any, Any] = Actor(aggregate, self.store, self.clock, self.settings.actor)
        actor.remembered = self.memory.pop(aggregate.aggregate_id, None)
        if isinstance(aggregate, GroupAggregate):
            actor.follow_ups = self._follow_group
        return actor

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
            if entry.actor.remembered is not None:  # not written back yet: for the next try
                self.memory.setdefault(aggregate_id, entry.actor.remembered)
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

    @contextlib.contextmanager
    def creating(self, stream_prefix: str) -> Iterator[None]:
        """A look at the stream and then its creation, as one (an admin `PUT`): a missing
        stream's actor is kept between the two (loaded once, not twice), and stopped at the end
        of the block if the stream is missing still (a refused creation keeps nothing)."""
        aggregate_id = AggregateId(stream_prefix)
        try:
            with self._marked_creating(aggregate_id):
                yield
        finally:
            # Only a started actor found missing (one still loading is its loader's to judge,
            # and may be another task's); `_stop_missing` spares one another creation marked.
            entry = self.actors.get(aggregate_id)
            if entry is not None and entry.started and entry.error is None:
                state = entry.actor.state
                if state is None or state.deleted:
                    self._stop_missing(aggregate_id)

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
        for entry in entries:  # remembered: written back if Redis holds less in a later term
            actor = entry.actor
            if actor.started and actor.state is not None:
                self.memory[actor.aggregate.aggregate_id] = (actor._revision, actor.state)
            elif actor.remembered is not None:  # still starting: what it was given is kept
                self.memory.setdefault(actor.aggregate.aggregate_id, actor.remembered)
        self.actors.clear()
        self.generation += 1
        self.layouts.clear()
        self.corrections.new_term()
        for entry in entries:
            entry.scope.cancel()
        if entries:
            log.info("stopped %d actor(s)", len(entries))

    def forget_terms(self) -> None:
        """Another coordinator held the lease since this process's last term: what this
        process remembers of that term is older than what the other may have written (and
        Redis may then have lost), so it is forgotten rather than written back later."""
        if self.memory:
            log.info("forgetting what %d aggregate(s) held in this process's last term", len(self.memory))
            self.memory.clear()

    async def feature_level(self) -> int:
        """The deployment's finalized feature level (read from Redis once a term).

        Raises `StoreError` (`UnsupportedFeatureLevel`: finalized at a level this release does
        not know)."""
        return (await self.store.features.current()).level

    def known_feature_level(self) -> int:
        """The finalized feature level as this coordinator last read it (no I/O: what heartbeat
        answers say; the baseline before the first read)."""
        return self.store.features.level

    async def peek_feature_state(self) -> FeatureState | None:
        """The feature level as Redis holds it now, read only: never initializes it (None: not
        recorded yet). Raises `StoreUnavailable` when Redis does not answer."""
        return await self.store.features.peek()

    def running(self) -> list[Actor[Any, Any, Any]]:
        """The actors started and running now."""
        return [e.actor for e in self.actors.values() if e.started]

    def running_actor(self, aggregate_id: AggregateId) -> Actor[Any, Any, Any] | None:
        """The aggregate's actor if one is started and running now (never starts one)."""
        entry = self.actors.get(aggregate_id)
        return entry.actor if entry is not None and entry.started and entry.error is None else None

    def creation_ended(self, aggregate_id: AggregateId) -> trio.Event | None:
        """Set when the creations of the aggregate in flight have ended (None: none is)."""
        return self._created.get(aggregate_id)

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

    async def stream_prefixes(self) -> list[str]:
        """Every stream the coordinator has created, sorted."""
        return sorted(await self.effects.streams())


@contextlib.asynccontextmanager
async def open_registry(
    store: Store, effects: Effects, clock: Clock, settings: RegistrySettings = RegistrySettings()
) -> AsyncIterator[Registry]:
    """Run a registry (and its timers: idle reaper, drain watch, consumer pruning, sweep) until
    the block exits; then stop every actor."""
    async with trio.open_nursery() as nursery:
        registry = Registry(nursery, store, effects, clock, settings)
        await nursery.start(registry.reap_idle)
        await nursery.start(watch_drains, registry, settings.drain_check_s)
        await nursery.start(
            watch_retention, registry, settings.retention_check_s, settings.retention_shards_per_s
        )
        await nursery.start(prune_consumers, registry.running, effects, settings.consumer_prune_s)
        await nursery.start(registry.corrections.sweep)
        try:
            yield registry
        finally:
            nursery.cancel_scope.cancel()
