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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import attrs
import trio

from rsc.actors import stream_dead_letters
from rsc.actors.actor import Actor, ActorSettings, Reply
from rsc.actors.aggregates import GroupAggregate, GroupObserver, StreamAggregate
from rsc.actors.clock import Clock
from rsc.actors.dataset import DATA_LOSS, EVERYTHING, LEASE, REBUILT, ROLLBACK, sweep
from rsc.actors.effects.port import Effects
from rsc.actors.errors import ActorStopped, StoreError, TermFenced
from rsc.actors.features import FeatureState
from rsc.actors.keys import AggregateId
from rsc.actors.store import Store
from rsc.actors.stream_dead_letters import DeadLetterCount, DeadLetterEntry, ReplayOutcome
from rsc.events import admin_rules, quotas
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
    RemoveMember,
    ResumeMigration,
    RetireShards,
    StreamCommand,
    UnregisterGroup,
)
from rsc.events.drain import drain_check
from rsc.events.errors import (
    CoordinationError,
    PreconditionFailed,
    QuotaExceeded,
    UnknownGroup,
    UnknownStream,
)
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.group import GroupState
from rsc.events.model import (
    MAX_COUNTER,
    GroupConfig,
    Layout,
    MigrationBounds,
    MigrationPhase,
    ReshardMode,
    StartFrom,
    Timing,
    check_name,
)
from rsc.events.placement import shard_key
from rsc.events.quotas import Quota
from rsc.events.stream import StreamState, moving, retirable
from rsc.events.versions import Party

log = logging.getLogger("rsc.registry")

GroupActor = Actor[GroupState, GroupCommand, GroupEvent]
StreamActor = Actor[StreamState, StreamCommand, StreamEvent]
#: How long a stream whose shard keys were looked for (a SCAN) and not found is not looked at
#: again: a member that keeps heartbeating about a stream Redis never held costs one SCAN so often.
EVIDENCE_RETRY_MS = 10_000
#: At most so many of those SCANs a minute, one at a time, for all names together.
EVIDENCE_SCANS_PER_MINUTE = 12
MAX_EVIDENCE_ENTRIES = 10_000
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
        #: (revision, state) of each aggregate an actor held when a term of this process ended:
        #: a later term writes it back if Redis then holds less (a failover to a lagging
        #: replica ends the term and rolls the store back).
        self.memory: dict[AggregateId, tuple[int, Any]] = {}
        #: When each group last had its 0.1.0 members fenced after a loss (`check_all`).
        self._blind_fenced_at: dict[AggregateId, int] = {}
        #: Streams rebuilt this term after Redis lost them: groups made on them start at `0`.
        self.rebuilt: set[str] = set()
        #: Streams whose shard keys were looked for and not found, until when not to look again.
        self._no_keys_until: dict[str, int] = {}
        self._scans: list[int] = []
        self._scanning = trio.Lock()
        #: Stream creations that count against quotas (`_counting`).
        self._creating_stream = trio.Lock()

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
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.group(
                    stream_prefix,
                    group,
                    create=create,
                    seen_version=seen_version,
                    rebuild=rebuild,
                    quota=quota,
                )
                return await actor.ask(command, expect)
            except ActorStopped:
                if attempt == ASK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

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
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.group(
                    stream_prefix,
                    group,
                    create=create,
                    seen_version=seen_version,
                    rebuild=rebuild,
                    quota=quota,
                )
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
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        for attempt in range(ASK_ATTEMPTS):
            try:
                actor = await self.stream(
                    stream_prefix, create=create, seen_version=seen_version, quota=quota
                )
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
            lost = stream_prefix in self.rebuilt
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
            try:
                with self._marked_creating(aggregate_id):
                    async with self._creating_group:
                        if actor.state is None or actor.state.deleted:  # else created meanwhile
                            await self._create_group(
                                actor,
                                stream_prefix,
                                group,
                                config or GroupConfig(),
                                seen_version,
                                quota,
                            )
                            if lost:
                                DATA_LOSS.noticed(
                                    REBUILT,
                                    f"group {group!r} of stream {stream_prefix!r}: nothing of it in Redis "
                                    f"while a member knows layout version {seen_version}; recreated, its "
                                    "consumer groups at 0 (its members rejoin)",
                                )
                        elif only_new:
                            raise PreconditionFailed(
                                f"group {group!r} of {stream_prefix!r} was created meanwhile"
                            )
            except (QuotaExceeded, UnknownStream):
                self._stop_missing(aggregate_id)  # refused names leave nothing in memory either
                raise
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
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> StreamActor:
        """The stream's actor, started; created (with `shard_count`, else the default) if allowed.

        `create` overrides the configured auto-creation; raises `UnknownStream`. With `only_new`,
        a stream that exists (or that someone else creates first) is `PreconditionFailed`.

        `seen_version`: the highest layout version the asking member (not a join) or producer
        has been told. If Redis holds nothing of the stream (not even its deletion) while a
        party knows a layout, Redis lost it: it is rebuilt (`_rebuild`). Where auto-creation is
        off, only with evidence in Redis: shard keys of that stream (`_leaves_keys`).

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
                    aggregate_id, self.effects, self._on_layout, self.settings.retired_retention_ms
                )
            ),
        )
        # (A version at the counters' limit cannot be rebuilt above: created as new instead.)
        lost = actor.state is None and 0 < seen_version < MAX_COUNTER and not only_new
        if lost and not (self.settings.auto_create_streams if create is None else create):
            lost = await self._leaves_keys(stream_prefix)  # where heartbeats may not create: evidence
        elif actor.state is None and not lost and create is None and self.settings.auto_create_streams:
            # A heartbeat creates a stream Redis holds nothing of, but shard keys of that name
            # exist: Redis lost it while no coordinator ran, and a join came before any party
            # that knows a layout. Rebuilt from those keys (not made anew beside them).
            lost = not only_new and await self._leaves_keys(stream_prefix)
        if actor.state is None or actor.state.deleted:
            if not lost and not (self.settings.auto_create_streams if create is None else create):
                self._stop_missing(aggregate_id)  # nothing to keep in memory for a name that does not exist
                raise UnknownStream(f"stream {stream_prefix!r} does not exist")
            if not self._current(aggregate_id, actor):  # stopped meanwhile as missing: again
                return await self.stream(stream_prefix, create, shard_count, only_new, seen_version, quota)
            count = self.settings.default_shard_count if shard_count is None else shard_count
            seen = actor.revision
            # A rebuild counts too: the version a client reports is no proof that Redis lost
            # anything, so a made-up one must not create streams past the quotas.
            counted = quota
            # Marked while it waits its turn too: a look that finds it missing meanwhile must not
            # stop the actor this creation will use.
            try:
                with self._marked_creating(aggregate_id):
                    async with self._counting(counted):
                        if counted is not None and (actor.state is None or actor.state.deleted):
                            await self._admit_stream(counted, stream_prefix, count)
                        reply, found_keys = await self._create_stream(
                            actor, stream_prefix, count, lost, seen_version, seen, only_new
                        )
                        if counted is not None and reply.events:
                            await self.effects.record_created(counted.owner, stream_prefix)
            except QuotaExceeded:
                self._stop_missing(aggregate_id)  # refused names leave nothing in memory either
                raise
            if lost and reply.events:
                self.rebuilt.add(stream_prefix)
                layout = reply.state.layout
                DATA_LOSS.noticed(
                    REBUILT,
                    f"stream {stream_prefix!r}: nothing of it in Redis while "
                    + (
                        f"its members or producers know layout version {seen_version}"
                        if seen_version
                        else "shard keys of it are there"
                    )
                    + f"; rebuilt at version {layout.metadata_version} "
                    f"with {len(layout.shards)} shard(s) "
                    + ("found in Redis" if found_keys else "(none found: the default count)"),
                )
            if only_new and not reply.events:  # it existed by then: someone else created it
                raise PreconditionFailed(f"stream {stream_prefix!r} was created meanwhile")
            if create is None and reply.events and not lost:  # a first heartbeat named it: say so
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

    async def _create_stream(
        self,
        actor: StreamActor,
        stream_prefix: str,
        count: int,
        lost: bool,
        seen_version: int,
        seen: int,
        only_new: bool,
    ) -> tuple[Reply[StreamState, StreamEvent], bool]:
        """Create (or rebuild) the stream; the reply, and whether a rebuild found shard keys."""
        aggregate_id = AggregateId(stream_prefix)
        with self._marked_creating(aggregate_id):
            topology = await self.effects.topology()
            command = CreateStream(stream_prefix, count, self.clock.now_ms(), topology)
            if lost:
                self.store.features.history_found = True  # a record made now starts at 1
                command = await self._rebuild(command, seen_version)
            # Only over what was seen missing: a stream created meanwhile is not created twice.
            return await actor.ask(command, seen if only_new else None), bool(command.found_keys)

    @contextlib.asynccontextmanager
    async def _counting(self, quota: Quota | None) -> AsyncIterator[None]:
        """Stream creations that count against quotas, one at a time: a check and the creation
        it admits are not interleaved with another's, so no quota is ever exceeded."""
        if quota is None:
            yield
            return
        async with self._creating_stream:
            yield

    async def _admit_stream(self, quota: Quota, stream_prefix: str, count: int) -> None:
        """Refuse (`QuotaExceeded`) a stream `quota`'s caller may not create."""
        limits = quota.limits
        if count > limits.shards_per_stream:
            raise QuotaExceeded(
                f"stream {stream_prefix!r} would have {count} shards; the quota "
                f"{quotas.SHARDS_PER_STREAM} allows {limits.shards_per_stream}",
                quotas.SHARDS_PER_STREAM,
                limits.shards_per_stream,
            )
        if await self.effects.stream_count() >= quota.total_streams:
            raise QuotaExceeded(
                f"the deployment has {quota.total_streams} streams, as many as its quota "
                f"{quotas.STREAMS} allows; delete one or raise quota_streams",
                quotas.STREAMS,
                quota.total_streams,
            )
        if await self.effects.created_count(quota.owner) >= limits.streams:
            raise QuotaExceeded(
                f"{quota.owner!r} created {limits.streams} stream(s) that still exist, as many as "
                f"its quota {quotas.STREAMS} allows; delete one, or give it a higher quota",
                quotas.STREAMS,
                limits.streams,
            )

    async def _create_group(
        self,
        actor: GroupActor,
        stream_prefix: str,
        group: str,
        config: GroupConfig,
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> None:
        stream = await self.stream(stream_prefix, seen_version=seen_version, quota=quota)
        if quota is not None and stream.state is not None:
            limit = quota.limits.groups_per_stream
            if len(stream.state.groups) >= limit:
                raise QuotaExceeded(
                    f"stream {stream_prefix!r} has {limit} groups, as many as the quota "
                    f"{quotas.GROUPS_PER_STREAM} allows",
                    quotas.GROUPS_PER_STREAM,
                    limit,
                )
        if stream_prefix in self.rebuilt:  # all its keys hold was appended since the loss
            config = attrs.evolve(config, start_from=StartFrom.EARLIEST)
        reply = await stream.ask(RegisterGroup(group, config.start_from))
        layout = reply.state.layout
        command = CreateGroup(stream_prefix, group, layout, self.settings.timing, config, self.clock.now_ms())
        await actor.ask(command)

    async def _leaves_keys(self, stream_prefix: str) -> bool:
        """Whether Redis holds shard keys of `stream_prefix` (`_scan`)."""
        return bool(await self._scan(stream_prefix))

    async def _scan(self, stream_prefix: str) -> dict[int, str]:
        """The shard keys of `stream_prefix` Redis holds (a SCAN of every primary), or none
        found. A name found without any is not looked at again for `EVIDENCE_RETRY_MS`, and
        there is one SCAN at a time, at most `EVIDENCE_SCANS_PER_MINUTE` for all names
        together: heartbeats naming ever new streams cannot make Redis scan in a loop."""
        now = self.clock.now_ms()
        if self._no_keys_until.get(stream_prefix, 0) > now:
            return {}
        self._scans = [t for t in self._scans if t > now - 60_000]
        if len(self._scans) >= EVIDENCE_SCANS_PER_MINUTE or self._scanning.locked():
            return {}
        self._scans.append(now)
        async with self._scanning:
            found = await self.effects.find_shard_keys(stream_prefix)
        if found:
            self._no_keys_until.pop(stream_prefix, None)
            return found
        if len(self._no_keys_until) >= MAX_EVIDENCE_ENTRIES:
            self._no_keys_until.clear()
        self._no_keys_until[stream_prefix] = now + EVIDENCE_RETRY_MS
        return {}

    async def _rebuild(self, command: CreateStream, seen_version: int) -> CreateStream:
        """A lost stream: its first layout is above the version the fleet reported (so that
        members and producers take it as a layout change), with the shard keys Redis still
        holds, or that producers routing by the lost layout have appended to since (found by
        name), plus any index between them; the default count when none is found."""
        found = dict(await self._scan(command.stream_prefix))
        if found:  # the namespace is the part of a found key before its name
            some = found[min(found)]
            namespace = some[: some.index(f"{command.stream_prefix}:{{")]
            for index in range(min(found), max(found) + 1):
                found.setdefault(index, shard_key(command.stream_prefix, index, namespace=namespace))
        return attrs.evolve(
            command, metadata_version=seen_version + 1, found_keys=tuple(sorted(found.items()))
        )

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
        actor: Actor[Any, Any, Any] = Actor(aggregate, self.store, self.clock, self.settings.actor)
        actor.remembered = self.memory.pop(aggregate.aggregate_id, None)
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
        self.rebuilt.clear()
        self._no_keys_until.clear()
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

    def check_all(self, kind: str, why: str) -> None:
        """Redis lost data (`rsc.actors.dataset`): every running actor compares its stored
        revision with its own, writes what it knows back where Redis holds less, and repairs
        every side effect as after a loss (shard keys, consumer groups at `0`, owner tokens)."""
        owner_tokens_lost = kind in (EVERYTHING, ROLLBACK, LEASE)  # not a restart that kept the data
        now = self.clock.now_ms()
        for aggregate_id, entry in list(self.actors.items()):
            entry.actor.check_store(why)
            group = isinstance(entry.actor.aggregate, GroupAggregate) and entry.started
            # Once per loss: the notices of one loss (lease, marker) come within a second.
            last = self._blind_fenced_at.get(aggregate_id, -(10**15))
            if owner_tokens_lost and group and now - last >= self.settings.timing.lease_ttl_ms:
                self._blind_fenced_at[aggregate_id] = now
                self.nursery.start_soon(self._fence_blind_members, entry.actor)

    async def _fence_blind_members(self, actor: GroupActor) -> None:
        """After a loss, members of 0.1.0 (client feature level 1) holding shards are fenced:
        their poller drops a shard whose owner token Redis lost and never says so (no
        `stalledShards`), so the shard would stay unread while the group believes it read.
        Fenced (`REMOVED`: a reason they know), they rejoin at once and read afresh; newer
        members report what they cannot read and keep their shards."""
        state = actor.state
        if state is None or state.deleted:
            return
        blind = sorted(
            m.member_id for m in state.members.values() if m.client.feature_level < 2 and m.installed
        )
        for member_id in blind:
            log.warning(
                "%s: fencing member %s after Redis lost data: its client (%s %s) cannot report "
                "shards it no longer reads; it rejoins and reads them afresh",
                actor.aggregate.aggregate_id,
                member_id,
                state.members[member_id].client.name,
                state.members[member_id].client.version,
            )
            with contextlib.suppress(CoordinationError, ActorStopped, StoreError):
                await actor.ask(RemoveMember(member_id, self.clock.now_ms()))

    def running(self) -> list[Actor[Any, Any, Any]]:
        """The actors started and running now."""
        return [e.actor for e in self.actors.values() if e.started]

    async def sweep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Partial loss: `sweep_per_round` running actors compare their stored revision each
        `sweep_every_s`, in rotation (a bounded number of Redis commands a second)."""
        task_status.started()
        if self.settings.sweep_per_round > 0:
            await sweep(self.running, self.settings.sweep_per_round, self.settings.sweep_every_s)

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
                except TermFenced:
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
            evidence = {index_of[k]: drain_check(e, state.groups) for k, e in found.items()}
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
        evidence = {index_of[key]: drain_check(e, state.groups) for key, e in found.items()}
        ready = retirable(state, evidence)
        if ready:
            log.info("retiring drained shards %s of %s", sorted(ready), stream_prefix)
            await self.ask_stream(stream_prefix, RetireShards(ready, self.clock.now_ms(), evidence))
        return ready != frozenset(s.index for s in state.layout.draining)

    async def stream_prefixes(self) -> list[str]:
        """Every stream the coordinator has created, sorted."""
        return sorted(await self.effects.streams())

    # --- what the Admin API asks ----------------------------------------

    async def feature_level(self) -> int:
        """The deployment's finalized feature level (read from Redis once a term).

        Raises `StoreError` (`UnsupportedFeatureLevel`: finalized at a level this release does
        not know)."""
        return (await self.store.features.current()).level

    async def feature_state(self) -> FeatureState:
        """The finalized feature level and the highest level written, read from Redis now.

        Raises `StoreError` as `feature_level` does."""
        return await self.store.features.load()

    async def finalize_feature_level(
        self, level: int, by: str, parties: Callable[[], Awaitable[Sequence[Party]]]
    ) -> tuple[FeatureState, FeatureState]:
        """Finalize the deployment's feature `level` (`by`: who asked); the state before and after.

        Raising the level first asks `parties` (every coordinator, member and producer) and
        waits for none of them (`rsc.events.admin_rules`). Raises `InvalidCommand` or
        `UnknownFeatureLevel` for a level this release does not know,
        `FeatureLevelNotSupported` if a party does not support it, `FeatureLevelMoved` if the
        level changed meanwhile or data above `level` was written, `StoreError`."""
        admin_rules.check_known_level(level)
        before = await self.store.features.load()
        if admin_rules.raises_level(level, before.level):
            admin_rules.check_supported(level, await parties())
        after = await self.store.features.finalize(level, by, expected=before.level)
        return before, after

    async def live_parties(self) -> list[Party]:
        """Every live member and live producer of every stream, with its client's feature level
        (a stream or group deleted meanwhile is left out).

        Raises `StoreError` or `ActorStopped` if an aggregate cannot be read."""
        parties: list[Party] = []
        for prefix in await self.stream_prefixes():
            try:
                actor = await self.stream(prefix, create=False)
            except UnknownStream:
                continue
            state = actor.state
            if state is None:
                continue
            for producer in state.producers.values():
                who = producer.client
                name = f"{prefix}/{producer.producer_id}"
                parties.append(Party("producer", name, who.version, who.feature_level))
            for group_name in sorted(state.groups):
                try:
                    group = await self.group(prefix, group_name, create=False)
                except (UnknownGroup, UnknownStream):
                    continue
                if group.state is None:
                    continue
                for member in group.state.members.values():
                    who = member.client
                    name = f"{prefix}/{group_name}/{member.member_id}"
                    parties.append(Party("member", name, who.version, who.feature_level))
        return parties

    async def dead_letter_counts(self, stream_prefix: str) -> list[DeadLetterCount]:
        """How many dead letters each shard of the stream's layout holds.

        Raises `UnknownStream`, `StoreError`."""
        shards = stream_dead_letters.shards_of(await self._stream_state(stream_prefix), stream_prefix)
        return await stream_dead_letters.counts(self.effects, shards)

    async def dead_letter_entries(
        self, stream_prefix: str, shard: int | None, limit: int
    ) -> list[DeadLetterEntry]:
        """The oldest dead letters of the stream (of `shard` only, if given), at most `limit`.

        Raises `UnknownStream`, `UnknownShard` (no such shard), `StoreError`."""
        state = await self._stream_state(stream_prefix)
        shards = stream_dead_letters.shards_of(state, stream_prefix, shard)
        return await stream_dead_letters.entries(self.effects, shards, limit)

    async def replay_dead_letters(
        self, stream_prefix: str, shard: int | None, ids: Sequence[str], limit: int
    ) -> ReplayOutcome:
        """Put dead letters (`ids`, or the oldest; of `shard` only, if given) back on their
        ACTIVE shards, at most `limit`.

        Raises `UnknownStream`, `UnknownShard` (no such shard), `StoreError`."""
        state = await self._stream_state(stream_prefix)
        shards = stream_dead_letters.shards_of(state, stream_prefix, shard)
        return await stream_dead_letters.replay(self.effects, shards, ids, limit)

    async def _stream_state(self, stream_prefix: str) -> StreamState:
        """The state of an existing stream (never creates one; `UnknownStream`)."""
        actor = await self.stream(stream_prefix, create=False)
        assert actor.state is not None  # `stream` refuses a stream that does not exist
        return actor.state

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
        await nursery.start(registry.sweep)
        try:
            yield registry
        finally:
            nursery.cancel_scope.cancel()
